"""A deliberately misbehaving engine, for testing the harness's isolation. Test-only.

It is ONNX Runtime underneath (real outputs, real accuracy), plus a ``fault`` knob that
makes ``load`` or ``run`` crash, hang or eat memory the way a broken engine would.
Registered through the registry by the tests: ``registry.register("faulty", TARGET)``.
"""

from __future__ import annotations

import ctypes
import signal
from collections.abc import Mapping
from typing import Any

import numpy as np

from autodeploy.adapters.base import Artifact, EngineSpace, Runner, TrialConfig
from autodeploy.adapters.ort import OnnxRuntimeEngine

TARGET = "tests.adapters.faulty:FaultyEngine"
FAULTS = (
    "none",
    "segfault",
    "hang",
    "hang_ignoring_sigterm",
    "oom",
    "raise_in_run",
    "raise_in_load",
    "wrong_outputs",
)


class FaultyEngine(OnnxRuntimeEngine):
    name = "faulty"

    def _space(self, target: Any, model: Any) -> EngineSpace:
        space = super()._space(target, model)
        return EngineSpace(
            space.precisions, space.unsupported, {**space.knobs, "fault": FAULTS}, space.max_threads
        )

    def _load(self, artifact: Artifact, config: TrialConfig, model: Any) -> Runner:
        fault = config.knobs.get("fault", "none")
        if fault == "raise_in_load":
            raise RuntimeError("deliberate load failure")
        inner = super()._load(artifact, config, model)
        return _FaultyRunner(inner, fault)


class _FaultyRunner(Runner):
    def __init__(self, inner: Runner, fault: str) -> None:
        super().__init__(inner.input_dtypes, inner.output_names)
        self._inner = inner
        self._fault = fault

    def _run(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        if self._fault == "segfault":
            ctypes.string_at(0)  # a real SIGSEGV, as from a broken native kernel
        elif self._fault in ("hang", "hang_ignoring_sigterm"):
            if self._fault == "hang_ignoring_sigterm":
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
            ctypes.CDLL(None).sleep(3600)  # blocked in C with the GIL released
        elif self._fault == "oom":
            hog = []
            for _ in range(64):  # up to 8 GiB in 128 MiB steps, each page touched
                hog.append(np.ones(16 * 2**20, dtype=np.float64))
        elif self._fault == "raise_in_run":
            raise RuntimeError("deliberate run failure")
        outputs = [v for v in self._inner.run(feeds).values()]
        if self._fault == "wrong_outputs":
            outputs = [np.roll(o, 1, axis=-1) for o in outputs]  # shifts every argmax
        return outputs
