"""Do the speed-up intervals hold from run to run? One study run N times, spread over a quarter of an hour.

Each run is the same ``autodeploy tune`` command (issue 42's study by default: ``zoo:mobilenetv2``, ONNX Runtime and
OpenVINO at fp32 and bf16, 6 trials, ``--fresh``), named ``coverage-1`` … ``coverage-N`` in one results file, so each
run also reads the baseline's history of the runs before it. The runs start at least ``--gap`` seconds apart and
spread over at least ``--span`` seconds: a shared VM's host moves the ORT fp32 default for seconds to minutes, and
runs minutes apart meet its different states. Per run it prints the winner, the speed-up over the baseline with the
interval its rounds give, the coverage that interval claims, the time the rounds span, and the history check. Then
the share of runs whose interval holds the median of all runs' speed-ups, against the coverage the intervals claim
(``autodeploy.harness.stats.CLAIMED_COVERAGE``, the one place to set it to what is measured here). Usage::

    python benchmarks/interval_coverage.py [--runs 8] [--span 900] [--gap 60] [--model zoo:mobilenetv2]
        [--engine onnxruntime --engine openvino] [--precision fp32 --precision bf16] [--trials 6] [--rounds R] [--spread S]
        [--tune-arg=--min-duration --tune-arg=1]
    python benchmarks/interval_coverage.py --runs 2 --span 0 --gap 0 --trials 2   # a smoke run: proves it works

Machines are shared: run it with nothing else building or testing, or the runs are not quiet and the coverage
measures the neighbours.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from autodeploy.device import probe_device
from autodeploy.harness.stats import CLAIMED_COVERAGE


def tune(args: argparse.Namespace, db: str, run: int) -> dict[str, Any]:
    """One run of the study, its ``--format json`` record."""
    command = [sys.executable, "-m", "autodeploy", "tune", args.model, "--name", f"coverage-{run}", "--fresh",
               "--format", "json", "--db", db, "--trials", str(args.trials),
               *(a for e in args.engine for a in ("--engine", e)), *(a for p in args.precision for a in ("--precision", p)),
               *(("--rounds", str(args.rounds)) if args.rounds else ()),
               *(("--spread", str(args.spread)) if args.spread is not None else ()), *args.tune_arg]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"run {run}: tune failed ({done.returncode}): {done.stderr.strip()[-800:]}")
    return json.loads(done.stdout)


def row(record: dict[str, Any]) -> dict[str, Any]:
    """What one run says: winner, speed-up, its interval, the coverage it claims, the rounds' span, the history check."""
    main = (record.get("speedups") or {}).get(record.get("optimised") or "") or {}
    winner = record.get("winner") or {}
    return {"winner": winner.get("label", "-"), "speedup": main.get("ratio"), "ci": main.get("ci"),
            "level": main.get("ci_level"), "rounds": main.get("rounds"), "span_s": main.get("span_s"),
            "statistic": record.get("optimised") or "-", "history": record.get("baseline_history") or {}}  # fmt: skip


def _history(history: dict[str, Any]) -> str:
    if not history:
        return "no history"
    from autodeploy.verdict import HISTORY_MIN_RUNS

    shown = f"today {history['today']:.3g}; {history['low']:.3g}-{history['high']:.3g} in {history['runs']} earlier"
    if history["runs"] < HISTORY_MIN_RUNS:  # not judged: too few earlier studies to call a range
        return f"too few ({history['runs']} < {HISTORY_MIN_RUNS}): {shown}"
    return ("OUTSIDE: " if history["outside"] else "inside: ") + shown


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="zoo:mobilenetv2")
    parser.add_argument("--runs", type=int, default=8, help="Runs of the study (the issue asks for 8 or more).")
    parser.add_argument("--span", type=float, default=900.0, help="Seconds the runs' starts spread over at least.")
    parser.add_argument("--gap", type=float, default=60.0, help="Seconds between one run's end and the next one's start, at least.")
    parser.add_argument("--engine", action="append", default=None)
    parser.add_argument("--precision", action="append", default=None)
    parser.add_argument("--trials", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=None, help="Finalist rounds (default: tune's).")
    parser.add_argument("--spread", type=float, default=None,
                        help="Seconds each run's finalist rounds span at least (default: tune's, as long as its screening).")
    parser.add_argument("--tune-arg", action="append", default=[], metavar="ARG",
                        help="One more argument for every tune, e.g. --tune-arg=--shape --tune-arg=x=1x3x160x160.")
    parser.add_argument("--db", default=None, help="Results database URL (default: a new SQLite file in a temp folder).")
    args = parser.parse_args()
    args.engine = args.engine or ["onnxruntime", "openvino"]
    args.precision = args.precision or ["fp32", "bf16"]
    console = Console(width=180)  # logs keep the table on one line per row
    console.print(probe_device().cpu_line())
    console.print(f"load average before: {os.getloadavg()[0]:.2f} (1 min)")
    db = args.db or f"sqlite:///{Path(tempfile.mkdtemp(prefix='autodeploy-coverage-')) / 'r.db'}"
    started, rows = time.monotonic(), []
    for run in range(1, args.runs + 1):
        due = started + args.span * (run - 1) / max(args.runs - 1, 1)
        if run > 1:
            time.sleep(max(args.gap, due - time.monotonic()))
        at = time.monotonic()
        rows.append(row(tune(args, db, run)))
        r = rows[-1]
        interval = "no interval" if r["ci"] is None else f"[{r['ci'][0]:.2f}, {r['ci'][1]:.2f}]"
        console.print(f"run {run} at {at - started:.0f} s ({time.monotonic() - at:.0f} s): {r['winner']}, "
                      f"{r['speedup'] or 0:.2f}x {interval} ({r['statistic']}, {r['rounds']} rounds over "
                      f"{r['span_s'] or 0:.0f} s); {_history(r['history'])}")  # fmt: skip
    speedups = [r["speedup"] for r in rows if r["speedup"] is not None]
    middle = statistics.median(speedups) if speedups else None
    table = Table(title=f"{args.model}: speed-up over the baseline, {args.runs} runs over {time.monotonic() - started:.0f} s "
                        f"(engines {', '.join(args.engine)}; precisions {', '.join(args.precision)}; {args.trials} trials)")  # fmt: skip
    for column in ("run", "winner", "speed-up", "interval", "claims", "rounds", "span", f"holds the median ({middle or 0:.2f}x)",
                   "baseline vs its history"):  # fmt: skip
        table.add_column(column)
    holds = []
    for run, r in enumerate(rows, 1):
        held = None if r["ci"] is None or middle is None else r["ci"][0] <= middle <= r["ci"][1]
        holds += [held] if held is not None else []
        table.add_row(str(run), r["winner"], "-" if r["speedup"] is None else f"{r['speedup']:.2f}x",
                      "-" if r["ci"] is None else f"[{r['ci'][0]:.2f}, {r['ci'][1]:.2f}]",
                      "-" if r["level"] is None else f"{r['level']:.0%}", str(r["rounds"] or "-"),
                      "-" if r["span_s"] is None else f"{r['span_s']:.0f} s", {None: "-", True: "yes", False: "no"}[held],
                      _history(r["history"]))  # fmt: skip
    console.print(table)
    if not holds:
        console.print("no run gave an interval (screening only, or the baseline won): nothing to judge")
        return
    measured = sum(holds) / len(holds)
    claimed = min([CLAIMED_COVERAGE, *(r["level"] for r in rows if r["level"] is not None)])
    verdict = "holds" if measured >= claimed else "falls short: raise --rounds or the spread, or set CLAIMED_COVERAGE to what was measured"
    console.print(f"measured coverage: {sum(holds)} of {len(holds)} intervals hold the median of all runs' speed-ups "
                  f"({measured:.0%}); claimed {claimed:.0%} (autodeploy.harness.stats.CLAIMED_COVERAGE "
                  f"{CLAIMED_COVERAGE:.0%}): {verdict}")  # fmt: skip
    outside = sum(bool(r["history"].get("outside")) for r in rows)
    console.print(f"the baseline lay outside its history on this device in {outside} of {len(rows)} runs")


if __name__ == "__main__":
    main()
