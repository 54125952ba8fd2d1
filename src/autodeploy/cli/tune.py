"""``autodeploy tune``: an Optuna study over engine × precision × batch × threads on this device."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from autodeploy.cli._common import cache_dir, command_line, err, out, resolve_model
from autodeploy.errors import UsageError
from autodeploy.verdict import DEFAULT_MAX_ACCURACY_DROP

Many = list[str] | None


def tune(
    model: Annotated[
        str | None, typer.Argument(help="An .onnx file or zoo:NAME (or `model:` in --config).")
    ] = None,
    config: Annotated[
        Path | None, typer.Option(help="Study config YAML (see configs/); flags override it.")
    ] = None,
    name: Annotated[str | None, typer.Option(help="Study name (default: MODEL-OBJECTIVE-DEVICE).")] = None,
    objective: Annotated[str | None, typer.Option(help="latency | throughput | server | pareto.")] = None,
    engine: Annotated[
        Many, typer.Option(help="Engines to search (default: all available); repeatable.")
    ] = None,
    precision: Annotated[
        Many, typer.Option(help="Precisions to search (default: each engine's); repeatable.")
    ] = None,
    batch: Annotated[list[int] | None, typer.Option(help="Batch sizes to search; repeatable.")] = None,
    threads: Annotated[list[int] | None, typer.Option(help="Thread counts to search; repeatable.")] = None,
    trials: Annotated[
        int | None, typer.Option(help="Trials this run adds (default 30; the whole grid for --sampler grid).")
    ] = None,
    timeout: Annotated[float | None, typer.Option(help="Start no new trial after this many seconds.")] = None,
    sampler: Annotated[
        str | None, typer.Option(help="tpe (default, seeded) | grid | random | nsga2.")
    ] = None,
    seed: Annotated[int | None, typer.Option()] = None,
    fresh: Annotated[bool, typer.Option("--fresh", help="Re-measure configs already in the store.")] = False,
    resume: Annotated[
        bool,
        typer.Option("--resume", help="Add trials to an existing study (or join it from another worker)."),
    ] = False,
    max_accuracy_drop: Annotated[
        float | None, typer.Option(help=f"Top-1 agreement drop allowed (default {DEFAULT_MAX_ACCURACY_DROP:g}).")
    ] = None,
    max_memory_mb: Annotated[float | None, typer.Option(help="Peak worker memory allowed, MB.")] = None,
    sla_ms: Annotated[
        float | None, typer.Option(help="p99 latency bound (needed by --objective server).")
    ] = None,
    finalists: Annotated[
        int | None, typer.Option(help="Finalists re-measured interleaved (default 3; 0: none).")
    ] = None,
    rounds: Annotated[
        int | None, typer.Option(help="Interleaved rounds for the finalists (default 3).")
    ] = None,
    min_samples: Annotated[
        int | None, typer.Option(help="Timed calls per screening trial, at least (default 64).")
    ] = None,
    min_duration: Annotated[
        float | None, typer.Option(help="Timed seconds per screening trial, at least (default 1).")
    ] = None,
    shape: Annotated[Many, typer.Option(help="Fix an input shape, NAME=1x3x224x224; repeatable.")] = None,
    data: Annotated[
        Path | None, typer.Option(help="Input data (.npz or folder of NAME.npy, optional 'labels').")
    ] = None,
    db: Annotated[
        str | None,
        typer.Option(help="Results database URL (default: $AUTODEPLOY_DB or the user SQLite file)."),
    ] = None,
    storage: Annotated[
        str | None, typer.Option(help="Optuna storage URL shared by workers (default: the results database).")
    ] = None,
) -> None:
    """Search the fastest config for a model on this device, re-measure the finalists and report the winner."""
    from autodeploy.data import load_user_data, shapes_from_data
    from autodeploy.device import probe_device
    from autodeploy.harness.run import HarnessSettings, prepare_data
    from autodeploy.harness.timing import TimingPolicy
    from autodeploy.model import parse_shape_flags
    from autodeploy.results_db.store import Store
    from autodeploy.search import config as study_config
    from autodeploy.search.study import StudyContext, run_study

    overrides = {
        "model": model, "name": name, "objective": objective, "engines": engine, "precisions": precision,
        "batches": batch, "threads": threads, "trials": trials, "timeout_s": timeout, "sampler": sampler,
        "seed": seed, "fresh": fresh or None, "constraints.max_accuracy_drop": max_accuracy_drop,
        "constraints.max_memory_mb": max_memory_mb, "constraints.sla_ms": sla_ms, "finalists.count": finalists,
        "finalists.rounds": rounds, "screening.min_samples": min_samples, "screening.min_duration_s": min_duration,
        "data": str(data) if data else None,
    }  # fmt: skip
    if shape:
        overrides["shapes"] = {k: list(v) for k, v in parse_shape_flags(shape).items()}
    if model is None and config is None:
        raise UsageError("no model given", fix="autodeploy tune MODEL, or put `model:` in --config")
    cfg = study_config.load(config, overrides)
    store = Store.open(db)
    resolved = resolve_model(cfg.model, {k: tuple(v) for k, v in cfg.shapes.items()})
    info, device = resolved.info, probe_device()
    study_name = cfg.name or _default_name(info.name, cfg.objective, device.fingerprint)
    stored = store.get_study(study_name) if resume else None
    if stored is not None:  # resume within the study's own search space; flags still win
        cfg = study_config.load(config, overrides, base={**stored.settings, "trials": None, "fresh": False})
    s = cfg.screening
    # The harness labels a trial "inaccurate" by the same budget the study constrains on.
    drop = cfg.constraints.max_accuracy_drop
    settings = HarnessSettings(workdir=cache_dir() / "work", timeout_s=s.timeout_s, max_top1_drop=drop,
                               min_cosine=1.0 - drop,
                               policy=TimingPolicy(min_samples=s.min_samples, min_duration_s=s.min_duration_s,
                                                   max_duration_s=s.max_duration_s))  # fmt: skip
    user_data = load_user_data(cfg.data, info) if cfg.data else resolved.data
    if cfg.data:  # arrays of a concrete shape fix the dims `shapes` left open
        info = info.with_shapes(shapes_from_data(info, user_data))
    prepared = prepare_data(
        info, settings, data=user_data, calibration=None if cfg.data else resolved.calibration
    )
    ctx = StudyContext(cfg, study_name, info, device, prepared, settings, store, storage or store.engine.url.render_as_string(hide_password=False),
                       command_line(), resume)  # fmt: skip
    with store, _ProgressReporter() as reporter:
        summary = run_study(ctx, reporter)
    _print_summary(summary, study_name)
    if prepared.synthetic:
        from autodeploy.harness.run import SYNTHETIC_NOTE

        err.print(f"note: {SYNTHETIC_NOTE}")
    if summary.winner is None:
        raise typer.Exit(1)


def _default_name(model_name: str, objective: str, fingerprint: str) -> str:
    return f"{re.sub(r'[^A-Za-z0-9_.-]+', '-', model_name).strip('-')}-{objective}-{fingerprint[:8]}"


class _ProgressReporter:
    """A Rich progress bar: trials done of the budget, the best so far, the current phase, ETA."""

    def __init__(self) -> None:
        self.progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), TextColumn("eta {task.fields[eta]}"), console=err,
                                 transient=False)  # fmt: skip
        self.task = None
        self.best = "none yet"

    def __enter__(self) -> _ProgressReporter:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def start(self, total: int, space: object) -> None:
        skipped = getattr(space, "skipped", {})
        for engine, reason in skipped.items():
            err.print(f"[yellow]skipping {escape(engine)}[/]: {escape(reason)}")
        self.task = self.progress.add_task("screening", total=total, eta="-")

    def phase(self, text: str) -> None:
        if self.task is not None:
            self.progress.update(self.task, description=escape(f"best: {self.best} | {text}"[:110]))

    def trial_done(self, done: int, best: str | None) -> None:
        self.best = best or "none meets the constraints"
        task = self.progress.tasks[0]
        eta = task.time_remaining
        self.progress.update(self.task, completed=done, description=escape(f"best: {self.best}"[:110]),
                             eta="-" if eta is None else f"{eta:.0f}s")  # fmt: skip


def _print_summary(summary, study_name: str) -> None:  # noqa: ANN001 - StudySummary, imported lazily
    counts = ", ".join(f"{v} {k}" for k, v in sorted(summary.trials.items()))
    out.print(f"study [bold]{escape(study_name)}[/] ({summary.objective}): {counts}")
    if summary.finalists:
        unit = {"latency": "p90 ms", "throughput": "items/s"}.get(summary.objective, "value")
        table = Table(
            title="finalists (re-measured interleaved)" if summary.finalists[0].n_samples else "best configs"
        )
        for column in ("config", unit, "95% CI", "samples", "note"):
            table.add_column(column)
        for f in summary.finalists:
            note = "baseline (ORT fp32 default)" if f.baseline else ""
            if summary.winner is not None and f.label == summary.winner.label:
                note = "[green]winner[/]"
            elif f.label in summary.tie_with:
                note = "tie with winner"
            if f.failure:
                note = f"[red]{escape(f.failure)}[/]"
            ci = "-" if f.ci is None else f"[{f.ci[0]:.4g}, {f.ci[1]:.4g}]"
            stat = "-" if f.statistic is None else f"{f.statistic:.4g}"
            table.add_row(escape(f.label), stat, ci, str(f.n_samples), note)
        out.print(table)
    if summary.winner is None:
        err.print(f"[red]no winner[/]: {escape(summary.note)}")
        return
    line = f"winner: [bold]{escape(summary.winner.label)}[/]"
    if summary.tie_with:
        line += (
            f" (statistical tie with {escape(', '.join(summary.tie_with))}; the cheaper config is preferred)"
        )
    if summary.speedup_vs_baseline is not None:
        line += f"; {summary.speedup_vs_baseline:.2f}x vs ONNX Runtime fp32 default"
    out.print(line)
    if summary.note:
        out.print(escape(summary.note))
