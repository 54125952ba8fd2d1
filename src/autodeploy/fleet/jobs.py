"""Fleet jobs from the submitter's side: submit a model once, read every device's state, export a winner, cancel.

A job carries the model's bytes and its data's (content-addressed blobs, :func:`ledger.put_blob`) and the
study config keys, validated here as ``tune`` validates them; never code (``--metric`` is refused).
"""

from __future__ import annotations

import asyncio
import io
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autodeploy.adapters.base import TrialConfig
from autodeploy.errors import AutodeployError, UsageError
from autodeploy.fleet import keys, ledger, queue
from autodeploy.report import SCHEMA_VERSION
from autodeploy.results_db.states import JobKind, JobState, JobStatus, RunState

if TYPE_CHECKING:
    from autodeploy.intake import ResolvedModel
    from autodeploy.results_db.store import Store

#: A device silent this long (no heartbeat), its run queued or running, reads as ``lost`` (``--lost-after``).
DEFAULT_LOST_AFTER_S = 1800.0
#: How often ``fleet status --wait`` reads the store.
WAIT_POLL_S = 5.0
#: Device names and tags: letters, digits, '_' and '-' (they name studies and queue entrypoints).
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,62}")
NAME_FIX = "use 1 to 63 letters, digits, '_' or '-', starting with a letter or digit"
#: The study config keys a fleet job may not carry: the agent names the study, the data travels as a blob, one
#: study per device (never per shape), and a metric is code.
REFUSED_KEYS = {"name": "a fleet job names its studies fleet.JOB.DEVICE", "per_shape": "a fleet job runs one study per device",
                "metric": "a metric is code, and a fleet job carries no code"}  # fmt: skip
#: The JSON form of one job's status (``autodeploy fleet status --format json``; ``report.SCHEMA``'s ``fleet``).
SCHEMA_NAME = "autodeploy.fleet"
SQLITE_REFUSED = "autodeploy fleet and agent need PostgreSQL"


def check_name(value: str, what: str) -> str:
    """``value`` when it can name a device or a tag. Raises: UsageError."""
    if not NAME.fullmatch(value):
        raise UsageError(f"{what} {value[:80]!r} is not a valid name", fix=NAME_FIX)
    return value


def check_devices(devices: str) -> str:
    """``all``, ``NAME`` or ``tag:TAG``. Raises: UsageError."""
    if devices != "all":
        check_name(devices.removeprefix("tag:"), "--devices tag" if devices.startswith("tag:") else "--devices")
    return devices


def require_postgres(url: str | None) -> str:
    """The store URL when it is PostgreSQL; SQLite (the single-machine default) is refused in one line.

    Raises:
        UsageError: no URL (the default is a SQLite file), a file path, or a ``sqlite://`` URL.
    """
    import sqlalchemy as sa

    from autodeploy.results_db.connection import ENV_VAR

    given = url or os.environ.get(ENV_VAR)
    fix = "pass --db postgresql+psycopg://USER@HOST/DBNAME (a database every device reaches)"
    if not given or "://" not in given:
        raise UsageError(f"{SQLITE_REFUSED}; the results database is SQLite ({given or 'the default file'})", fix=fix)
    try:
        backend = sa.make_url(given).get_backend_name()
    except (sa.exc.ArgumentError, ValueError):
        return given  # Store.open says what is wrong with it
    if backend != "postgresql":
        shown = sa.make_url(given).render_as_string(hide_password=True)
        raise UsageError(f"{SQLITE_REFUSED}; the results database is {'SQLite' if backend == 'sqlite' else backend} ({shown})", fix=fix)
    return given


def schema_made(url: str) -> bool:
    """Whether the database at ``url`` has autodeploy's schema (a study or a job wrote to it); a database that
    cannot be reached reads as made, so :meth:`Store.open <autodeploy.results_db.store.Store.open>` says why."""
    import sqlalchemy as sa

    from autodeploy.results_db import connection, migrate

    try:
        engine, _ = connection.connect(url, readonly=True)
        try:
            with engine.connect() as conn:
                return migrate.current_revision(conn) is not None
        finally:
            engine.dispose()
    except (sa.exc.SQLAlchemyError, AutodeployError):
        return True


# -- submit -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Submitted:
    job: int
    devices: tuple[str, ...]  # registered devices that took it now (an ``all`` job also goes to later ones)
    model_sha256: str


def submit(model: str | None, *, db: str | None, devices: str = "all", config: str | Path | None = None,
           overrides: Mapping[str, Any] | None = None, data: str | None = None,
           lost_after_s: float = DEFAULT_LOST_AFTER_S, accept_late_s: float = 0.0, profile: str | None = None,
           command: str | None = None) -> Submitted:  # fmt: skip
    """Store ``model`` (and its data) once and queue a run of it on every registered device ``devices`` selects.

    Args:
        model: an ``.onnx``, ``.tflite`` or ``.pt2`` file (one file), or ``zoo:NAME``; else ``model`` in ``config``.
        db: the PostgreSQL results database every agent reaches.
        devices: ``all`` (every device registered now), ``NAME`` (that device, whenever it registers while the job
            is open) or ``tag:TAG``.
        accept_late_s: an ``all`` or ``tag:`` job: a device it selects that registers within this many seconds of
            now takes a run too (``--accept-late 7d``); 0, the default: only the devices registered now (a device
            added next month re-tunes no old job). :func:`close` ends the window early.
        config, overrides: the study config (a YAML file) and the flags over it, as ``tune`` takes them
            (``overrides`` in config keys: ``engines``, ``finalists.count``, ...).
        data: ``--data``: an ``.npz`` or ``.npy`` file, or ``sample:images``.
        lost_after_s: a device silent this long, its run queued or running, reads as lost.
        profile: a **profile job** (``--profile``): measure this one config on every device instead of tuning,
            shown beside each device's own winner: a config label (``openvino/int8/b1/t2``, as ``fleet status``
            names winners) or ``JOB:DEVICE`` (that device's winner in that job).

    Raises:
        UsageError: SQLite, a bad selector, a study config that does not validate or names a refused key
            (``--metric``), a model of several files, data that is not one file.
        ModelError, DataError, StoreError: the model, the data or the database is unusable.
    """
    from autodeploy.adapters import registry
    from autodeploy.api import cache_dir
    from autodeploy.intake import load_source, resolve_model
    from autodeploy.results_db.store import Store
    from autodeploy.search import config as study_config

    url = require_postgres(db)
    check_devices(devices)
    if lost_after_s <= 0:
        raise UsageError(f"--lost-after {lost_after_s:g} is not a positive number of seconds", fix="e.g. --lost-after 1800")
    if accept_late_s < 0:
        raise UsageError(f"--accept-late {accept_late_s:g} is a negative number of seconds", fix="e.g. --accept-late 7d")
    keys = study_config.read(config)
    overrides = {**(overrides or {}), "model": model}
    for key, why in REFUSED_KEYS.items():
        if keys.get(key) or overrides.get(key):
            raise UsageError(f"fleet jobs refuse {key} ({why})", fix=f"drop {key} from the flags and the config")
    cfg = study_config.validate(keys, overrides)
    for name in cfg.engines or ():  # an unknown engine is refused now, not on every device later
        registry.target_of(name)
    resolved = resolve_model(cfg.model, cache_dir=cache_dir())
    model_path = _model_file(cfg.model, resolved)
    data_ref = data or cfg.data
    load_source(data_ref if data_ref is None or data_ref == "sample:images" else _data_file(data_ref), resolved.info)
    options = {k: v for k, v in cfg.model_dump(mode="json").items() if k not in ("model", "name", "data", "metric", "per_shape")}
    with Store.open(url) as store:
        chosen = profile_config(store, profile) if profile is not None else None
        model_sha = ledger.put_blob(store, model_path, f"model {model_path.name}")
        job, runs = ledger.add_job(store, model_name=cfg.model, model_file=safe_file_name(model_path.name), model_sha256=model_sha,
                                   data=_data_blob(store, data_ref, resolved), options=options, devices=devices,
                                   lost_after_s=lost_after_s, command=command, accept_late_s=accept_late_s,
                                   profile=chosen.to_dict() if chosen else None)  # fmt: skip
        asyncio.run(_enqueue(store, [(r.id, r.device) for r in runs]))
    return Submitted(job.id, tuple(r.device for r in runs), model_sha)


def profile_config(store: Store, given: str) -> TrialConfig:
    """The config ``--profile`` names: a label (``openvino/int8/b1/t2``) or ``JOB:DEVICE``, that device's winner in
    that job; its engine must be one autodeploy knows (whether a device runs it, the device says).

    Raises:
        UsageError: a label that does not parse, an unknown engine, or a ``JOB:DEVICE`` with no winner.
    """
    from autodeploy.adapters import registry

    job, sep, device = given.partition(":")
    if sep and job.isdigit():
        run = next((r for r in ledger.runs(store, [int(job)]) if r.device == device), None)
        if run is None or not run.winner:
            why = "has no run on that device" if run is None else f"gave it no winner ({run.state})"
            raise UsageError(f"--profile {given[:80]}: fleet job {job} {why}",
                             fix=f"autodeploy fleet status {job} lists its devices and winners")  # fmt: skip
        given = run.winner["config"]
    config = TrialConfig.from_label(given)
    registry.target_of(config.engine)  # an unknown engine: refused now, not on every device later
    return config


async def _enqueue(store: Store, runs: list[tuple[int, str]]) -> None:
    async with queue.connected(_url(store)) as queries:
        ledger.set_queue_jobs(store, await queue.enqueue(queries, runs))


def _url(store: Store) -> str:
    return store.engine.url.render_as_string(hide_password=False)


def _model_file(ref: str, resolved: ResolvedModel) -> Path:
    """The one file that is the model: the file given (a ``.pt2`` too), or the zoo's ONNX."""
    info = resolved.info
    if info.external_files:
        raise UsageError(f"{ref} keeps its weights in {len(info.external_files)} more file(s) "
                         f"({', '.join(info.external_files[:3])}): a fleet job carries one model file",
                         fix="save the model as one file (ONNX: onnx.save(model, path) without external data)")  # fmt: skip
    given = Path(ref)
    return given if given.is_file() else Path(info.path)


def _data_file(ref: str) -> Path:
    path = Path(ref)
    if not path.is_file() or path.suffix not in (".npz", ".npy"):
        raise UsageError(f"--data {ref}: a fleet job carries data as one .npz or .npy file (or sample:images)",
                         fix="pack the inputs into one .npz (numpy.savez(path, INPUT=array, labels=labels))")  # fmt: skip
    return path


def _data_blob(store: Store, ref: str | None, resolved: ResolvedModel) -> dict[str, Any] | None:
    """The job's data: a file's bytes as a blob, ``sample:images`` by name, a zoo model's own items as an
    ``.npz`` blob (so every device judges accuracy on the same labelled items), or ``None`` (synthetic inputs)."""
    import numpy as np

    if ref == "sample:images":
        return {"ref": ref}
    if ref is not None:
        path = _data_file(ref)
        return {"sha256": ledger.put_blob(store, path, f"--data {path.name}"), "file": safe_file_name(path.name)}
    if resolved.data is None:
        return None
    buffer = io.BytesIO()
    arrays = dict(resolved.data.inputs)
    if resolved.data.labels is not None:
        arrays["labels"] = resolved.data.labels
    np.savez(buffer, **arrays)
    return {"sha256": ledger.put_blob(store, buffer.getvalue(), f"{resolved.info.name}'s data"), "file": "data.npz"}


def safe_file_name(name: str) -> str:
    """A plain file name an agent may write, whatever ``name`` a job row holds: no path, no control characters,
    never ``..``, ``.`` or empty (those name a folder); the suffix is kept, it tells the format (``m.onnx``)."""
    stem, _, suffix = Path(name).name.partition(".")
    stem = re.sub(r"[^A-Za-z0-9_-]+", "-", stem).strip("-") or "model"
    suffix = re.sub(r"\.{2,}", ".", re.sub(r"[^A-Za-z0-9.]+", "", suffix)).strip(".")
    return f"{stem[:80]}.{suffix[:20]}" if suffix else stem[:80]


# -- status -----------------------------------------------------------------------------------------------


def device_state(run: ledger.Run, job: ledger.Job, at: datetime) -> tuple[RunState, str | None]:
    """A run's state as shown: a device silent for the job's ``lost_after_s``, its run queued or running, is
    ``lost`` (the run stays as it is in the store: if the agent comes back, it goes on)."""
    silent = (at - run.heartbeat_at).total_seconds()
    if run.state in (RunState.QUEUED, RunState.RUNNING) and silent > job.lost_after_s:
        return RunState.LOST, (f"agent lost: no heartbeat for {silent:.0f} s (the job's limit is {job.lost_after_s:g} "
                               f"s); its run stays {run.state} and goes on if the agent comes back")  # fmt: skip
    if run.state == RunState.RUNNING and job.state == JobState.CANCELLED:
        return RunState.RUNNING, "cancel requested: the agent stops at its next step"
    return RunState(run.state), run.reason


def record(job: ledger.Job, runs: list[ledger.Run], at: datetime | None = None, *,
           places: Mapping[int, int] | None = None, own: Mapping[str, dict[str, Any]] | None = None) -> dict[str, Any]:  # fmt: skip
    """One job's status as the JSON record ``fleet status --format json`` prints (``report.SCHEMA``).

    ``places``: each queued run's place in its device's line (:func:`ledger.queue_positions`); ``own``: a profile
    job's devices' own winners, by device (:func:`own_winners`), shown beside the profiled config's numbers."""
    from autodeploy.search.config import DEFAULT_TRIALS

    at, places, own = at or ledger.now(), places or {}, own or {}
    budget = None if job.profile else job.options.get("trials", DEFAULT_TRIALS)
    devices = []
    for run in runs:
        state, reason = device_state(run, job, at)
        ended = run.finished_at if RunState(run.state).final else None
        took = ((ended or at) - run.started_at).total_seconds() if run.started_at else None
        devices.append({"device": run.device, "state": state.value, "winner": run.winner, "reason": reason,
                        "heartbeat_age_s": round((at - run.heartbeat_at).total_seconds(), 1), "trials": run.trials,
                        "trials_budget": budget, "phase": run.phase, "queue_position": places.get(run.id),
                        "fingerprint": run.fingerprint, "own_winner": own.get(run.device) if job.profile else None,
                        "vs_own": vs_own(run.winner, own.get(run.device)) if job.profile else None,
                        "attempts": run.attempts, "skipped": run.skipped, "study": run.study,
                        "created_at": _iso(run.created_at), "started_at": _iso(run.started_at),
                        "finished_at": _iso(ended), "duration_s": round(took, 1) if took is not None else None})  # fmt: skip
    state = JobState.UNREADABLE if job.problem else JobState(job.state)
    late = job.accept_late_until.isoformat() if job.takes_late(at) and job.accept_late_until else None
    profile = TrialConfig.from_dict(job.profile).label() if job.profile else None
    return {"schema": SCHEMA_NAME, "schema_version": SCHEMA_VERSION, "job": job.id, "model": job.model_name,
            "model_sha256": job.model_sha256, "selects": job.devices, "state": state.value,
            "kind": JobKind.PROFILE.value if job.profile else JobKind.TUNE.value, "profile": profile,
            "status": JobStatus.of(state, [RunState(d["state"]) for d in devices]).value, "reason": job.problem,
            "created_at": job.created_at.isoformat(), "accepts_late_until": late, "devices": devices}  # fmt: skip


def vs_own(profiled: dict[str, Any] | None, own: dict[str, Any] | None) -> dict[str, Any] | None:
    """What the profiled config costs a device beside its own winner, in the winner's statistic (a profile keeps
    every statistic: ``values``): ``{"statistic", "ratio"}``, ratio > 1: the profiled config is that many times
    slower here (ms: profiled / own; items/s: own / profiled); ``None`` where either number is missing."""
    from autodeploy.objectives import STATISTICS

    if not (profiled and own and own.get("value")):
        return None
    name = own["statistic"]
    value = (profiled.get("values") or {}).get(name)
    if not value or name not in STATISTICS:  # a winner of screening values alone may name no round statistic
        return None
    ratio = value / own["value"] if STATISTICS[name].unit == "ms" else own["value"] / value
    return {"statistic": name, "ratio": round(ratio, 4), "own_job": own.get("job")}


def own_winners(jobs: list[ledger.Job], runs: list[ledger.Run], model_sha256: str) -> dict[str, dict[str, Any]]:
    """Each device's own winner for the model ``model_sha256``: its winner in the latest tune job of that model
    (not a profile job) that gave it one, with ``job`` added; what a profile job's numbers are set beside."""
    tuned = {j.id for j in jobs if j.model_sha256 == model_sha256 and not j.profile}
    found: dict[str, dict[str, Any]] = {}
    for run in sorted((r for r in runs if r.job_id in tuned and r.winner), key=lambda r: r.job_id):
        found[run.device] = {**run.winner, "job": run.job_id}  # type: ignore[dict-item]  # the latest job wins
    return found


def _iso(ts: datetime | None) -> str | None:
    return ts.isoformat() if ts is not None else None


def status(store: Store, job_id: int | None = None) -> list[dict[str, Any]]:
    """Every job's status record (or one job's), oldest first."""
    chosen = [ledger.job(store, job_id)] if job_id is not None else ledger.jobs(store)
    every = ledger.jobs(store) if any(j.profile for j in chosen) else chosen  # a profile job reads its model's tunes
    runs = ledger.runs(store, [j.id for j in every])
    places, at = ledger.queue_positions(store), ledger.now()
    return [record(j, [r for r in runs if r.job_id == j.id], at, places=places,
                   own=own_winners(every, runs, j.model_sha256) if j.profile else None) for j in chosen]  # fmt: skip


def wait(store: Store, job_id: int, poll_s: float = WAIT_POLL_S,
         seen: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:  # fmt: skip
    """Read job ``job_id``'s status every ``poll_s`` until it is over (:attr:`JobStatus.over`: every run done,
    failed, skipped or cancelled, or its device lost) and return that last record; ``seen`` is told each one.

    Raises:
        UsageError: no such job.
    """
    while True:
        (found,) = status(store, job_id)
        if seen is not None:
            seen(found)
        if JobStatus(found["status"]).over:
            return found
        time.sleep(poll_s)


# -- devices ----------------------------------------------------------------------------------------------

#: A device whose agent beat within this many seconds reads online (an agent beats every 10 s at most).
ONLINE_S = 60.0


def devices(store: Store, *, retired: bool = False) -> list[dict[str, Any]]:
    """Every device of the fleet (``fleet devices``), as JSON-ready records: its name, tags, fingerprint and the other
    names that share it (two agents on one machine), CPU and ISA flags, each engine's availability as its agent
    probed it, autodeploy's version, its last heartbeat, online or offline, and the run it is on. Retired devices
    (``fleet forget``) only with ``retired``."""
    at, agents = ledger.now(), ledger.agents(store)
    infos = ledger.device_infos(store)
    running = {r.device: r for r in ledger.runs(store) if r.state == RunState.RUNNING}
    shown = []
    for agent in agents:
        if agent.retired_at is not None and not retired:
            continue
        age = (at - agent.heartbeat_at).total_seconds()
        run = running.get(agent.name)
        shown.append({"name": agent.name, "tags": list(agent.tags), "fingerprint": agent.fingerprint,
                      "same_machine_as": [a.name for a in agents if a.fingerprint == agent.fingerprint and a is not agent],
                      "cpu": agent.cpu, "isa": list(infos.get(agent.name, {}).get("isa", [])), "engines": agent.engines,
                      "version": agent.version, "heartbeat_age_s": round(age, 1), "online": age <= ONLINE_S,
                      "running": {"job": run.job_id, "study": run.study, "trials": run.trials} if run else None,
                      "retired_at": agent.retired_at.isoformat() if agent.retired_at else None})  # fmt: skip
    return shown


def forget(store: Store, name: str) -> list[int]:
    """Retire the device ``name`` (:func:`ledger.retire`) and withdraw its queued runs from the queue; returns the
    runs cancelled.

    Raises:
        UsageError: no such device, or it is running a run now.
    """
    cancelled, withdrawn = ledger.retire(store, name)
    _withdraw(store, withdrawn)
    return cancelled


def _withdraw(store: Store, queue_jobs: list[int]) -> None:
    """Take these entries out of the queue (runs the store has just cancelled)."""

    async def take_out() -> None:
        async with queue.connected(_url(store)) as queries:
            await queue.withdraw(queries, queue_jobs)

    if queue_jobs:
        asyncio.run(take_out())


# -- export, cancel and close ------------------------------------------------------------------------------


def export(store: Store, job_id: int, device: str, output: str | Path, *,
           trust: str | Path | None = None) -> tuple[Path, dict[str, Any]]:  # fmt: skip
    """Write ``device``'s winner bundle of job ``job_id`` from the store to the new folder ``output``, verified.

    Without ``trust`` that is integrity only: the bundle is the one the run row names, and its files are the
    ones its manifest lists, but anyone who can write the database can write both. With ``trust`` (the device's
    PEM public key, :mod:`autodeploy.fleet.keys`) the run's result (winner, bundle SHA-256, job, run, device,
    model) must carry the device key's signature, and the bundle its model-signing signature by that key.

    Returns:
        The bundle folder and its manifest.

    Raises:
        UsageError: no such job, device or winner; ``output`` exists.
        StoreError: the stored bundle does not match its SHA-256, or was pruned (``fleet prune``: submit again).
        BundleError: the bundle fails its checks; with ``trust``, the result or the bundle is not signed by it.
        KeyFileError: ``trust`` is not a PEM elliptic-curve public key.
    """
    from autodeploy.bundle import safe_extract, verify
    from autodeploy.bundle.loader import check_key

    job = ledger.job(store, job_id)
    run = next((r for r in ledger.runs(store, [job_id]) if r.device == device), None)
    if run is None:
        raise UsageError(f"device {device!r} has no run of fleet job {job_id}", fix=f"see autodeploy fleet status {job_id}")
    if run.bundle_sha256 is None:
        raise UsageError(f"device {device!r} has no winner bundle for fleet job {job_id} (state {run.state})",
                         fix=f"see autodeploy fleet status {job_id}")  # fmt: skip
    output = Path(output)
    if output.exists():
        raise UsageError(f"{output} already exists", fix="choose a new folder for -o")
    if trust is not None:
        check_result(job, run, check_key(trust, private=False))  # before a byte of the bundle is read
    scratch = Path(tempfile.mkdtemp(prefix=f".{output.name}.", dir=output.parent if output.parent.is_dir() else None))
    try:
        archive = ledger.get_blob(store, run.bundle_sha256, scratch / "bundle.tar.gz", "winner bundle")
        root = safe_extract(archive, scratch / "extracted")
        manifest = verify(root, trust=trust)
        output.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(root), str(output))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return output, manifest


def check_result(job: ledger.Job, run: ledger.Run, public_key: Path) -> None:
    """Raises: BundleError: the run's result is not signed by the device key ``public_key`` (a winner or bundle
    changed in the database, a result planted there, or one another key made)."""
    from autodeploy.bundle.loader import BundleError

    record = keys.result_record(job=job.id, run=run.id, device=run.device, model_sha256=job.model_sha256,
                                winner=run.winner, bundle_sha256=run.bundle_sha256)  # fmt: skip
    fault = keys.result_fault(public_key, record, run.signature)
    if fault is not None:
        raise BundleError(f"the result of device {run.device!r} for fleet job {job.id} is not signed by {public_key}: {fault}; "
                          "its winner or bundle was changed in the results database, or another key made it",
                          fix="do not use it; check that --trust is this device's key (its agent prints where it is), "
                          "and find who writes the database outside the agents")  # fmt: skip


def prune(store: Store, older_than_s: float, *, dry_run: bool = False) -> tuple[ledger.Pruned, datetime]:
    """Remove the stored winner bundles of runs that finished more than ``older_than_s`` ago (``fleet prune``),
    never one a newer run or a job still names (:func:`ledger.prune`); with ``dry_run``, only count them.
    Returns what was (or would be) removed and the cut-off."""
    before = ledger.now() - timedelta(seconds=older_than_s)
    return ledger.prune(store, before, dry_run=dry_run), before


def close(store: Store, job_id: int) -> ledger.Job:
    """No device registering from now on takes job ``job_id`` (its ``--accept-late`` window ends); its runs go on.

    Raises:
        UsageError: no such job.
    """
    return ledger.close(store, job_id)


def cancel(store: Store, job_id: int) -> list[ledger.Run]:
    """Cancel job ``job_id``: queued runs at once (withdrawn from the queue), running ones by their agents.
    Returns its runs as the cancel left them (those ``running`` stop at their agent's next step)."""
    runs, withdrawn = ledger.cancel(store, job_id)
    _withdraw(store, withdrawn)
    return runs
