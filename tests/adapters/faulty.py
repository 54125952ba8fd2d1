"""A deliberately misbehaving engine, for testing the harness's isolation. Test-only.

It is ONNX Runtime underneath (real outputs, real accuracy), plus a ``fault`` knob that
makes building fail, or opening or running crash, hang or eat memory the way a broken engine would. Like any
engine it is an adapter (:class:`FaultyEngine`) plus a runtime (this module's :func:`open`).
Registered through the registry by the tests: ``registry.register("faulty", TARGET)``.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from autodeploy.adapters.base import Artifact, EngineSpace, TrialConfig
from autodeploy.adapters.ort import OnnxRuntimeEngine
from autodeploy.errors import BuildError, ConversionError
from autodeploy.runtime import onnxruntime
from autodeploy.runtime.base import IO, Pool, Runner, ThreadPool

TARGET = "tests.adapters.faulty:FaultyEngine"
FAULTS = (
    "none",
    "fail_build",
    "fail_conversion",  # the conversion every precision shares fails (OpenVINO's frontend, onnx2tf)
    "segfault",
    "hang",
    "hang_ignoring_sigterm",
    "oom",
    "raise_in_run",
    "raise_in_load",
    "wrong_outputs",
    "hang_in_build",  # the build never ends (a stuck conversion): only a timeout stops it
    "abort_in_build",  # a native library's failed assertion: its words on stderr, then SIGABRT
    "slow_int8",  # an int8 artifact that runs 2 ms slower per call than fp32 (a runtime without int8 kernels)
    "fail_in_flight",  # the sync path runs; with requests in flight (Runner.pool) the 5th call raises
)


class FaultyEngine(OnnxRuntimeEngine):
    name = "faulty"
    runtime = __name__
    build_knobs = frozenset({"fault"})  # each fault is its own artifact; "fail_build" never builds

    def _build(self, model: Any, config: TrialConfig, calibration: Any, outdir: Path, target: Any) -> dict[str, Any]:
        if config.knobs.get("fault") == "fail_build":
            raise BuildError("deliberate build failure")
        if config.knobs.get("fault") == "fail_conversion":
            raise ConversionError("faulty could not convert the model: No conversion rule found for operations: "
                                  "ai.onnx.ml.Deliberate")  # fmt: skip
        if config.knobs.get("fault") == "hang_in_build":
            time.sleep(3600)
        if config.knobs.get("fault") == "abort_in_build":  # as ONNX Runtime 1.32 aborted on silero-vad's QDQ graph
            print("stl_vector.h:1130: std::vector<onnxruntime::NodeArg*>::operator[]: Assertion '__n < this->size()' failed.",
                  file=sys.stderr, flush=True)  # fmt: skip
            os.abort()
        return super()._build(model, config, calibration, outdir, target)

    def _space(self, target: Any, model: Any) -> EngineSpace:
        space = super()._space(target, model)
        return EngineSpace(space.precisions, space.unsupported, {**space.knobs, "fault": FAULTS})

    def _runtime_settings(self, artifact: Artifact, config: TrialConfig, model: Any) -> dict[str, Any]:
        return {**super()._runtime_settings(artifact, config, model), "fault": config.knobs.get("fault", "none"),
                "precision": config.precision}


def open(model_dir: Path, settings: Mapping[str, Any], io: IO) -> Runner:  # noqa: A001 - the runtime interface
    fault = settings["fault"]
    if fault == "raise_in_load":
        # As OpenVINO words it: where in its source first, the node that broke last.
        raise RuntimeError("Exception from src/inference/src/cpp/core.cpp:117:\n"
                           "Exception from src/plugins/intel_cpu/src/node.cpp:1621:\n"
                           "[ GENERAL_ERROR ] deliberate load failure of node /model/Add_10")  # fmt: skip
    if fault == "slow_int8" and settings.get("precision") != "int8":
        fault = "none"
    return _FaultyRunner(onnxruntime.open(model_dir, settings, io), fault)


class _FaultyRunner(Runner):
    def __init__(self, inner: Runner, fault: str) -> None:
        super().__init__(inner.io)
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
        elif self._fault == "slow_int8":
            time.sleep(0.002)
        elif self._fault == "raise_in_run":
            raise RuntimeError("deliberate run failure")
        outputs = [v for v in self._inner.run(feeds).values()]
        if self._fault == "fail_in_flight" and getattr(self, "_in_flight", None) is not None:
            self._in_flight += 1
            if self._in_flight >= 5:
                raise RuntimeError("deliberate failure of a request in flight")
        if self._fault == "wrong_outputs":
            outputs = [np.roll(o, 1, axis=-1) for o in outputs]  # shifts every argmax
        return outputs

    def _pool(self, requests: int | None) -> Pool:
        self._in_flight = 0
        return ThreadPool([self._run] * (requests or 2))


class SlowFaultyEngine(FaultyEngine):
    """The same engine, declared a slow converter (as TFLite's onnx2tf is): a time budget may skip it."""

    name = "slowfaulty"
    slow_build = True


SLOW_TARGET = "tests.adapters.faulty:SlowFaultyEngine"
