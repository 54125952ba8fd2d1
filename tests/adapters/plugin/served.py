"""A second plug-in engine: the ONNX file run on autodeploy's own ONNX Runtime runtime, its weights made constant.

Because its runtime ships in :mod:`autodeploy.runtime`, its winners can be bundled; it declares
what bundle export reads from an engine (a Triton backend, a runner extra) with values no
built-in engine has, so a test can tell that export read them from here
(``tests/bundle/test_plugin_engine.py``).

Its build does one thing ONNX Runtime does not: exporters before ONNX IR 4 listed every weight as a
graph input too, so each is an input with a default that a caller may override, and ORT neither folds
nor fuses it ("Initializer ... appears in graph inputs and will not be treated as constant"; its own
``remove_initializer_from_input.py`` is the fix). autodeploy never feeds those inputs, so this engine
drops them from the inputs and ORT optimizes the graph: on such a model it is genuinely faster than
ORT on the file as given, and a study over both picks it. Any other model is copied unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from autodeploy.adapters.base import Artifact, Availability, Engine, EngineSpace, TrialConfig
from autodeploy.adapters.ort import MODEL_FILE, OrtTritonBackend, session_settings
from autodeploy.model import copy_unchanged
from autodeploy.runtime import onnxruntime as rt

TARGET = "tests.adapters.plugin.served:ServedEngine"
#: Pinned in a bundle's requirements.txt beside the runtime's package (installed here, and no built-in's extra).
RUNNER_EXTRA = "onnx"
#: ``max_batch_size`` is at least this in a Triton config (ONNX Runtime's own declaration has none).
MAX_BATCH_FLOOR = 16


class ServedEngine(Engine):
    name = "served"
    runtime = rt.__name__
    packages = rt.PACKAGES
    runner_extras = (RUNNER_EXTRA,)
    triton = OrtTritonBackend(max_batch_floor=MAX_BATCH_FLOOR)  # ORT's backend and its parameters, with a floor

    def _probe(self, target: Any) -> Availability:
        import onnxruntime  # noqa: F401 - the runtime must import

        return Availability(True, version=self._version())

    def _space(self, target: Any, model: Any) -> EngineSpace:
        return EngineSpace(precisions=("fp32",))

    def _build(self, model: Any, config: TrialConfig, calibration: Mapping[str, np.ndarray] | None,
               outdir: Path, target: Any) -> dict[str, Any]:  # fmt: skip
        copy_unchanged(model, outdir, MODEL_FILE)
        return {"constant_weights": constant_weights(outdir / MODEL_FILE)}

    def _runtime_settings(self, artifact: Artifact, config: TrialConfig, model: Any) -> dict[str, Any]:
        return session_settings(config)


def constant_weights(path: Path) -> list[str]:
    """Drop the graph inputs that an initializer of the same name backs (rewriting ``path`` only when
    there are any): each becomes a constant weight. Returns their names."""
    import onnx

    proto = onnx.load(str(path), load_external_data=False)
    weights = {t.name for t in proto.graph.initializer}
    shadowed = [v.name for v in proto.graph.input if v.name in weights]
    if shadowed:
        kept = [v for v in proto.graph.input if v.name not in weights]
        del proto.graph.input[:]
        proto.graph.input.extend(kept)
        onnx.save(proto, str(path))
    return shadowed
