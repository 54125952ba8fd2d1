"""ONNX Runtime (CPU execution provider).

``settings``: ``model_file`` and ONNX Runtime's own ``SessionOptions`` names:
``intra_op_num_threads`` (0: ORT's default, one per physical core), ``inter_op_num_threads``,
``execution_mode`` (``ORT_SEQUENTIAL``/``ORT_PARALLEL``) and ``graph_optimization_level``
(``ORT_DISABLE_ALL`` ... ``ORT_ENABLE_ALL``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from .base import IO, Runner

PACKAGES = ("onnxruntime",)
MODEL_FILE = "model.onnx"


def open(model_dir: Path, settings: Mapping[str, Any], io: IO) -> Runner:  # noqa: A001 - the runtime interface
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = int(settings.get("intra_op_num_threads", 0))
    options.inter_op_num_threads = int(settings.get("inter_op_num_threads", 0))
    options.execution_mode = getattr(ort.ExecutionMode, settings.get("execution_mode", "ORT_SEQUENTIAL"))
    options.graph_optimization_level = getattr(
        ort.GraphOptimizationLevel, settings.get("graph_optimization_level", "ORT_ENABLE_ALL")
    )
    options.log_severity_level = 3  # warnings from quantized graphs are noise in a benchmark
    session = ort.InferenceSession(
        str(Path(model_dir) / settings.get("model_file", MODEL_FILE)),
        sess_options=options,
        providers=["CPUExecutionProvider"],
    )
    return _OrtRunner(session, io)


class _OrtRunner(Runner):
    def __init__(self, session: Any, io: IO) -> None:
        super().__init__(io)
        self._session = session

    def _run(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        return self._session.run(list(self.output_names), dict(feeds))

    def _close(self) -> None:
        del self._session
