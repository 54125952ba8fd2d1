"""The adapter of the plug-in engine: fp32 only, the artifact is the ONNX file itself."""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from autodeploy.adapters.base import Artifact, Availability, Engine, EngineSpace, TrialConfig
from tests.adapters.plugin import runtime as rt

TARGET = "tests.adapters.plugin.adapter:ReferenceEngine"


class ReferenceEngine(Engine):
    name = "reference"
    runtime = rt.__name__
    packages = rt.PACKAGES

    def _probe(self, target: Any) -> Availability:
        import onnx.reference  # noqa: F401 - the runtime must import

        return Availability(True, version=self._version())

    def _space(self, target: Any, model: Any) -> EngineSpace:
        return EngineSpace(precisions=("fp32",), unsupported={"int8": "the reference evaluator runs fp32 only"})

    def _build(self, model: Any, config: TrialConfig, calibration: Mapping[str, np.ndarray] | None,
               outdir: Path, target: Any) -> None:  # fmt: skip
        shutil.copyfile(model.path, outdir / rt.MODEL_FILE)

    def _runtime_settings(self, artifact: Artifact, config: TrialConfig, model: Any) -> dict[str, Any]:
        return {"model_file": rt.MODEL_FILE}
