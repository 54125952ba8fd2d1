"""Every result's distance to this machine's limit (issue 41): the CPU, the peak GOP/s each precision reaches
here, and per model × config the median, the accuracy verdict, the GOP/s achieved and their share of that
precision's peak.

The peaks are the microbenchmark ``autodeploy engines`` shows (``harness/peaks.py``: a MatMul and a Conv per
engine and precision, on every core). Each config is measured with ``autodeploy.bench`` (fresh worker,
accuracy against the ONNX Runtime fp32 reference on the zoo model's own photos), once per round, the rounds
interleaved (A B C .., A B C ..); the median is the median of the rounds' medians, and the GOP/s are the
model's operations (``roofline.count_ops``: 2 x the MACs of its Conv, MatMul, Gemm, attention at the measured
shape) over it. Read shares and ratios measured in one run; absolute times depend on the machine's load
(each row says when its runs were under load).

Usage::

    python benchmarks/roofline.py [--models zoo:resnet50,zoo:mobilenetv2] [--rounds 3] [--threads N]
                                  [--refresh-peaks] [--quick]

``--quick``: 1 round, short timing and a small microbenchmark (to check the script runs; its numbers are not
the machine's). Configs the machine cannot run (bf16 without AVX512-BF16 or AMX, an engine not installed)
are left out with the reason.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import autodeploy  # noqa: E402
from autodeploy.adapters import registry  # noqa: E402
from autodeploy.adapters.base import TrialConfig  # noqa: E402
from autodeploy.api import cache_dir  # noqa: E402
from autodeploy.device import probe_device  # noqa: E402
from autodeploy.errors import AutodeployError  # noqa: E402
from autodeploy.harness.peaks import PeakSettings, device_peaks, peaks_folder  # noqa: E402
from autodeploy.harness.timing import TimingPolicy  # noqa: E402
from autodeploy.intake import resolve_model  # noqa: E402
from autodeploy.model import ModelInfo  # noqa: E402
from autodeploy.results_db.records import StoredTrial  # noqa: E402
from autodeploy.roofline import Peaks, gops_text  # noqa: E402
from autodeploy.units import fmt_ms  # noqa: E402

#: (label, engine, precision, knobs): the ORT fp32 default, then each engine's precisions, int8 last.
CONFIGS = (
    ("ORT fp32", "onnxruntime", "fp32", {}),
    ("ORT int8 (quantize_static)", "onnxruntime", "int8", {"quant_method": "static"}),
    ("OpenVINO fp32", "openvino", "fp32", {}),
    ("OpenVINO bf16", "openvino", "bf16", {}),
    ("NNCF int8 (OpenVINO)", "openvino", "int8", {}),
    ("in-house int8 on OpenVINO", "inhouse", "int8", {"runtime": "openvino"}),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="zoo:resnet50,zoo:mobilenetv2")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="threads per config (default: the engine's)")
    parser.add_argument("--refresh-peaks", action="store_true", help="measure this device's peaks again")
    parser.add_argument("--quick", action="store_true", help="1 round, short timing, a small microbenchmark")
    args = parser.parse_args()
    console = Console(width=170)
    device = probe_device()
    console.print(device.cpu_line())
    settings = PeakSettings(size=128, seconds=0.05) if args.quick else PeakSettings.from_env()
    with tempfile.TemporaryDirectory(prefix="roofline-peaks-") as quick_peaks:
        folder = Path(quick_peaks) if args.quick else peaks_folder(cache_dir())  # a quick run never caches its peaks
        peaks = device_peaks(device, folder, settings=settings, refresh=args.refresh_peaks)
    _peaks_table(console, peaks)
    rounds = 1 if args.quick else args.rounds
    timing = TimingPolicy(min_samples=16, min_duration_s=0.3) if args.quick else TimingPolicy()
    with tempfile.TemporaryDirectory(prefix="roofline-") as tmp:
        db = f"sqlite:///{Path(tmp) / 'roofline.db'}"
        for model in args.models.split(","):
            _model_table(console, model.strip(), rounds, timing, args.threads, db)
    console.print("[yellow]note:[/yellow] read shares and ratios from one run; absolute times depend on the load")


def _peaks_table(console: Console, peaks: Peaks) -> None:
    table = Table(title=f"peak throughput per precision (measured {peaks.measured_at}, {peaks.wall_s:.1f} s; "
                        f"MatMul and Conv per engine, every core)")  # fmt: skip
    for column in ("precision", "peak", "kernels (GOP/s)"):
        table.add_column(column, justify="right" if column == "peak" else "left")
    for precision in peaks.precisions():
        best = peaks.best(precision)
        kernels = "; ".join(f"{k.engine} {k.op}: {k.gops:.0f}{' (under load)' * k.under_load}"
                            for k in peaks.kernels if k.precision == precision)  # fmt: skip
        table.add_row(precision, gops_text(best.gops) if best else "-", kernels)
    console.print(table)
    for what, why in peaks.failures.items():
        console.print(f"peak not measured for {what}: {why}")


def _runnable(info: ModelInfo, config: TrialConfig) -> str | None:
    """Why ``config`` cannot run here (its engine's own check), or ``None``."""
    engine = registry.get(config.engine)
    availability = engine.probe(probe_device())
    if not availability.available:
        return str(availability)
    try:
        engine.check(probe_device(), info, config)
    except AutodeployError as exc:
        return str(exc).splitlines()[0]
    return None


def _model_table(console: Console, model: str, rounds: int, timing: TimingPolicy, threads: int | None, db: str) -> None:
    info = resolve_model(model, None).info  # a zoo model is built on first use
    configs = []
    for label, engine, precision, knobs in CONFIGS:
        config = TrialConfig(engine, precision, 1, threads, knobs)
        why = _runnable(info, config)
        if why:
            console.print(f"{model}: {label} left out: {why}")
        else:
            configs.append((label, config))
    runs: dict[str, list[StoredTrial]] = {label: [] for label, _ in configs}
    for round_ in range(rounds):  # interleaved: every config once per round
        for label, config in configs:
            console.print(f"{model} round {round_ + 1}/{rounds}: {label} ...")
            runs[label].append(autodeploy.bench(model, config, timing=timing, db=db))
    first = next((r.result.measurement.roofline for rs in runs.values() for r in rs
                  if r.result.measurement is not None and r.result.measurement.roofline is not None), None)  # fmt: skip
    gop = f", {first.gop:.3g} GOP a call" if first is not None else ""
    table = Table(title=f"{model} (batch 1{gop}; median of {rounds} round(s))")
    for column in ("config", "median", "verdict", "GOP/s", "share of peak", "load"):
        table.add_column(column, justify="left" if column in ("config", "verdict") else "right")
    for label, _ in configs:
        table.add_row(label, *_row(runs[label]))
    console.print(table)


def _row(runs: list[StoredTrial]) -> tuple[str, str, str, str, str]:
    """median, verdict, GOP/s, share of peak, load, over one config's rounds."""
    measured = [r.result for r in runs if r.result.measurement is not None]
    if not measured:
        failed = runs[-1].result
        return "-", f"failed ({failed.failure_kind})", "-", "-", "-"
    median = statistics.median(m.median_ms for m in measured)
    last = measured[-1]
    verdict = "passes" if last.ok else f"fails: {last.failure_kind}"
    if last.accuracy is not None and not last.accuracy.passed:
        verdict = f"fails: {last.failure_message.split('worst: ', 1)[-1][:60]}" if last.failure_message else verdict
    line = last.measurement.roofline
    gops = share = "-"
    if line is not None:
        achieved = line.gop / (median / 1e3)
        gops = gops_text(achieved, unit=False)
        share = f"{achieved / line.peak_gops:.0%}" if line.peak_gops else "no peak"
    loaded = sum(1 for m in measured if m.measurement.under_load)
    return fmt_ms(median), verdict, gops, share, f"{loaded} of {len(measured)} under load" if loaded else "quiet"


if __name__ == "__main__":
    main()
