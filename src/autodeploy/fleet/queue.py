"""The queue that hands runs to agents: PgQueuer, in its own PostgreSQL schema.

PgQueuer does what a queue must and we do not write ourselves: claiming with ``FOR UPDATE SKIP LOCKED``, a
heartbeat on every picked job, taking back a job whose heartbeat stopped (a killed agent's lease), one job at
a time per device (``concurrency_limit=1`` on the device's entrypoint), one queued job per run (dedupe key),
and LISTEN/NOTIFY so an idle agent wakes when work arrives.

Each device is one entrypoint, ``fleet.NAME``; a job's payload is the id of its run in the store
(:mod:`autodeploy.fleet.ledger`), which stays the record. The tables live in the schema :data:`SCHEMA`,
installed here on first use (under an advisory lock, so agents starting together take turns), never by
Alembic. pgqueuer and psycopg are imported inside the functions: ``autodeploy`` works without them.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

if TYPE_CHECKING:
    from pgqueuer import Queries

#: PgQueuer's schema: its tables, types and trigger, apart from the store's (and from Optuna's).
SCHEMA = "autodeploy_queue"
#: The NOTIFY channel of PgQueuer's trigger (database-wide, so named for us). No agent listens on it: each listens on
#: its device's own (:func:`channel_of`), where its listener's health checks go and where a submit wakes it
#: (:func:`wake`), so N agents' checks are N deliveries, not N x N.
CHANNEL = "autodeploy_fleet"
#: Advisory lock key held while installing the schema ("adqueue" in ASCII).
_INSTALL_LOCK = 0x616471756575


def entrypoint(device: str) -> str:
    """The queue entrypoint of a device: its runs are enqueued there and only its agent dequeues them."""
    return f"fleet.{device}"


def channel_of(device: str) -> str:
    """A device's own NOTIFY channel: ``autodeploy_fleet.NAME`` (a name too long for PostgreSQL's 63-byte channel
    names goes by its SHA-256 instead)."""
    import hashlib

    name = f"{CHANNEL}.{device}"
    return name if len(name) <= 63 else f"{CHANNEL}.{hashlib.sha256(device.encode()).hexdigest()[:40]}"


def dedupe_key(run_id: int) -> str:
    """One queued (or picked) job per run, whoever enqueues it: the submitter, or the agent re-enqueueing."""
    return f"run:{run_id}"


def dsn(url: str) -> str:
    """A libpq connection string from the store's SQLAlchemy URL (``postgresql+psycopg://`` -> ``postgresql://``)."""
    return sa.make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def settings(channel: str = CHANNEL) -> Any:
    """PgQueuer's object names, in :data:`SCHEMA`, with ``channel`` (the trigger's is always :data:`CHANNEL`)."""
    from pgqueuer.domain.settings import DBSettings

    return DBSettings(db_schema=SCHEMA, channel=channel)


@asynccontextmanager
async def connected(url: str, device: str | None = None) -> AsyncIterator[Queries]:
    """PgQueuer's queries over one autocommit psycopg connection to the store's database, the schema installed;
    with ``device``, its health checks on that device's channel (:func:`channel_of`: an agent's)."""
    import psycopg
    from pgqueuer import PsycopgDriver, Queries
    from pgqueuer.adapters.persistence.qb import QueryBuilderEnvironment, QueryQueueBuilder

    def queries_of(names: Any) -> Queries:
        return Queries(PsycopgDriver(conn), qbe=QueryBuilderEnvironment(names), qbq=QueryQueueBuilder(names))

    name = f"autodeploy queue pid {os.getpid()}"  # pg_stat_activity names whose connection it is
    async with await psycopg.AsyncConnection.connect(dsn(url), autocommit=True, application_name=name) as conn:
        await _install(conn, queries_of(settings()))  # the trigger notifies CHANNEL, whoever installs it
        yield queries_of(settings(channel_of(device))) if device is not None else queries_of(settings())


async def _install(conn: Any, queries: Queries) -> None:
    """Create PgQueuer's schema once; concurrent first users wait on the advisory lock, then find it made."""
    if await queries.has_table(queries.qbe.settings.queue_table):
        return
    await conn.execute("SELECT pg_advisory_lock(%s)", (_INSTALL_LOCK,))
    try:
        if not await queries.schema_is_installed():
            await queries.install()
    finally:
        await conn.execute("SELECT pg_advisory_unlock(%s)", (_INSTALL_LOCK,))


async def enqueue(queries: Queries, runs: list[tuple[int, str]]) -> dict[int, int]:
    """Queue ``(run id, device)`` pairs; a run already queued or picked is skipped (its dedupe key).
    Returns ``{run id: queue job id}`` of those queued now."""
    if not runs:
        return {}
    ids = await queries.enqueue([entrypoint(d) for _, d in runs], [str(r).encode() for r, _ in runs], [0] * len(runs),
                                dedupe_key=[dedupe_key(r) for r, _ in runs], on_conflict="skip")  # fmt: skip
    await wake(queries, sorted({d for _, d in runs}))
    return {run: int(qid) for (run, _), qid in zip(runs, ids, strict=True) if qid is not None}


async def wake(queries: Queries, devices: list[str]) -> None:
    """Tell each device's agent that its queue changed (the event PgQueuer's trigger sends, on the device's own
    channel): an idle agent looks at once instead of at its next poll."""
    from pgqueuer.domain.models import TableChangedEvent, utc_now

    for device in devices:
        event = TableChangedEvent(channel=channel_of(device), sent_at=utc_now(), type="table_changed_event",
                                  operation="insert", table=queries.qbe.settings.queue_table)  # fmt: skip
        await queries.driver.notify(channel_of(device), event.model_dump_json())


async def withdraw(queries: Queries, queue_jobs: list[int]) -> None:
    """Take queued jobs out of the queue (logged as cancelled by PgQueuer)."""
    from pgqueuer.models import JobId

    if queue_jobs:
        await queries.mark_job_as_cancelled([JobId(j) for j in queue_jobs])
