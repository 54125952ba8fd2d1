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
    devices: Annotated[str, typer.Option(help="all (every device registered now), NAME, or tag:TAG.")] = "all",
    accept_late: Annotated[str | None, typer.Option(metavar="DURATION", help="A device the selector takes that registers within this long (7d, 12h) takes a run too; default: only the devices registered now.")] = None,
    config: Annotated[Path | None, typer.Option(metavar="YAML", help="Study config, as for tune; flags override it.")] = None,
    data: Annotated[str | None, typer.Option(help="Input data: one .npz or .npy file (stored with the job), or sample:images.")] = None,
    metric: MetricOption = None,
    lost_after: Annotated[float, typer.Option(callback=at_least(1.0), metavar="SECONDS", help="A device silent this long, its run queued or running, reads as lost.")] = 1800.0,
    db: DbOption = None,
    format: FormatOption = Format.table,
    **flags: Any,  # the study's settings (add_flags, below)
) -> None:  # fmt: skip
    """Store the model (and its data) once, content-addressed, and queue a study of it on every device selected."""
    from autodeploy.fleet import jobs
    from autodeploy.search.budget import parse_duration

    if metric is not None:
        raise UsageError("--metric is refused for fleet jobs: a metric is code, and a fleet job carries no code",
                         fix="drop --metric; judge accuracy by the outputs (--max-accuracy-drop)")  # fmt: skip
    if model is None and config is None:
        raise UsageError("no model given", fix="autodeploy fleet submit MODEL --db URL")
    overrides = study_settings.overrides(study_settings.given("fleet submit", settings_of(flags)))
    late = parse_duration(accept_late, "--accept-late") if accept_late is not None else 0.0
    done = jobs.submit(model, db=db, devices=devices, config=config, overrides=overrides, data=data,
                       lost_after_s=lost_after, accept_late_s=late, command=command_line())  # fmt: skip
    if format is not Format.table:
        emit(format, {"job": done.job})
        return
    out.print(f"job {done.job}: model sha256 {done.model_sha256[:12]}, devices {shown(devices)}")
    if done.devices:
        out.print(f"queued on {len(done.devices)} registered device(s): {shown(', '.join(done.devices))}")
    elif late or not (devices == "all" or devices.startswith("tag:")):
        when = f"within --accept-late {shown(accept_late)}" if late else "under that name"
        err.print(f"[yellow]no registered device is selected by {shown(devices)} yet[/]: it runs on one that registers "
                  f"{when} (autodeploy agent --db URL --name NAME)")  # fmt: skip
    else:
        err.print(f"[yellow]no registered device is selected by {shown(devices)}[/], and without --accept-late no "
                  "device registering later takes it", soft_wrap=True)  # fmt: skip
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
    wait: Annotated[bool, typer.Option(help="Wait until the job is over: exit 0 when every device is done, 1 when one failed or was lost.")] = False,
    db: DbOption = None,
    format: FormatOption = Format.table,
) -> None:  # fmt: skip
    """Per device: state, heartbeat age, trials done, the winner with its speed-up and statistic, or the reason."""
    from autodeploy.fleet import jobs
    from autodeploy.results_db.states import JobStatus
    from autodeploy.results_db.store import Store

    if wait and job is None:
        raise UsageError("--wait waits for one job", fix="autodeploy fleet status JOB --wait")
    url = jobs.require_postgres(db)
    if not jobs.schema_made(url):  # a new database: no study or job has written to it yet
        records = []
    else:
        with Store.open(url, readonly=True) as store:
            records = [jobs.wait(store, job, seen=_said_once())] if wait and job is not None else jobs.status(store, job)
    if job is not None and not records:
        raise UsageError(f"no fleet job {job}: the results database holds no fleet job yet", fix=SUBMIT_FIRST)
    if format is Format.csv:  # one row per device
        emit(format, [device_row(r, d) for r in records for d in r["devices"]])
    elif format is not Format.table:
        emit(format, records[0] if job is not None else records)
    elif not records:
        out.print(f"no fleet job yet: {SUBMIT_FIRST}")
    for record in records if format is Format.table else ():
        _print_job(record)
    if wait and not JobStatus(records[0]["status"]).ok:
        raise typer.Exit(1)


SUBMIT_FIRST = "autodeploy fleet submit MODEL --db URL"


def device_row(record: dict[str, Any], d: dict[str, Any]) -> dict[str, Any]:
    """One device of one job as a CSV row: the job, where it stands, the device's state, winner and caveats."""
    w = d["winner"] or {}
    return {"job": record["job"], "model": record["model"], "job_status": record["status"], "device": d["device"],
            "state": d["state"], "winner": w.get("config"), "statistic": w.get("statistic"), "value": w.get("value"),
            "speedup": w.get("speedup"), "caveats": "; ".join(w.get("caveats") or []), "reason": d["reason"],
            "trials": d["trials"], "heartbeat_age_s": d["heartbeat_age_s"], "started_at": d.get("started_at"),
            "finished_at": d.get("finished_at"), "duration_s": d.get("duration_s"), "study": d["study"]}  # fmt: skip


def _said_once() -> Any:
    """A ``seen`` hook for ``--wait`` that prints the job's status on stderr each time it changes."""
    last: list[str] = []

    def seen(record: dict[str, Any]) -> None:
        now = f"{record['status']}: " + ", ".join(f"{d['device']} {d['state']}" for d in record["devices"])
        if not last or last[-1] != now:
            err.print(f"job {record['job']} {shown(now)}", soft_wrap=True)
            last.append(now)

    return seen


def _print_job(record: dict[str, Any]) -> None:
    from autodeploy.results_db.states import JobState, JobStatus, RunState

    # where it stands, or unreadable: its row is not what autodeploy writes (the line below the table says why)
    status = JobState.UNREADABLE if record["state"] == JobState.UNREADABLE else JobStatus(record["status"])
    colour = "red" if status == JobState.UNREADABLE else status.colour  # type: ignore[union-attr]
    late = f"; devices registering until {record['accepts_late_until'][:16]} take it" if record.get("accepts_late_until") else ""
    title = (f"job {record['job']}: {shown(record['model'])} on {shown(record['selects'])} "
             f"([{colour}]{status}[/]{shown(late)})")  # fmt: skip
    table = Table(title=title)
    for column in ("device", "state", "took", "heartbeat", "trials", "winner", "speed-up", "reason"):
        table.add_column(column)
    unreadable: list[str] = []
    for d in record["devices"]:
        w = d["winner"] or {}
        speedup = f"{w['speedup']:.2f}x ({shown(w['statistic'])})" if w.get("speedup") else "-"
        weak = w.get("caveats") or []  # why this winner is weaker than a finalist-proven one (fleet/readback.py)
        speedup += f", [yellow]{shown(', '.join(weak))}[/]" if weak else ""  # why this winner is weaker than proven
        winner = f"{shown(w['config'])}, {shown(w['statistic'])} {shown(w['value_text'])}" if w else "-"
        reason, state = d["reason"] or "", RunState(d["state"])
        if state == RunState.UNREADABLE:  # its line below the table, whole (a cell would wrap it)
            unreadable.append(reason)
            reason = "see below"
        if d["skipped"]:
            reason = "; ".join([reason] * bool(reason) + [f"skipped {s['engine']}: {s['reason']}" for s in d["skipped"]])
        took = _age(d["duration_s"]) if d.get("duration_s") is not None else "-"
        table.add_row(shown(d["device"]), f"[{state.colour}]{state}[/]", took, f"{d['heartbeat_age_s']:.0f} s ago",
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
def devices(
    every: Annotated[bool, typer.Option("--all", help="Retired devices too (fleet forget).")] = False,
    db: DbOption = None,
    format: FormatOption = Format.table,
) -> None:  # fmt: skip
    """Every device: name, tags, fingerprint (and the names that share it), CPU, engines, version, heartbeat, online,
    and the run it is on."""
    from autodeploy.fleet import jobs
    from autodeploy.results_db.store import Store

    url = jobs.require_postgres(db)
    records = []
    if jobs.schema_made(url):
        with Store.open(url, readonly=True) as store:
            records = jobs.devices(store, retired=every)
    if format is not Format.table:
        emit(format, records)
        return
    if not records:
        out.print("no fleet device yet: start one with autodeploy agent --db URL --name NAME")
        return
    table = Table(title=f"{len(records)} fleet device(s)")
    for column in ("device", "tags", "fingerprint", "cpu", "engines available", "version", "heartbeat", "run"):
        table.add_column(column)
    for d in records:
        shared = f" (= {', '.join(d['same_machine_as'])})" if d["same_machine_as"] else ""
        engines = ", ".join(e for e, state in d["engines"].items() if str(state).startswith("available"))
        beat = f"[green]online[/], {d['heartbeat_age_s']:.0f} s ago" if d["online"] else f"[red]offline[/], {_age(d['heartbeat_age_s'])} ago"
        run = f"job {d['running']['job']}, {d['running']['trials']} trials" if d["running"] else "-"
        name = d["name"] + (" (retired)" if d["retired_at"] else "")
        table.add_row(shown(name), shown(", ".join(d["tags"])) or "-", shown(d["fingerprint"] + shared), shown(d["cpu"]),
                      shown(engines) or "-", shown(d["version"]), beat, run)  # fmt: skip
    out.print(table)


def _age(seconds: float) -> str:
    from autodeploy.search.budget import duration_text

    return duration_text(seconds)


@app.command()
def forget(name: Annotated[str, typer.Argument(help="The device's name.")], db: DbOption = None) -> None:
    """Retire a device: no job selects it from now on and its queued runs are cancelled; its results stay."""
    from autodeploy.fleet import jobs
    from autodeploy.results_db.store import Store

    with Store.open(jobs.require_postgres(db)) as store:
        cancelled = jobs.forget(store, name)
    out.print(f"device {shown(name)} retired" + (f"; {len(cancelled)} queued run(s) cancelled" if cancelled else "")
              + " (an agent starting under this name again puts it back)")  # fmt: skip


@app.command()
def close(job: Annotated[int, typer.Argument(help="The job.")], db: DbOption = None) -> None:
    """Close a job: no device registering from now on takes it (its --accept-late window ends); its runs go on."""
    from autodeploy.fleet import jobs
    from autodeploy.results_db.store import Store

    with Store.open(jobs.require_postgres(db)) as store:
        jobs.close(store, job)
    out.print(f"job {job} closed: no device registering from now on takes it; its devices' runs go on")


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
