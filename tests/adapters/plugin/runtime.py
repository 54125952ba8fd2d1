"""The runtime of the plug-in engine: ``onnx.reference.ReferenceEvaluator`` runs ``model.onnx``."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from autodeploy.runtime.base import IO, Runner

PACKAGES = ("onnx",)
MODEL_FILE = "model.onnx"


def open(model_dir: Path, settings: Mapping[str, Any], io: IO) -> Runner:  # noqa: A001 - the runtime interface
    from onnx.reference import ReferenceEvaluator

    return _ReferenceRunner(ReferenceEvaluator(str(Path(model_dir) / settings["model_file"])), io)


class _ReferenceRunner(Runner):
    def __init__(self, evaluator: Any, io: IO) -> None:
        super().__init__(io)
        self._evaluator = evaluator

    def _run(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        return [np.asarray(a) for a in self._evaluator.run(list(self.output_names), dict(feeds))]
