"""``autodeploy fleet submit|status|export|cancel``: a model submitted once, tuned by every device's agent."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from autodeploy.cli._common import (
    Format,
    FormatOption,
    MetricOption,
    at_least,
    command_line,
    emit,
    err,
    out,
    shown,
)
from autodeploy.cli._settings import add_flags, settings_of
from autodeploy.errors import UsageError
from autodeploy.search import settings as study_settings
from autodeploy.search.config import DEFAULT_TRIALS

app = typer.Typer(help="Fleet jobs: submit a model once, and every device's agent tunes it (PostgreSQL).",
                  no_args_is_help=True)  # fmt: skip
DbOption = Annotated[str | None, typer.Option(help="The PostgreSQL results database every agent reaches (default: $AUTODEPLOY_DB).")]
Many = list[str] | None
#: What an export without --trust proved, in one line.
EXPORT_UNTRUSTED = ("integrity only, not authenticity: pass --trust KEY (the device's public key: autodeploy agent "
                    "prints where it is)")  # fmt: skip


@app.command()
def submit(
    model: Annotated[str | None, typer.Argument(help="An .onnx, .tflite or .pt2 file, or zoo:NAME (or `model:` in --config).")] = None,
    devices: Annotated[str, typer.Option(help="all (every device registered now or while the job is open), NAME, or tag:TAG.")] = "all",
    config: Annotated[Path | None, typer.Option(metavar="YAML", help="Study config, as for tune; flags override it.")] = None,
    data: Annotated[str | None, typer.Option(help="Input data: one .npz or .npy file (stored with the job), or sample:images.")] = None,
    metric: MetricOption = None,
    lost_after: Annotated[float, typer.Option(callback=at_least(1.0), metavar="SECONDS", help="A running device silent this long reads as failed: agent lost.")] = 1800.0,
    db: DbOption = None,
    format: FormatOption = Format.table,
    **flags: Any,  # the study's settings (add_flags, below)
) -> None:  # fmt: skip
    """Store the model (and its data) once, content-addressed, and queue a study of it on every device selected."""
    from autodeploy.fleet import jobs

    if metric is not None:
        raise UsageError("--metric is refused for fleet jobs: a metric is code, and a fleet job carries no code",
                         fix="drop --metric; judge accuracy by the outputs (--max-accuracy-drop)")  # fmt: skip
    if model is None and config is None:
        raise UsageError("no model given", fix="autodeploy fleet submit MODEL --db URL")
    overrides = study_settings.overrides(study_settings.given("fleet submit", settings_of(flags)))
    done = jobs.submit(model, db=db, devices=devices, config=config, overrides=overrides, data=data,
                       lost_after_s=lost_after, command=command_line())  # fmt: skip
    if format is not Format.table:
        emit(format, {"job": done.job})
        return
    out.print(f"job {done.job}: model sha256 {done.model_sha256[:12]}, devices {shown(devices)}")
    if done.devices:
        out.print(f"queued on {len(done.devices)} registered device(s): {shown(', '.join(done.devices))}")
    else:
        err.print(f"[yellow]no registered device is selected by {shown(devices)} yet[/]: it runs when one registers "
                  "(autodeploy agent --db URL --name NAME)")  # fmt: skip
    out.print(f"follow it with: autodeploy fleet status {done.job} --db URL")


#: The study's settings a fleet job carries (not the run's own: --resume, --name, the worker timeouts; nor code: --metric).
SUBMITTED = ("objective", "engines", "precisions", "batches", "threads", "trials", "time_budget", "sampler", "seed", "fresh",
             "max_accuracy_drop", "max_memory_mb", "sla_ms", "finalists", "rounds", "min_samples", "min_duration_s")  # fmt: skip
add_flags(submit, SUBMITTED, after="config", helps={
    "engines": "Engines to search; a device that lacks one runs the rest. Repeatable.",
    "trials": f"Measured trials per device (default {DEFAULT_TRIALS}, or fewer when the search stops improving).",
    "time_budget": "Wall time of each device's study (600, 90s, 10m).",
    "fresh": "Re-measure configs already in the store for the same fingerprint.",
})


@app.command()
def status(
    job: Annotated[int | None, typer.Argument(help="The job (default: every job).")] = None,
    db: DbOption = None,
    format: FormatOption = Format.table,
) -> None:
    """Per device: state, heartbeat age, trials done, the winner with its speed-up and statistic, or the reason."""
    from autodeploy.fleet import jobs
    from autodeploy.results_db.store import Store

    with Store.open(jobs.require_postgres(db), readonly=True) as store:
        records = jobs.status(store, job)
    if format is not Format.table:
        emit(format, records[0] if job is not None else records)
        return
    if not records:
        out.print("no fleet job yet: autodeploy fleet submit MODEL --db URL")
    for record in records:
        _print_job(record)


def _print_job(record: dict[str, Any]) -> None:
    from autodeploy.results_db.states import RunState

    title = f"job {record['job']}: {shown(record['model'])} on {shown(record['selects'])} ({shown(record['state'])})"
    table = Table(title=title)
    for column in ("device", "state", "heartbeat", "trials", "winner", "speed-up", "reason"):
        table.add_column(column)
    unreadable: list[str] = []
    for d in record["devices"]:
        w = d["winner"] or {}
        speedup = f"{w['speedup']:.2f}x ({shown(w['statistic'])})" if w.get("speedup") else "-"
        winner = f"{shown(w['config'])}, {shown(w['statistic'])} {shown(w['value_text'])}" if w else "-"
        reason, state = d["reason"] or "", RunState(d["state"])
        if state == RunState.UNREADABLE:  # its line below the table, whole (a cell would wrap it)
            unreadable.append(reason)
            reason = "see below"
        if d["skipped"]:
            reason = "; ".join([reason] * bool(reason) + [f"skipped {s['engine']}: {s['reason']}" for s in d["skipped"]])
        table.add_row(shown(d["device"]), f"[{state.colour}]{state}[/]", f"{d['heartbeat_age_s']:.0f} s ago",
                      str(d["trials"]), winner, speedup, shown(reason))  # fmt: skip
    out.print(table)
    if record.get("reason"):  # the job row itself is unreadable
        unreadable.insert(0, record["reason"])
    for reason in unreadable:
        err.print(f"[red]unreadable[/]: {shown(reason)}", soft_wrap=True)
    if not record["devices"]:
        out.print("no device has taken it yet")


@app.command()
def export(
    job: Annotated[int, typer.Argument(help="The job.")],
    device: Annotated[str, typer.Option(help="The device whose winner to write.")],
    output: Annotated[Path, typer.Option("-o", "--output", help="Destination folder; must not exist.")],
    trust: Annotated[Path | None, typer.Option(metavar="KEY", help="The device's public key (its agent prints where it is): the result and the bundle must be signed by it.")] = None,
    trusted_devices: Annotated[Path | None, typer.Option(metavar="FILE", help="'NAME PUBLIC-KEY-FILE' lines: --trust with the key named for --device.")] = None,
    db: DbOption = None,
) -> None:  # fmt: skip
    """Write a device's winner bundle from the store, verified (every file against its manifest; with --trust, the
    device key's signatures over its result and its bundle)."""
    from autodeploy.fleet import jobs, keys
    from autodeploy.results_db.store import Store

    if trust is not None and trusted_devices is not None:
        raise UsageError("give --trust or --trusted-devices, not both", fix="drop one of them")
    if trusted_devices is not None:
        trust = keys.trusted_key(trusted_devices, device)
    with Store.open(jobs.require_postgres(db), readonly=True) as store:
        path, manifest = jobs.export(store, job, device, output, trust=trust)
    engine = manifest.get("engine") or {}
    signed = f", signed by {shown(str(trust))}" if trust is not None else ""
    out.print(f"exported {shown(device)}'s winner of job {job} to [bold]{shown(str(path))}[/] "
              f"({len(manifest['files'])} files verified against the manifest{signed}; {shown(engine.get('name', '?'))})")  # fmt: skip
    if trust is None:
        err.print(f"[yellow]{EXPORT_UNTRUSTED}[/]", soft_wrap=True)
    out.print(f"check it with: autodeploy bundle verify {shown(str(path))}")


@app.command()
def cancel(job: Annotated[int, typer.Argument(help="The job.")], db: DbOption = None) -> None:
    """Cancel a job: queued devices at once, running ones at their agent's next step."""
    from autodeploy.fleet import jobs
    from autodeploy.results_db.states import RunState
    from autodeploy.results_db.store import Store

    with Store.open(jobs.require_postgres(db)) as store:
        runs = jobs.cancel(store, job)
    running = [r.device for r in runs if r.state == RunState.RUNNING]
    out.print(f"job {job} cancelled" + (f"; stopping on {shown(', '.join(running))}" if running else ""))
