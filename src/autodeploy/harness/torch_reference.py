"""The reference of a live ``nn.Module``: its own outputs on the evaluation inputs, computed eagerly in
the caller's process (an object cannot reach a worker without pickle), written where
:func:`autodeploy.harness.run.reference` reads them, as ``.npz``. A ``.pt2``'s reference runs in the
reference worker instead (``harness/worker.py``)."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from autodeploy.adapters.base import TrialConfig
from autodeploy.adapters.registry import BASELINE_ENGINE
from autodeploy.data import Dataset
from autodeploy.errors import ModelError
from autodeploy.harness.run import HarnessSettings, PreparedData, reference_path
from autodeploy.harness.worker import run_all
from autodeploy.model import ModelInfo
from autodeploy.pytorch import TorchRunner, one_line

#: Items a call where the model has a batch axis: the PyTorch model's own batching, whatever the export fixed.
BATCH = 8


def write_module_reference(
    module: Any, model: ModelInfo, data: PreparedData, settings: HarnessSettings
) -> None:
    """The module's outputs on every input set a config is judged on (the held-out items, and all of
    them), ``BATCH`` items a call where ``model`` has a batch axis (an export that fixed it to 1 included:
    a model whose items depend on each other is then caught by the verdict), else one.

    Raises:
        ModelError: the module raised on the evaluation inputs (one line, with the fix).
    """
    axes = {n: model.batch_axis(n) for n in (*model.input_names, *model.output_names)}
    batch = BATCH if model.batched_inputs() else 1
    runner = TorchRunner(module, model)
    for config in (None, TrialConfig(BASELINE_ENGINE, "fp32")):
        path, sha256, _ = data.evaluation_for(config)
        evaluation = Dataset.load(path)
        try:
            outputs, _ = run_all(runner, evaluation.batches(batch, axes), len(evaluation), axes)
        except Exception as exc:
            raise ModelError(f"the PyTorch module raised on the evaluation inputs at {batch} items a call: "
                             f"{one_line(exc)}", fix="pass batch_dim=None if it takes one item a call") from None  # fmt: skip
        out = reference_path(model, sha256, settings)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(out.name + ".tmp.npz")
        np.savez(tmp, **outputs)
        os.replace(tmp, out)
