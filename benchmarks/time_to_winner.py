"""Time to a trustworthy winner: ``tune`` with its defaults against the exhaustive grid, in the same run.

For each model, with every engine available here (``--quick``: the cheap builders only), the grid
measures every engine × precision × threads × knob point once (screening only); ``tune`` then runs
with its defaults (TPE, 3 finalists re-measured interleaved) under several seeds. Each run gets its
own database and cache, so neither reuses the other's builds or measurements. Both winners, and
every engine × precision whose grid best looks faster than tune's winner, are then judged by
interleaved re-measurement (A B C A B C …, longer runs). It prints:

* the fraction of the grid's wall time ``tune`` needed to come within 5% of the grid's best: the
  first screening trial of a config the grid measured within 5% of its best (median over seeds).
  Configs are judged by the grid's own values, so one set of measurements ranks them: the grid's
  best is the least of many noisy screening values, and a later run of the same config rarely
  lands within 5% of it on a busy machine (that stricter reading, by tune's own screening values,
  is printed beside it). Also whether ``tune``'s winner is within 5% of the grid's best when both
  are re-measured interleaved;
* every engine × precision the grid found at least 10% faster than ``tune``'s winner (re-measured).

and, per run, where its wall time went (builds, accuracy, screening timing, the finalists' rounds).

Usage::

    python benchmarks/time_to_winner.py            # zoo:resnet50, zoo:bert-small, ppocrv5-det 320; 3 seeds (an hour or more)
    python benchmarks/time_to_winner.py --medium   # zoo:bert-small, ppocrv5-det 96; 2 seeds, no slow builders
                                                   # (17 min on a 2-core machine loaded by other work, about half quiet)
    python benchmarks/time_to_winner.py --quick    # ppocrv5-det 64, one seed, short timing: ~3 min
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np
import optuna
from rich.console import Console
from rich.table import Table

from autodeploy import api
from autodeploy.adapters import registry
from autodeploy.adapters.base import TrialConfig
from autodeploy.device import probe_device
from autodeploy.harness.stats import summarize
from autodeploy.harness.timing import TimingPolicy
from autodeploy.objectives import of as objective_of
from autodeploy.search.study import ranked

ROOT = Path(__file__).resolve().parents[1]
TOLERANCE, MISS = 0.05, 0.10


@dataclass(frozen=True)
class Case:
    ref: str  # zoo:NAME or an .onnx path
    label: str
    shapes: dict[str, tuple[int, ...]]
    data: Path | None = None


def detector(folder: Path, size: int) -> Case | None:
    """PP-OCRv5's text detector from the real-model corpus, on crops of real photos."""
    sys.path.insert(0, str(ROOT))
    from tests.realmodels.corpus import MODELS, crops, imagenet

    model = next(m for m in MODELS if m.name == "ppocrv5-det")
    path = model.extract(folder)
    if isinstance(path, str):
        Console(stderr=True).print(f"[yellow]skipping ppocrv5-det[/]: {path}")
        return None
    from sklearn.datasets import load_sample_images

    photos = list(load_sample_images().images)
    data = folder / "ppocrv5-det.npz"
    np.savez(data, x=imagenet(crops(photos, 128, size, size)))  # PaddleOCR's own preprocessing
    return Case(str(path), "ppocrv5-det (real detector)", {"x": (1, 3, size, size)}, data)


def engines(quick: bool) -> list[str]:
    device = probe_device()
    available = [n for n in registry.targets() if registry.get(n).probe(device).available]
    return [n for n in available if not (quick and registry.get(n).slow_build)]


def run(case: Case, folder: Path, engine_list: list[str], timing: dict,
        **tune_args) -> tuple[object, optuna.Study, datetime, float]:  # fmt: skip
    """One study in its own database and cache: its summary, its Optuna study, when it started, its wall seconds."""
    folder.mkdir(parents=True, exist_ok=True)
    db = f"sqlite:///{folder / 'results.db'}"
    started, clock = datetime.now(), time.monotonic()
    summary = api.tune(case.ref, name="s", engines=engine_list, shapes=case.shapes or None, data=case.data, db=db,
                       cache=folder / "cache", fresh=True, **timing, **tune_args)  # fmt: skip
    return summary, optuna.load_study(study_name="s", storage=db), started, time.monotonic() - clock


def _measured(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """Feasible screening trials that ran a measurement (repeats answered from an earlier one left out), in order."""
    out = []
    for t in sorted(study.trials, key=lambda t: t.number):
        ok = t.state.name == "COMPLETE" and t.constraints and all(v <= 0 for v in t.constraints.values())
        if ok and "repeat_of" not in t.user_attrs:
            out.append(t)
    return out


def time_to_within(study: optuna.Study, started: datetime, target: float) -> float | None:
    """Seconds from the run's start to the first feasible screening trial whose own value is within TOLERANCE of ``target``."""
    for t in _measured(study):
        if t.values[0] <= target * (1 + TOLERANCE):
            return (t.datetime_complete - started).total_seconds()
    return None


def time_to_near_best(study: optuna.Study, started: datetime, grid: dict[str, float], target: float) -> float | None:
    """Seconds from the run's start to the first screening trial of a config the grid measured within TOLERANCE of ``target``."""
    for t in _measured(study):
        value = grid.get(TrialConfig.from_dict(t.user_attrs["config"]).key())
        if value is not None and value <= target * (1 + TOLERANCE):
            return (t.datetime_complete - started).total_seconds()
    return None


def breakdown(summary, study: optuna.Study, started: datetime, wall: float) -> str:
    """Where one run's wall time went: builds, accuracy, screening timing, the finalists, the rest."""
    parts = {"build": 0.0, "accuracy": 0.0, "timing": 0.0}
    for t in study.trials:
        for k, v in (t.user_attrs.get("wall_s") or {}).items():
            parts[k] = parts.get(k, 0.0) + float(v)
    ends = [t.datetime_complete for t in study.trials if t.datetime_complete]
    screening = (max(ends) - started).total_seconds() if ends else 0.0
    finalists = sum(row["timing_s"] + row["accuracy_s"] for row in summary.time_by_engine.values()) - parts["timing"] - parts["accuracy"]
    counts = ", ".join(f"{n} {k}" for k, n in sorted(summary.trials.items()))
    return (f"wall {wall:.0f} s = screening {screening:.0f} s (build {parts['build']:.0f}, accuracy {parts['accuracy']:.0f}, "
            f"timing {parts['timing']:.0f}, the rest {screening - sum(parts.values()):.0f}: worker starts, Optuna, pruned asks) "
            f"+ finalists {wall - screening:.0f} s (of which timed runs {finalists:.0f}); trials: {counts}; "
            f"stopped by {summary.stopped_by or '-'}; {summary.confidence or summary.note}")  # fmt: skip


def best_per_branch(study: optuna.Study) -> dict[str, tuple[float, TrialConfig]]:
    out: dict[str, tuple[float, TrialConfig]] = {}
    for t in ranked(study, objective_of("latency")):
        config = TrialConfig.from_dict(t.user_attrs["config"])
        out.setdefault(f"{config.engine}/{config.precision}", (t.values[0], config))
    return out


def interleaved(case: Case, configs: list[TrialConfig], folder: Path, rounds: int, policy: TimingPolicy) -> list[float | None]:
    """p90 ms of each config over ``rounds`` interleaved runs (rotated order), pooled samples."""
    samples: list[list[float]] = [[] for _ in configs]
    folder.mkdir(parents=True, exist_ok=True)
    db = f"sqlite:///{folder / 'judge.db'}"
    for r in range(rounds):
        for i in [(j + r) % len(configs) for j in range(len(configs))]:
            trial = api.bench(case.ref, config=configs[i], shapes=case.shapes or None, data=case.data, db=db,
                              cache=folder / "judge-cache", timing=policy)  # fmt: skip
            samples[i].extend(trial.result.samples_ms)
    out: list[float | None] = []
    for s in samples:
        if len(s) < 2:
            out.append(None)
            continue
        stats = summarize(np.asarray(s) * 1e6)
        out.append(stats.p90 if stats.p90 is not None else stats.median)
    return out


def median_text(fractions: list[float | None]) -> str:
    """The median over seeds, a seed that never got there counting as the worst; "never" when none did."""
    if all(f is None for f in fractions):
        return "never"
    values = [math.inf if f is None else f for f in fractions]
    middle = statistics.median(values)
    missed = sum(f is None for f in fractions)
    return ("never" if math.isinf(middle) else f"{middle:.0%}") + (f" ({missed} seed(s) never)" if missed else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one small model, one seed, short timing, no slow builders")
    parser.add_argument("--medium", action="store_true", help="zoo:bert-small and ppocrv5-det 96, two seeds, short timing, "
                        "no slow builders (leaves out zoo:resnet50, TFLite's onnx2tf and the 320 detector)")  # fmt: skip
    parser.add_argument("--seeds", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds of the judgement")
    args = parser.parse_args()
    begun = time.monotonic()
    device = probe_device()
    console = Console(width=220)  # a table for a terminal or a file alike
    console.print(device.cpu_line())
    seeds = args.seeds or (1 if args.quick else 2 if args.medium else 3)
    rounds = args.rounds or (2 if args.quick else 3 if args.medium else 5)
    cheap = args.quick or args.medium
    engine_list = engines(cheap)
    console.print(f"engines: {', '.join(engine_list)}" + (" (slow builders left out)" if cheap else ""))
    tmp = Path(tempfile.mkdtemp(prefix="autodeploy-time-to-winner-"))
    if args.quick:
        cases = [c for c in (detector(tmp, 64),) if c] or [Case("zoo:tiny-cnn", "zoo:tiny-cnn", {})]
        timing = {"min_duration_s": 0.3, "min_samples": 32}
        judge = TimingPolicy(min_samples=100, min_duration_s=0.5)
    elif args.medium:
        cases = [Case("zoo:bert-small", "zoo:bert-small", {}), *[c for c in (detector(tmp, 96),) if c]]
        timing = {"min_duration_s": 0.3, "min_samples": 32}
        judge = TimingPolicy(min_samples=100, min_duration_s=0.5)
    else:
        cases = [Case("zoo:resnet50", "zoo:resnet50", {}), Case("zoo:bert-small", "zoo:bert-small", {}),
                 *[c for c in (detector(tmp, 320),) if c]]  # fmt: skip
        timing, judge = {}, TimingPolicy(min_samples=200, min_duration_s=2.0)
    table = Table(title=f"tune (defaults) against the exhaustive grid; {seeds} seed(s), judged over {rounds} interleaved rounds")
    for column in ("model", "grid points", "grid wall", "grid best", "tune winner (per seed)",
                   "grid's own time to its best / grid wall",
                   f"tune time to within {TOLERANCE:.0%} / grid wall (median)",
                   "same, by tune's own screening values (median)", "tune wall / grid wall (median)",
                   f"winner within {TOLERANCE:.0%} (re-measured)", f"grid branches >= {MISS:.0%} faster than tune's winner"):  # fmt: skip
        table.add_column(column)
    for case in cases:
        folder = tmp / case.label.split()[0].replace(":", "-")
        grid_summary, grid_study, grid_started, grid_wall = run(case, folder / "grid", engine_list, timing,
                                                                sampler="grid", finalists=0)  # fmt: skip
        console.print(f"{case.label} grid: {breakdown(grid_summary, grid_study, grid_started, grid_wall)}")
        top = ranked(grid_study, objective_of("latency"))
        if not top:
            table.add_row(case.label, str(len(grid_study.trials)), f"{grid_wall:.0f} s", "no feasible point", *["-"] * 7)
            continue
        grid_values = {TrialConfig.from_dict(t.user_attrs["config"]).key(): t.values[0] for t in top}
        own = time_to_within(grid_study, grid_started, top[0].values[0])
        grid_best = TrialConfig.from_dict(top[0].user_attrs["config"])
        branches = best_per_branch(grid_study)
        fractions, strict, walls, winners, within = [], [], [], [], []
        misses: dict[str, list[float]] = {}  # engine/precision -> how much faster than tune's winner, per seed that missed it
        for seed in range(seeds):
            summary, study, started, wall = run(case, folder / f"tune-{seed}", engine_list, timing, seed=seed)
            console.print(f"{case.label} tune seed {seed}: {breakdown(summary, study, started, wall)}")
            reached = time_to_near_best(study, started, grid_values, top[0].values[0])
            fractions.append(None if reached is None else reached / grid_wall)
            by_own = time_to_within(study, started, top[0].values[0])
            strict.append(None if by_own is None else by_own / grid_wall)
            walls.append(wall / grid_wall)
            if summary.winner is None:
                winners.append("none")
                within.append(False)
                continue
            winner = summary.winner.config
            winners.append(winner.label())
            # the grid's best, and each grid branch that screened faster than the winner (as the grid measured
            # it, else as tune screened it) by about MISS: judged against the winner interleaved
            same = [t.values[0] for t in top if TrialConfig.from_dict(t.user_attrs["config"]) == winner]
            mine_screened = same[0] if same else next((t.values[0] for t in ranked(study, objective_of("latency"))
                                                       if TrialConfig.from_dict(t.user_attrs["config"]) == winner), 0.0)  # fmt: skip
            rivals = [grid_best] if grid_best != winner else []
            rivals += [c for v, c in branches.values()
                       if c not in rivals and c != winner and v * (1 + MISS) <= mine_screened * (1 + TOLERANCE)]  # fmt: skip
            judged = interleaved(case, [winner, *rivals], folder / f"judge-{seed}", rounds, judge)
            mine = judged[0]
            for config, p90 in zip(rivals, judged[1:], strict=True):
                if mine is not None and p90 is not None and p90 * (1 + MISS) <= mine:
                    misses.setdefault(f"{config.engine}/{config.precision}", []).append(mine / p90)
            best = [p for c, p in zip(rivals, judged[1:], strict=True) if c == grid_best]
            within.append(mine is not None and (not best or best[0] is None or mine <= best[0] * (1 + TOLERANCE)))
        table.add_row(case.label, str(len(grid_study.trials)), f"{grid_wall:.0f} s", grid_best.label(),
                      "; ".join(winners), f"{own / grid_wall:.0%}" if own is not None else "-",
                      median_text(fractions), median_text(strict),
                      f"{statistics.median(walls):.0%}", f"{sum(within)}/{len(within)}",
                      ", ".join(f"{b} ({'x, '.join(f'{r:.2f}' for r in rs)}x; {len(rs)}/{seeds} seeds)"
                                for b, rs in sorted(misses.items())) or "none")  # fmt: skip
    console.print(table)
    console.print(f"[dim]work folder: {tmp}; this benchmark ran {time.monotonic() - begun:.0f} s[/]")


if __name__ == "__main__":
    main()
