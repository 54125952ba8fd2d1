"""SQLAlchemy models of the results database (docs/architecture.md, "Layers").

Portable across SQLite and PostgreSQL: generic types only (``sa.JSON``, timezone-aware
``DateTime``), every constraint named through :data:`NAMING_CONVENTION` so Alembic
migrations stay stable. Natural keys (device fingerprint, model SHA-256, trial uid) make
ingest idempotent.

Any change here needs a new revision in ``migrations/versions/``;
``tests/results_db/test_schema.py`` fails until the migrations match these models.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from autodeploy.results_db.states import JobState, RunState, check_constraint

#: Alembic's bookkeeping table. Not the default ``alembic_version``, which Optuna's RDB
#: storage also uses for its own migrations.
VERSION_TABLE = "autodeploy_alembic_version"

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class Base(DeclarativeBase):
    metadata = sa.MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {dict[str, Any]: sa.JSON, datetime: sa.DateTime(timezone=True)}


class Device(Base):
    """A machine as the target probe saw it; results compare only under one fingerprint."""

    __tablename__ = "ad_devices"

    id: Mapped[int] = mapped_column(primary_key=True)
    fingerprint: Mapped[str] = mapped_column(unique=True)
    cpu: Mapped[str]
    info: Mapped[dict[str, Any]]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Model(Base):
    """A model file, identified by the SHA-256 of its bytes (name and path as first seen)."""

    __tablename__ = "ad_models"

    id: Mapped[int] = mapped_column(primary_key=True)
    sha256: Mapped[str] = mapped_column(unique=True)
    name: Mapped[str]
    path: Mapped[str]
    inputs: Mapped[list[dict[str, Any]]] = mapped_column(sa.JSON)
    outputs: Mapped[list[dict[str, Any]]] = mapped_column(sa.JSON)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Trial(Base):
    """One config run once on one device for one model, successful or not."""

    __tablename__ = "ad_trials"
    __table_args__ = (
        sa.Index(None, "model_id", "device_id", "config_key"),
        sa.CheckConstraint("status IN ('ok', 'failed')", name="status"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    uid: Mapped[str] = mapped_column(unique=True)
    model_id: Mapped[int] = mapped_column(sa.ForeignKey("ad_models.id"))
    device_id: Mapped[int] = mapped_column(sa.ForeignKey("ad_devices.id"))
    study: Mapped[str | None] = mapped_column(index=True)
    phase: Mapped[str | None]  # "screening" or "finalist" inside a study; NULL for a plain bench
    engine: Mapped[str]
    engine_version: Mapped[str | None]
    precision: Mapped[str]
    batch: Mapped[int]
    threads: Mapped[int | None]
    config: Mapped[dict[str, Any]]
    config_key: Mapped[str]
    status: Mapped[str]
    failure_kind: Mapped[str | None]
    failure_message: Mapped[str | None] = mapped_column(sa.Text)
    command: Mapped[str | None] = mapped_column(sa.Text)
    artifact_path: Mapped[str | None] = mapped_column(sa.Text)  # the artifact as benchmarked, on that machine
    #: SHA-256 of every artifact file as measured; export ships only these bytes (NULL before revision 0002).
    artifact_files: Mapped[dict[str, str] | None] = mapped_column(sa.JSON)
    #: The shapes the user fixed for this trial (``x=1x3x48x320``; ``""`` for none): one case of a
    #: shape set, part of what identifies a measurement. NULL before revision 0003.
    shape_key: Mapped[str | None] = mapped_column(index=True)
    #: Every input's concrete shape as fed, ``{name: [dims]}`` (NULL before revision 0003, or when unknown).
    shapes: Mapped[dict[str, list[int]] | None] = mapped_column(sa.JSON)
    #: What it was fed, ``{"data": source, "preprocess": {...} | None}`` (NULL before revision 0005, or when unknown).
    inputs: Mapped[dict[str, Any] | None] = mapped_column(sa.JSON)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Study(Base):
    """A named search for one model on one device; ``summary`` holds the finalists and the winner."""

    __tablename__ = "ad_studies"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(unique=True)
    model_id: Mapped[int] = mapped_column(sa.ForeignKey("ad_models.id"))
    device_id: Mapped[int] = mapped_column(sa.ForeignKey("ad_devices.id"))
    objective: Mapped[str]
    settings: Mapped[dict[str, Any]]
    command: Mapped[str | None] = mapped_column(sa.Text)
    winner_uid: Mapped[str | None]
    summary: Mapped[dict[str, Any] | None] = mapped_column(sa.JSON(none_as_null=True))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)


class Measurement(Base):
    """What the harness measured for a trial in one scenario (times in milliseconds).

    ``p90``/``p99`` columns are NULL when there were too few samples to claim them.
    """

    __tablename__ = "ad_measurements"
    __table_args__ = (sa.UniqueConstraint("trial_id", "scenario"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    trial_id: Mapped[int] = mapped_column(sa.ForeignKey("ad_trials.id", ondelete="CASCADE"))
    scenario: Mapped[str]
    batch: Mapped[int]
    n_samples: Mapped[int]
    median_ms: Mapped[float]
    mean_ms: Mapped[float]
    stdev_ms: Mapped[float]
    cv: Mapped[float]
    min_ms: Mapped[float]
    max_ms: Mapped[float]
    median_ci_low: Mapped[float]
    median_ci_high: Mapped[float]
    p90_ms: Mapped[float | None]
    p90_ci_low: Mapped[float | None]
    p90_ci_high: Mapped[float | None]
    p99_ms: Mapped[float | None]
    p99_ci_low: Mapped[float | None]
    p99_ci_high: Mapped[float | None]
    unstable: Mapped[bool]
    throughput: Mapped[float | None]  # items per second
    peak_rss_mb: Mapped[float | None]
    artifact_mb: Mapped[float | None]
    build_s: Mapped[float | None]
    accuracy: Mapped[dict[str, Any] | None] = mapped_column(sa.JSON(none_as_null=True))
    accuracy_passed: Mapped[bool | None]
    samples_ms: Mapped[list[float]] = mapped_column(sa.JSON)  # raw per-call latencies
    warmup_calls: Mapped[int]
    duration_s: Mapped[float]
    serving: Mapped[dict[str, Any] | None] = mapped_column(sa.JSON(none_as_null=True))  # requests in flight, server split
    #: How busy the machine was over the timed phase (``harness/load.py`` ``Load``); NULL before revision 0006.
    load: Mapped[dict[str, Any] | None] = mapped_column(sa.JSON(none_as_null=True))
    #: Operations per call, GOP/s achieved and share of the precision's peak (``roofline.Roofline``); NULL before
    #: revision 0008, or for a model whose operations were not counted (a model file run as given).
    roofline: Mapped[dict[str, Any] | None] = mapped_column(sa.JSON(none_as_null=True))
    #: A start in fresh processes (load, first inference; with and without the compiled cache); NULL before revision
    #: 0013 or where not asked for (``bench --cold-start``, objective ``cold-start``).
    cold_start: Mapped[dict[str, Any] | None] = mapped_column(sa.JSON(none_as_null=True))
    #: Energy per inference from a named meter, or the worker's CPU time per inference where none exists; NULL
    #: before revision 0013.
    cost: Mapped[dict[str, Any] | None] = mapped_column(sa.JSON(none_as_null=True))


class GateRun(Base):
    """One ``autodeploy gate`` verdict: baseline vs candidate on one device, per-metric statistics.

    ``mode`` is ``interleaved`` (both measured A B A B … in this run) or ``against-db`` (the
    candidate measured now against the stored history of the baseline: weaker, no interleaving).
    ``metrics`` holds one entry per metric (values, change and its CI, p-values, verdict, reason).
    """

    __tablename__ = "ad_gate_runs"
    __table_args__ = (
        sa.CheckConstraint("verdict IN ('pass', 'fail', 'inconclusive')", name="verdict"),
        sa.CheckConstraint("mode IN ('interleaved', 'against-db')", name="mode"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    device_id: Mapped[int] = mapped_column(sa.ForeignKey("ad_devices.id"), index=True)
    mode: Mapped[str]
    verdict: Mapped[str]
    baseline_ref: Mapped[str] = mapped_column(sa.Text)
    baseline_sha256: Mapped[str]
    baseline_config: Mapped[dict[str, Any]]
    candidate_ref: Mapped[str] = mapped_column(sa.Text)
    candidate_sha256: Mapped[str]
    candidate_config: Mapped[dict[str, Any]]
    settings: Mapped[dict[str, Any]]
    metrics: Mapped[list[dict[str, Any]]] = mapped_column(sa.JSON)
    notes: Mapped[list[str]] = mapped_column(sa.JSON)
    wall_s: Mapped[float]
    command: Mapped[str | None] = mapped_column(sa.Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Export(Base):
    """One bundle or Triton repository exported from a trial, known by its manifest's SHA-256.

    ``autodeploy bundle verify --db`` looks a bundle up here: "this is the bundle exported from trial N".
    """

    __tablename__ = "ad_exports"

    id: Mapped[int] = mapped_column(primary_key=True)
    trial_id: Mapped[int] = mapped_column(sa.ForeignKey("ad_trials.id"), index=True)
    manifest_sha256: Mapped[str] = mapped_column(index=True)
    format: Mapped[str]
    destination: Mapped[str] = mapped_column(sa.Text)
    signed: Mapped[bool]
    command: Mapped[str | None] = mapped_column(sa.Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


# -- fleet (autodeploy fleet / agent, docs/architecture.md "Fleet") -----------------------------------------
# The record of fleet jobs. Claiming, leases and retries are PgQueuer's, in its own schema (autodeploy_queue),
# outside these models and Alembic: a run's state here is what happened; the queue only says who holds it.
# The states a run or job row holds are the rows of results_db/states.py (RunState, JobState).


class FleetAgent(Base):
    """A device that runs fleet jobs: known by its name, bound to the public key (and the fingerprint) it first
    registered with."""

    __tablename__ = "ad_fleet_agents"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(unique=True)
    device_id: Mapped[int] = mapped_column(sa.ForeignKey("ad_devices.id"), index=True)
    fingerprint: Mapped[str]
    cpu: Mapped[str]
    #: {engine: "available" or why not}, as this agent's probe saw it at registration.
    engines: Mapped[dict[str, Any]]
    tags: Mapped[list[str]] = mapped_column(sa.JSON)
    version: Mapped[str]  # autodeploy's
    #: The PEM public key of the key pair its agent made at registration (``fleet/keys.py``): the device's
    #: identity. NULL before revision 0009, until the device's agent registers again.
    public_key: Mapped[str | None] = mapped_column(sa.Text)
    registered_at: Mapped[datetime] = mapped_column(default=utcnow)
    heartbeat_at: Mapped[datetime] = mapped_column(default=utcnow)
    #: When ``fleet forget`` retired it: no new job selects it, and its queued runs were cancelled; NULL: in service
    #: (an agent that registers under the name again puts it back).
    retired_at: Mapped[datetime | None] = mapped_column(default=None)


class FleetBlob(Base):
    """Bytes the fleet shares (a job's model and data, a run's winner bundle), known by their SHA-256: this row
    says what and how big, the bytes are its chunks (:class:`FleetBlobChunk`, revision 0012)."""

    __tablename__ = "ad_fleet_blobs"

    sha256: Mapped[str] = mapped_column(primary_key=True)
    size: Mapped[int] = mapped_column(sa.BigInteger)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    #: When ``fleet prune`` removed its chunks (a winner bundle past retention); the row stays, so the runs that
    #: name it keep their digest (their signed result names it) and ``fleet export`` says when. NULL: stored.
    pruned_at: Mapped[datetime | None] = mapped_column(default=None)


class FleetBlobChunk(Base):
    """One piece of a blob's bytes, ``seq`` from 0 (``fleet/ledger.py`` ``BLOB_CHUNK_BYTES`` each, the last
    shorter): written and read one at a time, so a large model never sits whole in memory or in one statement."""

    __tablename__ = "ad_fleet_blob_chunks"

    sha256: Mapped[str] = mapped_column(sa.ForeignKey("ad_fleet_blobs.sha256"), primary_key=True)
    seq: Mapped[int] = mapped_column(primary_key=True)
    data: Mapped[bytes] = mapped_column(sa.LargeBinary)


class FleetJob(Base):
    """A model submitted once, to be tuned by every device ``devices`` selects (``all``, ``NAME``, ``tag:TAG``)."""

    __tablename__ = "ad_fleet_jobs"
    __table_args__ = (sa.CheckConstraint(check_constraint(JobState), name="state"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    model_name: Mapped[str]  # as given: zoo:tiny-cnn, model.onnx
    model_file: Mapped[str]  # the file name an agent writes the model under (its suffix tells the format)
    model_sha256: Mapped[str] = mapped_column(sa.ForeignKey("ad_fleet_blobs.sha256"))
    #: ``{"sha256", "file"}`` of a data blob, ``{"ref": "sample:images"}``, or NULL (the default inputs).
    data: Mapped[dict[str, Any] | None] = mapped_column(sa.JSON(none_as_null=True))
    options: Mapped[dict[str, Any]]  # validated study config keys, never code (no metric)
    devices: Mapped[str]
    lost_after_s: Mapped[float]  # a device silent this long, queued or running, reads as lost
    state: Mapped[str]
    command: Mapped[str | None] = mapped_column(sa.Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    #: Until when a device that registers after the submission takes a run of it (``--accept-late``); NULL: none does.
    accept_late_until: Mapped[datetime | None] = mapped_column(default=None)
    #: A profile job's one config (``TrialConfig.to_dict``), measured on every device; NULL: the job tunes.
    profile: Mapped[dict[str, Any] | None] = mapped_column(sa.JSON(none_as_null=True), default=None)


class FleetRun(Base):
    """One job on one device: its own study, its state, progress and winner (the bundle as a blob)."""

    __tablename__ = "ad_fleet_runs"
    __table_args__ = (
        sa.UniqueConstraint("job_id", "agent_id"),
        sa.CheckConstraint(check_constraint(RunState), name="state"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    job_id: Mapped[int] = mapped_column(sa.ForeignKey("ad_fleet_jobs.id"), index=True)
    agent_id: Mapped[int] = mapped_column(sa.ForeignKey("ad_fleet_agents.id"), index=True)
    study: Mapped[str]
    state: Mapped[str]
    queue_job: Mapped[int | None] = mapped_column(sa.BigInteger)  # PgQueuer's job id, while queued
    attempts: Mapped[int] = mapped_column(default=0)  # times an agent took it (a lease taken back counts)
    trials: Mapped[int] = mapped_column(default=0)  # measured screening trials in its study so far
    #: The study's current step as its agent last wrote it (``screening 3/12``, ``exporting``); NULL when not running.
    phase: Mapped[str | None] = mapped_column(sa.Text, default=None)
    winner: Mapped[dict[str, Any] | None] = mapped_column(sa.JSON(none_as_null=True))
    bundle_sha256: Mapped[str | None] = mapped_column(sa.ForeignKey("ad_fleet_blobs.sha256"))
    reason: Mapped[str | None] = mapped_column(sa.Text)  # why it failed or was skipped; a note beside a winner
    skipped: Mapped[list[dict[str, str]] | None] = mapped_column(sa.JSON(none_as_null=True))  # engines left out, why
    #: The device key's signature over the run's result (``fleet/keys.py``, ``result_record``); NULL before 0009.
    signature: Mapped[str | None] = mapped_column(sa.Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
