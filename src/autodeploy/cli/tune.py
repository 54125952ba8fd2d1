"""``autodeploy tune``: an Optuna study over engine × precision × batch × threads on this device."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    Task,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.status import Status
from rich.table import Table

from autodeploy import api
from autodeploy.cli._common import (
    ACCURACY_DROP_HELP,
    Format,
    FormatOption,
    LayoutOption,
    MeanOption,
    MetricDropOption,
    MetricOption,
    ReverseOption,
    ScaleOption,
    at_least,
    command_line,
    emit,
    err,
    fmt_ms,
    out,
    preprocess_of,
    print_converter_logs,
    shown,
)
from autodeploy.errors import AutodeployError, UsageError
from autodeploy.objectives import OBJECTIVES
from autodeploy.redact import mask_secrets
from autodeploy.search import config as study_config
from autodeploy.search.config import EXAMPLES
from autodeploy.shapes import ShapeSet, parse_flags

if TYPE_CHECKING:
    from autodeploy.search.study import Finalist, StudySummary

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
    timeout: Annotated[float | None, typer.Option(callback=at_least(0.001), help="Seconds before a worker running the model (reference, measurement) is killed, as for bench (default 600).")] = None,
    build_timeout: Annotated[float | None, typer.Option(callback=at_least(0.001), help="Seconds before a worker building an artifact is killed (default 1800).")] = None,
    screening_time: Annotated[float | None, typer.Option(callback=at_least(0.001), metavar="SECONDS", help="Start no new screening trial after this many seconds (the finalists still run; --time-budget bounds the whole run).")] = None,
    time_budget: Annotated[
        str | None, typer.Option(metavar="DURATION", help="Wall time of this run, finalists included (600, 90s, 10m, "
                                 "1h30m): the best found in it, with the confidence reached; --resume goes on.")
    ] = None,
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
        float | None, typer.Option(callback=at_least(0.0), help=ACCURACY_DROP_HELP)
    ] = None,
    max_memory_mb: Annotated[float | None, typer.Option(help="Peak worker memory allowed, MB.")] = None,
    sla_ms: Annotated[
        float | None, typer.Option(help="p99 latency bound (needed by --objective server).")
    ] = None,
    finalists: Annotated[
        int | None, typer.Option(help="Finalists re-measured interleaved (default 3; 0: none).")
    ] = None,
    rounds: Annotated[
        int | None, typer.Option(help="Interleaved rounds for the finalists, spread over time (default 5).")
    ] = None,
    spread: Annotated[float | None, typer.Option(callback=at_least(0.0), metavar="SECONDS", help="Least seconds the finalist rounds span, waiting between them at random times (default: as long as screening took, at most 300; 0: back to back).")] = None,
    min_samples: Annotated[
        int | None, typer.Option(help="Timed calls per screening trial, at least (default 64).")
    ] = None,
    min_duration: Annotated[
        float | None, typer.Option(help="Timed seconds per screening trial, at least (default 1).")
    ] = None,
    shape: Annotated[Many, typer.Option(help="Fix an input shape, NAME=1x3x224x224[@WEIGHT]; repeat an input for several shapes.")] = None,
    per_shape: Annotated[
        bool, typer.Option("--per-shape", help="With several shapes: one study and winner per shape (default: one config for the weighted mix).")
    ] = False,
    data: Annotated[
        str | None, typer.Option(help="Input data: .npz, a folder of NAME.npy (optional 'labels'), a folder of "
                                 "images (subfolders: classes), or sample:images (crops of real photos).")
    ] = None,
    layout: LayoutOption = None,
    reverse_input_channels: ReverseOption = False,
    mean_values: MeanOption = None,
    scale_values: ScaleOption = None,
    metric: MetricOption = None,
    max_metric_drop: MetricDropOption = None,
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
    if config is not None:  # a bare name may be a file here or a shipped example: say which is read
        err.print(f"config: {shown(str(study_config.resolve(config)))}", soft_wrap=True)  # one line, however long
    reporter = _ProgressReporter()
    shape_set = parse_flags(shape or [])
    per_shape = per_shape or bool(study_config.read(config).get("per_shape")) if config is not None else per_shape
    kwargs = dict(config=config, objective=objective, engines=engine, precisions=precision,
                  batches=batch, threads=threads, trials=trials, timeout_s=timeout, build_timeout_s=build_timeout,
                  screening_time_s=screening_time, time_budget=time_budget,
                  sampler=sampler, seed=seed, fresh=fresh, resume=resume, max_accuracy_drop=max_accuracy_drop, max_memory_mb=max_memory_mb,
                  sla_ms=sla_ms, finalists=finalists, rounds=rounds, spread_s=spread, min_samples=min_samples,
                  min_duration_s=min_duration, shapes=shape_set if shape else None, data=data, db=db,
                  preprocess=preprocess_of(layout, reverse_input_channels, mean_values, scale_values),
                  metric=metric, max_metric_drop=max_metric_drop,
                  storage=storage, command=command_line())  # fmt: skip
    try:
        if per_shape:
            summaries = []
            for case in (shape_set if shape else study_config.load(config, {"model": model}).shape_set()).cases:
                with reporter:  # one study per shape, one after the other
                    summaries += api.tune_per_shape(model, name=name, reporter=reporter,
                                                    **{**kwargs, "shapes": ShapeSet((case,))})  # fmt: skip
                reporter = _ProgressReporter()
        else:
            with reporter:
                summaries = [api.tune(model, name=name, reporter=reporter, **kwargs)]  # type: ignore[arg-type]
    except KeyboardInterrupt:
        _interrupted(reporter.name, db)
        raise typer.Exit(130) from None
    if format is Format.table:
        for summary in summaries:
            _print_summary(summary, summary.name)
            if summary.inputs:
                err.print(f"note: {shown(summary.inputs)}")
            if summary.reference:
                err.print(f"accuracy judged against {shown(summary.reference)}")
            if summary.winner is not None:
                _print_next_steps(summary.name, db)
    else:
        from autodeploy.report import study_record

        records = [study_record(s) for s in summaries]
        emit(format, records[0] if len(records) == 1 else records)
    if any(s.winner is None for s in summaries):
        raise typer.Exit(1)


def value_text(value: float | None, objective: str) -> str:
    """A study statistic with its unit: ``91.85 µs`` (latency), ``1234.5 items/s``, ``412.0 q/s``
    (:meth:`autodeploy.objectives.Objective.value_text`)."""
    return OBJECTIVES[objective].value_text(value)


def best_text(best: str | None, objective: str) -> str:
    """The study's ``label = v[, v, v]`` as ``best p90: label at 91.85 µs``."""
    if not best:
        return "best: none meets the constraints yet"
    label, _, values = best.rpartition(" = ")
    numbers = [float(v) for v in values.split(", ")]
    if not OBJECTIVES[objective].single and len(numbers) == 3:  # pareto: p90 ms × accuracy drop × MB
        shown_values = f"{fmt_ms(numbers[0])}, drop {numbers[1]:.2%}, {numbers[2]:.0f} MB"
    else:
        shown_values = value_text(numbers[0], objective)
    return f"best {OBJECTIVES[objective].words}: {label} at {shown_values}"


class _ProgressReporter:  # a search.study.Reporter (not imported: it loads the store and SQLAlchemy)
    """A spinner while the study is prepared, then a Rich progress bar for the screening trials (the best so far
    with its unit, the current phase, an ETA), then a second bar for the interleaved finalist runs."""

    def __init__(self) -> None:
        self.progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), TextColumn("eta {task.fields[eta]}"), console=err,
                                 transient=False)  # fmt: skip
        self.status: Status | None = None  # before the study starts (e.g. a zoo model being built)
        self.task: TaskID | None = None
        self.final: TaskID | None = None
        self.best = "best: none yet"
        self.name: str | None = None
        self.objective = "latency"
        self.runs = 0  # finalist runs started

    def __enter__(self) -> _ProgressReporter:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop_status()
        if self.task is not None:
            if exc[0] is None:
                self._screening_done()
            if self.final is not None and exc[0] is None:
                self.progress.update(self.final, completed=self.progress.tasks[self.final].total, eta="0s")
            self.progress.stop()

    def study(self, name: str, objective: str) -> None:
        self.name, self.objective = name, objective

    def start(self, total: int, space: object) -> None:
        self._stop_status()
        skipped = getattr(space, "skipped", {})
        for engine, reason in skipped.items():
            err.print(f"[yellow]skipping {shown(engine)}[/]: {shown(reason)}")
        self.progress.start()
        self.task = self.progress.add_task("screening", total=total, eta="-")

    def finalists(self, runs: int) -> None:
        if self.task is None:
            return
        self._screening_done()
        self.final = self.progress.add_task("finalists", total=runs, eta="-")

    def _screening_done(self) -> None:
        """Screening may end before its trial count (search space, time budget): the bar says done, not 13/28."""
        done = self.progress.tasks[self.task].completed
        self.progress.update(self.task, total=done, eta="0s", description=shown(f"screening done | {self.best}"[:110]))

    def phase(self, text: str) -> None:
        if self.task is None:
            if self.status is None:
                self.status = err.status(shown(text))
                self.status.start()
            else:
                self.status.update(shown(text))
            return
        if self.final is not None:
            if text.startswith("finalists round"):
                self.runs += 1
                self.progress.update(self.final, completed=self.runs - 1, eta=_eta(self.progress.tasks[self.final]))
            self.progress.update(self.final, description=shown(f"finalists: {text.removeprefix('finalists ')}"[:110]))
            return
        self.progress.update(self.task, description=shown(f"{self.best} | {text}"[:110]))

    def note(self, text: str) -> None:
        self.progress.console.print(f"[yellow]note[/]: {shown(text)}", soft_wrap=True)

    def rerun(self, runs: int) -> None:
        """A finalist round runs again (it ran under load): the bar grows by its runs."""
        if self.final is not None:
            self.progress.update(self.final, total=(self.progress.tasks[self.final].total or 0) + runs)

    def _stop_status(self) -> None:
        if self.status is not None:
            self.status.stop()
            self.status = None

    def trial_done(self, done: int, best: str | None) -> None:
        self.best = best_text(best, self.objective)
        self.progress.update(self.task, completed=done, description=shown(self.best[:110]))
        self.progress.update(self.task, eta=_eta(self.progress.tasks[self.task]))


def _eta(task: Task) -> str:
    """Remaining time from the mean time per step so far (Rich's own estimate needs many steps)."""
    if not task.completed or task.total is None or task.elapsed is None:
        return "-"
    left = task.elapsed / task.completed * (task.total - task.completed)
    return f"{left:.0f}s" if left < 120 else f"{left / 60:.0f} min"


def _interrupted(name: str | None, db: str | None) -> None:
    """Ctrl-C: say what the store kept and the command that goes on from there."""
    if name is None:
        err.print("[yellow]interrupted[/] before the study started: nothing was stored; run the same command again")
        return
    from autodeploy.results_db import Store, TrialFilter

    try:
        with Store.open(db, readonly=True) as store:
            rows = store.trials(TrialFilter(study=name))
    except AutodeployError:
        rows = []
    ok = sum(r.status == "ok" for r in rows)
    err.print(f"[yellow]interrupted[/]: study {shown(name)} keeps its {len(rows)} stored trial(s) ({ok} ok, "
              f"{len(rows) - ok} failed); the trial in progress was dropped")  # fmt: skip
    err.print(f"resume with: {shown(resume_command(name))}", soft_wrap=True)


def resume_command(name: str) -> str:
    """The command as typed, with ``--resume`` and the study's ``--name`` (added when missing)."""
    argv = shlex.split(command_line())
    if "--name" not in argv and not any(a.startswith("--name=") for a in argv):
        argv += ["--name", name]
    if "--resume" not in argv:
        argv.append("--resume")
    return shlex.join(argv)


def _best_first(summary: StudySummary) -> list[Finalist]:
    """The finalists as ranked: the winner, then by their re-measured value, failures and unmeasured last."""
    sign = -1 if OBJECTIVES[summary.objective].higher_is_better else 1
    winner = summary.winner.label if summary.winner is not None else None

    def rank(f: Finalist) -> tuple[bool, bool, bool, float]:
        return (f.label != winner, bool(f.failure), f.statistic is None, sign * (f.statistic or 0.0))

    return sorted(summary.finalists, key=rank)


def _print_summary(summary: StudySummary, study_name: str) -> None:
    counts = ", ".join(f"{v} {k}" for k, v in sorted(summary.trials.items()))
    out.print(f"study [bold]{shown(study_name)}[/] ({summary.objective}): {counts}")
    objective = summary.objective
    if summary.finalists:
        remeasured = bool(summary.finalists[0].n_samples)
        title = "finalists (re-measured interleaved)" if remeasured else "best configs"
        if summary.finalists[0].per_shape:
            title += ", weighted by the shape mix"
        table = Table(title=title)
        value_column = OBJECTIVES[objective].words + " [95% CI]"
        if summary.statistic and remeasured:  # paired by round: each round's value, their median and range
            value_column = f"{summary.statistic}: median of rounds \\[interval over rounds]"
        for column in ("config", value_column, "samples", "load", "note"):
            table.add_column(column)
        # the record the dashboard's winners page reads
        from autodeploy.search.summary import baseline_name, finalist_load_text, runner_up

        second, base = runner_up(summary.to_dict()), shown(baseline_name(summary.to_dict()))
        for f in _best_first(summary):
            note = f"baseline ({base})" if f.baseline else ""
            if summary.winner is not None and f.label == summary.winner.label:
                note = "[green]winner[/]" + (f" (baseline: {base})" if f.baseline else "")
            elif f.label in summary.tie_with:
                note = "tie with winner"
            if second is not None and f.label == second["label"]:
                note = ", ".join(filter(None, ("runner-up", note)))
            if f.failure:
                note = f"[red]{shown(f.failure)}[/]"
            load = finalist_load_text({"loads": f.loads})
            table.add_row(shown(f.label), _stat_ci(f.statistic, f.ci, objective), str(f.n_samples),
                          f"[yellow]{load}[/]" if "under load" in load else load, note)  # fmt: skip
        out.print(table)
    if summary.winner is not None and summary.winner.per_shape:
        shapes = Table(title=f"the winner at each shape ({OBJECTIVES[objective].words})")
        shapes.add_column("shape")
        shapes.add_column("value", justify="right")
        for key, value in summary.winner.per_shape.items():
            shapes.add_row(shown(key), value_text(value, objective))
        out.print(shapes)
    if summary.winner is None:
        err.print(f"[red]no winner[/]: {shown(summary.note)}", soft_wrap=True)
        _print_search(summary)
        return
    line = shown(summary.headline()).replace(shown(summary.winner.label), f"[bold]{shown(summary.winner.label)}[/]", 1)
    if summary.tie_with:
        line += f" (statistical tie with {shown(', '.join(summary.tie_with))}; the cheaper config is preferred)"
    out.print(line)
    limit = summary.limit_text()
    if limit:
        out.print(f"limit: {shown(limit)}", soft_wrap=True)
    why = _why_not_screening_best(summary)
    if why:
        out.print(shown(why))
    if summary.note:
        out.print(shown(summary.note))
    _print_search(summary)


def _print_search(summary: StudySummary) -> None:
    """What the winner rests on, what the search learned and left out, and where the time went."""
    if summary.confidence:
        out.print(f"confidence: {shown(summary.confidence)}")
    from autodeploy.search.summary import load_text

    load = load_text(summary.to_dict())
    if load:
        out.print(f"[yellow]{shown(load)}[/]" if "under load" in load else shown(load), soft_wrap=True)
    if summary.time_budget_s is not None and summary.wall_s is not None:
        stop = f"; screening stopped by {summary.stopped_by}" if summary.stopped_by else ""
        out.print(f"time budget: {fmt_s(summary.time_budget_s)}, used {fmt_s(summary.wall_s)}{shown(stop)}; "
                  "every trial is kept for --resume")  # fmt: skip
    for branch, reason in summary.deprioritized.items():
        out.print(f"deprioritized {shown(branch)}: {shown(reason)}")
    for reason in summary.skipped:
        out.print(shown(reason))
    for kind, seen in summary.failures.items():
        first = seen["reason"].splitlines()[0] if seen["reason"] else kind
        out.print(f"failed: {seen['count']} {shown(kind)}, e.g. {shown(seen['config'])}: {shown(first[:200])}",
                  soft_wrap=True)  # fmt: skip
        print_converter_logs(seen["reason"])  # -v: the converter's own log
    _print_rejected(summary)
    if not summary.time_by_engine:
        return
    table = Table(title="where the time went (whole study)")
    for column in ("engine", "build", "accuracy", "timing", "worker runs"):
        table.add_column(column, justify="left" if column == "engine" else "right")
    for engine, row in sorted(summary.time_by_engine.items()):
        table.add_row(shown(engine), fmt_s(row["build_s"]), fmt_s(row["accuracy_s"]), fmt_s(row["timing_s"]),
                      str(int(row["runs"])))  # fmt: skip
    if summary.reference_s:
        from autodeploy.search.summary import baseline_name

        reference = f"reference ({shown(baseline_name(summary.to_dict()))})"
        table.add_row(reference, "", fmt_s(summary.reference_s), "", "1")
    out.print(table)


#: Rejected configs the table output lists (closest first); --format json lists every one.
REJECTED_SHOWN = 8


def _print_rejected(summary: StudySummary) -> None:
    """Every config a constraint rejected, closest first, at most REJECTED_SHOWN lines and a count of the rest."""
    if not summary.rejected:
        return
    n = len(summary.rejected)
    out.print(f"rejected by a constraint: {n} config{'s' if n != 1 else ''}, closest first")
    for r in summary.rejected[:REJECTED_SHOWN]:
        out.print(f"  {shown(r.text())}", soft_wrap=True)
    if n > REJECTED_SHOWN:
        out.print(f"  ... {n - REJECTED_SHOWN} more (see --format json)")


def fmt_s(seconds: float) -> str:
    from autodeploy.search.budget import duration_text

    return duration_text(seconds)


def _stat_ci(value: float | None, ci: tuple[float, float] | None, objective: str) -> str:
    return OBJECTIVES[objective].value_text(value, ci)


def _why_not_screening_best(summary: StudySummary) -> str:
    """Why the winner is not the screening best (the first finalist), when they differ."""
    first, winner = summary.finalists[0], summary.winner
    if winner is None or not first.n_samples and not first.failure or first.label == winner.label or first.baseline:
        return ""
    objective = summary.objective
    if first.failure:
        return f"{first.label} led the screening but failed its re-measurement ({first.failure})"
    if first.label in summary.tie_with:
        return (f"{first.label} led the screening and ties with the winner when re-measured "
                f"({_stat_ci(first.statistic, first.ci, objective)}): the cheaper config (fewer threads, then a "
                "smaller batch) is preferred")  # fmt: skip
    if winner.baseline:
        from autodeploy.search.summary import baseline_name

        return (f"{first.label} led the screening; {baseline_name(summary.to_dict())}, re-measured interleaved with the "
                f"finalists as the baseline, was faster: {_stat_ci(winner.statistic, winner.ci, objective)} against "
                f"{_stat_ci(first.statistic, first.ci, objective)}")  # fmt: skip
    return (f"{first.label} led the screening, but re-measured interleaved with the others over "
            f"{first.n_samples} samples it reached {_stat_ci(first.statistic, first.ci, objective)}, against the "
            f"winner's {_stat_ci(winner.statistic, winner.ci, objective)}: the short screening run flattered it")  # fmt: skip


def _print_next_steps(name: str, db: str | None) -> None:
    db_flag = "" if db is None else f" --db {shlex.quote(mask_secrets(db))}"
    folder = shlex.quote(f"{name}-bundle")
    out.print("next:")
    for command, why in ((f"autodeploy export {shlex.quote(name)} -o {folder}{db_flag}", "ship the winner as a bundle"),
                         (f"autodeploy bundle run {folder}", "load it (checksums verified) and time it here"),
                         (f"autodeploy dashboard{db_flag}", "compare every trial in the browser")):  # fmt: skip
        out.print(f"  {shown(command)}   [dim]# {why}[/]", soft_wrap=True)
