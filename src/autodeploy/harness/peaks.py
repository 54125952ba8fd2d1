"""What each precision can reach on this device: a short MatMul and Conv microbenchmark per engine, run once
per device in a child process and cached with the device fingerprint.

Every measurement's share of peak (``roofline.Roofline``) is read against these numbers. The kernels are
the two ops that carry a network's arithmetic, built as ONNX graphs here: a square MatMul
(``size x size x size``) and a 3x3 Conv (``size/4`` channels in and out on 28x28, ResNet's middle
stages), each as float (fp32, and bf16 or fp16 through OpenVINO's ``INFERENCE_PRECISION_HINT``) and as
a QDQ graph for int8 (ONNX Runtime fuses it into ``QLinearMatMul``/``QLinearConv``, OpenVINO runs its
int8 kernels). Each engine with kernels of its own (``Engine.peak_kernels``) measures the precisions its own
``space`` offers on this CPU, on its default threads (every core), opened by its ``peak_call`` through ``runtime/``
as every measured artifact is, timed by
:func:`~autodeploy.harness.timing.time_calls`.

The result is a file per device, ``<peaks folder>/<fingerprint>.json`` (:func:`peaks_folder`), not a
store table: it describes the device and its engines, not a model; ``autodeploy engines`` shows it with
no database, and every store a machine writes to (SQLite per project, a fleet's PostgreSQL) reads its
shares against the same numbers. Each measurement keeps the peak it was judged against in its own
record, so a store holds what it needs. A file measured with other engine versions or other settings is
measured again; so is one measured under load, on first use after :data:`RETRY_LOADED_S`, each kernel keeping
its faster reading; ``autodeploy engines --refresh`` measures again on demand. A config faster than its
precision's peak proves the peak read low: its share is not claimed (``roofline.above_peak``).

Run as ``python -m autodeploy.harness.peaks SETTINGS.json RESULT.json`` by :func:`measure_peaks`.
"""

from __future__ import annotations

import faulthandler
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autodeploy.roofline import Kernel, Peaks

if TYPE_CHECKING:
    import numpy as np
    import onnx

    from autodeploy.runtime.device import DeviceInfo

#: The Conv's spatial size: ResNet-50's third stage.
CONV_HW = 28
#: Seconds the whole microbenchmark may take before its child is stopped.
TIMEOUT_S = 300.0
#: A file measured under load is measured again on first use after this many seconds (each kernel keeping its
#: faster reading), so one busy moment does not set this device's peaks for good.
RETRY_LOADED_S = 600.0

Progress = Callable[[str], None]


@dataclass(frozen=True)
class PeakSettings:
    """How large and how long: the MatMul's side ``size`` (the Conv has ``size/4`` channels) and the
    seconds each kernel is timed. Defaults: 1024 and 0.2 s, about 5 s in all on a 2-core CPU;
    ``$AUTODEPLOY_PEAK_SIZE`` and ``$AUTODEPLOY_PEAK_SECONDS`` override them (tests run a tiny one)."""

    size: int = 1024
    seconds: float = 0.2

    def __post_init__(self) -> None:
        if self.size < 8 or not self.seconds > 0:
            raise ValueError(f"peak microbenchmark: size must be >= 8 and seconds > 0, got {self.size}, {self.seconds}")

    @classmethod
    def from_env(cls) -> PeakSettings:
        size, seconds = os.environ.get("AUTODEPLOY_PEAK_SIZE"), os.environ.get("AUTODEPLOY_PEAK_SECONDS")
        return cls(int(size) if size else cls.size, float(seconds) if seconds else cls.seconds)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_dict()))


def peaks_folder(cache: Path) -> Path:
    """Where the peak files live: ``$AUTODEPLOY_PEAKS_DIR``, else ``<cache>/peaks``."""
    return Path(os.environ.get("AUTODEPLOY_PEAKS_DIR") or Path(cache) / "peaks")


def peaks_path(folder: Path, fingerprint: str) -> Path:
    return Path(folder) / f"{fingerprint}.json"


def cached_peaks(device: DeviceInfo, folder: Path, settings: PeakSettings | None = None) -> Peaks | None:
    """The peaks measured before on this device with its engine versions and ``settings``, or ``None``."""
    path = peaks_path(folder, device.fingerprint)
    try:
        peaks = Peaks.from_dict(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError):  # none yet, or unreadable: measured again
        return None
    settings = settings or PeakSettings.from_env()
    if peaks.fingerprint != device.fingerprint or dict(peaks.settings) != settings.to_dict():
        return None
    return peaks if dict(peaks.versions) == _versions(device) else None


def device_peaks(device: DeviceInfo, folder: Path, *, refresh: bool = False, settings: PeakSettings | None = None,
                 progress: Progress | None = None) -> Peaks:  # fmt: skip
    """This device's peaks: the cached file, or measured now (on first use, or with ``refresh``) and cached.

    A microbenchmark that could not run at all (its child crashed or timed out) returns peaks with no
    kernel and the reason under ``failures["microbenchmark"]``, not cached: the next call tries again.
    """
    settings = settings or PeakSettings.from_env()
    found = None if refresh else cached_peaks(device, folder, settings)
    if found is not None and not (found.under_load and _age_s(found) > RETRY_LOADED_S):
        return found
    if progress:
        progress("measuring this device's peak throughput per precision (once per device, a few seconds)")
    peaks = measure_peaks(device, settings, progress)
    if found is not None:  # a file measured under load, measured again: each kernel keeps its faster reading
        peaks = faster(found, peaks)
    if peaks.kernels:
        path = peaks_path(folder, device.fingerprint)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(peaks.to_dict(), indent=1))
        os.replace(tmp, path)
    return peaks


def faster(old: Peaks, new: Peaks) -> Peaks:
    """``new`` with each kernel replaced by ``old``'s reading of it where that one was faster: a peak is the most
    a kernel reached, and load only ever slows one down."""
    before = {(k.engine, k.precision, k.op): k for k in old.kernels}
    kernels = tuple(max(k, before.get((k.engine, k.precision, k.op), k), key=lambda x: x.gops) for k in new.kernels)
    return replace(new, kernels=kernels)


def _age_s(peaks: Peaks) -> float:
    """Seconds since ``peaks`` were measured (infinite where the time is unreadable)."""
    try:
        return (datetime.now(timezone.utc) - datetime.fromisoformat(peaks.measured_at)).total_seconds()
    except ValueError:
        return float("inf")


def measure_peaks(device: DeviceInfo, settings: PeakSettings, progress: Progress | None = None,
                  timeout_s: float = TIMEOUT_S) -> Peaks:  # fmt: skip
    """Run the microbenchmark in a supervised child (its own process group, timeout, memory cap)."""
    from autodeploy.child import default_memory_cap_mb
    from autodeploy.harness.supervisor import run_worker

    outcome = run_worker(settings, timeout_s, default_memory_cap_mb(), progress, module=__name__)
    if outcome.status != "ok":
        return Peaks(device.fingerprint, (), {"microbenchmark": f"{outcome.failure_kind}: {outcome.failure_message}"},
                     _versions(device), settings.to_dict(), _now())  # fmt: skip
    # Filed under the device this process measures for, with its engine versions: what the cache is checked against.
    return replace(Peaks.from_dict(outcome.payload["peaks"]), fingerprint=device.fingerprint, versions=_versions(device))


def _versions(device: DeviceInfo) -> dict[str, str]:
    """The versions of the engines the microbenchmark runs (a new one is measured again)."""
    return {name: device.engines[name] for name in _measured() if name in device.engines}


def _measured() -> list[str]:
    """The engines with kernels of their own (``Engine.peak_kernels``), in the registry's order; the others run
    on these (the in-house engine) or on a GPU."""
    from autodeploy.adapters import registry

    return [engine.name for engine in registry.all_engines() if engine.peak_kernels]


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


# ---- the child ------------------------------------------------------------------------------------------


def _graphs(size: int) -> dict[str, tuple[float, dict[str, onnx.ModelProto], dict[str, np.ndarray]]]:
    """Per kernel (``"MatMul 1024x1024x1024"``): its operations, its float and QDQ int8 graphs, its feeds."""
    import numpy as np

    rng = np.random.default_rng(0)
    c = max(8, size // 4)
    matmul = (f"MatMul {size}x{size}", 2.0 * size**3, [size, size], [size, size], "MatMul", {})
    conv = (f"Conv3x3 {c}ch {CONV_HW}x{CONV_HW}", 2.0 * CONV_HW * CONV_HW * c * c * 9,
            [1, c, CONV_HW, CONV_HW], [c, c, 3, 3], "Conv", {"pads": [1, 1, 1, 1]})  # fmt: skip
    out = {}
    for name, ops, x_shape, w_shape, op, attrs in (matmul, conv):
        w = rng.uniform(-1, 1, w_shape).astype(np.float32)
        feeds = {"x": rng.uniform(-1, 1, x_shape).astype(np.float32)}
        out[name] = (ops, {"float": _float_graph(op, x_shape, w, attrs), "int8": _qdq_graph(op, x_shape, w, attrs)},
                     feeds)  # fmt: skip
    return out


def _float_graph(op: str, x_shape: list[int], w: np.ndarray, attrs: dict[str, Any]) -> onnx.ModelProto:
    from onnx import TensorProto, helper, numpy_helper

    node = helper.make_node(op, ["x", "w"], ["y"], **attrs)
    graph = helper.make_graph([node], "peak", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w, "w")])  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _qdq_graph(op: str, x_shape: list[int], w: np.ndarray, attrs: dict[str, Any]) -> onnx.ModelProto:
    """``op`` between QuantizeLinear/DequantizeLinear pairs (u8 activations, s8 weights): the QDQ form both
    engines turn into int8 kernels."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    w_scale = float(np.abs(w).max() / 127)
    inits = [numpy_helper.from_array(np.round(w / w_scale).astype(np.int8), "w_q"),
             numpy_helper.from_array(np.array(w_scale, np.float32), "w_scale"),
             numpy_helper.from_array(np.array(0, np.int8), "w_zero"),
             numpy_helper.from_array(np.array(2 / 255, np.float32), "x_scale"),
             numpy_helper.from_array(np.array(128, np.uint8), "x_zero"),
             numpy_helper.from_array(np.array(0.05, np.float32), "y_scale"),
             numpy_helper.from_array(np.array(128, np.uint8), "y_zero")]  # fmt: skip
    nodes = [helper.make_node("QuantizeLinear", ["x", "x_scale", "x_zero"], ["x_q"]),
             helper.make_node("DequantizeLinear", ["x_q", "x_scale", "x_zero"], ["x_dq"]),
             helper.make_node("DequantizeLinear", ["w_q", "w_scale", "w_zero"], ["w_dq"]),
             helper.make_node(op, ["x_dq", "w_dq"], ["y_f"], **attrs),
             helper.make_node("QuantizeLinear", ["y_f", "y_scale", "y_zero"], ["y_q"]),
             helper.make_node("DequantizeLinear", ["y_q", "y_scale", "y_zero"], ["y"])]  # fmt: skip
    graph = helper.make_graph(nodes, "peak-int8", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _offered(engine: Any, device: DeviceInfo, graph: onnx.ModelProto) -> tuple[str, ...]:
    """The precisions ``engine`` offers on this CPU (its own ``space``, on the float MatMul graph)."""
    import onnx

    from autodeploy.model import load_model
    from autodeploy.roofline import PRECISIONS

    with tempfile.TemporaryDirectory(prefix="autodeploy-peaks-") as tmp:
        path = Path(tmp, "peak.onnx")
        onnx.save(graph, str(path))
        offered = engine.space(device, load_model(path)).precisions
    return tuple(p for p in PRECISIONS if p in offered)


def measure_here(settings: PeakSettings, phase: Progress | None = None) -> Peaks:
    """The microbenchmark in this process (the child's side; tests and ``benchmarks/roofline.py`` call it too)."""
    import numpy as np

    from autodeploy.adapters import registry
    from autodeploy.device import probe_device
    from autodeploy.harness.timing import TimingPolicy, time_calls

    device, started = probe_device(), time.monotonic()
    policy = TimingPolicy(warmup_min_calls=2, warmup_max_s=settings.seconds, warmup_window=2, min_samples=3,
                          min_duration_s=settings.seconds, max_duration_s=max(4 * settings.seconds, 1.0))  # fmt: skip
    graphs = _graphs(settings.size)
    kernels: list[Kernel] = []
    failures: dict[str, str] = {}
    for name in _measured():
        engine = registry.get(name)
        availability = engine.probe(device)
        if not availability.available:
            failures[name] = availability.reason
            continue
        first = next(iter(graphs.values()))[1]["float"]
        for precision in _offered(engine, device, first):
            for kernel, (ops, models, feeds) in graphs.items():
                if phase:
                    phase(f"peaks: {name} {precision} {kernel}")
                graph = models["int8" if precision == "int8" else "float"]
                try:
                    run = engine.peak_call(graph.SerializeToString(), precision, {"x": feeds["x"].shape})
                    timed = time_calls(lambda run=run, feeds=feeds: run(feeds), policy)
                except Exception as exc:  # one kernel an engine cannot run: said, the others still measured
                    failures[f"{name}/{precision} {kernel.split()[0]}"] = f"{type(exc).__name__}: {exc}".splitlines()[0]
                    continue
                median_s = float(np.median(timed.samples_ns)) / 1e9
                kernels.append(Kernel(name, precision, kernel, ops / median_s / 1e9, device.physical_cores,
                                      timed.load is not None and timed.load.under_load))  # fmt: skip
    return Peaks(device.fingerprint, tuple(kernels), failures, _versions(device), settings.to_dict(), _now(),
                 time.monotonic() - started)  # fmt: skip


def main(argv: list[str]) -> int:
    from autodeploy.harness.supervisor import die_with_parent

    faulthandler.enable()
    die_with_parent()
    settings_path, result_path = Path(argv[0]), Path(argv[1])
    settings = PeakSettings(**json.loads(settings_path.read_text()))
    phase_path = Path(f"{result_path}.phase")
    peaks = measure_here(settings, phase=phase_path.write_text)
    tmp = result_path.with_name(result_path.name + ".tmp")
    tmp.write_text(json.dumps({"status": "ok", "peaks": peaks.to_dict()}))
    os.replace(tmp, result_path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
