"""The fleet's record in the results store: agents, jobs, one run per job and device, shared blobs.

The store, not the agent, is the record: every state an agent reaches is written here before it goes on,
so a killed agent leaves its run as it was (``running``) and whoever takes it back reads where it stood.
SQLAlchemy Core and ORM over :mod:`autodeploy.results_db.schema`; every value a bound parameter.
"""

from __future__ import annotations

import hashlib
import io
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from autodeploy.errors import AutodeployError, StoreError, UsageError
from autodeploy.fleet import readback
from autodeploy.results_db import rows
from autodeploy.results_db.records import DeviceRecord
from autodeploy.results_db.schema import FleetAgent, FleetBlob, FleetBlobChunk, FleetJob, FleetRun
from autodeploy.results_db.states import JobState, RunState

if TYPE_CHECKING:
    from autodeploy.results_db.store import Store
    from autodeploy.runtime.device import DeviceInfo



class StaleRun(AutodeployError):
    """A run write from an agent whose attempt is over: another agent took the run since (this one's lease
    lapsed while it was stopped or cut off), so the write is refused and the agent stops."""

    def __init__(self, run_id: int, attempt: int, current: tuple[int, str] | None) -> None:
        self.run_id, self.attempt, self.current = run_id, attempt, current
        held = f"attempt {current[0]}, now {current[1]}" if current else "the run is gone"
        super().__init__(f"run {run_id} was taken over by another agent ({held}); this agent's attempt {attempt} "
                         "stopped and wrote nothing to it")  # fmt: skip


class ForeignRun(AutodeployError):
    """A queue entry names a run of another device: this agent refuses it and runs nothing."""


@dataclass(frozen=True)
class Agent:
    id: int
    name: str
    fingerprint: str
    cpu: str
    tags: tuple[str, ...]
    engines: dict[str, str]
    version: str
    heartbeat_at: datetime
    #: PEM: the device's identity (fleet/keys.py); None for a row made before keys.
    public_key: str | None = None
    registered_at: datetime | None = None
    #: When ``fleet forget`` retired it (:func:`retire`); ``None``: in service.
    retired_at: datetime | None = None


@dataclass(frozen=True)
class Job:
    id: int
    model_name: str
    model_file: str
    model_sha256: str
    data: dict[str, Any] | None
    options: dict[str, Any]
    devices: str
    lost_after_s: float
    state: JobState
    created_at: datetime
    #: Why the row is unreadable (its options or data are not what ``fleet submit`` writes), else ``None``.
    problem: str | None = None
    #: Until when a device registering after the submission takes a run of it; ``None``: none does.
    accept_late_until: datetime | None = None
    #: A profile job's one config (``TrialConfig.to_dict``: measured, not tuned, on every device); ``None``: it tunes.
    profile: dict[str, Any] | None = None

    def takes_late(self, at: datetime) -> bool:
        """Whether a device registering at ``at`` takes a run of it: open, and inside its ``--accept-late`` window."""
        return self.state == JobState.OPEN and self.accept_late_until is not None and at <= self.accept_late_until


@dataclass(frozen=True)
class Run:
    """One job on one device, with its agent's name and last heartbeat."""

    id: int
    job_id: int
    device: str
    study: str
    state: RunState
    attempts: int
    trials: int
    winner: dict[str, Any] | None
    bundle_sha256: str | None
    reason: str | None
    skipped: list[dict[str, str]]
    heartbeat_at: datetime
    queue_job: int | None = None
    signature: str | None = None  # the device key's, over its result (fleet/keys.py)
    #: When the run was made, first taken and ended (``None``: not yet).
    created_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    #: Where a running run's study stands (:class:`~autodeploy.results_db.states.RunPhase` words, ``screening 3/12``); ``None`` when not running.
    phase: str | None = None
    fingerprint: str = ""  # the device's (another name on the same machine shares it)


def now() -> datetime:
    return datetime.now(timezone.utc)


def study_name(job_id: int, device: str) -> str:
    """``fleet.JOB.DEVICE``: one study per job and device (a study name may not hold '/', so dots)."""
    return f"fleet.{job_id}.{device}"


def selects(devices: str, agent: Agent) -> bool:
    """Whether a job's ``--devices`` (``all``, ``NAME`` or ``tag:TAG``) takes this agent."""
    if devices == "all":
        return True
    if devices.startswith("tag:"):
        return devices[4:] in agent.tags
    return devices == agent.name


# -- plumbing ---------------------------------------------------------------------------------------------


def _agent(a: FleetAgent) -> Agent:
    return Agent(a.id, a.name, a.fingerprint, a.cpu, tuple(a.tags), dict(a.engines), a.version, rows.utc(a.heartbeat_at),
                 a.public_key, rows.utc(a.registered_at) if a.registered_at else None,
                 rows.utc(a.retired_at) if a.retired_at else None)  # fmt: skip


def _job(j: FleetJob) -> Job:
    # options and data are JSON any database writer could have planted: checked, and a bad row reads unreadable, alone
    problem = readback.job_problem(j.id, options=j.options, data=j.data, profile=j.profile)
    options, data, profile = (dict(j.options), j.data, j.profile) if problem is None else ({}, None, None)
    late = rows.utc(j.accept_late_until) if j.accept_late_until is not None else None
    return Job(j.id, j.model_name, j.model_file, j.model_sha256, data, options, j.devices, j.lost_after_s,
               JobState(j.state), rows.utc(j.created_at), problem, late, profile)  # fmt: skip


def _run(r: FleetRun, a: FleetAgent) -> Run:
    # every value any database writer could have planted, checked: a row that does not fit reads unreadable, alone
    v = readback.run_values(r.id, r.job_id, device=a.name, study=r.study, state=r.state, reason=r.reason,
                            winner=r.winner, skipped=r.skipped, phase=r.phase)  # fmt: skip
    def at(ts: datetime | None) -> datetime | None:
        return rows.utc(ts) if ts is not None else None

    return Run(r.id, r.job_id, v.device, v.study, v.state, r.attempts, r.trials, v.winner, r.bundle_sha256, v.reason,
               v.skipped, rows.utc(a.heartbeat_at), r.queue_job, r.signature, at(r.created_at), at(r.started_at),
               at(r.finished_at), v.phase if v.state == RunState.RUNNING else None, a.fingerprint)  # fmt: skip


# -- blobs ------------------------------------------------------------------------------------------------


#: The bytes of one ``ad_fleet_blob_chunks`` row: a blob is read, hashed and written a chunk at a time, so a large
#: model never sits whole in memory, nor in one statement.
BLOB_CHUNK_BYTES = 4 * 2**20
#: The largest blob stored. Chunks lift bytea's limit on one row, but not on one value: PostgreSQL checks a stored
#: blob's SHA-256 over its chunks joined (:func:`_stored_digest`), which holds at most 1 GB; and every device
#: downloads the blob for every job. A model this big is tuned on the device itself.
MAX_BLOB_BYTES = 2**30 - 2**20


def put_blob(store: Store, source: Path | bytes, what: str = "a file") -> str:
    """Store the file ``source`` (or these bytes) once, under its SHA-256; returns the digest. The bytes are read,
    hashed and written :data:`BLOB_CHUNK_BYTES` at a time, in one transaction. A blob already stored under the
    digest is kept as it is (a second copy is not written), unless its bytes no longer hash to it (damaged,
    tampered with) or were pruned: then they are written anew.

    Raises:
        UsageError: ``source`` is larger than :data:`MAX_BLOB_BYTES`.
        StoreError: the file changed while it was stored (it no longer hashes to what was read first); nothing stored.
    """
    size = source.stat().st_size if isinstance(source, Path) else len(source)
    if size > MAX_BLOB_BYTES:
        raise UsageError(f"{what} has {size:,} bytes: a fleet job stores at most {MAX_BLOB_BYTES:,}",
                         fix="tune it on the device itself (autodeploy tune --db URL)")  # fmt: skip
    digest = _hashed(source, lambda chunk: None)  # first: a blob stored already is not sent again

    def insert(s: Session) -> None:
        row = s.scalar(sa.select(FleetBlob).where(FleetBlob.sha256 == digest).with_for_update())
        sound = row is not None and row.pruned_at is None and row.size == size
        if sound and _stored_digest(s, digest) == digest:
            return
        if row is None:
            s.add(FleetBlob(sha256=digest, size=size))
            s.flush()
        else:  # else "submit the job again" would find the damaged (or pruned) blob and keep it
            row.size, row.pruned_at = size, None
            s.execute(sa.delete(FleetBlobChunk).where(FleetBlobChunk.sha256 == digest))
        seqs = itertools.count()

        def write(chunk: bytes) -> None:  # sent now, one statement a chunk (Core: the session keeps no copy)
            s.execute(sa.insert(FleetBlobChunk).values(sha256=digest, seq=next(seqs), data=chunk))

        written = _hashed(source, write)
        if written != digest:
            raise StoreError(f"{what} changed while it was stored in results database {store.url} (its SHA-256 read "
                             f"{digest[:12]}, then {written[:12]}); nothing stored", fix="store it again once nothing writes to it")  # fmt: skip

    try:
        store.transaction("cannot store a blob in", insert, write=True)
    except sa.exc.IntegrityError:  # another process stored the same bytes at once
        pass
    return digest


def _hashed(source: Path | bytes, each: Callable[[bytes], object]) -> str:
    """The SHA-256 of ``source``, read :data:`BLOB_CHUNK_BYTES` at a time, each chunk handed to ``each``."""
    digest = hashlib.sha256()
    with open(source, "rb") if isinstance(source, Path) else io.BytesIO(source) as f:
        for chunk in iter(lambda: f.read(BLOB_CHUNK_BYTES), b""):
            digest.update(chunk)
            each(chunk)
    return digest.hexdigest()


def _chunks(s: Session, digest: str) -> Iterator[bytes]:
    """The blob's chunks in order, one query (and one chunk in memory) at a time."""
    mine = FleetBlobChunk.sha256 == digest
    for seq in s.scalars(sa.select(FleetBlobChunk.seq).where(mine).order_by(FleetBlobChunk.seq)).all():
        yield s.scalar(sa.select(FleetBlobChunk.data).where(mine, FleetBlobChunk.seq == seq))


def _stored_digest(s: Session, digest: str) -> str:
    """The SHA-256 the chunks stored under ``digest`` hash to now, joined in order. PostgreSQL hashes them where
    they are; SQLite, which cannot, sends them."""
    if s.get_bind().dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import aggregate_order_by

        none = sa.literal(b"", sa.LargeBinary)
        joined = sa.func.string_agg(FleetBlobChunk.data, aggregate_order_by(none, FleetBlobChunk.seq))
        # no chunk at all: the empty blob
        hashed = sa.func.encode(sa.func.sha256(sa.func.coalesce(joined, none)), "hex")
        return str(s.scalar(sa.select(hashed).where(FleetBlobChunk.sha256 == digest)))
    hashed = hashlib.sha256()
    for chunk in _chunks(s, digest):
        hashed.update(chunk)
    return hashed.hexdigest()


def get_blob(store: Store, digest: str, path: Path, what: str) -> Path:
    """Write the blob stored under ``digest`` to the file ``path`` a chunk at a time, hashing as it goes; refused
    unless the bytes hash to ``digest``. On any failure nothing is left at ``path``.

    Raises:
        StoreError: no such blob, it was pruned (``fleet prune``), or its bytes were changed (tampered with, or
            damaged) since stored.
        OSError: ``path`` cannot be written (the caller names the disk).
    """

    def copy(s: Session) -> str:
        row = s.get(FleetBlob, digest)
        if row is None:
            raise StoreError(f"{what} {digest[:12]} is not in results database {store.url}",
                             fix="submit the job again (autodeploy fleet submit)")  # fmt: skip
        if row.pruned_at is not None:
            raise StoreError(f"{what} {digest[:12]} was pruned from results database {store.url} on "
                             f"{rows.utc(row.pruned_at):%Y-%m-%d %H:%M} UTC (autodeploy fleet prune)",
                             fix="submit the job again (autodeploy fleet submit): its devices tune it anew and store new bundles")  # fmt: skip
        hashed = hashlib.sha256()
        with open(path, "wb") as f:
            for chunk in _chunks(s, digest):
                hashed.update(chunk)
                f.write(chunk)
        return hashed.hexdigest()

    try:
        got = store.transaction("cannot read", copy)
        if got != digest:
            raise StoreError(f"{what} {digest[:12]} in results database {store.url} does not match its SHA-256 "
                             f"(it reads {got[:12]}): changed or damaged since it was stored; not used",
                             fix="submit the job again, so its bytes are stored anew")  # fmt: skip
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return path


@dataclass(frozen=True)
class Pruned:
    """What :func:`prune` removed (or, dry, would remove)."""

    blobs: int
    bytes: int
    runs: int  # the runs whose bundle it was


def prune(store: Store, before: datetime, *, dry_run: bool = False) -> Pruned:
    """Remove the bytes of the winner bundles of runs that finished before ``before`` (``fleet prune``). A bundle
    that a run not over, or one finished since, names stays, and so does any blob a job names (its model, its
    data). The blob's row stays with ``pruned_at``: the runs keep its digest (their signed result names it), and
    :func:`get_blob` says when it was pruned."""
    named = FleetRun.bundle_sha256.is_not(None)
    old = sa.select(FleetRun.bundle_sha256).where(named, FleetRun.finished_at < before)
    since = sa.or_(FleetRun.finished_at.is_(None), FleetRun.finished_at >= before)
    newer = sa.select(FleetRun.bundle_sha256).where(named, since)
    data = FleetJob.data["sha256"].as_string()
    # every job's model and data; never a NULL (NOT IN a list holding one is never true)
    inputs = sa.union(sa.select(FleetJob.model_sha256), sa.select(data).where(data.is_not(None)))
    query = sa.select(FleetBlob).where(FleetBlob.sha256.in_(old), FleetBlob.sha256.not_in(newer),
                                       FleetBlob.sha256.not_in(inputs), FleetBlob.pruned_at.is_(None))  # fmt: skip

    def update(s: Session) -> Pruned:
        found = s.scalars(query.order_by(FleetBlob.sha256) if dry_run else query.with_for_update()).all()
        digests = [b.sha256 for b in found]
        runs = s.scalar(sa.select(sa.func.count()).where(FleetRun.bundle_sha256.in_(digests)))
        if not dry_run and digests:
            s.execute(sa.delete(FleetBlobChunk).where(FleetBlobChunk.sha256.in_(digests)))
            s.execute(sa.update(FleetBlob).where(FleetBlob.sha256.in_(digests)).values(pruned_at=now()))
        return Pruned(len(found), sum(b.size for b in found), int(runs or 0))

    return store.transaction("cannot prune", update, write=not dry_run)


# -- agents -----------------------------------------------------------------------------------------------


def _refuse(name: str, bound: tuple[str, str], device: DeviceRecord) -> UsageError:
    return UsageError(f"device name {name!r} is registered with fingerprint {bound[0]} ({bound[1]}); this machine is "
                      f"{device.fingerprint} ({device.cpu}): results never mix devices", fix="give this machine its own --name")  # fmt: skip


def _check_bound(name: str, row: FleetAgent | None, record: DeviceRecord, public_key: str | None) -> None:
    """The device key is the identity: a name registered with another public key is refused; then, as a second
    check, one registered with another fingerprint. A row made before keys (none) takes the key it is given."""
    if row is None:
        return
    if public_key is not None and row.public_key is not None and row.public_key.strip() != public_key.strip():
        from autodeploy.fleet.keys import NEW_NAME, key_id

        raise UsageError(f"device name {name!r} is registered with another device key ({key_id(row.public_key)}); this "
                         f"machine's key is {key_id(public_key)}: a name is one device, and only its key speaks for it",
                         fix=NEW_NAME)  # fmt: skip
    if row.fingerprint != record.fingerprint:
        raise _refuse(name, (row.fingerprint, row.cpu), record)


def check_binding(store: Store, name: str, device: DeviceInfo, public_key: str | None = None) -> None:
    """Raises: UsageError: ``name`` is registered with another public key, or another device fingerprint."""
    record = DeviceRecord.of(device)
    query = sa.select(FleetAgent).where(FleetAgent.name == name)
    store.transaction("cannot read", lambda s: _check_bound(name, s.scalar(query), record, public_key))


def register(store: Store, name: str, device: DeviceInfo, engines: dict[str, str], tags: tuple[str, ...],
             version: str, public_key: str | None = None) -> Agent:  # fmt: skip
    """Register (or refresh) the device ``name`` of this machine with its ``public_key`` (PEM, fleet/keys.py); a
    name bound to another public key, or another fingerprint, is refused.

    Raises:
        UsageError: ``name`` is registered with another device key or fingerprint (results never mix devices).
    """
    record = DeviceRecord.of(device)

    def upsert(s: Session) -> Agent:
        row = s.scalar(sa.select(FleetAgent).where(FleetAgent.name == name).with_for_update())
        _check_bound(name, row, record, public_key)
        if row is None:
            row = FleetAgent(name=name, fingerprint=record.fingerprint, device_id=rows.device_id(s, record), cpu=record.cpu,
                             engines=engines, tags=list(tags), version=version, public_key=public_key)  # fmt: skip
            s.add(row)
        else:
            row.engines, row.tags, row.version, row.heartbeat_at = engines, list(tags), version, now()
            row.public_key, row.retired_at = row.public_key or public_key, None  # a retired device that comes back serves
        s.flush()
        return _agent(row)

    try:
        return store.transaction(f"cannot register device {name!r} in", upsert, write=True)
    except sa.exc.IntegrityError:  # the same name registered at once by another process: read it now
        return store.transaction(f"cannot register device {name!r} in", upsert, write=True)


def beat(store: Store, agent_id: int) -> None:
    """The agent is alive now."""
    beating = sa.update(FleetAgent).where(FleetAgent.id == agent_id).values(heartbeat_at=now())
    store.transaction("cannot write to", lambda s: s.execute(beating), write=True)


def agents(store: Store) -> list[Agent]:
    query = sa.select(FleetAgent).order_by(FleetAgent.id)
    return store.transaction("cannot read", lambda s: [_agent(a) for a in s.scalars(query)])


def device_infos(store: Store) -> dict[str, dict[str, Any]]:
    """Each device's probe as it registered (``DeviceInfo.to_dict``: CPU, ISA flags, GPUs, ...), by device name."""
    from autodeploy.results_db.schema import Device

    query = sa.select(FleetAgent.name, Device.info).join(Device, FleetAgent.device_id == Device.id)
    return store.transaction("cannot read", lambda s: {name: dict(info or {}) for name, info in s.execute(query)})


def retire(store: Store, name: str) -> tuple[list[int], list[int]]:
    """Retire the device ``name`` (``fleet forget``): no job selects it from now on, and its queued runs are
    cancelled (their jobs read over without it). Its finished runs, their results and bundles, stay. Returns the
    runs cancelled and the queue's job ids to withdraw. An agent registering under the name again puts it back.

    Raises:
        UsageError: no such device, or it is running a run now (stop its agent first).
    """

    def update(s: Session) -> tuple[list[int], list[int]]:
        row = s.scalar(sa.select(FleetAgent).where(FleetAgent.name == name).with_for_update())
        if row is None:
            raise UsageError(f"no fleet device {name!r}", fix="see autodeploy fleet devices")
        mine = s.scalars(sa.select(FleetRun).where(FleetRun.agent_id == row.id, FleetRun.state.not_in(RunState.finals())))
        runs = list(mine)
        if any(r.state == RunState.RUNNING for r in runs):
            raise UsageError(f"device {name!r} is running a fleet run now", fix=f"stop its agent first, then forget {name}")
        for run in runs:
            run.state, run.finished_at, run.reason = RunState.CANCELLED.value, now(), "its device was retired (fleet forget)"
        row.retired_at = now()
        s.flush()
        return [r.id for r in runs], [r.queue_job for r in runs if r.queue_job is not None]

    return store.transaction("cannot write to", update, write=True)


# -- jobs and runs ----------------------------------------------------------------------------------------


def add_job(store: Store, *, model_name: str, model_file: str, model_sha256: str, data: dict[str, Any] | None,
            options: dict[str, Any], devices: str, lost_after_s: float, command: str | None,
            accept_late_s: float = 0.0, profile: dict[str, Any] | None = None) -> tuple[Job, list[Run]]:  # fmt: skip
    """Store a job and a queued run for every registered agent it selects, in one transaction; a device registering
    later takes one only within ``accept_late_s`` of now (0: none does). ``profile``: the one config a profile job
    measures (``TrialConfig.to_dict``), else the job tunes."""

    def insert(s: Session) -> tuple[Job, list[Run]]:
        late = now() + timedelta(seconds=accept_late_s) if accept_late_s > 0 else None
        job = FleetJob(model_name=model_name, model_file=model_file, model_sha256=model_sha256, data=data,
                       options=options, devices=devices, lost_after_s=lost_after_s, state=JobState.OPEN.value,
                       command=command, accept_late_until=late, profile=profile)  # fmt: skip
        s.add(job)
        s.flush()
        serving = sa.select(FleetAgent).where(FleetAgent.retired_at.is_(None)).order_by(FleetAgent.id)
        made = [_add_run(s, job, a) for a in s.scalars(serving) if selects(devices, _agent(a))]
        return _job(job), made

    return store.transaction("cannot store a fleet job in", insert, write=True)


def _add_run(s: Session, job: FleetJob, agent: FleetAgent) -> Run:
    run = FleetRun(job_id=job.id, agent_id=agent.id, study=study_name(job.id, agent.name),
                   state=RunState.QUEUED.value)
    s.add(run)
    s.flush()
    return _run(run, agent)


def adopt(store: Store, agent: Agent) -> list[Run]:
    """Give ``agent`` a run of every open job that selects it and has none for it yet, submitted before it
    registered: one naming it (``--devices NAME``: the user meant this device), or an ``all`` or ``tag:`` job that
    still takes late devices (:meth:`Job.takes_late`: its ``--accept-late`` window); returns every run of it that
    is not over (queued or running)."""

    def fetch(s: Session) -> list[Run]:
        me = s.get_one(FleetAgent, agent.id)
        have = sa.select(FleetRun.job_id).where(FleetRun.agent_id == agent.id)
        late = sa.select(FleetJob).where(FleetJob.state == JobState.OPEN.value, FleetJob.id.not_in(have),
                                         sa.or_(FleetJob.accept_late_until >= now(), FleetJob.devices == agent.name))  # fmt: skip
        for job in s.scalars(late):
            if selects(job.devices, agent):
                _add_run(s, job, me)
        query = sa.select(FleetRun).where(FleetRun.agent_id == agent.id, FleetRun.state.not_in(RunState.finals()))
        return [_run(r, me) for r in s.scalars(query.order_by(FleetRun.id))]

    try:
        return store.transaction("cannot read", fetch, write=True)
    except sa.exc.IntegrityError:  # two processes of one name adopted at once: the other made the runs
        return store.transaction("cannot read", fetch, write=True)


def set_queue_jobs(store: Store, queued: dict[int, int]) -> None:
    """Remember the queue's job id of each run (``{run id: queue job id}``), so a cancel can withdraw it."""

    def update(s: Session) -> None:
        for run_id, queue_job in queued.items():
            s.execute(sa.update(FleetRun).where(FleetRun.id == run_id).values(queue_job=queue_job))

    store.transaction("cannot write to", update, write=True)


def job(store: Store, job_id: int) -> Job:
    """Raises: UsageError: no such job."""
    found = store.transaction("cannot read", lambda s: (lambda j: j and _job(j))(s.get(FleetJob, job_id)))
    if found is None:
        raise UsageError(f"no fleet job {job_id} in results database {store.url}", fix="see autodeploy fleet status")
    return found


def jobs(store: Store) -> list[Job]:
    query = sa.select(FleetJob).order_by(FleetJob.id)
    return store.transaction("cannot read", lambda s: [_job(j) for j in s.scalars(query)])


def runs(store: Store, job_ids: list[int] | None = None) -> list[Run]:
    """The runs of these jobs (every job's with ``None``), by job then device name."""
    return store.transaction("cannot read", lambda s: _runs(s, job_ids))


def _runs(s: Session, job_ids: list[int] | None) -> list[Run]:
    query = sa.select(FleetRun, FleetAgent).join(FleetAgent, FleetRun.agent_id == FleetAgent.id)
    if job_ids is not None:
        query = query.where(FleetRun.job_id.in_(job_ids))
    return [_run(r, a) for r, a in s.execute(query.order_by(FleetRun.job_id, FleetAgent.name))]


def take(store: Store, run_id: int, agent: Agent) -> tuple[Run, Job] | None:
    """Mark the run ``running`` for ``agent``, which took it from the queue, or ``None`` when there is nothing to
    do: it is over, or its job was cancelled (the run is then marked cancelled). The run returned carries the
    attempt it was taken with (``attempts``, one more than before): every later write of it names that attempt
    and is refused once another agent took the run since (:class:`StaleRun`).

    Raises:
        ForeignRun: the run is another device's (a forged queue entry): nothing is changed, nothing is run.
    """

    def update(s: Session) -> tuple[Run, Job] | None:
        run = s.scalar(sa.select(FleetRun).where(FleetRun.id == run_id).with_for_update())
        if run is not None and run.agent_id != agent.id:
            owner = s.get_one(FleetAgent, run.agent_id).name
            raise ForeignRun(f"run {run_id} belongs to device {owner!r}, not to {agent.name!r}: refused, nothing run "
                             "(a queue entry of this device named another device's run)")  # fmt: skip
        if run is None or RunState(run.state).final:
            return None
        job = s.get_one(FleetJob, run.job_id)
        if job.state == JobState.CANCELLED:
            run.state, run.finished_at, run.reason = RunState.CANCELLED.value, now(), "the job was cancelled"
            return None
        # a run taken back after its agent stopped says so; the requeue's reason ("it resumes when ...") is over
        resumed = f"resumed after its agent stopped (attempt {run.attempts + 1})" if run.started_at else None
        run.state, run.attempts, run.queue_job, run.reason = RunState.RUNNING.value, run.attempts + 1, None, resumed
        run.started_at = run.started_at or now()
        s.flush()
        return _run(run, s.get_one(FleetAgent, run.agent_id)), _job(job)

    return store.transaction("cannot write to", update, write=True)


def _fenced(store: Store, run: Run, **values: Any) -> None:
    """Write ``values`` to the run only while it is still ``running`` under the attempt it was taken with.

    Raises:
        StaleRun: another agent took the run since (or it is over): nothing is written.
    """

    def update(s: Session) -> None:
        held = (FleetRun.id == run.id, FleetRun.attempts == run.attempts, FleetRun.state == RunState.RUNNING.value)
        if s.execute(sa.update(FleetRun).where(*held).values(**values)).rowcount == 0:
            raise StaleRun(run.id, run.attempts, _held(s, run.id))

    store.transaction("cannot write to", update, write=True)


def _held(s: Session, run_id: int) -> tuple[int, str] | None:
    """The run's attempt and state now (``None``: no such run)."""
    found = s.execute(sa.select(FleetRun.attempts, FleetRun.state).where(FleetRun.id == run_id)).first()
    return None if found is None else (found[0], found[1])


def check_held(store: Store, run: Run) -> None:
    """Raises: StaleRun: another agent took the run since this one did (or it is over)."""
    current = store.transaction("cannot read", lambda s: _held(s, run.id))
    if current != (run.attempts, RunState.RUNNING):
        raise StaleRun(run.id, run.attempts, current)


def progress(store: Store, run: Run, *, trials: int | None = None, phase: str | None = None) -> None:
    """How many trials the run measured so far, and where its study stands (:class:`~autodeploy.results_db.states.RunPhase`'s text): those given.
    Raises: StaleRun (see :func:`take`)."""
    values = {"trials": trials, "phase": phase}
    _fenced(store, run, **{k: v for k, v in values.items() if v is not None})


def queue_positions(store: Store) -> dict[int, int]:
    """Every queued run's place in its device's line (1: next), by when it was made: an agent takes one run at a
    time, so a device's running run, if any, goes first."""
    query = (sa.select(FleetRun.id, FleetRun.agent_id).where(FleetRun.state == RunState.QUEUED.value)
             .order_by(FleetRun.agent_id, FleetRun.created_at, FleetRun.id))  # fmt: skip
    places: dict[int, int] = {}
    seen: dict[int, int] = {}
    for run_id, agent_id in store.transaction("cannot read", lambda s: s.execute(query).all()):
        seen[agent_id] = seen.get(agent_id, 0) + 1
        places[run_id] = seen[agent_id]
    return places


def finish(store: Store, run: Run, state: RunState | str, *, reason: str | None = None, winner: dict[str, Any] | None = None,
           bundle_sha256: str | None = None, skipped: list[dict[str, str]] | None = None,
           signature: str | None = None) -> None:  # fmt: skip
    """The run is over: ``done`` (with its winner, or none and the reason), ``failed``, ``cancelled`` or ``skipped``;
    ``signature``: the device key's over the result (:func:`autodeploy.fleet.keys.result_record`).

    Raises:
        StaleRun: another agent took the run since (a ``done`` run is never turned ``failed`` by a stale agent).
    """
    state = RunState(state)  # a member, or its word
    assert state.final, state
    values = {"state": state.value, "reason": reason, "winner": winner, "bundle_sha256": bundle_sha256, "finished_at": now(),
              "signature": signature, "phase": None}  # fmt: skip
    if skipped is not None:
        values["skipped"] = skipped
    _fenced(store, run, **values)


def requeue(store: Store, run: Run, reason: str) -> None:
    """The run goes back to ``queued`` (its agent stopped mid-run): the device's next agent takes it and resumes.

    Raises:
        StaleRun: another agent took the run since.
    """
    _fenced(store, run, state=RunState.QUEUED.value, reason=reason, phase=None)


def note_skipped(store: Store, run: Run, skipped: list[dict[str, str]]) -> None:
    """The engines this device leaves out of the run, and why (written before the study starts).

    Raises:
        StaleRun: another agent took the run since.
    """
    _fenced(store, run, skipped=skipped)


def cancelled(store: Store, job_id: int) -> bool:
    query = sa.select(FleetJob.state).where(FleetJob.id == job_id)
    return store.transaction("cannot read", lambda s: s.scalar(query)) == JobState.CANCELLED


def cancel(store: Store, job_id: int) -> tuple[list[Run], list[int]]:
    """Cancel the job: its queued runs are cancelled now, a running one by its agent (which checks between
    steps). Returns the job's runs as the cancel left them (read in its transaction: a run read ``running`` here
    was running when the job was cancelled, however soon its agent ends it) and the queue's job ids of the runs
    withdrawn."""
    job(store, job_id)  # no such job: UsageError

    def update(s: Session) -> tuple[list[Run], list[int]]:
        s.execute(sa.update(FleetJob).where(FleetJob.id == job_id).values(state=JobState.CANCELLED.value))
        queued = s.scalars(sa.select(FleetRun).where(FleetRun.job_id == job_id,
                                                     FleetRun.state == RunState.QUEUED.value)).all()  # fmt: skip
        for run in queued:
            when = "while it waited to resume (its agent had stopped)" if run.started_at else "before it started"
            run.state, run.finished_at, run.reason = RunState.CANCELLED.value, now(), f"the job was cancelled {when}"
        s.flush()
        return _runs(s, [job_id]), [r.queue_job for r in queued if r.queue_job is not None]

    return store.transaction("cannot write to", update, write=True)


def close(store: Store, job_id: int) -> Job:
    """No device that registers from now on takes a run of the job (its ``--accept-late`` window ends now); its
    runs go on. Returns the job as closed.

    Raises:
        UsageError: no such job.
    """
    job(store, job_id)  # no such job: UsageError

    def update(s: Session) -> Job:
        row = s.get_one(FleetJob, job_id)
        at = now()
        if row.accept_late_until is not None and rows.utc(row.accept_late_until) > at:
            row.accept_late_until = at
        s.flush()
        return _job(row)

    return store.transaction("cannot write to", update, write=True)


def unfinished(store: Store, agent_id: int) -> int:
    """How many runs of this agent are not over (queued, or running: a run its killed predecessor held counts
    until the queue hands it back)."""
    query = sa.select(sa.func.count()).select_from(FleetRun).where(FleetRun.agent_id == agent_id,
                                                                  FleetRun.state.not_in(RunState.finals()))  # fmt: skip
    return store.transaction("cannot read", lambda s: int(s.scalar(query) or 0))
