"""An agent: the loop that runs on each device of a fleet.

register → heartbeat → take a run meant for this device from the queue → run an ordinary ``tune`` into the
study ``fleet.JOB.DEVICE`` → export and verify the winner's bundle → store its bytes → mark the run done.

Every step is written to the store before the next (:mod:`autodeploy.fleet.ledger`), so nothing is lost when
the agent dies: its queue lease lapses (PgQueuer stops seeing its heartbeat), this device takes the run back
and resumes the study by name, which keeps every measured trial (``tune --resume``) and asks only for the
trials still missing. A device is its name and its fingerprint: two names on one machine are two devices
with one fingerprint; a name that comes back with another fingerprint is refused.
"""

from __future__ import annotations

import asyncio
import re
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

from autodeploy.errors import AutodeployError, StoreError
from autodeploy.fleet import jobs, ledger, queue
from autodeploy.search.context import Reporter

if TYPE_CHECKING:
    from autodeploy.results_db.store import Store
    from autodeploy.runtime.device import DeviceInfo
    from autodeploy.search.summary import StudySummary

#: How long a taken run stays this agent's without a heartbeat (PgQueuer's ``heartbeat_timeout``): then the
#: queue hands it back, and this device's next agent resumes it.
DEFAULT_LEASE_S = 60.0
#: Seconds between this agent's heartbeats in the store (what ``fleet status`` shows as the heartbeat's age).
HEARTBEAT_S = 10.0
#: Seconds between two looks at the store for a cancel, while a study runs.
CANCEL_CHECK_S = 2.0

Log = Callable[[str], None]
LOST_FIX = "check the database server and start the agent again; its run goes back to the queue after its lease"


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
    #: Set on SIGTERM or Ctrl-C: the study in progress stops at its next step.
    stop: threading.Event = field(default_factory=threading.Event, compare=False)


def default_name() -> str:
    """This machine's host name as a device name (dots and other characters made ``-``)."""
    name = re.sub(r"[^A-Za-z0-9_-]+", "-", socket.gethostname()).strip("-_")[:63]
    return name or "device"


def engines_here(device: DeviceInfo) -> dict[str, str]:
    """Every registered engine's availability here, as text (``available (1.32.0)``, ``unavailable: ...``)."""
    from autodeploy.adapters import registry

    return {e.name: str(e.probe(device)) for e in registry.all_engines()}


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
    with Store.open(url) as store:
        device = probe_device()
        ledger.check_binding(store, settings.name, device)  # a name taken by another device is refused before probing
        agent = ledger.register(store, settings.name, device, engines_here(device), settings.tags, __version__)
        log(f"device {agent.name}: fingerprint {agent.fingerprint} ({agent.cpu}), tags {', '.join(agent.tags) or '-'}")
        try:
            return asyncio.run(_serve(store, agent, settings, log))
        except psycopg.OperationalError as error:  # the queue's connection (the store's own say so themselves)
            raise StoreError(f"the fleet agent lost results database {store.url}: {str(error).splitlines()[0]}",
                             fix=LOST_FIX) from error  # fmt: skip


async def _serve(store: Store, agent: ledger.Agent, settings: AgentSettings, log: Log) -> int:
    from pgqueuer import QueueManager
    from pgqueuer.domain.types import QueueExecutionMode

    taken = {"busy": 0, "runs": 0}
    async with queue.connected(store.engine.url.render_as_string(hide_password=False)) as queries:
        # Runs of jobs submitted before this device registered, and any whose queue entry was lost, are queued
        # again (one per run: the dedupe key skips those still queued or held).
        mine = await asyncio.to_thread(ledger.adopt, store, agent)
        ledger.set_queue_jobs(store, await queue.enqueue(queries, [(r.id, agent.name) for r in mine]))
        manager = QueueManager(queries, channel=queue.CHANNEL)

        @manager.entrypoint(queue.entrypoint(agent.name), concurrency_limit=1)
        async def take(job: Any) -> None:
            taken["busy"] += 1
            try:
                if await asyncio.to_thread(run_one, store, agent, int(job.payload), settings, log):
                    taken["runs"] += 1
            finally:
                taken["busy"] -= 1

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
            log("stopping: the run in progress goes back to the queue")
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


def run_one(store: Store, agent: ledger.Agent, run_id: int, settings: AgentSettings, log: Log) -> bool:
    """Run ``run_id`` on this device to its end, writing every state to the store; False when there was nothing
    to do (the run is over, or its job cancelled). A failure is the run's (recorded); a bug is recorded and raised."""
    taken = ledger.take(store, run_id)
    if taken is None:
        return False
    run, job = taken
    again = f", attempt {run.attempts}: taken back" if run.attempts > 1 else ""
    log(f"job {job.id} ({job.model_name}): study {run.study}{again}")
    try:
        state, fields = _tune_and_ship(store, agent, run, job, settings, log)
    except AgentStopped:
        ledger.requeue(store, run.id, "its agent stopped; it resumes when this device's agent runs again")
        log(f"job {job.id}: back in the queue")
        return True
    except JobCancelled:
        state, fields = "cancelled", {"reason": "the job was cancelled while it ran"}
    except AutodeployError as error:
        state, fields = "failed", {"reason": str(error)}
    except Exception as error:  # a bug: the record says so, and the traceback goes to the agent's log
        ledger.finish(store, run.id, "failed", reason=f"internal error: {type(error).__name__}: {error}")
        raise
    ledger.finish(store, run.id, state, **fields)
    log(f"job {job.id}: {state}" + (f": {fields['reason']}" if fields.get("reason") else ""))
    return True


def _tune_and_ship(store: Store, agent: ledger.Agent, run: ledger.Run, job: ledger.Job, settings: AgentSettings,
                   log: Log) -> tuple[str, dict[str, Any]]:  # fmt: skip
    from autodeploy import api
    from autodeploy.device import probe_device

    model, data = _materialize(store, job, settings.cache or api.cache_dir() / "fleet")
    asked = job.options.get("engines")
    engines, skipped = _engines(asked, probe_device())
    if skipped:
        ledger.note_skipped(store, run.id, skipped)
        log("skipped here: " + "; ".join(f"{s['engine']}: {s['reason']}" for s in skipped))
    if asked and not engines:
        return "skipped", {"reason": "none of the engines the job asks for runs here", "skipped": skipped}
    before = measured_trials(store, run.study)
    wanted = job.options.get("trials")
    summary = api.tune(config={**job.options, "model": str(model)}, name=run.study, resume=True, data=data,
                       engines=engines or None, trials=None if wanted is None else max(0, wanted - before), db=store,
                       reporter=_Progress(store, run, job, before, settings.stop),
                       command=f"autodeploy agent --name {agent.name}  # fleet job {job.id}")  # fmt: skip
    if summary.winner is None:
        return "done", {"reason": summary.note or "no config meets the constraints"}
    digest = _ship(store, summary)
    return "done", {"winner": winner_record(summary), "bundle_sha256": digest, "reason": None}


def _materialize(store: Store, job: ledger.Job, folder: Path) -> tuple[Path, str | None]:
    """The job's model (and data) as files here, each checked against its SHA-256 before use."""
    model = _blob_file(store, job.model_sha256, job.model_file, folder, "model")
    if job.data is None:
        return model, None
    if "ref" in job.data:  # sample:images: built in, not a file
        return model, str(job.data["ref"])
    return model, str(_blob_file(store, job.data["sha256"], job.data["file"], folder, "data"))


def _blob_file(store: Store, digest: str, name: str, folder: Path, what: str) -> Path:
    """``folder/DIGEST/name`` holding the blob: taken again when its bytes still hash to ``digest``, else written
    from the store's copy (itself checked first: :func:`ledger.checked_blob`)."""
    path = folder / digest / Path(name).name
    if path.is_file() and ledger.sha256(path.read_bytes()) == digest:
        return path
    data = ledger.checked_blob(store, digest, f"{what} blob")
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=path.parent, delete=False) as tmp:
        tmp.write(data)
    Path(tmp.name).replace(path)
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


def measured_trials(store: Store, study: str) -> int:
    """How many configs the study ``study`` has measured so far: its finished Optuna trials that ran or reused
    a measurement (a ``uid``), less the repeats of an earlier one and those a killed run left unfinished."""
    import optuna

    # A study measures nothing before it is saved in the store (run_study saves it before its first trial): none
    # saved, none measured, and Optuna's tables are not touched (agents starting together would race to create them).
    if store.get_study(study) is None:
        return 0
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    url = store.engine.url.render_as_string(hide_password=False)
    finished = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.FAIL, optuna.trial.TrialState.PRUNED)
    trials = optuna.load_study(study_name=study, storage=url).get_trials(deepcopy=False, states=finished)
    return sum(1 for t in trials if "uid" in t.user_attrs and not {"repeat_of", "interrupted"} & set(t.user_attrs))


def _ship(store: Store, summary: StudySummary) -> str:
    """Export the winner as a ``.tar.gz``, verify it, store its bytes; returns their SHA-256."""
    from autodeploy import api
    from autodeploy.bundle import opened, verify

    with tempfile.TemporaryDirectory(prefix="autodeploy-fleet-") as scratch:
        path = api.export(summary, Path(scratch) / summary.name, tar=True, db=store,
                          command=f"autodeploy export {summary.name}  # by the fleet agent")  # fmt: skip
        with opened(path) as root:
            verify(root)
        return ledger.put_blob(store, path.read_bytes())


def winner_record(summary: StudySummary) -> dict[str, Any]:
    """The winner as ``fleet status`` shows it: config, statistic and value, speed-up over the baseline."""
    from autodeploy.objectives import OBJECTIVES

    w = summary.winner
    assert w is not None
    objective = OBJECTIVES[summary.objective]  # a winner from screening values alone names no round statistic
    statistic = summary.statistic or objective.latency_statistic or objective.shown_unit
    return {"config": w.label, "uid": w.uids[-1] if w.uids else None, "statistic": statistic,
            "value": w.statistic, "value_text": objective.value_text(w.statistic),
            "speedup": summary.speedup_vs_baseline, "baseline": summary.baseline_name,
            "screening_only": summary.screening_only, "headline": summary.headline()}  # fmt: skip


class _Progress(Reporter):
    """The study's progress into the run's record (trials done), and a cancel read from the store between steps."""

    def __init__(self, store: Store, run: ledger.Run, job: ledger.Job, before: int, stop: threading.Event) -> None:
        self.store, self.run, self.job, self.before, self.stop = store, run, job, before, stop
        self.checked = 0.0

    def phase(self, text: str) -> None:
        self._check_cancel()

    def trial_done(self, done: int, best: str | None) -> None:
        ledger.progress(self.store, self.run.id, self.before + done)
        self._check_cancel()

    def _check_cancel(self) -> None:
        if self.stop.is_set():
            raise AgentStopped()
        if time.monotonic() - self.checked < CANCEL_CHECK_S:
            return
        self.checked = time.monotonic()
        if ledger.cancelled(self.store, self.job.id):
            raise JobCancelled(f"fleet job {self.job.id} was cancelled")
