"""The results store: every trial, successful or not, in one SQL database (docs/architecture.md, "Layers").

SQLite by default (one file, WAL mode, 30 s busy timeout, foreign keys on), any PostgreSQL
URL for a fleet. The schema is upgraded to head when a store opens read-write; read-only
stores (the dashboard) never migrate and refuse writes. Every failure to open, read or write
is a :class:`~autodeploy.errors.StoreError` naming the database and the fix; data that breaks
the schema is a bug and keeps its SQLAlchemy exception.

Contract: one :class:`Store` may be shared by threads (it holds a connection pool, no
session state); several processes may write one SQLite file (writes take the lock up front
with ``BEGIN IMMEDIATE``) but parallel workers belong on PostgreSQL.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import quote, unquote

import platformdirs
import sqlalchemy as sa
from sqlalchemy.orm import Session, aliased, defer

from autodeploy.adapters.base import TrialConfig
from autodeploy.errors import StoreError, StoreLocationError, UsageError
from autodeploy.harness.result import STATUSES, MeasuredShortcuts, TrialResult
from autodeploy.harness.result import Measurement as MeasurementRecord
from autodeploy.results_db import migrate
from autodeploy.results_db.schema import Device, Export, GateRun, Measurement, Model, Study, Trial

if TYPE_CHECKING:
    from autodeploy.device import DeviceInfo
    from autodeploy.model import ModelInfo

ENV_VAR = "AUTODEPLOY_DB"
BUSY_TIMEOUT_MS = 30_000
PG_CONNECT_TIMEOUT_S = 10
FIX_PATH = f"pass --db with a writable path or set {ENV_VAR}"
FIX_URL = "use sqlite:///path/to/results.db or postgresql+psycopg://user@host/dbname"
T = TypeVar("T")

#: What a driver's error text means and how to fix it: (text it contains, reason, fix).
_DIAGNOSES = (
    ("file is not a database", "the file is not an SQLite database", "pass --db with another path"),
    ("malformed", "the SQLite file is damaged", "restore it from a backup, or pass --db with another path"),
    (
        "database or disk is full",
        "the disk is full",
        "free disk space or pass --db with a path on another disk",
    ),
    ("unable to open database file", "the file cannot be opened or created", FIX_PATH),
    ("readonly database", "the file or its folder is read-only", FIX_PATH),
    (
        "database is locked",
        f"another process held the write lock for over {BUSY_TIMEOUT_MS // 1000} s",
        "let the other autodeploy process finish, or use PostgreSQL for parallel workers",
    ),
    (
        "connection refused",
        "the PostgreSQL server refused the connection",
        "start the server or fix the host and port in the URL",
    ),
    ("could not translate host name", "the PostgreSQL host name does not resolve", "fix the host in the URL"),
    (
        "timeout expired",
        f"PostgreSQL did not answer within {PG_CONNECT_TIMEOUT_S} s",
        "check the server is up and reachable from here",
    ),
    (
        "password authentication failed",
        "PostgreSQL rejected the user or password",
        "fix the user or password",
    ),
    (
        "does not exist",
        "the PostgreSQL database or role does not exist",
        "create it (createdb NAME) or fix the URL",
    ),
)


@dataclass(frozen=True)
class ModelRecord:
    """The model a trial ran, identified by the SHA-256 of its file."""

    sha256: str
    name: str
    path: str
    inputs: list[dict[str, Any]]
    outputs: list[dict[str, Any]]

    @classmethod
    def of(cls, info: ModelInfo) -> ModelRecord:
        return cls(info.sha256, info.name, str(info.path), [s.to_dict() for s in info.inputs],
                   [s.to_dict() for s in info.outputs])  # fmt: skip


@dataclass(frozen=True)
class DeviceRecord:
    """The device a trial ran on, identified by its fingerprint."""

    fingerprint: str
    cpu: str
    info: dict[str, Any]

    @classmethod
    def of(cls, device: DeviceInfo) -> DeviceRecord:
        return cls(device.fingerprint, device.cpu_model, device.to_dict())


@dataclass(frozen=True)
class StudyRow:
    """One stored study: what was searched, and (once finished) its winner and finalists."""

    id: int
    name: str
    objective: str
    settings: dict[str, Any]
    command: str | None
    winner_uid: str | None
    summary: dict[str, Any] | None
    model_name: str
    model_sha256: str
    device_fingerprint: str
    created_at: datetime
    updated_at: datetime
    device_cpu: str = ""


@dataclass(frozen=True)
class GateRunRecord:
    """One gate verdict to store (see :class:`~autodeploy.results_db.schema.GateRun`)."""

    mode: str  # "interleaved" or "against-db"
    verdict: str  # "pass", "fail" or "inconclusive"
    baseline_ref: str
    baseline_sha256: str
    baseline_config: dict[str, Any]
    candidate_ref: str
    candidate_sha256: str
    candidate_config: dict[str, Any]
    settings: dict[str, Any]
    metrics: list[dict[str, Any]]
    notes: list[str]
    wall_s: float


@dataclass(frozen=True)
class GateRunRow(GateRunRecord):
    """One stored gate verdict, with its device and time."""

    id: int = 0
    device_fingerprint: str = ""
    command: str | None = None
    created_at: datetime = datetime.min.replace(tzinfo=timezone.utc)
    device_cpu: str = ""


@dataclass(frozen=True)
class ExportRow:
    """One recorded export: which trial, which manifest digest, where and when."""

    id: int
    trial_id: int
    trial_uid: str
    study: str | None
    manifest_sha256: str
    format: str
    destination: str
    signed: bool
    command: str | None
    created_at: datetime


@dataclass(frozen=True)
class TrialRow(MeasuredShortcuts):
    """One stored trial with its config, model, device and measurement (``None`` for most failures).

    The measurement's ``samples_ms`` is ``None`` unless the query asked for samples.
    """

    id: int
    uid: str
    created_at: datetime
    status: str
    failure_kind: str | None
    failure_message: str | None
    study: str | None
    phase: str | None
    command: str | None
    artifact_path: str | None
    engine_version: str | None
    config: TrialConfig
    config_key: str
    model_name: str
    model_sha256: str
    device_cpu: str
    device_fingerprint: str
    measurement: MeasurementRecord | None = None
    #: SHA-256 of every artifact file as measured (empty for trials stored before schema 0002).
    artifact_files: dict[str, str] = field(default_factory=dict)
    #: The user-fixed shapes of this trial (``x=1x3x48x320``, ``""`` for none; ``None`` before schema 0003).
    shape_key: str | None = None
    #: Every input's concrete shape as fed (``None`` before schema 0003).
    shapes: dict[str, list[int]] | None = None
    #: What it was fed: ``{"data": source, "preprocess": {...} | None}`` (``None`` before schema 0005, or unknown).
    inputs: dict[str, Any] | None = None

    @property
    def shape_text(self) -> str:
        """The shape to show: the fixed shapes, else every input's shape as fed, else ``-`` (not recorded)."""
        if self.shape_key:
            return self.shape_key
        if self.shapes:
            return ";".join(f"{k}={'x'.join(map(str, v))}" for k, v in sorted(self.shapes.items()))
        return "-"

    @property
    def measured(self) -> bool:
        return self.measurement is not None

    # The config's columns, and shortcuts to the numbers the search, the gate and the CLI read.
    @property
    def engine(self) -> str:
        return self.config.engine

    @property
    def precision(self) -> str:
        return self.config.precision

    @property
    def batch(self) -> int:
        return self.config.batch

    @property
    def threads(self) -> int | None:
        return self.config.threads

    @property
    def samples_ms(self) -> tuple[float, ...] | None:
        return None if self.measurement is None else self.measurement.samples_ms


@dataclass(frozen=True)
class TrialFilter:
    """Which trials :meth:`Store.find_trials` returns; ``None`` or empty means no filter."""

    model_sha256: str | None = None
    device: str | None = None  # fingerprint
    engines: tuple[str, ...] = ()
    scenario: str | None = None
    study: str | None = None
    measured_only: bool = False


@dataclass(frozen=True)
class Catalog:
    """The values stored trials can be filtered by: models (sha256, name) by name, devices
    (fingerprint, cpu) oldest first, engines and scenarios sorted, studies newest first."""

    models: tuple[tuple[str, str], ...]
    devices: tuple[tuple[str, str], ...]
    engines: tuple[str, ...]
    scenarios: tuple[str, ...]
    studies: tuple[str, ...]


@dataclass(frozen=True)
class DeviceRow:
    """One stored device: its fingerprint, what the probe saw, and how many trials ran on it."""

    fingerprint: str
    cpu: str
    info: dict[str, Any]
    created_at: datetime
    trials: int


class Store:
    """The SQL store of every trial. Open with :meth:`Store.open`; use as a context manager."""

    def __init__(self, engine: sa.Engine, url: str, *, readonly: bool) -> None:
        self.engine = engine
        self.url = url  # as shown to users: password hidden
        self.readonly = readonly
        self._write_engine = engine.execution_options(autodeploy_write=True)

    # -- opening ---------------------------------------------------------------------------

    @classmethod
    def open(cls, url: str | None = None, *, readonly: bool = False) -> Store:
        """Open (and, unless ``readonly``, create or upgrade) the results database.

        Args:
            url: a SQLAlchemy URL (``sqlite:///path``, ``postgresql+psycopg://...``) or a plain
                file path; default ``$AUTODEPLOY_DB``, else ``results.db`` in the user data folder.
            readonly: open without migrating; every write raises :class:`StoreError`.

        Raises:
            StoreError: the database cannot be opened; the message names it and the fix.
        """
        target, shown = _resolve_url(url)
        if target.get_backend_name() == "sqlite":
            target = _check_sqlite_path(target, shown, readonly=readonly)
        engine = _create_engine(target, shown, readonly=readonly)
        store = cls(engine, shown, readonly=readonly)
        try:
            store._ensure_schema()
        except sa.exc.DBAPIError as err:
            engine.dispose()
            raise store._error("cannot open", err) from err
        except StoreError:
            engine.dispose()
            raise
        return store

    def _ensure_schema(self) -> None:
        with self.engine.connect() as conn:
            rev = migrate.current_revision(conn)
        head = migrate.head_revision()
        if rev == head:
            return
        if rev is not None and rev not in migrate.known_revisions():
            raise StoreError(
                f"cannot open results database {self.url}: its schema {rev} is newer than this "
                f"autodeploy's {head}",
                fix="upgrade autodeploy",
            )
        if self.readonly:
            what = "has no autodeploy schema" if rev is None else f"has schema {rev}, older than {head}"
            raise StoreError(
                f"cannot open results database {self.url} read-only: it {what}",
                fix="open it once read-write (e.g. run a study) to create or upgrade it",
            )
        migrate.upgrade(self.engine)

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Store({self.url!r}{', readonly' if self.readonly else ''})"

    # -- writing ---------------------------------------------------------------------------

    def add_trial(
        self,
        result: TrialResult,
        *,
        model: ModelRecord,
        device: DeviceRecord,
        command: str | None = None,
        study: str | None = None,
        phase: str | None = None,
        shape_key: str | None = None,
        shapes: Mapping[str, Sequence[int]] | None = None,
        inputs: Mapping[str, Any] | None = None,
    ) -> int:
        """Store a trial (and its measurement, if any) in one transaction; return its id.

        ``shape_key`` names the shapes the user fixed (:meth:`ShapeCase.key`), ``shapes`` every
        input's shape as fed: a trial is measured at one shape, and a repeat is found by it.
        ``inputs`` says what it was fed (data source, image preprocessing), for its bundle.

        The device and model are added when their fingerprint / SHA-256 is new, else the stored
        ones are used unchanged. A result whose ``uid`` is already stored changes nothing and
        returns the stored id. On any failure the transaction rolls back as a whole.

        Raises:
            StoreError: the store is read-only, or the database failed (disk full, locked, gone).
            sqlalchemy.exc.IntegrityError: the result breaks the schema (a bug in its producer).
        """
        if self.readonly:
            raise StoreError(
                f"cannot store trial {result.uid} in results database {self.url}: it is open read-only",
                fix="open the store without readonly",
            )

        def insert(s: Session) -> int:
            return _insert_trial(s, result, model, device, command=command, study=study, phase=phase,
                                 shape_key=shape_key, shapes=shapes, inputs=inputs)  # fmt: skip

        what = f"cannot store trial {result.uid} in"
        try:
            return self._run(what, insert, write=True)
        except sa.exc.IntegrityError:
            # On PostgreSQL a concurrent writer may have stored the same device, model or uid
            # first; the retry finds its rows. Failing again means bad data: raise it.
            return self._run(what, insert, write=True)

    # -- reading ---------------------------------------------------------------------------

    def get_trial(self, id: int) -> TrialRow | None:
        """The trial with this id, with its samples; ``None`` when there is none."""
        rows = self._rows(_select_rows(samples=True).where(Trial.id == id), samples=True)
        return rows[0] if rows else None

    def add_export(self, trial_id: int, *, manifest_sha256: str, format: str, destination: str, signed: bool,
                   command: str | None = None) -> int:  # fmt: skip
        """Record that trial ``trial_id`` was exported with this manifest digest; returns the export's id."""
        self._check_writable("record an export in")

        def insert(s: Session) -> int:
            row = Export(trial_id=trial_id, manifest_sha256=manifest_sha256, format=format,
                         destination=destination, signed=signed, command=command)  # fmt: skip
            s.add(row)
            s.flush()
            return row.id

        return self._run("cannot write to", insert, write=True)

    def exports_of(self, manifest_sha256: str) -> list[ExportRow]:
        """Every recorded export whose manifest has this SHA-256 (oldest first)."""

        def fetch(s: Session) -> list[ExportRow]:
            query = (sa.select(Export, Trial.uid, Trial.study).join(Trial, Export.trial_id == Trial.id)
                     .where(Export.manifest_sha256 == manifest_sha256).order_by(Export.id))  # fmt: skip
            return [ExportRow(e.id, e.trial_id, uid, study, e.manifest_sha256, e.format, e.destination, e.signed,
                              e.command, _utc(e.created_at)) for e, uid, study in s.execute(query)]  # fmt: skip

        return self._run("cannot read", fetch)

    def trial(self, uid: str, *, samples: bool = True) -> TrialRow | None:
        """The trial with this uid (as the harness chose it), with its samples; ``None`` when there is none."""
        rows = self._rows(_select_rows(samples=samples).where(Trial.uid == uid), samples=samples)
        return rows[0] if rows else None

    def find_trials(self, where: TrialFilter = TrialFilter(), *, samples: bool = False) -> list[TrialRow]:
        """Every trial that matches ``where``, oldest first (the dashboard's view; bound parameters only)."""
        return self._rows(_filtered(_select_rows(samples=samples), where).order_by(Trial.id), samples=samples)

    def trial_counts(self, where: TrialFilter = TrialFilter()) -> dict[str, int]:
        """How many trials that match ``where`` have each status (``ok``, ``failed``): one query, no rows read."""
        query = _filtered(_joined(Trial.status, sa.func.count()), where).group_by(Trial.status)
        return self._run("cannot read", lambda s: {status: int(n) for status, n in s.execute(query)})

    def trial_pairs(self, where: TrialFilter = TrialFilter()) -> list[tuple[str, str, str, str]]:
        """The (model SHA-256, model name, device fingerprint, cpu) pairs of the trials ``where`` selects,
        by model name and cpu: one query, no trial rows read."""
        columns = (Model.sha256, Model.name, Device.fingerprint, Device.cpu)
        query = _filtered(_joined(*columns), where).distinct().order_by(Model.name, Device.cpu, Device.fingerprint)
        return self._run("cannot read", lambda s: [tuple(r) for r in s.execute(query)])

    def samples(self, trial_ids: tuple[int, ...]) -> dict[int, tuple[float, ...]]:
        """The raw per-call latencies (ms) of these trials' measurements, by trial id (unmeasured ones absent)."""
        query = sa.select(Measurement.trial_id, Measurement.samples_ms).where(Measurement.trial_id.in_(trial_ids))
        return self._run("cannot read", lambda s: {t: tuple(v) for t, v in s.execute(query)})

    def catalog(self) -> Catalog:
        """The models, devices, engines, scenarios and studies in the store."""

        def fetch(s: Session) -> Catalog:
            models = s.execute(sa.select(Model.sha256, Model.name).order_by(Model.name)).all()
            devices = s.execute(sa.select(Device.fingerprint, Device.cpu).order_by(Device.id)).all()
            engines = s.scalars(sa.select(Trial.engine).distinct().order_by(Trial.engine)).all()
            scenarios = s.scalars(sa.select(Measurement.scenario).distinct().order_by(Measurement.scenario)).all()
            studies = s.scalars(sa.select(Study.name).order_by(Study.updated_at.desc())).all()
            return Catalog(tuple((a, b) for a, b in models), tuple((a, b) for a, b in devices), tuple(engines),
                           tuple(scenarios), tuple(studies))  # fmt: skip

        return self._run("cannot read", fetch)

    def list_devices(self) -> list[DeviceRow]:
        """Every stored device, oldest first, with its number of trials."""
        counts = sa.select(Trial.device_id, sa.func.count().label("n")).group_by(Trial.device_id).subquery()
        query = sa.select(Device, counts.c.n).outerjoin(counts, counts.c.device_id == Device.id).order_by(Device.id)

        def fetch(s: Session) -> list[DeviceRow]:
            return [DeviceRow(d.fingerprint, d.cpu, dict(d.info), _utc(d.created_at), int(n or 0))
                    for d, n in s.execute(query)]  # fmt: skip

        return self._run("cannot read", fetch)

    def has_tables(self, *names: str) -> bool:
        """Whether every one of these tables exists (e.g. Optuna's, which share the database)."""

        def check(s: Session) -> bool:
            inspector = sa.inspect(s.connection())
            return all(inspector.has_table(name) for name in names)

        return self._run("cannot read", check)

    def artifact_files_measured(self, path: str | Path) -> list[dict[str, str]]:
        """The files (name -> SHA-256, ``artifact.json`` included) of the artifact at ``path``, as each
        trial stored here measured them: what a cached artifact taken again must still be."""

        def fetch(s: Session) -> list[dict[str, str]]:
            query = sa.select(Trial.artifact_files).where(Trial.artifact_path == str(path),
                                                          Trial.artifact_files.is_not(None))  # fmt: skip
            return [dict(files) for files in s.execute(query).scalars()]

        return self._run("cannot read", fetch)

    def model_interface(self, sha256: str) -> dict[str, Any] | None:
        """A stored model's name, SHA-256, inputs and outputs; ``None`` when it is not stored."""

        def fetch(s: Session) -> dict[str, Any] | None:
            m = s.execute(sa.select(Model).where(Model.sha256 == sha256)).scalar_one_or_none()
            return m and {"name": m.name, "sha256": m.sha256, "inputs": m.inputs, "outputs": m.outputs}

        return self._run("cannot read", fetch)

    def device_info(self, fingerprint: str) -> dict[str, Any] | None:
        """A stored device's description (CPU, ISA, cores, memory, ...); ``None`` when it is not stored."""

        def fetch(s: Session) -> dict[str, Any] | None:
            query = sa.select(Device.info).where(Device.fingerprint == fingerprint)
            info = s.execute(query).scalar_one_or_none()
            return None if info is None else dict(info)

        return self._run("cannot read", fetch)

    def list_trials(
        self,
        *,
        model: str | None = None,
        engine: str | None = None,
        status: str | None = None,
        study: str | None = None,
        limit: int = 50,
        samples: bool = False,
    ) -> list[TrialRow]:
        """The newest trials first (a study's: oldest first, in the order they ran), filtered.

        Args:
            model: a model name, or a prefix of its SHA-256.
            engine: an engine name as in the trial config.
            status: ``"ok"`` or ``"failed"``.
            study: only this study's trials.
            limit: at most this many rows.
            samples: also load the raw per-call latencies (large).
        """
        if status is not None and status not in STATUSES:
            raise UsageError(f"unknown trial status {status!r}; choose from {', '.join(STATUSES)}")
        query = _select_rows(samples=samples)
        if model:
            query = query.where(
                sa.or_(Model.name == model, Model.sha256.startswith(model.lower(), autoescape=True))
            )
        if engine is not None:
            query = query.where(Trial.engine == engine)
        if status is not None:
            query = query.where(Trial.status == status)
        if study is not None:
            return self._rows(query.where(Trial.study == study).order_by(Trial.id).limit(limit), samples=samples)
        return self._rows(_newest_first(query).limit(limit), samples=samples)

    def count_trials(self) -> int:
        return self._run("cannot read", lambda s: s.scalar(sa.select(sa.func.count()).select_from(Trial)))

    def find_measured(
        self,
        model_sha256: str,
        fingerprint: str,
        config_key: str,
        engine_version: str | None,
        *,
        samples: bool = False,
        shape_key: str = "",
        scenario: str | None = None,
    ) -> TrialRow | None:
        """The newest trial with a measurement for this model, device, config, engine version and shape
        (and ``scenario``, when given: an offline number is no single-stream one).

        Failed trials that were measured (``inaccurate``) count: their numbers are still valid.
        ``config_key`` is :meth:`TrialConfig.key`; ``engine_version=None`` matches only NULL.
        ``shape_key`` is the fixed shapes' :meth:`ShapeCase.key`; ``""`` (none fixed) also matches
        trials stored before shapes were recorded.
        """
        same_shape = Trial.shape_key == shape_key
        if not shape_key:
            same_shape = sa.or_(same_shape, Trial.shape_key.is_(None))
        query = _select_rows(samples=samples).where(
            Model.sha256 == model_sha256,
            Device.fingerprint == fingerprint,
            Trial.config_key == config_key,
            Trial.engine_version == engine_version,  # None renders as IS NULL
            same_shape,
            Measurement.id.is_not(None),
        )
        if scenario is not None:
            query = query.where(Measurement.scenario == scenario)
        rows = self._rows(_newest_first(query).limit(1), samples=samples)
        return rows[0] if rows else None

    def history(
        self, model_sha256: str, fingerprint: str, config_key: str, *, limit: int = 50, samples: bool = False
    ) -> list[TrialRow]:
        """Measured trials of this model, config and device, newest first: one row per worker run.

        Trials that failed after being measured (``inaccurate``) count, as in :meth:`find_measured`.
        """
        query = _select_rows(samples=samples).where(
            Model.sha256 == model_sha256,
            Device.fingerprint == fingerprint,
            Trial.config_key == config_key,
            Measurement.id.is_not(None),
        )
        return self._rows(_newest_first(query).limit(limit), samples=samples)

    # -- gate runs -------------------------------------------------------------------------

    def add_gate_run(self, run: GateRunRecord, *, device: DeviceRecord, command: str | None = None) -> int:
        """Store one gate verdict; return its id."""
        self._check_writable("cannot store a gate run in")

        def insert(s: Session) -> int:
            row = GateRun(device_id=_device_id(s, device), command=command, **asdict(run))
            s.add(row)
            s.flush()
            return row.id

        return self._run("cannot store a gate run in", insert, write=True)

    def list_gate_runs(
        self, *, limit: int = 50, verdict: str | None = None, candidate_sha256: str | None = None,
        device: str | None = None,
    ) -> list[GateRunRow]:  # fmt: skip
        """Stored gate verdicts, newest first, optionally filtered by verdict, candidate model or device fingerprint."""
        query = sa.select(GateRun, Device.fingerprint, Device.cpu).join(Device, GateRun.device_id == Device.id)
        if verdict is not None:
            query = query.where(GateRun.verdict == verdict)
        if candidate_sha256 is not None:
            query = query.where(GateRun.candidate_sha256 == candidate_sha256)
        if device is not None:
            query = query.where(Device.fingerprint == device)
        query = query.order_by(GateRun.created_at.desc(), GateRun.id.desc()).limit(limit)
        fields = [f for f in GateRunRecord.__dataclass_fields__]

        def row(g: GateRun, fingerprint: str, cpu: str) -> GateRunRow:
            stored = {f: getattr(g, f) for f in fields}
            return GateRunRow(**stored, id=g.id, device_fingerprint=fingerprint, command=g.command,
                              created_at=_utc(g.created_at), device_cpu=cpu)  # fmt: skip

        def fetch(s: Session) -> list[GateRunRow]:
            return [row(g, fingerprint, cpu) for g, fingerprint, cpu in s.execute(query)]

        return self._run("cannot read", fetch)

    # -- studies ---------------------------------------------------------------------------

    def save_study(
        self, name: str, *, model: ModelRecord, device: DeviceRecord, objective: str,
        settings: dict[str, Any], command: str | None,
    ) -> int:  # fmt: skip
        """Create the study ``name``, or refresh its settings when it exists (resume).

        The command that created the study is kept: it is the one that reproduces it (``--resume
        --trials 0`` names no ``--data`` or ``--engine``); it is set here only when none was stored."""
        self._check_writable(f"cannot save study {name!r} in")

        def upsert(s: Session) -> int:
            study = s.scalar(sa.select(Study).where(Study.name == name))
            if study is None:
                study = Study(name=name, model_id=_model_id(s, model), device_id=_device_id(s, device),
                              objective=objective, settings=settings, command=command)  # fmt: skip
                s.add(study)
            else:
                study.settings, study.command = settings, study.command or command
            s.flush()
            return study.id

        what = f"cannot save study {name!r} in"
        try:
            return self._run(what, upsert, write=True)
        except sa.exc.IntegrityError:
            # Workers that join one study (--resume) may all find it missing and create it at once,
            # or race on its device or model row; the retry finds the rows the first one stored.
            return self._run(what, upsert, write=True)

    def finish_study(self, name: str, *, winner_uid: str | None, summary: dict[str, Any]) -> None:
        """Record the outcome of a study: the winning trial (or none) and the finalists' numbers."""
        self._check_writable(f"cannot save study {name!r} in")

        def update(s: Session) -> None:
            s.execute(sa.update(Study).where(Study.name == name).values(
                winner_uid=winner_uid, summary=summary, updated_at=datetime.now(timezone.utc)))  # fmt: skip

        self._run(f"cannot save study {name!r} in", update, write=True)

    def get_study(self, name: str) -> StudyRow | None:
        rows = self._studies(sa.select(Study, Model, Device).where(Study.name == name))
        return rows[0] if rows else None

    def list_studies(
        self, limit: int | None = 50, *, model_sha256: str | None = None, device: str | None = None
    ) -> list[StudyRow]:
        """Stored studies, most recently updated first, optionally of one model or device fingerprint."""
        query = sa.select(Study, Model, Device).order_by(Study.updated_at.desc()).limit(limit)
        if model_sha256:
            query = query.where(Model.sha256 == model_sha256)
        if device:
            query = query.where(Device.fingerprint == device)
        return self._studies(query)

    def study_trials(self, name: str, *, phase: str | None = None, samples: bool = False) -> list[TrialRow]:
        """Every trial of a study, oldest first."""
        query = _select_rows(samples=samples).where(Trial.study == name)
        if phase is not None:
            query = query.where(Trial.phase == phase)
        return self._rows(query.order_by(Trial.id), samples=samples)

    def _studies(self, query: sa.Select[Any]) -> list[StudyRow]:
        query = query.join(Model, Study.model_id == Model.id).join(Device, Study.device_id == Device.id)

        def fetch(s: Session) -> list[StudyRow]:
            return [
                StudyRow(st.id, st.name, st.objective, st.settings, st.command, st.winner_uid, st.summary,
                         m.name, m.sha256, d.fingerprint, _utc(st.created_at), _utc(st.updated_at), d.cpu)  # fmt: skip
                for st, m, d in s.execute(query)
            ]

        return self._run("cannot read", fetch)

    def _check_writable(self, what: str) -> None:
        if self.readonly:
            raise StoreError(f"{what} results database {self.url}: it is open read-only",
                             fix="open the store without readonly")  # fmt: skip

    # -- plumbing --------------------------------------------------------------------------

    def _rows(self, query: sa.Select[Any], *, samples: bool) -> list[TrialRow]:
        def fetch(s: Session) -> list[TrialRow]:
            return [_to_row(*r, samples=samples) for r in s.execute(query)]

        return self._run("cannot read", fetch)

    def _run(self, what: str, fn: Callable[[Session], T], *, write: bool = False) -> T:
        """Run ``fn`` in one transaction; database failures become :class:`StoreError`."""
        try:
            with Session(self._write_engine if write else self.engine) as s, s.begin():
                return fn(s)
        except sa.exc.DatabaseError as err:
            # The database itself failed (locked, full, damaged, unreachable). Data that breaks the
            # schema (IntegrityError, DataError, ProgrammingError) is a bug and keeps its traceback.
            if isinstance(err, (sa.exc.IntegrityError, sa.exc.DataError, sa.exc.ProgrammingError)):
                raise
            raise self._error(what, err) from err

    def _error(self, what: str, err: Exception) -> StoreError:
        reason, fix = _diagnose(err)
        return StoreError(f"{what} results database {self.url}: {reason}", fix=fix)


# -- URLs and engines ----------------------------------------------------------------------


def default_url() -> str:
    """``sqlite:///<user data folder>/results.db``, creating the folder."""
    folder = Path(platformdirs.user_data_dir("autodeploy"))
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise StoreError(
            f"cannot open results database in {folder}: cannot create the folder ({err.strerror})",
            fix=FIX_PATH,
        ) from err
    return sa.URL.create("sqlite", database=str(folder / "results.db")).render_as_string()


def _resolve_url(url: str | None) -> tuple[sa.URL, str]:
    url = url or os.environ.get(ENV_VAR) or default_url()
    if "://" not in url:  # a plain file path
        url = sa.URL.create("sqlite", database=url).render_as_string()
    try:
        parsed = sa.make_url(url)
    except (sa.exc.ArgumentError, ValueError) as err:  # ValueError: a port that is not a number
        raise StoreError(f"cannot open results database {url!r}: not a database URL", fix=FIX_URL) from err
    shown = parsed.render_as_string(hide_password=True)
    if parsed.get_backend_name() not in ("sqlite", "postgresql"):
        raise StoreError(
            f"cannot open results database {shown}: unknown URL scheme {parsed.drivername!r} "
            "(autodeploy stores results in SQLite or PostgreSQL)",
            fix=FIX_URL,
        )
    return parsed, shown


def _check_sqlite_path(url: sa.URL, shown: str, *, readonly: bool) -> sa.URL:
    """Fail early, with the reason, where SQLite would only say 'unable to open'."""
    if url.database and url.database.startswith("file:"):
        if not readonly:
            return url
        url = url.set(database=_uri_path(url.database, shown))
    if not url.database or url.database == ":memory:":
        return url

    def fail(reason: str, fix: str = FIX_PATH) -> StoreError:
        return StoreLocationError(f"cannot open results database {shown}: {reason}", fix=fix)

    path = Path(url.database).absolute()
    if path.is_dir():
        raise fail(f"{path} is a folder, not a database file")
    if readonly:
        if not path.is_file():
            raise fail(
                "the file does not exist", fix="store a result first (autodeploy bench), or pass --db with an existing database"
            )
        return _readonly_uri(url, path, shown)
    if not path.parent.is_dir() or not os.access(path.parent, os.W_OK):
        raise fail(f"parent {path.parent} is not a writable folder")
    if path.exists() and not os.access(path, os.W_OK):
        raise fail("the file is not writable")
    return url


#: Query keys a read-only SQLite URL may carry: ``mode`` is replaced by ``ro``; the others cannot write.
_READONLY_KEYS = frozenset({"mode", "uri", "cache", "timeout"})
_FIX_READONLY = "give sqlite:///PATH (or sqlite:///file:PATH) with no '?' or '#' in the path and no other options"


def _uri_path(database: str, shown: str) -> str:
    """The file a ``file:`` URI names; a query or fragment inside it (``#``, ``%3F``) would override ``mode=ro``."""
    rest = database.removeprefix("file:")
    if "?" in rest or "#" in rest:
        raise StoreLocationError(
            f"cannot open results database {shown} read-only: its file: URI has a query or fragment in the path",
            fix=_FIX_READONLY,
        )
    if rest.startswith("//"):  # file://HOST/PATH: SQLite accepts only an empty host or localhost
        host, _, tail = rest[2:].partition("/")
        if host not in ("", "localhost"):
            raise StoreLocationError(
                f"cannot open results database {shown} read-only: file URI host {host!r} is not local",
                fix=_FIX_READONLY,
            )
        rest = "/" + tail
    return unquote(rest)


def _readonly_uri(url: sa.URL, path: Path, shown: str) -> sa.URL:
    """``sqlite:///file:PATH?mode=ro&uri=true``, built from the file's path, whatever mode the URL asked for."""
    foreign = sorted(set(url.query) - _READONLY_KEYS)
    if foreign:
        raise StoreLocationError(
            f"cannot open results database {shown} read-only: option {', '.join(foreign)} is not allowed there",
            fix=_FIX_READONLY,
        )
    query = {k: v for k, v in url.query.items() if k in ("cache", "timeout")}
    return url.set(database=f"file:{quote(str(path))}", query={**query, "mode": "ro", "uri": "true"})


def _create_engine(url: sa.URL, shown: str, *, readonly: bool) -> sa.Engine:
    kwargs: dict[str, Any] = {}
    if url.get_backend_name() == "postgresql":
        connect_args: dict[str, Any] = {}
        if "connect_timeout" not in url.query:
            connect_args["connect_timeout"] = PG_CONNECT_TIMEOUT_S
        if readonly:
            connect_args["options"] = "-c default_transaction_read_only=on"
        kwargs = {"connect_args": connect_args, "pool_pre_ping": True}
    elif url.database in (None, "", ":memory:"):
        kwargs = {"poolclass": sa.pool.StaticPool}  # one in-memory database, not one per connection
    try:
        engine = sa.create_engine(url, **kwargs)
    except ImportError as err:
        fix = "pip install 'autodeploy[postgres]'" if url.get_backend_name() == "postgresql" else FIX_URL
        raise StoreError(
            f"cannot open results database {shown}: its driver is not installed ({err})", fix=fix
        ) from err
    except sa.exc.ArgumentError as err:  # includes NoSuchModuleError: unknown driver
        raise StoreError(f"cannot open results database {shown}: {err}", fix=FIX_URL) from err
    if url.get_backend_name() == "sqlite":
        _configure_sqlite(engine, readonly=readonly)
    return engine


def _configure_sqlite(engine: sa.Engine, *, readonly: bool) -> None:
    @sa.event.listens_for(engine, "connect")
    def on_connect(dbapi_conn: Any, _record: Any) -> None:
        # The driver's own BEGIN handling is off: on_begin below emits it, so that writes can
        # take the lock up front instead of failing with "locked" when upgrading a read lock.
        dbapi_conn.isolation_level = None
        cursor = dbapi_conn.cursor()
        cursor.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS:d}")
        cursor.execute("PRAGMA foreign_keys = ON")
        if not readonly:
            cursor.execute("PRAGMA journal_mode = WAL")
        cursor.close()

    @sa.event.listens_for(engine, "begin")
    def on_begin(conn: sa.Connection) -> None:
        conn.exec_driver_sql(
            "BEGIN IMMEDIATE" if conn.get_execution_options().get("autodeploy_write") else "BEGIN"
        )


def _diagnose(err: Exception) -> tuple[str, str]:
    text = str(getattr(err, "orig", None) or err)
    first = next((line.strip() for line in text.splitlines() if line.strip()), type(err).__name__)
    for needle, reason, fix in _DIAGNOSES:
        if needle in text.lower():
            return f"{reason} ({first[:200]})", fix
    return first[:300], f"check the database URL (--db or {ENV_VAR})"


# -- rows ----------------------------------------------------------------------------------


def _insert_trial(
    s: Session,
    result: TrialResult,
    model: ModelRecord,
    device: DeviceRecord,
    *,
    command: str | None,
    study: str | None,
    phase: str | None,
    shape_key: str | None = None,
    shapes: Mapping[str, Sequence[int]] | None = None,
    inputs: Mapping[str, Any] | None = None,
) -> int:
    existing = s.scalar(sa.select(Trial.id).where(Trial.uid == result.uid))
    if existing is not None:
        return existing
    cfg = result.config
    trial = Trial(
        uid=result.uid,
        model_id=_model_id(s, model),
        device_id=_device_id(s, device),
        study=study,
        phase=phase,
        engine=cfg.engine,
        engine_version=result.engine_version,
        precision=cfg.precision,
        batch=cfg.batch,
        threads=cfg.threads,
        config=cfg.to_dict(),
        config_key=cfg.key(),
        status=result.status,
        failure_kind=result.failure_kind,
        failure_message=result.failure_message,
        command=command,
        artifact_path=result.artifact_path,
        artifact_files=result.artifact_files or None,
        shape_key=shape_key,
        shapes=None if shapes is None else {k: [int(d) for d in v] for k, v in shapes.items()},
        inputs=None if inputs is None else dict(inputs),
    )
    s.add(trial)
    s.flush()
    if result.measurement is not None:
        s.add(Measurement(trial_id=trial.id, **_columns(result.measurement)))
        s.flush()
    return trial.id


def _device_id(s: Session, device: DeviceRecord) -> int:
    found = s.scalar(sa.select(Device.id).where(Device.fingerprint == device.fingerprint))
    if found is not None:
        return found
    row = Device(fingerprint=device.fingerprint, cpu=device.cpu, info=dict(device.info))
    s.add(row)
    s.flush()
    return row.id


def _model_id(s: Session, model: ModelRecord) -> int:
    found = s.scalar(sa.select(Model.id).where(Model.sha256 == model.sha256))
    if found is not None:
        return found
    row = Model(
        sha256=model.sha256,
        name=model.name,
        path=model.path,
        inputs=list(model.inputs),
        outputs=list(model.outputs),
    )
    s.add(row)
    s.flush()
    return row.id


def _columns(m: MeasurementRecord) -> dict[str, Any]:
    """The measurement's flat dict as ``ad_measurements`` columns: each ``*_ci`` pair becomes ``*_ci_low``/``*_ci_high``."""
    columns: dict[str, Any] = {}
    for key, value in m.to_dict().items():
        if key.endswith("_ci"):
            columns[f"{key}_low"], columns[f"{key}_high"] = value or (None, None)
        else:
            columns[key] = value
    columns["samples_ms"] = list(m.samples_ms or ())
    columns["serving"] = m.serving
    columns["load"] = None if m.load is None else m.load.to_dict()
    columns["accuracy_passed"] = None if m.accuracy is None else m.accuracy.passed
    return columns


def _record(ms: Measurement, *, samples: bool) -> MeasurementRecord:
    """The inverse of :func:`_columns` (``samples_ms`` only when loaded: the column is deferred otherwise)."""
    d: dict[str, Any] = {}
    for key in MeasurementRecord.keys(samples=samples):
        if key.endswith("_ci"):
            d[key] = _pair(getattr(ms, f"{key}_low"), getattr(ms, f"{key}_high"))
        else:
            d[key] = getattr(ms, key)
    return MeasurementRecord.from_dict({**d, "serving": ms.serving, "load": ms.load})


def _select_rows(*, samples: bool) -> sa.Select[Any]:
    # A trial has one measurement today; the (trial, scenario) key allows more later, so join
    # the first one to keep one row per trial.
    query = _joined(Trial, Model, Device, Measurement)
    return query if samples else query.options(defer(Measurement.samples_ms))


def _joined(*columns: Any) -> sa.Select[Any]:
    """``columns`` over trials joined to their model, device and first measurement (``None`` when unmeasured)."""
    other = aliased(Measurement)
    first = (
        sa.select(sa.func.min(other.id)).where(other.trial_id == Trial.id).correlate(Trial).scalar_subquery()
    )
    return (
        sa.select(*columns)
        .select_from(Trial)
        .join(Model, Trial.model_id == Model.id)
        .join(Device, Trial.device_id == Device.id)
        .outerjoin(Measurement, Measurement.id == first)
    )


def _filtered(query: sa.Select[Any], where: TrialFilter) -> sa.Select[Any]:
    """``query`` (over :func:`_select_rows`' joins) narrowed to the trials ``where`` selects."""
    if where.model_sha256:
        query = query.where(Model.sha256 == where.model_sha256)
    if where.device:
        query = query.where(Device.fingerprint == where.device)
    if where.engines:
        query = query.where(Trial.engine.in_(where.engines))
    if where.scenario:
        query = query.where(Measurement.scenario == where.scenario)
    if where.study:
        query = query.where(Trial.study == where.study)
    if where.measured_only:
        query = query.where(Measurement.id.is_not(None))
    return query


def _newest_first(query: sa.Select[Any]) -> sa.Select[Any]:
    return query.order_by(Trial.created_at.desc(), Trial.id.desc())


def _utc(ts: datetime) -> datetime:
    # SQLite hands back naive datetimes; we only ever write UTC.
    return ts.replace(tzinfo=timezone.utc) if ts.tzinfo is None else ts.astimezone(timezone.utc)


def _pair(low: float | None, high: float | None) -> tuple[float, float] | None:
    return None if low is None or high is None else (low, high)


def _to_row(t: Trial, m: Model, d: Device, ms: Measurement | None, *, samples: bool) -> TrialRow:
    return TrialRow(
        id=t.id, uid=t.uid, created_at=_utc(t.created_at), status=t.status, failure_kind=t.failure_kind,
        failure_message=t.failure_message, study=t.study, phase=t.phase, command=t.command,
        artifact_path=t.artifact_path, engine_version=t.engine_version, config=TrialConfig.from_dict(t.config),
        config_key=t.config_key, model_name=m.name, model_sha256=m.sha256, device_cpu=d.cpu,
        device_fingerprint=d.fingerprint, measurement=None if ms is None else _record(ms, samples=samples),
        artifact_files=dict(t.artifact_files or {}), shape_key=t.shape_key,
        shapes=None if t.shapes is None else dict(t.shapes), inputs=None if t.inputs is None else dict(t.inputs),
    )  # fmt: skip
