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
    profile: Annotated[str | None, typer.Option(metavar="CONFIG", help="A profile job: measure this one config on every device instead of tuning, shown beside each device's own winner: ENGINE/PRECISION/bBATCH/tTHREADS (as fleet status names winners) or JOB:DEVICE (that device's winner).")] = None,
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
                       lost_after_s=lost_after, accept_late_s=late, profile=profile, command=command_line())  # fmt: skip
    if format is not Format.table:
        emit(format, {"job": done.job})
        return
    what = f", profile of {shown(profile)}" if profile else ""
    out.print(f"job {done.job}: model sha256 {done.model_sha256[:12]}, devices {shown(devices)}{what}")
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
    return {"job": record["job"], "kind": record.get("kind"), "model": record["model"], "job_status": record["status"], "device": d["device"],
            "state": d["state"], "phase": d.get("phase"), "queue_position": d.get("queue_position"),
            "winner": w.get("config"), "statistic": w.get("statistic"), "value": w.get("value"),
            "ci_low": (w.get("ci") or [None])[0], "ci_high": (w.get("ci") or [None, None])[1], "memory_mb": w.get("memory_mb"),
            "accuracy": w.get("accuracy"), "speedup": w.get("speedup"), "caveats": "; ".join(w.get("caveats") or []),
            "vs_own": (d.get("vs_own") or {}).get("ratio"), "fingerprint": d.get("fingerprint"), "reason": d["reason"],
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
    what = f" profile of {shown(record['profile'])}" if record.get("profile") else ""
    title = (f"job {record['job']}:{what} {shown(record['model'])} on {shown(record['selects'])} "
             f"([{colour}]{status}[/]{shown(late)})")  # fmt: skip
    profile = bool(record.get("profile"))
    table = Table(title=title)
    columns = ("measured", "memory", "own winner", "vs own") if profile else ("trials", "winner", "speed-up", "memory")
    for column in ("device", "state", "took", "heartbeat", *columns, "reason"):
        table.add_column(column)
    unreadable: list[str] = []
    shared = _same_machine(record["devices"])
    for d in sorted(record["devices"], key=lambda d: (d.get("fingerprint") or "", d["device"])):  # one machine's together
        w = d["winner"] or {}
        weak = w.get("caveats") or []  # why this winner is weaker than a finalist-proven one (fleet/readback.py)
        winner = f"{shown(w['config'])}, {shown(w['statistic'])} {shown(w['value_text'])}" if w else "-"
        reason, state = d["reason"] or "", RunState(d["state"])
        if state == RunState.UNREADABLE:  # its line below the table, whole (a cell would wrap it)
            unreadable.append(reason)
            reason = "see below"
        if d["skipped"]:
            reason = "; ".join([reason] * bool(reason) + [f"skipped {s['engine']}: {s['reason']}" for s in d["skipped"]])
        took = _age(d["duration_s"]) if d.get("duration_s") is not None else "-"
        memory = f"{w['memory_mb']:.0f} MB" if w.get("memory_mb") is not None else "-"
        if profile:
            cells = (winner + (f", [yellow]{shown(', '.join(weak))}[/]" if weak else ""), memory, *_own(d))
        else:
            speedup = f"{w['speedup']:.2f}x ({shown(w['statistic'])})" if w.get("speedup") else "-"
            speedup += f", [yellow]{shown(', '.join(weak))}[/]" if weak else ""
            cells = (_trials(d), winner, speedup, memory)
        device = shown(d["device"]) + (f" [dim](same machine as {shown(', '.join(shared[d['device']]))})[/]" if shared.get(d["device"]) else "")  # fmt: skip
        table.add_row(device, _state(d, state), took, f"{d['heartbeat_age_s']:.0f} s ago", *cells, shown(reason))
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


def _same_machine(devices: list[dict[str, Any]]) -> dict[str, list[str]]:
    """Each device's other names with its fingerprint (two agents on one machine measure the same silicon)."""
    by_print: dict[str, list[str]] = {}
    for d in devices:
        if d.get("fingerprint"):
            by_print.setdefault(d["fingerprint"], []).append(d["device"])
    return {d["device"]: [n for n in by_print.get(d.get("fingerprint") or "", []) if n != d["device"]] for d in devices}


def _state(d: dict[str, Any], state: Any) -> str:
    """The state, with where a running run stands (its phase) or a queued one's place in its device's line."""
    text = f"[{state.colour}]{state}[/]"
    if d.get("phase"):
        return f"{text}: {shown(d['phase'])}"
    return f"{text}, #{d['queue_position']} in line" if d.get("queue_position") else text


def _trials(d: dict[str, Any]) -> str:
    return f"{d['trials']}/{d['trials_budget']}" if d.get("trials_budget") else str(d["trials"])


def _own(d: dict[str, Any]) -> tuple[str, str]:
    """A profile job's device: its own winner (job, config, value) and what the profiled config costs beside it."""
    own, vs = d.get("own_winner"), d.get("vs_own")
    if not own:
        return "- (no tune job of this model gave this device a winner)", "-"
    text = f"job {own.get('job')}: {shown(own['config'])}, {shown(own['statistic'])} {shown(own.get('value_text') or '-')}"
    if not vs:
        return text, "-"
    return text, f"{vs['ratio']:.2f}x {'slower' if vs['ratio'] >= 1 else 'faster'} ({shown(vs['statistic'])})"


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


@app.command()
def prune(
    older_than: Annotated[str, typer.Option(metavar="DURATION", help="Remove the winner bundles of runs that finished longer ago than this (30d, 12h).")],
    dry_run: Annotated[bool, typer.Option(help="Say what would be removed; remove nothing.")] = False,
    db: DbOption = None,
) -> None:  # fmt: skip
    """Remove stored winner bundles past retention; one a newer run or a job still names stays. The runs keep their
    results; exporting one says when its bundle was pruned."""
    from autodeploy.fleet import jobs
    from autodeploy.results_db.store import Store
    from autodeploy.search.budget import parse_duration

    seconds = parse_duration(older_than, "--older-than")
    with Store.open(jobs.require_postgres(db)) as store:
        pruned, before = jobs.prune(store, seconds, dry_run=dry_run)
    verb = "would remove" if dry_run else "removed"
    out.print(f"{verb} {pruned.blobs} winner bundle(s), {pruned.bytes / 1e6:.1f} MB, of {pruned.runs} run(s) finished "
              f"before {before:%Y-%m-%d %H:%M} UTC")  # fmt: skip
