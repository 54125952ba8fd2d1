"""The gate's error rates on this machine: A/A false positives and detection of a 15% slowdown.

Two models that differ only in depth: a chain of 20 MatMul+Tanh layers and a longer chain
whose length is calibrated first (ONNX Runtime in this process, one thread, interleaved) to run
``--slowdown`` (15%) slower; a fixed per-call cost means 15% more layers is less than 15% more
time. Each repetition runs one A/A gate (the 20-layer model against itself) and one A/B gate,
alternating, with the gate's defaults (the CLI's: 16 rounds per side, >= 100 calls and >= 0.1 s
per run, metrics p10 and median, alpha 0.01, --max-regression 5%). Prints the false-positive
rate (A/A verdict ``fail``), the detection rate (A/B verdict ``fail``), the other verdicts, the
change the gate measured, and the wall time per gate run; ``--json`` keeps every run. Goals
(issue #8): <= 1 false positive in 100, >= 95 detections in 100. Usage::

    python benchmarks/gate_false_positives.py [--runs 100] [--rounds 16] [--layers 20] [--slowdown 0.15]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.gate.models, from a checkout

from rich.console import Console
from rich.table import Table
from tests.gate.models import matmul_chain

from autodeploy.adapters.base import TrialConfig
from autodeploy.device import probe_device
from autodeploy.gate import Criteria, GateSettings, model_arm, run_gate
from autodeploy.harness.run import HarnessSettings
from autodeploy.harness.timing import TimingPolicy
from autodeploy.model import load_model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=100, help="gate runs of each kind (A/A and A/B)")
    ap.add_argument(
        "--rounds", type=int, default=GateSettings.rounds, help="worker runs per side per gate run"
    )
    ap.add_argument("--calls", type=int, default=100)
    ap.add_argument("--duration", type=float, default=0.1)
    ap.add_argument("--layers", type=int, default=20)
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--slowdown", type=float, default=0.15)
    ap.add_argument("--json", type=Path, help="write every gate run's verdict, changes and wall time here")
    args = ap.parse_args()
    console = Console(width=160)  # logs keep the table on one line per row
    work = Path(tempfile.mkdtemp(prefix="gate-bench-"))
    base = load_model(matmul_chain(work / "base.onnx", layers=args.layers, width=args.width), name="base")
    slow_layers, ratio = _calibrate(work, args)
    console.print(f"calibrated: {slow_layers} layers run {ratio - 1:+.1%} against {args.layers} (target "
                  f"{args.slowdown:+.0%}; ONNX Runtime in this process, 1 thread)", highlight=False)  # fmt: skip
    slow = load_model(matmul_chain(work / "slow.onnx", layers=slow_layers, width=args.width), name="slow")
    config = TrialConfig("onnxruntime", threads=1)
    policy = TimingPolicy(warmup_min_calls=10, warmup_max_s=2.0, min_samples=args.calls,
                          min_duration_s=args.duration, max_duration_s=max(30.0, 4 * args.duration))  # fmt: skip
    harness = HarnessSettings(workdir=work / "cache", policy=policy, timeout_s=300)
    settings = GateSettings(rounds=args.rounds, criteria=Criteria())
    runs: list[dict] = []
    device = probe_device()
    outcomes: dict[str, list[tuple[str, float, float | None]]] = {"A/A": [], "A/B": []}
    for i in range(args.runs):
        for kind, candidate in (("A/A", base), ("A/B", slow)):
            result = run_gate(model_arm("baseline", "base", base, config),
                              model_arm("candidate", candidate.name, candidate, config),
                              settings, harness, device=device)  # fmt: skip
            median = next(m for m in result.metrics if m.name == "latency median")
            outcomes[kind].append((result.verdict, result.wall_s, median.change))
            why = "; ".join(f"{m.name}: {m.reason}" for m in result.metrics if m.verdict != "pass")
            console.print(f"[{i + 1}/{args.runs}] {kind}: {result.verdict:12s} median change "
                          f"{median.change:+.1%}  {result.wall_s:.0f} s  {why}", highlight=False)  # fmt: skip
            runs.append({"kind": kind, "verdict": result.verdict, "wall_s": result.wall_s,
                         "metrics": [m.to_dict() for m in result.metrics]})  # fmt: skip
            if args.json:
                args.json.write_text(
                    json.dumps({"slow_layers": slow_layers, "calibrated_ratio": ratio, "runs": runs})
                )
    _table(console, outcomes, args, slow_layers, ratio, device.cpu_model)


def _calibrate(work: Path, args: argparse.Namespace) -> tuple[int, float]:
    """The layer count whose in-process median latency is closest to ``1 + slowdown`` times the base's."""
    import numpy as np
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    x = {"x": np.random.default_rng(0).standard_normal((1, args.width)).astype(np.float32)}
    candidates = range(args.layers + 1, round(args.layers * (1 + 3 * args.slowdown)) + 1)
    sessions = {n: ort.InferenceSession(str(matmul_chain(work / f"cal{n}.onnx", layers=n, width=args.width)),
                                        options, providers=["CPUExecutionProvider"])
                for n in (args.layers, *candidates)}  # fmt: skip
    times: dict[int, list[float]] = {n: [] for n in sessions}
    for _ in range(30):  # rounds of 200 calls each, every model in each round: drift hits all alike
        for n, session in sessions.items():
            start = time.perf_counter()
            for _ in range(200):
                session.run(None, x)
            times[n].append(time.perf_counter() - start)
    base = statistics.median(times[args.layers])
    ratios = {n: statistics.median(times[n]) / base for n in candidates}
    best = min(ratios, key=lambda n: abs(ratios[n] - 1 - args.slowdown))
    return best, ratios[best]


def _table(console: Console, outcomes: dict, args: argparse.Namespace, slow_layers: int, ratio: float,
           cpu: str) -> None:  # fmt: skip
    table = Table(title=f"autodeploy gate on {cpu}: {args.runs} runs each, {args.rounds} rounds per side "
                  f"({args.layers} vs {slow_layers} layers, width {args.width})")  # fmt: skip
    for col in (
        "gate runs",
        "fail",
        "pass",
        "inconclusive",
        "rate of fail",
        "median change",
        "wall s / run (median)",
    ):
        table.add_column(col, justify="right" if col != "gate runs" else "left")
    for kind, rows in outcomes.items():
        verdicts = [v for v, _, _ in rows]
        changes = [c for _, _, c in rows if c is not None]
        label = (
            "A/A (false positive = fail)"
            if kind == "A/A"
            else f"A/B {ratio - 1:+.1%} in-process (detection = fail)"
        )
        table.add_row(label, str(verdicts.count("fail")), str(verdicts.count("pass")),
                      str(verdicts.count("inconclusive")), f"{verdicts.count('fail') / len(rows):.0%}",
                      f"{statistics.median(changes):+.1%}" if changes else "-",
                      f"{statistics.median(w for _, w, _ in rows):.0f}")  # fmt: skip
    console.print(table)


if __name__ == "__main__":
    start = time.monotonic()
    main()
    print(f"total wall time {time.monotonic() - start:.0f} s")
