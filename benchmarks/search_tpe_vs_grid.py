"""Search efficiency: how many TPE trials reach within 5% of the full grid's optimum.

For each model the full grid (every engine × precision × threads × knob point, batch 1) is
measured once; TPE studies with several seeds then run over the same space. Configs measured
by the grid are taken from the store, so TPE sees exactly the grid's numbers and only the
*order* of the search is compared (no measurement noise between the two). Usage::

    python benchmarks/search_tpe_vs_grid.py [--model zoo:resnet50 --model zoo:bert-small]
        [--engine onnxruntime --engine openvino] [--seeds 5] [--trials 30]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from autodeploy import zoo
from autodeploy.device import probe_device
from autodeploy.harness.run import HarnessSettings, prepare_data
from autodeploy.harness.timing import TimingPolicy
from autodeploy.model import load_model
from autodeploy.objectives import of as objective_of
from autodeploy.results_db import Store
from autodeploy.search.config import StudyConfig
from autodeploy.search.study import StudyContext, ranked, run_study


def study(model_ref: str, info, data, settings, store, db, name: str, **config) -> tuple[float, object]:
    cfg = StudyConfig(model=model_ref, finalists={"count": 0}, **config)
    ctx = StudyContext(cfg, name, info, probe_device(), data, settings, store, db, "benchmark")
    start = time.perf_counter()
    run_study(ctx)
    import optuna

    return time.perf_counter() - start, optuna.load_study(study_name=name, storage=db)


def trials_to_within(study, optimum: float, tolerance: float) -> int | None:
    """1-based index of the first feasible trial within ``tolerance`` of the optimum (latency: lower is better)."""
    for t in sorted(study.trials, key=lambda t: t.number):
        feasible = (
            t.state.name == "COMPLETE" and t.constraints and all(v <= 0 for v in t.constraints.values())
        )
        if feasible and t.values[0] <= optimum * (1 + tolerance):
            return t.number + 1
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", default=None)
    parser.add_argument("--engine", action="append", default=None)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--trials", type=int, default=30)
    parser.add_argument("--tolerance", type=float, default=0.05)
    args = parser.parse_args()
    models = args.model or ["zoo:resnet50", "zoo:bert-small"]
    engines = args.engine or ["onnxruntime", "openvino"]
    tmp = Path(tempfile.mkdtemp(prefix="autodeploy-search-bench-"))
    db = f"sqlite:///{tmp / 'results.db'}"
    settings = HarnessSettings(workdir=tmp / "work", policy=TimingPolicy(min_samples=64, min_duration_s=1.0))
    table = Table(
        title=f"TPE vs full grid (latency p90, batch 1, engines {', '.join(engines)}, {args.seeds} TPE seeds)"
    )
    for column in ("model", "grid points", "grid wall s", "grid optimum (p90 ms)", "winner",
                   f"TPE trials to within {args.tolerance:.0%} (median [min, max])", "TPE runs that never got there"):  # fmt: skip
        table.add_column(column)
    with Store.open(db) as store:
        for ref in models:
            info = load_model(zoo.get(zoo.parse_ref(ref)), name=ref)
            data = prepare_data(info, settings)
            grid_s, grid = study(
                ref, info, data, settings, store, db, f"{ref}-grid", engines=engines, sampler="grid"
            )
            best = ranked(grid, objective_of("latency"))
            if not best:
                table.add_row(ref, str(len(grid.trials)), f"{grid_s:.0f}", "no feasible point", "-", "-", "-")
                continue
            optimum = best[0].values[0]
            reached = []
            for seed in range(args.seeds):
                _, tpe = study(ref, info, data, settings, store, db, f"{ref}-tpe-{seed}", engines=engines,
                               sampler="tpe", seed=seed, trials=args.trials)  # fmt: skip
                reached.append(trials_to_within(tpe, optimum, args.tolerance))
            hits = [r for r in reached if r is not None]
            spread = f"{statistics.median(hits):.0f} [{min(hits)}, {max(hits)}]" if hits else "-"
            label = best[0].user_attrs["config"]
            table.add_row(ref, str(len(grid.trials)), f"{grid_s:.0f}", f"{optimum:.3f}",
                          f"{label['engine']}/{label['precision']}/t{label['threads']}", spread,
                          f"{len(reached) - len(hits)}/{len(reached)}")  # fmt: skip
    Console().print(table)


if __name__ == "__main__":
    main()
