"""``autodeploy tune``: an Optuna study over engine × precision × batch × threads on this device."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.status import Status
from rich.table import Table

from autodeploy import api
from autodeploy.cli._common import Format, FormatOption, command_line, emit, err, out, shown
from autodeploy.errors import UsageError
from autodeploy.model import parse_shape_flags
from autodeploy.search.config import EXAMPLES
from autodeploy.verdict import DEFAULT_MAX_ACCURACY_DROP

Many = list[str] | None


def tune(
    model: Annotated[
        str | None, typer.Argument(help="An .onnx file or zoo:NAME (or `model:` in --config).")
    ] = None,
    config: Annotated[
        Path | None, typer.Option(metavar="YAML", help=f"Study config; flags override it. Examples, usable by name "
                                  f"(e.g. latency-mobilenetv2.yaml): {EXAMPLES}")
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
    format: FormatOption = Format.table,
) -> None:
    """Search the fastest config for a model on this device, re-measure the finalists and report the winner."""
    if model is None and config is None:
        raise UsageError("no model given", fix="autodeploy tune MODEL, or put `model:` in --config")
    with _ProgressReporter() as reporter:
        summary = api.tune(model, config=config, name=name, objective=objective, engines=engine, precisions=precision,
                           batches=batch, threads=threads, trials=trials, timeout_s=timeout, sampler=sampler, seed=seed,
                           fresh=fresh, resume=resume, max_accuracy_drop=max_accuracy_drop, max_memory_mb=max_memory_mb,
                           sla_ms=sla_ms, finalists=finalists, rounds=rounds, min_samples=min_samples,
                           min_duration_s=min_duration, shapes=parse_shape_flags(shape or []), data=data, db=db,
                           storage=storage, reporter=reporter, command=command_line())  # fmt: skip
    if format is Format.table:
        _print_summary(summary, summary.name)
    else:
        from autodeploy.report import study_record

        emit(format, study_record(summary))
    if summary.winner is None:
        raise typer.Exit(1)


class _ProgressReporter:
    """A spinner while the study is prepared, then a Rich progress bar: trials done of the budget, the best so
    far, the current phase, ETA."""

    def __init__(self) -> None:
        self.progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), TextColumn("eta {task.fields[eta]}"), console=err,
                                 transient=False)  # fmt: skip
        self.status: Status | None = None  # before the study starts (e.g. a zoo model being built)
        self.task = None
        self.best = "none yet"

    def __enter__(self) -> _ProgressReporter:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop_status()
        if self.task is not None:
            self.progress.stop()

    def start(self, total: int, space: object) -> None:
        self._stop_status()
        skipped = getattr(space, "skipped", {})
        for engine, reason in skipped.items():
            err.print(f"[yellow]skipping {shown(engine)}[/]: {shown(reason)}")
        self.progress.start()
        self.task = self.progress.add_task("screening", total=total, eta="-")

    def phase(self, text: str) -> None:
        if self.task is None:
            if self.status is None:
                self.status = err.status(shown(text))
                self.status.start()
            else:
                self.status.update(shown(text))
            return
        self.progress.update(self.task, description=shown(f"best: {self.best} | {text}"[:110]))

    def _stop_status(self) -> None:
        if self.status is not None:
            self.status.stop()
            self.status = None

    def trial_done(self, done: int, best: str | None) -> None:
        self.best = best or "none meets the constraints"
        task = self.progress.tasks[0]
        eta = task.time_remaining
        self.progress.update(self.task, completed=done, description=shown(f"best: {self.best}"[:110]),
                             eta="-" if eta is None else f"{eta:.0f}s")  # fmt: skip


def _print_summary(summary, study_name: str) -> None:  # noqa: ANN001 - StudySummary, imported lazily
    counts = ", ".join(f"{v} {k}" for k, v in sorted(summary.trials.items()))
    out.print(f"study [bold]{shown(study_name)}[/] ({summary.objective}): {counts}")
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
                note = f"[red]{shown(f.failure)}[/]"
            ci = "-" if f.ci is None else f"[{f.ci[0]:.4g}, {f.ci[1]:.4g}]"
            stat = "-" if f.statistic is None else f"{f.statistic:.4g}"
            table.add_row(shown(f.label), stat, ci, str(f.n_samples), note)
        out.print(table)
    if summary.winner is None:
        err.print(f"[red]no winner[/]: {shown(summary.note)}")
        return
    line = f"winner: [bold]{shown(summary.winner.label)}[/]"
    if summary.tie_with:
        line += (
            f" (statistical tie with {shown(', '.join(summary.tie_with))}; the cheaper config is preferred)"
        )
    if summary.speedup_vs_baseline is not None:
        line += f"; {summary.speedup_vs_baseline:.2f}x vs ONNX Runtime fp32 default"
    out.print(line)
    if summary.note:
        out.print(shown(summary.note))
