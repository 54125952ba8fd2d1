"""``autodeploy tune``: an Optuna study over engine × precision × batch × threads on this device.

Its flags are the study's settings (:data:`autodeploy.search.settings.SETTINGS`), one option per row, built into
:func:`tune`'s signature below; the command's own (the model, ``--config``, ``--db``, ``--storage``, ``--format``)
are written out.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

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
    Format,
    FormatOption,
    command_line,
    emit,
    err,
    fmt_ms,
    out,
    print_converter_logs,
    shown,
)
from autodeploy.cli._settings import add_flags, settings_of
from autodeploy.errors import AutodeployError, UsageError
from autodeploy.objectives import DEFAULT_OBJECTIVE, of
from autodeploy.redact import mask_secrets
from autodeploy.search import config as study_config
from autodeploy.search.config import EXAMPLES
from autodeploy.search.reporter import Reporter
from autodeploy.search.settings import SETTINGS
from autodeploy.shapes import ShapeSet, parse_flags

if TYPE_CHECKING:
    from autodeploy.search.study import Finalist, StudySummary


def tune(
    model: Annotated[
        str | None, typer.Argument(help="An .onnx, .tflite, OpenVINO IR .xml or PyTorch .pt2 file, or zoo:NAME (or `model:` in --config).")
    ] = None,
    config: Annotated[
        Path | None, typer.Option(metavar="YAML", help=f"Study config; flags override it. Examples, usable by name "
                                  f"(e.g. latency-mobilenetv2.yaml): {EXAMPLES}")
    ] = None,
    db: Annotated[
        str | None,
        typer.Option(help="Results database URL (default: $AUTODEPLOY_DB or the user SQLite file)."),
    ] = None,
    storage: Annotated[
        str | None, typer.Option(help="Optuna storage URL shared by workers (default: the results database).")
    ] = None,
    format: FormatOption = Format.table,
    **flags: Any,  # the settings' flags (add_flags, below)
) -> None:
    """Search the fastest config for a model on this device, re-measure the finalists and report the winner."""
    if model is None and config is None:
        raise UsageError("no model given", fix="autodeploy tune MODEL, or put `model:` in --config")
    if config is not None:  # a bare name may be a file here or a shipped example: say which is read
        err.print(f"config: {shown(str(study_config.resolve(config)))}", soft_wrap=True)  # one line, however long
    reporter = _ProgressReporter()
    shape, per_shape = flags.pop("shape"), flags.pop("per_shape")
    shape_set = parse_flags(shape or [])
    per_shape = per_shape or bool(study_config.read(config).get("per_shape")) if config is not None else per_shape
    kwargs = {**settings_of(flags), "shapes": shape_set if shape else None, "config": config, "db": db,
              "storage": storage, "command": command_line()}  # fmt: skip
    try:
        if per_shape:
            summaries = []
            for case in (shape_set if shape else study_config.load(config, {"model": model}).shape_set()).cases:
                with reporter:  # one study per shape, one after the other
                    summaries += api.tune_per_shape(model, reporter=reporter,
                                                    **{**kwargs, "shapes": ShapeSet((case,))})  # fmt: skip
                reporter = _ProgressReporter()
        else:
            with reporter:
                summaries = [api.tune(model, reporter=reporter, **kwargs)]
    except KeyboardInterrupt:
        _interrupted(reporter.name, db)
        raise typer.Exit(130) from None
    _print_summaries(summaries, format, db)
    if any(s.winner is None for s in summaries):
        raise typer.Exit(1)


add_flags(tune, (s.name for s in SETTINGS), after="config")


def _print_summaries(summaries: list[StudySummary], fmt: Format, db: str | None) -> None:
    """Each study's tables and next steps, or their records as JSON or CSV."""
    if fmt is not Format.table:
        from autodeploy.report import study_record

        records = [study_record(s) for s in summaries]
        emit(fmt, records[0] if len(records) == 1 else records)
        return
    for summary in summaries:
        _print_summary(summary, summary.name)
        if summary.inputs:
            err.print(f"note: {shown(summary.inputs)}")
        if summary.reference:
            err.print(f"accuracy judged against {shown(summary.reference)}")
        if summary.winner is not None:
            _print_next_steps(summary.name, db)


def value_text(value: float | None, objective: str) -> str:
    """A study statistic with its unit: ``91.85 µs`` (latency), ``1234.5 items/s``, ``412.0 q/s``
    (:meth:`autodeploy.objectives.Objective.value_text`)."""
    return of(objective).value_text(value)


def best_text(best: str | None, objective: str) -> str:
    """The study's ``label = v[, v, v]`` as ``best p90: label at 91.85 µs``."""
    if not best:
        return "best: none meets the constraints yet"
    label, _, values = best.rpartition(" = ")
    numbers = [float(v) for v in values.split(", ")]
    if not of(objective).single and len(numbers) == 3:  # pareto: p90 ms × accuracy drop × MB
        shown_values = f"{fmt_ms(numbers[0])}, drop {numbers[1]:.2%}, {numbers[2]:.0f} MB"
    else:
        shown_values = value_text(numbers[0], objective)
    return f"best {of(objective).words}: {label} at {shown_values}"


class _ProgressReporter(Reporter):
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
        self.objective = DEFAULT_OBJECTIVE.name
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
    sign = -1 if of(summary.objective).higher_is_better else 1
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
        value_column = of(objective).words + " [95% CI]"
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
        shapes = Table(title=f"the winner at each shape ({of(objective).words})")
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
    return of(objective).value_text(value, ci)


def _why_not_screening_best(summary: StudySummary) -> str:
    """Why the winner is not the screening best (the first finalist), when they differ."""
    first, winner = summary.finalists[0], summary.winner
    if winner is None or not first.n_samples and not first.failure or first.label == winner.label or first.baseline:
        return ""
    objective = summary.objective
    if first.failure:
        return f"{first.label} led the screening but failed its re-measurement ({first.failure})"
    if winner.baseline:  # one rule, both ways: the baseline stays unless beaten by more than the tie margin
        from autodeploy.search.summary import baseline_name
        from autodeploy.verdict import TIE_TOLERANCE

        return (f"{first.label} led the screening; re-measured interleaved with {baseline_name(summary.to_dict())}, "
                f"it reached {_stat_ci(first.statistic, first.ci, objective)} against the baseline's "
                f"{_stat_ci(winner.statistic, winner.ci, objective)}: a config replaces the baseline only by beating it "
                f"by more than the {TIE_TOLERANCE:.0%} tie margin (median of the per-round ratios), so the baseline stays")  # fmt: skip
    if first.label in summary.tie_with:
        return (f"{first.label} led the screening and ties with the winner when re-measured "
                f"({_stat_ci(first.statistic, first.ci, objective)}): the cheaper config (fewer threads, then a "
                "smaller batch) is preferred")  # fmt: skip
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
