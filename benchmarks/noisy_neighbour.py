"""The speed verdict under a noisy neighbour: does a study name the same winner beside a CPU hog?

Runs the same ``autodeploy tune`` N times on a quiet machine and N times beside a CPU hog
(``python -c 'while True: pass'``, stopped and continued on a jittered duty cycle so that some finalist rounds
are noisy and others are not, as on a laptop or a shared CI runner). Each run has its own results file,
so nothing is reused between runs. For every run it reads the JSON summary and judges the finalists
two ways, on the same rounds:

- **paired** (the study's own rule, issue 26): each round reduced to one value per config, the winner and
  the speed-up over the ONNX Runtime fp32 baseline from the median of the per-round ratios, over the rounds
  in which neither the winner's nor the baseline's run was under load (the two run alone, paired, when too
  few were quiet);
- **pooled** (the rule before it): every call of every round pooled, the lowest pooled p90 wins and the
  speed-up is the ratio of pooled p90s (``Finalist.pooled``, kept for display).

It prints, per condition and rule, how often the winner's engine/precision agrees with the quiet runs'
most common one, and how far the speed-ups spread (min, median, max, and max/min). Usage::

    python benchmarks/noisy_neighbour.py [--model zoo:mobilenetv2] [--runs 3] [--hog-on 6 --hog-off 6 --hog-jitter 0.5]
        [--engine onnxruntime --engine openvino] [--trials 10] [--rounds 5] [--tune-arg=--data --tune-arg=DATA]

Machines are shared: run it with nothing else building or testing, or the "quiet" runs are not.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from autodeploy.device import probe_device


@contextmanager
def hog(on_s: float, off_s: float, jitter: float = 0.5, seed: int = 0) -> Iterator[None]:
    """One process spinning a core, running about ``on_s`` seconds then paused about ``off_s`` seconds, over
    and over; each spell drawn uniformly within ``jitter`` (a fraction) of its mean, seeded. A fixed period
    can lock onto the study's own rhythm: 6 s on / 6 s off against pair rounds of two ~3 s runs put one run
    of each pair in the busy half, five pairs in a row in one run. A real neighbour keeps no such beat."""
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    stop = threading.Event()
    rng = random.Random(seed)

    def spell(mean: float) -> float:
        return mean * rng.uniform(1 - jitter, 1 + jitter)

    def cycle() -> None:
        while not stop.wait(spell(on_s)):
            proc.send_signal(signal.SIGSTOP)
            if stop.wait(spell(off_s)):
                break
            proc.send_signal(signal.SIGCONT)

    thread = threading.Thread(target=cycle, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        proc.send_signal(signal.SIGCONT)
        proc.kill()
        proc.wait()


def tune(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    command = [sys.executable, "-m", "autodeploy", "tune", args.model, "--format", "json", "--db", f"sqlite:///{folder / 'r.db'}",
               "--trials", str(args.trials), "--rounds", str(args.rounds), "--seed", "0",
               *(a for e in args.engine for a in ("--engine", e)), *args.tune_arg]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"tune failed ({done.returncode}): {done.stderr.strip()[-800:]}")
    return json.loads(done.stdout)


def verdicts(summary: dict[str, Any]) -> dict[str, tuple[str, float | None]]:
    """(engine/precision of the winner, its speed-up over the baseline) by the paired and the pooled rule."""
    finalists = [f for f in summary["finalists"] if not f.get("failure")]
    baseline = next((f for f in finalists if f.get("baseline")), None)
    out: dict[str, tuple[str, float | None]] = {}
    winner = summary.get("winner")
    if winner:
        out["paired"] = (_kind(winner), summary.get("speedup_vs_baseline"))
    pooled = [f for f in finalists if f.get("pooled") is not None]
    if pooled:
        throughput = summary["statistic"] == "items/s"
        best = (max if throughput else min)(pooled, key=lambda f: f["pooled"])
        ratio = None
        if baseline and baseline.get("pooled"):
            ratio = best["pooled"] / baseline["pooled"] if throughput else baseline["pooled"] / best["pooled"]
        out["pooled"] = (_kind(best), ratio)
    return out


def _pairs(summary: dict[str, Any]) -> str:
    """What the paired speed-up rests on: ``3 quiet rounds, 2 under load left out, 2 pair rounds added``, and a
    finalist whose quiet rounds read values more than 1.5x apart: ``baseline unsteady 5.33-10.63``."""
    main = (summary.get("speedups") or {}).get(summary.get("optimised") or "")
    if not main:
        return "no speed-up"
    if main.get("under_load"):
        text = f"{main['rounds']} rounds, every one under load"
    else:
        text = f"{main['rounds']} quiet rounds, {main.get('left_out', 0)} under load left out"
    load = summary.get("load") or {}
    text += f", {load.get('pair_rounds', 0)} pair rounds added"
    for u in load.get("unsteady") or ():  # quiet rounds more than 1.5x apart: the machine moved them
        text += f"; {'baseline' if u['baseline'] else 'winner'} unsteady {u['low']:.2f}-{u['high']:.2f}"
    return text


def _kind(finalist: dict[str, Any]) -> str:
    config = finalist["config"]
    return f"{config['engine']}/{config['precision']}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="zoo:mobilenetv2")
    parser.add_argument("--runs", type=int, default=3, help="Studies per condition (quiet, hog).")
    parser.add_argument("--engine", action="append", default=None)
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tune-arg", action="append", default=[], metavar="ARG",
                        help="One more argument for every tune, e.g. --tune-arg=--shape --tune-arg=x=1x3x160x160.")
    parser.add_argument("--hog-on", type=float, default=6.0, help="Seconds the hog spins before each pause.")
    parser.add_argument("--hog-off", type=float, default=6.0, help="Seconds it pauses.")
    parser.add_argument("--hog-jitter", type=float, default=0.5,
                        help="Each spell drawn uniformly within this fraction of its mean (0: a fixed period).")
    args = parser.parse_args()
    args.engine = args.engine or ["onnxruntime", "openvino"]
    console = Console(width=160)  # logs keep the table on one line per row
    console.print(probe_device().cpu_line())
    console.print(f"load average before: {os.getloadavg()[0]:.2f} (1 min)")
    tmp = Path(tempfile.mkdtemp(prefix="autodeploy-noisy-"))
    results: dict[str, list[dict[str, tuple[str, float | None]]]] = {"quiet": [], "hog": []}
    for run in range(args.runs):
        for condition in ("quiet", "hog"):  # alternated, so slow drift of the machine hits both alike
            folder = tmp / f"{condition}-{run}"
            folder.mkdir()
            start = time.monotonic()
            if condition == "hog":
                with hog(args.hog_on, args.hog_off, args.hog_jitter, seed=run):
                    summary = tune(args, folder)
            else:
                summary = tune(args, folder)
            judged = verdicts(summary)
            results[condition].append(judged)
            shown = ", ".join(
                f"{rule} {k} {r:.2f}x" if r else f"{rule} {k} -" for rule, (k, r) in judged.items()
            )
            console.print(f"{condition} run {run + 1}: {shown} ({time.monotonic() - start:.0f} s, "
                          f"statistic {summary['statistic']}, {summary['rounds']} rounds; {_pairs(summary)})")  # fmt: skip
    table = Table(title=f"{args.model}: winner and speed-up over the ORT fp32 default, {args.runs} runs per condition "
                        f"(hog {args.hog_on:g} s on / {args.hog_off:g} s off ±{args.hog_jitter:.0%}; engines {', '.join(args.engine)})")  # fmt: skip
    for column in ("rule", "condition", "winners (engine/precision: runs)", "agree with quiet's usual winner",
                   "speed-up min / median / max", "max/min"):  # fmt: skip
        table.add_column(column)
    for rule in ("pooled", "paired"):
        quiet_kinds = Counter(r[rule][0] for r in results["quiet"] if rule in r)
        usual = quiet_kinds.most_common(1)[0][0] if quiet_kinds else None
        for condition in ("quiet", "hog"):
            judged = [r[rule] for r in results[condition] if rule in r]
            kinds = Counter(k for k, _ in judged)
            ratios = sorted(r for _, r in judged if r)
            spread = (
                f"{ratios[0]:.2f} / {statistics.median(ratios):.2f} / {ratios[-1]:.2f}" if ratios else "-"
            )
            table.add_row("pooled p90 of calls (before)" if rule == "pooled" else "paired by round (now)", condition,
                          ", ".join(f"{k}: {n}" for k, n in kinds.most_common()),
                          f"{sum(k == usual for k, _ in judged)}/{len(judged)}",
                          spread, f"{ratios[-1] / ratios[0]:.2f}" if ratios else "-")  # fmt: skip
    console.print(table)
    console.print("pooled: the lowest p90 over every call of every finalist round pooled, ratio of pooled p90s; "
                  "paired: the study's winner, median over rounds of the per-round ratio (its statistic: "
                  "p90, or median below 64 calls a round).")  # fmt: skip


if __name__ == "__main__":
    main()
