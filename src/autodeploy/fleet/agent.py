"""An agent: the loop that runs on each device of a fleet.

register → heartbeat → take a run meant for this device from the queue → run an ordinary ``tune`` into the
study ``fleet.JOB.DEVICE`` → export and verify the winner's bundle → store its bytes → mark the run done.

Every step is written to the store before the next (:mod:`autodeploy.fleet.ledger`), so nothing is lost when
the agent dies: its queue lease lapses (PgQueuer stops seeing its heartbeat), this device takes the run back
and resumes the study by name, which keeps every measured trial (``tune --resume``) and asks only for the
trials still missing. A device is its name and its key pair (:mod:`autodeploy.fleet.keys`), made here the first
time the name registers: two names on one machine are two devices with one fingerprint; a name that comes back
with another public key (or fingerprint) is refused. What it stores is signed with its key, and what it tunes
trusts only what it measured itself (:mod:`autodeploy.fleet.provenance`).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autodeploy import sealed
from autodeploy.errors import AutodeployError, DataError, StoreError, WriteError, excerpt
from autodeploy.fleet import jobs, keys, ledger, provenance, queue
from autodeploy.results_db.states import RunPhase, RunState
from autodeploy.search.reporter import Reporter

if TYPE_CHECKING:
    from autodeploy.adapters.base import TrialConfig
    from autodeploy.results_db.records import TrialRow
    from autodeploy.results_db.store import Store
    from autodeploy.runtime.device import DeviceInfo
    from autodeploy.search.summary import StudySummary

#: How long a taken run stays this agent's without a heartbeat (PgQueuer's ``heartbeat_timeout``): then the
#: queue hands it back, and this device's next agent resumes it.
DEFAULT_LEASE_S = 60.0
#: Seconds between this agent's heartbeats in the store (what ``fleet status`` shows as the heartbeat's age).
HEARTBEAT_S = 10.0
#: The store connections an agent holds at most (its heartbeat and its run may write at once); with the queue's
#: LISTEN connection, an agent's PostgreSQL budget is one more (README, "Connections").
STORE_CONNECTIONS = 2
#: Seconds between two looks at the store for a cancel, while a study runs.
CANCEL_CHECK_S = 2.0

Log = Callable[[str], None]
LOST_FIX = "check the database server and start the agent again; its run goes back to the queue after its lease"
#: The folder under the agent's cache folder where bundles are exported before they are stored.
SCRATCH = "scratch"
#: What a job's ``data`` may name instead of a stored blob (built in, not a file on the device).
DATA_REFS = ("sample:images",)


class JobCancelled(Exception):
    """The job was cancelled while this agent ran it: the study stops at its next step."""


class AgentStopped(KeyboardInterrupt):
    """The agent was told to stop (SIGTERM, Ctrl-C): the study stops at its next step as it does for Ctrl-C (the
    trial it was in is marked interrupted and asked again), and the run goes back to the queue."""


@dataclass(frozen=True)
class AgentSettings:
    name: str
    tags: tuple[str, ...] = ()
    once: bool = False  # exit when nothing is left for this device
    lease_s: float = DEFAULT_LEASE_S
    cache: Path | None = None  # where blobs are written (default: the cache folder's fleet/)
    #: Run ``.pt2`` jobs (``--allow-pytorch``): loading a PyTorch program comes close to running its code.
    allow_pytorch: bool = False
    #: Set on SIGTERM or Ctrl-C: the study in progress stops at its next step.
    stop: threading.Event = field(default_factory=threading.Event, compare=False)


def default_name() -> str:
    """This machine's host name as a device name (dots and other characters made ``-``)."""
    name = re.sub(r"[^A-Za-z0-9_-]+", "-", socket.gethostname()).strip("-_")[:63]
    return name or "device"


def fleet_dir(settings: AgentSettings) -> Path:
    """The agent's own folder: blobs by digest, and the scratch where bundles are exported."""
    from autodeploy import api

    return settings.cache or api.cache_dir() / "fleet"


def engines_here(device: DeviceInfo) -> dict[str, str]:
    """Every registered engine's availability here, as text (``available (1.32.0)``, ``unavailable: ...``)."""
    from autodeploy.adapters import registry

    return {e.name: str(e.probe(device)) for e in registry.all_engines()}


#: Seconds the child that probes the engines at registration may take (importing every engine: seconds).
PROBE_TIMEOUT_S = 300.0


def engines_probed_apart(device: DeviceInfo) -> dict[str, str]:
    """:func:`engines_here`, probed in a child process: probing imports every engine's library (ONNX Runtime,
    OpenVINO, LiteRT: 130 MB here), which an idle agent should not hold until it takes a run. The child sees no
    secret of the agent's environment (:func:`autodeploy.child.child_env`: ``AUTODEPLOY_DB`` neither). A child that
    fails leaves the probe to this process (what registers must be true; the memory is second)."""
    from autodeploy.child import ChildFailed, run_module

    try:
        found = json.loads(run_module(__name__, timeout_s=PROBE_TIMEOUT_S) or "null")
    except (OSError, ChildFailed, ValueError):
        found = None
    if isinstance(found, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in found.items()):
        return found
    return engines_here(device)


def serve(db: str | None, settings: AgentSettings, log: Log = lambda _: None) -> int:
    """Register this device and run the jobs meant for it, one at a time; returns how many runs it took.

    With ``settings.once`` it returns when no run of this device is left (queued, or running under a lapsed
    lease of an agent that died); without, it waits for work (LISTEN/NOTIFY, else a poll every half lease).

    Raises:
        UsageError: SQLite, a bad name or tag, or a name registered with another fingerprint.
        StoreError: the database is unreachable.
    """
    import psycopg

    from autodeploy import __version__
    from autodeploy.device import probe_device
    from autodeploy.results_db.store import Store

    url = jobs.require_postgres(db)
    jobs.check_name(settings.name, "--name")
    for tag in settings.tags:
        jobs.check_name(tag, "--tag")
    swept = sweep_scratch(fleet_dir(settings))
    if swept:
        log(f"removed {len(swept)} scratch folder(s) that killed agents left in {swept[0].parent}")
    key = keys.device_key(fleet_dir(settings), settings.name)  # made the first time this name registers here
    with Store.open(url, connections=STORE_CONNECTIONS) as store:  # its budget: these and the queue's one
        device = probe_device()
        ledger.check_binding(store, settings.name, device, key.pem)  # another device's name: refused before probing
        # an agent that waits for work probes the engines in a child (it holds none while idle); one run --once
        # takes its run at once and imports them anyway: a child would only pay the imports twice
        engines = engines_here(device) if settings.once else engines_probed_apart(device)
        agent = ledger.register(store, settings.name, device, engines, settings.tags, __version__,
                                key.pem)  # fmt: skip
        log(f"device {agent.name}: fingerprint {agent.fingerprint} ({agent.cpu}), tags {', '.join(agent.tags) or '-'}")  # fmt: skip
        log(f"device {agent.name}: public key {key.public} ({key.id}): check its results with "
            f"autodeploy fleet export --trust {key.public}")  # fmt: skip
        try:
            return asyncio.run(_serve(store, agent, settings, log))
        except psycopg.OperationalError as error:  # the queue's connection (the store's own say so themselves)
            raise StoreError(f"the fleet agent lost results database {store.url}: {str(error).splitlines()[0]}",
                             fix=LOST_FIX) from error  # fmt: skip


async def _serve(store: Store, agent: ledger.Agent, settings: AgentSettings, log: Log) -> int:
    from pgqueuer import QueueManager
    from pgqueuer.domain.types import QueueExecutionMode

    taken = {"busy": 0, "runs": 0}
    async with queue.connected(store.engine.url.render_as_string(hide_password=False), agent.name) as queries:
        # Runs of jobs submitted before this device registered, and any whose queue entry was lost, are queued
        # again (one per run: the dedupe key skips those still queued or held).
        mine = await asyncio.to_thread(ledger.adopt, store, agent)
        ledger.set_queue_jobs(store, await queue.enqueue(queries, [(r.id, agent.name) for r in mine]))
        manager = QueueManager(queries, channel=queue.channel_of(agent.name))  # its own: see queue.CHANNEL

        @manager.entrypoint(queue.entrypoint(agent.name), concurrency_limit=1)
        async def take(job: Any) -> None:
            run_id = _run_id(job.payload)
            if run_id is None:  # a forged entry: said, and nothing run
                shown = excerpt((job.payload or b"").decode("ascii", "replace"), 40, quote=True)
                log(f"queue entry {job.id}: payload {shown} is not a run id: refused, nothing run")
                return
            taken["busy"] += 1
            try:
                if await asyncio.to_thread(run_one, store, agent, run_id, settings, log):
                    taken["runs"] += 1
            finally:
                taken["busy"] -= 1
            if settings.once and not await asyncio.to_thread(ledger.unfinished, store, agent.id):
                manager.shutdown.set()  # now, not at the next heartbeat (up to 10 s later)

        async def heartbeat() -> None:
            while not manager.shutdown.is_set():
                try:
                    await asyncio.to_thread(ledger.beat, store, agent.id)
                    if settings.once and not taken["busy"] and not await asyncio.to_thread(ledger.unfinished, store, agent.id):
                        manager.shutdown.set()
                        return
                except StoreError as error:  # the database is away for a while: say so, and beat again
                    log(f"heartbeat: {error}")
                await asyncio.sleep(min(HEARTBEAT_S, settings.lease_s / 3))

        def stop() -> None:  # the run in progress stops at its next step and goes back to the queue
            log("stopping: the run in progress goes back to the queue" if taken["busy"] else "stopping: no run in progress")
            settings.stop.set()
            manager.shutdown.set()

        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop)
        beats = asyncio.create_task(heartbeat())
        try:
            poll = timedelta(seconds=max(1.0, min(30.0, settings.lease_s / 2)))
            await manager.run(dequeue_timeout=poll, batch_size=1, mode=QueueExecutionMode.continuous,
                              heartbeat_timeout=timedelta(seconds=settings.lease_s))  # fmt: skip
        finally:
            beats.cancel()
    return taken["runs"]


def _run_id(payload: bytes | None) -> int | None:
    """The run id a queue entry carries (:func:`queue.enqueue` writes it as digits), ``None`` when it is not one."""
    text = (payload or b"").decode("ascii", "replace")
    return int(text) if text.isdigit() and len(text) < 19 else None


def run_one(store: Store, agent: ledger.Agent, run_id: int, settings: AgentSettings, log: Log) -> bool:
    """Run ``run_id`` on this device to its end, writing every state to the store; False when there was nothing
    to do (the run is over, its job cancelled, or it is another device's). A failure is the run's (recorded); a
    bug is recorded and raised. Once another agent took the run (this one was stopped past its lease), every
    write is refused: the study stops at its next step and the agent says so in one line."""
    try:
        taken = ledger.take(store, run_id, agent)
    except ledger.ForeignRun as error:  # a forged queue entry: never run another device's job here
        log(str(error))
        return False
    if taken is None:
        return False
    run, job = taken
    again = f", attempt {run.attempts}: taken back" if run.attempts > 1 else ""
    log(f"job {job.id} ({job.model_name}): study {run.study}{again}")
    try:
        _run_taken(store, agent, run, job, settings, log)
    except ledger.StaleRun as error:  # nothing of this attempt is written (a bug it met included)
        log(f"job {job.id}: {error}")
    return True


def _run_taken(store: Store, agent: ledger.Agent, run: ledger.Run, job: ledger.Job, settings: AgentSettings,
               log: Log) -> None:  # fmt: skip
    """The run, taken, to its end; every write fenced by the attempt it was taken with (:class:`ledger.StaleRun`)."""
    try:
        state, fields = _tune_and_ship(store, agent, run, job, settings, log)
    except AgentStopped:
        ledger.requeue(store, run, "its agent stopped; it resumes when this device's agent runs again")
        log(f"job {job.id}: back in the queue")
        return
    except JobCancelled:
        state, fields = RunState.CANCELLED, {"reason": "the job was cancelled while it ran"}
    except ledger.StaleRun:
        raise
    except AutodeployError as error:
        state, fields = RunState.FAILED, {"reason": str(error)}
    except Exception as error:  # a bug: the record says so (unless the run is another agent's now), and the
        # traceback goes to the agent's log
        ledger.finish(store, run, RunState.FAILED, reason=f"internal error: {type(error).__name__}: {error}")
        raise
    ledger.finish(store, run, state, **fields)
    log(f"job {job.id}: {state}" + (f": {fields['reason']}" if fields.get("reason") else ""))


def _tune_and_ship(store: Store, agent: ledger.Agent, run: ledger.Run, job: ledger.Job, settings: AgentSettings,
                   log: Log) -> tuple[RunState, dict[str, Any]]:  # fmt: skip
    from autodeploy import api, pytorch
    from autodeploy.device import probe_device

    if job.problem:  # its options or data were changed outside autodeploy: nothing of it is run
        return RunState.FAILED, {"reason": job.problem}
    if pytorch.is_pt2(job.model_file) and not settings.allow_pytorch:  # before a byte of it is written here
        return RunState.SKIPPED, {"reason": f"{excerpt(job.model_file, 80)} is a PyTorch .pt2, refused on this device "
                           "(loading one comes close to running its code); fix: start the agent with --allow-pytorch "
                           "to run .pt2 jobs"}  # fmt: skip
    model, data = _materialize(store, job, fleet_dir(settings))
    # the study trusts only what this agent measured: its search state here, its reuse only of its own rows
    studies = provenance.study_file(fleet_dir(settings), store, job, agent.name)
    own = provenance.OwnTrials(store, fleet_dir(settings) / provenance.STUDIES / f"{agent.name}.trials")
    before = measured_trials(studies, run.study)
    progress = _Progress(store, run, job, before, settings.stop, log)
    key = keys.device_key(fleet_dir(settings), agent.name)
    if job.profile is not None:
        return _profile(own, run, job, model, data, progress, key)
    asked = job.options.get("engines")
    engines, skipped = _engines(asked, probe_device())
    if skipped:
        ledger.note_skipped(store, run, skipped)
        log("skipped here: " + "; ".join(f"{s['engine']}: {s['reason']}" for s in skipped))
    if asked and not engines:
        return RunState.SKIPPED, {"reason": "none of the engines the job asks for runs here", "skipped": skipped}
    wanted = job.options.get("trials")
    progress.set(RunPhase.PREPARING.text())
    summary = api.tune(config={**job.options, "model": str(model)}, name=run.study, resume=True, data=data,
                       engines=engines or None, trials=None if wanted is None else max(0, wanted - before), db=own,
                       storage=f"sqlite:///{studies}", reporter=progress,
                       command=f"autodeploy agent --name {agent.name}  # fleet job {job.id}")  # fmt: skip
    if summary.winner is None:  # the first failure said too: a full disk is not "no trial produced a measurement"
        why = [f"{s['count']} {kind}, e.g. {s['reason']}" for kind, s in summary.failures.items()]
        why += [f"{f.label}: {f.failure}" for f in summary.finalists if f.failure]
        reason = (summary.note or "no config meets the constraints") + (f"; {excerpt(why[0], 1000)}" if why else "")
        if why and all(f.statistic is None for f in summary.finalists):  # nothing was measured here: the run failed
            return RunState.FAILED, {"reason": reason}
        return RunState.DONE, _signed(key, run, job, {"reason": reason})
    progress.set(RunPhase.EXPORTING.text())
    digest = _ship(own, summary, fleet_dir(settings), key)
    fields = {"winner": winner_record(summary, _winner_row(own, summary)), "bundle_sha256": digest, "reason": None}
    return RunState.DONE, _signed(key, run, job, fields)


def _profile(own: Store, run: ledger.Run, job: ledger.Job, model: Path, data: str | None, progress: _Progress,
             key: keys.DeviceKey) -> tuple[RunState, dict[str, Any]]:  # fmt: skip
    """A profile job's run: its one config measured here (one run of the finalists' length, stored in this device's
    trials), its numbers signed as a winner's are; an engine that does not run here skips the device, one line."""
    from autodeploy import api
    from autodeploy.accuracy.records import DEFAULT_MAX_ACCURACY_DROP
    from autodeploy.adapters.base import TrialConfig
    from autodeploy.device import probe_device
    from autodeploy.harness.timing import TimingPolicy

    config = TrialConfig.from_dict(job.profile or {})
    _, skipped = _engines([config.engine], probe_device())
    if skipped:
        return RunState.SKIPPED, {"reason": f"{config.engine}: {skipped[0]['reason']}", "skipped": skipped}
    progress.set(RunPhase.PROFILING.text())
    finalists = job.options.get("finalists") or {}
    timing = TimingPolicy(min_samples=finalists.get("min_samples", 200), min_duration_s=finalists.get("min_duration_s", 2.0))
    limits = job.options.get("constraints") or {}
    stored = api.bench(str(model), config=config, data=data, db=own, timing=timing, progress=progress.phase,
                       max_accuracy_drop=limits.get("max_accuracy_drop", DEFAULT_MAX_ACCURACY_DROP),
                       command=f"autodeploy bench  # fleet profile job {job.id}")  # fmt: skip
    result = stored.result
    if result.measurement is None:  # nothing measured: the run failed, and says why
        return RunState.FAILED, {"reason": f"{config.label()}: {result.failure_kind}: {result.failure_message}"}
    return RunState.DONE, _signed(key, run, job, {"winner": profile_record(config, stored.row), "reason": None})


def profile_record(config: TrialConfig, row: TrialRow) -> dict[str, Any]:
    """A profile run's numbers in a winner's keys (:func:`winner_record`): the median latency with its interval over
    the calls, memory, the verdict; its caveat says it is one run, not paired rounds."""
    from autodeploy.objectives import DEFAULT_OBJECTIVE, MEDIAN, STATISTICS

    latency = row.latency
    assert latency is not None
    caveats = ["one run, not finalist rounds"] + (["fails the accuracy budget"] if row.accuracy and not row.accuracy.passed else [])
    values = {s.name: s.value(row) for s in STATISTICS.values() if hasattr(row, s.field)}  # set beside any winner's
    return {"config": config.label(), "uid": row.uid, "statistic": MEDIAN.name, "value": latency.median,
            "value_text": DEFAULT_OBJECTIVE.value_text(latency.median, latency.median_ci), "ci": list(latency.median_ci),
            "caveats": caveats, "memory_mb": row.peak_rss_mb, "accuracy": _accuracy_text(row), "headline": None, "speedup": None,
            "values": {k: v for k, v in values.items() if v is not None}}  # fmt: skip


def _winner_row(own: Store, summary: StudySummary) -> TrialRow | None:
    """The winner's stored trial (its memory and verdict), read back from this device's own trials."""
    from autodeploy.results_db.records import TrialFilter

    uid = summary.winner.uids[-1] if summary.winner is not None and summary.winner.uids else None
    return own.trial(TrialFilter(uid=uid), samples=False) if uid else None


def _accuracy_text(row: TrialRow | None) -> str | None:
    """The verdict in one short phrase: ``passed: top-1 agreement >= 0.99 ...`` (``None``: not judged)."""
    if row is None or row.accuracy is None:
        return None
    return excerpt(f"{'passed' if row.accuracy.passed else 'failed'}: {row.accuracy.constraint}", 190)


def _signed(key: keys.DeviceKey, run: ledger.Run, job: ledger.Job, fields: dict[str, Any]) -> dict[str, Any]:
    """``fields`` of a done run, with the device key's signature over its result (:func:`keys.result_record`)."""
    record = keys.result_record(job=job.id, run=run.id, device=run.device, model_sha256=job.model_sha256,
                                winner=fields.get("winner"), bundle_sha256=fields.get("bundle_sha256"))  # fmt: skip
    return {**fields, "signature": keys.sign_result(key, record)}


def _materialize(store: Store, job: ledger.Job, folder: Path) -> tuple[Path, str | None]:
    """The job's model (and data) as files here, each checked against its SHA-256 before use.

    Raises:
        DataError: the job's data names something else than a stored blob or a built-in set (a path here).
    """
    model = _blob_file(store, job.model_sha256, job.model_file, folder, "model")
    if job.data is None:
        return model, None
    if job.data in ({"ref": ref} for ref in DATA_REFS):  # sample:images: built in, not a file
        return model, str(job.data["ref"])
    blob = isinstance(job.data, dict) and set(job.data) == {"sha256", "file"}
    if not (blob and _DIGEST.fullmatch(str(job.data["sha256"]))):
        raise DataError(f"fleet job {job.id}'s data {excerpt(json.dumps(job.data), 120)} is refused: a job's data is a "
                        f"stored blob or {' or '.join(DATA_REFS)}, never a path on the device",
                        fix="submit the job again with --data FILE.npz (or sample:images)")  # fmt: skip
    return model, str(_blob_file(store, job.data["sha256"], str(job.data["file"]), folder, "data"))


_DIGEST = re.compile(r"[0-9a-f]{64}")


def _blob_file(store: Store, digest: str, name: str, folder: Path, what: str) -> Path:
    """``folder/DIGEST/name`` holding the blob: taken again when its bytes still hash to ``digest``, else written
    from the store's copy a chunk at a time, checked as it is written (:func:`ledger.get_blob`), and put in place
    only then: a refused blob leaves nothing behind."""
    path = folder / digest / jobs.safe_file_name(name)  # a row may name "..", "." or "": never a folder
    if sealed.holds(path, digest):
        return path
    tmp = None
    try:
        folder.mkdir(parents=True, exist_ok=True)
        handle, tmp = tempfile.mkstemp(dir=folder, prefix=f".{digest[:16]}.")
        os.close(handle)
        ledger.get_blob(store, digest, Path(tmp), f"{what} blob")
        path.parent.mkdir(exist_ok=True)
        Path(tmp).replace(path)
    except OSError as error:  # no half-written file stays; a full or read-only disk is one line, not a bug
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        full = WriteError.of(error, f"the {what} blob {path.name}", folder, instead="set AUTODEPLOY_CACHE to a disk with room")  # fmt: skip
        if full is None:
            raise
        raise full from error
    return path


def _engines(asked: list[str] | None, device: DeviceInfo) -> tuple[list[str], list[dict[str, str]]]:
    """The engines the job asks for that run here, and those that do not, each with its reason."""
    from autodeploy.adapters import registry

    if not asked:
        return [], []
    runs, skipped = [], []
    for name in asked:
        availability = registry.get(name).probe(device)
        if availability.available:
            runs.append(name)
        else:
            skipped.append({"engine": name, "reason": str(availability)})
    return runs, skipped


def measured_trials(studies: Path, study: str) -> int:
    """How many configs the study ``study`` (in the SQLite file ``studies``: :func:`provenance.study_file`) has
    measured so far: its finished Optuna trials that ran or reused a measurement (a ``uid``), less the repeats of
    an earlier one and those a killed run left unfinished."""
    import optuna

    if not studies.is_file():  # nothing measured yet; Optuna's tables are made by the study itself
        return 0
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    url = f"sqlite:///{studies}"
    if study not in optuna.study.get_all_study_names(storage=url):
        return 0
    finished = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.FAIL, optuna.trial.TrialState.PRUNED)
    trials = optuna.load_study(study_name=study, storage=url).get_trials(deepcopy=False, states=finished)
    return sum(1 for t in trials if "uid" in t.user_attrs and not {"repeat_of", "interrupted"} & set(t.user_attrs))


def _ship(store: Store, summary: StudySummary, folder: Path, key: keys.DeviceKey) -> str:
    """Export the winner as a ``.tar.gz`` (in the agent's scratch under ``folder``), signed with the device key,
    verify it with its public key, store its bytes; returns their SHA-256.

    What ships is the trial this study chose (not whatever the shared database names since), read through
    ``store`` (a :class:`provenance.OwnTrials`: a row this agent did not store, as stored, is not found), and its
    artifact only from this machine's artifact store, built from the trial's model, never from the path a row names.
    """
    from dataclasses import replace

    from autodeploy import api
    from autodeploy.bundle import opened, verify

    source = replace(api.find_source(summary.name, db=store), artifacts=provenance.artifact_store())
    chosen = summary.winner.uids[-1] if summary.winner is not None and summary.winner.uids else None
    if source.trial.uid != chosen:
        raise StoreError(f"study {summary.name!r} names winner trial {source.trial.uid} in results database {store.url}, "
                         f"but it chose {chosen}: the row was changed since; nothing shipped",
                         fix="find who writes this database outside autodeploy; then submit the job again")  # fmt: skip
    with scratch_folder(folder) as scratch:
        path = api.export(source=source, output=Path(scratch) / summary.name, tar=True, db=store, sign_key=key.private,
                          command=f"autodeploy export {summary.name}  # by the fleet agent")  # fmt: skip
        with opened(path) as root:
            verify(root, trust=key.public)
        return ledger.put_blob(store, path)


def scratch_folder(folder: Path) -> tempfile.TemporaryDirectory[str]:
    """A new folder of this process under ``folder/scratch``, removed when done; named ``PID-START-...`` so that
    an agent starting later tells a killed one's leftover (kill -9 mid-store) from a live agent's."""
    import psutil

    root = folder / SCRATCH
    root.mkdir(parents=True, exist_ok=True)
    started = int(psutil.Process().create_time())
    return tempfile.TemporaryDirectory(prefix=f"{os.getpid()}-{started}-", dir=root)


def sweep_scratch(folder: Path) -> list[Path]:
    """Remove the scratch folders under ``folder/scratch`` whose process is gone; returns those removed. A name
    not ``PID-START-...`` is not the agent's and is left as it is, as is a live process's."""
    root = folder / SCRATCH
    removed = []
    for path in sorted(root.iterdir()) if root.is_dir() else ():
        pid, started, *_ = path.name.split("-") + ["", ""]
        if not (pid.isdigit() and started.isdigit()) or _alive(int(pid), int(started)):
            continue
        shutil.rmtree(path, ignore_errors=True)
        if not path.exists():  # one that cannot be removed stays for the next start (and for the operator)
            removed.append(path)
    return removed


def _alive(pid: int, started: int) -> bool:
    """Whether process ``pid`` runs and is the one started at ``started`` (a reused pid is another process)."""
    import psutil

    try:
        return abs(psutil.Process(pid).create_time() - started) < 2.0
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:  # another user's process: not ours to judge
        return True


def winner_record(summary: StudySummary, row: TrialRow | None = None) -> dict[str, Any]:
    """The winner as ``fleet status`` shows it: config, statistic and value (with its interval over the rounds),
    speed-up over the baseline, and why it is weaker than a finalist-proven one where it is (``caveats``: screening
    only, under load, unsteady machine); with its stored trial ``row``, its memory and accuracy verdict too."""
    from autodeploy.objectives import of
    from autodeploy.search.summary import caveats

    w = summary.winner
    assert w is not None
    objective = of(summary.objective)  # a winner from screening values alone names no round statistic
    statistic = summary.statistic or objective.latency_statistic or objective.shown_unit
    return {"config": w.label, "uid": w.uids[-1] if w.uids else None, "statistic": statistic,
            "value": w.statistic, "value_text": objective.value_text(w.statistic),
            "speedup": summary.speedup_vs_baseline, "baseline": summary.baseline_name,
            "screening_only": summary.screening_only, "caveats": caveats(summary.to_dict()),
            "headline": summary.headline(), "ci": list(w.ci) if w.ci else None,
            "memory_mb": row.peak_rss_mb if row is not None else None, "accuracy": _accuracy_text(row)}  # fmt: skip


class _Progress(Reporter):
    """The study's progress into the run's record (trials done, its :class:`RunPhase`) and the agent's log (one line
    per trial and phase), and a cancel read from the store between steps."""

    def __init__(self, store: Store, run: ledger.Run, job: ledger.Job, before: int, stop: threading.Event,
                 log: Log = lambda _: None) -> None:  # fmt: skip
        self.store, self.run, self.job, self.before, self.stop, self.log = store, run, job, before, stop, log
        self.checked, self.total, self.shown = 0.0, before, ""

    def set(self, phase: str) -> None:
        """The run's phase, written and logged when it changed. Raises: StaleRun (another agent took the run)."""
        if phase != self.shown:
            ledger.progress(self.store, self.run, phase=phase)
            self.log(f"job {self.job.id}: {phase}")
            self.shown = phase

    def start(self, total: int, space: Any) -> None:
        self.total = self.before + total
        self.set(RunPhase.SCREENING.text(self.before, self.total))

    def round(self, r: int, rounds: int) -> None:
        self.set(RunPhase.FINALIST_ROUND.text(r, rounds))
        self._check_cancel()

    def phase(self, text: str) -> None:
        self._check_cancel()

    def trial_done(self, done: int, best: str | None) -> None:
        n = self.before + done
        self.shown = RunPhase.SCREENING.text(n, max(n, self.total))
        ledger.progress(self.store, self.run, trials=n, phase=self.shown)  # StaleRun: another agent took the run
        self.log(f"job {self.job.id}: {self.shown}" + (f", best so far {best}" if best else ""))
        self._check_cancel()

    def wait(self, seconds: float) -> None:
        """The finalist rounds' spread (up to minutes): waits on the stop flag, and looks for a cancel or a takeover
        every :data:`CANCEL_CHECK_S`, so SIGTERM ends the agent in seconds (systemd stops it after 90 s), not after."""
        self.set(f"{RunPhase.WAITING.text()} ({seconds:.0f} s)")
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            if self.stop.wait(min(left, CANCEL_CHECK_S)):
                raise AgentStopped()
            self._check_cancel()

    def _check_cancel(self) -> None:
        if self.stop.is_set():
            raise AgentStopped()
        if time.monotonic() - self.checked < CANCEL_CHECK_S:
            return
        self.checked = time.monotonic()
        ledger.check_held(self.store, self.run)  # taken over while this agent was stopped: it stops here
        if ledger.cancelled(self.store, self.job.id):
            raise JobCancelled(f"fleet job {self.job.id} was cancelled")


if __name__ == "__main__":  # engines_probed_apart's child: the engines' availability, as the last line of stdout
    from autodeploy.child import child_main
    from autodeploy.device import probe_device

    raise SystemExit(child_main(lambda: engines_here(probe_device())))
