"""The best INT8 any tool gets on ONNX Runtime's CPU provider for one model, and where the time goes.

Part of ``benchmarks/inhouse_int8.py`` (issue 17's goal "in-house int8 on ORT >= 1.5x ORT fp32"):

* the ceiling: ORT ``quantize_static`` in each format/type it offers (QDQ and QOperator, S8S8 and
  U8S8, per channel or not, reduce_range) and the in-house quantizer with and without its
  accuracy fallback, timed in interleaved rounds against ORT fp32 (full graph optimization, the
  same threads), each with its held-out cosine vs fp32;
* the profile: ORT's own profiler (``SessionOptions.enable_profiling``) on fp32 and on the in-house
  int8 model, per op type: its share of the run and how many nodes run as float vs integer
  kernels, so a ratio below the goal says which ops hold it back.

Usage (one model of the corpus)::

    python benchmarks/ort_int8_ceiling.py --model ppocrv5-det [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

#: Integer kernels after ORT's QDQ fusions (contrib and standard); everything else runs float.
INTEGER_OPS = ("QLinear", "QGemm", "ConvInteger", "MatMulInteger", "DynamicQuantize", "QuantizeLinear",
               "DequantizeLinear", "QAttention", "NhwcQLinear")  # fmt: skip


def ceiling_lines(console, path: Path, info, calibration: dict, evaluation: dict, threads: int,
                  workdir: Path, rounds: int = 5) -> None:  # fmt: skip
    """Print the ceiling table's lines and the profile lines for the model at ``path``."""
    import onnx

    from autodeploy.inhouse.passes import optimize
    from autodeploy.inhouse.quantize import QuantConfig, quantize

    workdir.mkdir(parents=True, exist_ok=True)
    feeds = {k: v[:1] for k, v in evaluation.items()}
    axes = {name: info.batch_axis(name) for name in info.input_names}
    source = _opset13(path, workdir)
    models: dict[str, bytes | str] = {"ORT fp32": str(path)}
    for label, kwargs in _static_variants():
        try:
            models[label] = _quantize_static(
                source, calibration, workdir / f"{label.replace(' ', '_')}.onnx", **kwargs
            )
        except Exception as exc:  # one variant failing is a line, not the end of the benchmark
            console.print(
                f"ORT ceiling {info.name}: {label} failed to build: {type(exc).__name__}: {str(exc)[:120]}"
            )
    optimized, _ = optimize(onnx.load(str(path)), target="onnx")
    for label, budget in (
        ("in-house int8, all int8", None),
        ("in-house int8, fallback", QuantConfig().max_accuracy_drop),
    ):
        config = QuantConfig(calibration="percentile", max_accuracy_drop=budget)
        q, report = quantize(optimized, calibration, config, axes)
        models[label] = q.SerializeToString()
        if budget is not None:
            fallback_kept = len(report.kept_float)
    sessions = {label: _session(m, threads) for label, m in models.items()}
    times = _interleaved(sessions, feeds, rounds)
    reference = _outputs(sessions["ORT fp32"], evaluation)
    base = times["ORT fp32"]
    for label, ms in times.items():
        cosine = _cosine(reference, _outputs(sessions[label], evaluation))
        note = f"; {fallback_kept} nodes float" if label == "in-house int8, fallback" else ""
        console.print(f"ORT ceiling {info.name}: {label:<34} {ms:7.2f} ms  x ORT fp32 {base / ms:4.2f}  "
                      f"held-out cosine {cosine:.4f}{note}")  # fmt: skip
    best = max((label for label in times if label != "ORT fp32"), key=lambda k: base / times[k])
    console.print(f"ORT ceiling {info.name}: best int8 {best} at {base / times[best]:.2f}x ORT fp32 "
                  f"(goal 1.5x; {threads} thread(s), {rounds} interleaved rounds)")  # fmt: skip
    profiles = {}
    for label in ("ORT fp32", "in-house int8, all int8", "in-house int8, fallback"):
        profiles[label] = _profile(models[label], feeds, threads, workdir)
        console.print(f"ORT profile {info.name}, {label}: {_profile_line(profiles[label])}")
    console.print(
        f"ORT bound {info.name}: {_bound(profiles['ORT fp32'], profiles['in-house int8, all int8'])}"
    )


def _bound(fp32: dict[str, float], int8: dict[str, float]) -> str:
    """Amdahl: the share of fp32 time in ops ORT has int8 kernels for, and the whole-model speed-up
    if exactly those ran at the speed-up measured for them in the all-int8 model, the rest unchanged
    (an estimate: int8 removes fp32's NCHWc reorders and adds Q/DQ, so other ops move too).
    (In the all-int8 model "Conv" also counts: ORT runs a QDQ Conv it cannot fuse as float.)"""
    heavy = ("Conv", "FusedConv", "MatMul", "Gemm", "FusedMatMul")
    f = sum(v for op, v in fp32.items() if op in heavy) / (sum(fp32.values()) or 1.0)
    int8_heavy = sum(
        v
        for op, v in int8.items()
        if op in heavy
        or op.startswith(("QLinearConv", "QLinearMatMul", "QGemm", "MatMulInteger", "ConvInteger"))
    )  # whichever kernel ran them there: a Conv the QDQ fusion missed still counts
    fp32_heavy = sum(v for op, v in fp32.items() if op in heavy)
    kernel = fp32_heavy / int8_heavy if int8_heavy else float("nan")
    bound = 1.0 / ((1.0 - f) + f / kernel) if kernel == kernel and kernel > 0 else float("nan")
    rest = 1 / 1.5 - (1.0 - f)  # the time left for the integer ops at 1.5x
    needed = f"{f / rest:.1f}x" if rest > 0 else "more than an infinite speed-up of them"
    return (f"{f:.0%} of ORT fp32 node time is in Conv/MatMul/Gemm; they ran {kernel:.2f}x faster as integer "
            f"kernels in the all-int8 model; with every other op as in fp32 the model would reach about {bound:.2f}x "
            f"(an estimate, not a limit: int8 also drops fp32's layout reorders and adds Q/DQ); 1.5x needs "
            f"them {needed} faster, or the other ops fused away")  # fmt: skip


def _static_variants() -> list[tuple[str, dict]]:
    from onnxruntime.quantization import QuantFormat, QuantType

    s8, u8 = QuantType.QInt8, QuantType.QUInt8
    return [
        ("quantize_static QDQ S8S8 per-channel", {"fmt": QuantFormat.QDQ, "act": s8, "per_channel": True}),
        ("quantize_static QDQ U8S8 per-channel", {"fmt": QuantFormat.QDQ, "act": u8, "per_channel": True}),
        ("quantize_static QDQ U8S8 per-tensor", {"fmt": QuantFormat.QDQ, "act": u8, "per_channel": False}),
        ("quantize_static QDQ U8S8 reduce_range",
         {"fmt": QuantFormat.QDQ, "act": u8, "per_channel": True, "reduce_range": True}),
        ("quantize_static QOperator U8S8", {"fmt": QuantFormat.QOperator, "act": u8, "per_channel": True}),
    ]  # fmt: skip


def _opset13(path: Path, workdir: Path) -> Path:
    """ORT's per-channel QDQ needs DequantizeLinear's axis (opset 13); ORT's pre-processing on top."""
    import onnx
    from onnxruntime.quantization.shape_inference import quant_pre_process

    model = onnx.load(str(path))
    version = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=13)
    source = path
    if version < 13:
        source = workdir / "opset13.onnx"
        onnx.save(onnx.version_converter.convert_version(model, 13), str(source))
    prepared = workdir / "prepared.onnx"
    quant_pre_process(str(source), str(prepared), skip_symbolic_shape=True)
    return prepared


def _quantize_static(
    source: Path, calibration: dict, out: Path, fmt, act, per_channel, reduce_range=False
) -> str:
    from onnxruntime.quantization import CalibrationDataReader, QuantType, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            n = len(next(iter(calibration.values())))
            self._it = iter([{k: v[i : i + 1] for k, v in calibration.items()} for i in range(n)])

        def get_next(self):
            return next(self._it, None)

    quantize_static(str(source), str(out), Reader(), quant_format=fmt, per_channel=per_channel,
                    reduce_range=reduce_range, activation_type=act, weight_type=QuantType.QInt8)  # fmt: skip
    return str(out)


def _session(model: bytes | str, threads: int, profile_prefix: str | None = None):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads, options.log_severity_level = threads, 3
    if profile_prefix:
        options.enable_profiling, options.profile_file_prefix = True, profile_prefix
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def _interleaved(sessions: dict, feeds: dict, rounds: int, calls: int = 10) -> dict[str, float]:
    samples: dict[str, list[float]] = defaultdict(list)
    for session in sessions.values():
        for _ in range(3):
            session.run(None, feeds)
    for _ in range(rounds):
        for label, session in sessions.items():
            start = time.perf_counter()
            for _ in range(calls):
                session.run(None, feeds)
            samples[label].append((time.perf_counter() - start) / calls * 1e3)
    return {label: float(np.median(v)) for label, v in samples.items()}


def _outputs(session, evaluation: dict) -> np.ndarray:
    n = len(next(iter(evaluation.values())))
    return np.concatenate(
        [session.run(None, {k: v[i : i + 1] for k, v in evaluation.items()})[0].ravel() for i in range(n)]
    )


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64), b.astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-12))


def _profile(
    model: bytes | str, feeds: dict, threads: int, workdir: Path, runs: int = 20
) -> dict[str, float]:
    """ORT's profiler over ``runs`` calls: ms per call per op type (``"op (n nodes)"`` keys carry no count)."""
    session = _session(model, threads, str(workdir / "profile"))
    for _ in range(runs):
        session.run(None, feeds)
    events = json.loads(Path(session.end_profiling()).read_text())
    per_type: dict[str, float] = defaultdict(float)
    for e in events:
        if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time"):
            per_type[e.get("args", {}).get("op_name", "?")] += e.get("dur", 0) / runs / 1e3
    return dict(per_type)


def _profile_line(per_type: dict[str, float]) -> str:
    total = sum(per_type.values()) or 1.0
    integer = sum(v for op, v in per_type.items() if op.startswith(INTEGER_OPS))
    top = sorted(per_type.items(), key=lambda kv: -kv[1])[:8]
    parts = [f"{op} {ms / total:.0%}" for op, ms in top]
    return f"{total:.2f} ms of node time, {integer / total:.0%} in integer kernels and Q/DQ; " + ", ".join(
        parts
    )


def main() -> None:
    from rich.console import Console
    from sklearn.datasets import load_sample_images
    from tests.realmodels.corpus import MODELS

    from autodeploy.device import probe_device
    from autodeploy.model import load_model

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="ppocrv5-det")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--items", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    console = Console(width=170)
    console.print(probe_device().cpu_line())
    real = next(m for m in MODELS if m.name == args.model)
    workdir = Path(tempfile.mkdtemp(prefix="autodeploy-ort-ceiling-"))
    path = real.extract(workdir)
    if isinstance(path, str):
        console.print(f"{real.name} skipped: {path}")
        return
    info = load_model(path, real.shapes, name=real.name)
    arrays = real.make(list(load_sample_images().images), 2 * args.items)
    split = ({k: v[: args.items] for k, v in arrays.items()}, {k: v[args.items :] for k, v in arrays.items()})
    ceiling_lines(console, path, info, *split, args.threads, workdir / "ceiling", rounds=args.rounds)


if __name__ == "__main__":
    main()
