"""The results store: every trial, successful or not, in one SQL database (docs/architecture.md, "Layers").

:class:`Store` is the facade: open it, add trials (and studies, gate runs, exports), read them
back. Trials are read one way, :meth:`Store.trials` with a
:class:`~autodeploy.results_db.records.TrialFilter`; :meth:`Store.trial` is its first row.
The records live in :mod:`~autodeploy.results_db.records`, URLs and engines in
:mod:`~autodeploy.results_db.connection`, the row mapping in :mod:`~autodeploy.results_db.rows`.

The schema is upgraded to head when a store opens read-write; read-only stores (the dashboard)
never migrate and refuse writes. Every failure to open, read or write is a
:class:`~autodeploy.errors.StoreError` naming the database and the fix; data that breaks the
schema is a bug and keeps its SQLAlchemy exception.

Contract: one :class:`Store` may be shared by threads (it holds a connection pool, no
session state); several processes may write one SQLite file (writes take the lock up front
with ``BEGIN IMMEDIATE``) but parallel workers belong on PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.orm import Session

from autodeploy.errors import StoreError
from autodeploy.harness.result import TrialResult
from autodeploy.redact import mask_secrets
from autodeploy.results_db import connection, migrate, rows
from autodeploy.results_db.records import (
    Catalog,
    DeviceRecord,
    DeviceRow,
    ExportRow,
    GateRunRecord,
    GateRunRow,
    ModelRecord,
    StudyRow,
    TrialFilter,
    TrialRow,
)
from autodeploy.results_db.schema import Device, Export, GateRun, Measurement, Model, Study, Trial

T = TypeVar("T")
#: No filter: every trial, oldest first.
ALL_TRIALS = TrialFilter()


class Store:
    """The SQL store of every trial. Open with :meth:`Store.open`; use as a context manager."""

    def __init__(self, engine: sa.Engine, url: str, *, readonly: bool) -> None:
        self.engine = engine
        self.url = url  # as shown to users: password hidden
        self.readonly = readonly
        self._write_engine = engine.execution_options(autodeploy_write=True)

    # -- opening ---------------------------------------------------------------------------

    @classmethod
    def open(cls, url: str | None = None, *, readonly: bool = False, connections: int | None = None) -> Store:
        """Open (and, unless ``readonly``, create or upgrade) the results database.

        Args:
            url: a SQLAlchemy URL (``sqlite:///path``, ``postgresql+psycopg://...``) or a plain
                file path; default ``$AUTODEPLOY_DB``, else ``results.db`` in the user data folder.
            readonly: open without migrating; every write raises :class:`StoreError`.
            connections: on PostgreSQL, the most connections it holds at once (a fleet agent's budget).

        Raises:
            StoreError: the database cannot be opened; the message names it and the fix.
        """
        engine, shown = connection.connect(url, readonly=readonly, connections=connections)
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
            return rows.insert_trial(s, result, model, device, command=command, study=study, phase=phase,
                                     shape_key=shape_key, shapes=shapes, inputs=inputs)  # fmt: skip

        what = f"cannot store trial {result.uid} in"
        try:
            return self.transaction(what, insert, write=True)
        except sa.exc.IntegrityError:
            # On PostgreSQL a concurrent writer may have stored the same device, model or uid
            # first; the retry finds its rows. Failing again means bad data: raise it.
            return self.transaction(what, insert, write=True)

    # -- reading ---------------------------------------------------------------------------

    def trials(self, where: TrialFilter = ALL_TRIALS, *, samples: bool = False) -> list[TrialRow]:
        """The trials ``where`` selects, oldest first (newest first with ``where.newest_first``).

        The one trial query: a study's trials (``TrialFilter(study=name)``), the listing
        (``model=``, ``engines=``, ``status=``, ``limit=``), a config's measured history or its
        newest repeat (``model_sha256=``, ``device=``, ``config_key=``, ``measured_only=True``).

        Args:
            where: which trials, in which order, how many.
            samples: also load each measurement's raw per-call latencies (large).
        """
        return self._rows(rows.trial_query(where, samples=samples), samples=samples)

    def trial(self, where: TrialFilter, *, samples: bool = True) -> TrialRow | None:
        """The first trial :meth:`trials` gives for ``where`` (e.g. ``TrialFilter(id=7)`` or ``uid=``),
        with its samples unless told otherwise; ``None`` when there is none."""
        found = self.trials(replace(where, limit=1), samples=samples)
        return found[0] if found else None

    def trial_counts(self, where: TrialFilter = ALL_TRIALS) -> dict[str, int]:
        """How many trials that match ``where`` have each status (``ok``, ``failed``): one query, no rows read."""
        query = rows.filtered(rows.joined(Trial.status, sa.func.count()), where).group_by(Trial.status)
        return self.transaction("cannot read", lambda s: {status: int(n) for status, n in s.execute(query)})

    def trial_pairs(self, where: TrialFilter = ALL_TRIALS) -> list[tuple[str, str, str, str]]:
        """The (model SHA-256, model name, device fingerprint, cpu) pairs of the trials ``where`` selects,
        by model name and cpu: one query, no trial rows read."""
        columns = (Model.sha256, Model.name, Device.fingerprint, Device.cpu)
        query = rows.filtered(rows.joined(*columns), where).distinct()
        query = query.order_by(Model.name, Device.cpu, Device.fingerprint)
        return self.transaction("cannot read", lambda s: [tuple(r) for r in s.execute(query)])

    def samples(self, trial_ids: tuple[int, ...]) -> dict[int, tuple[float, ...]]:
        """The raw per-call latencies (ms) of these trials' measurements, by trial id (unmeasured ones absent)."""
        query = sa.select(Measurement.trial_id, Measurement.samples_ms).where(
            Measurement.trial_id.in_(trial_ids)
        )
        return self.transaction("cannot read", lambda s: {t: tuple(v) for t, v in s.execute(query)})

    def catalog(self) -> Catalog:
        """The models, devices, engines, scenarios and studies in the store."""

        def fetch(s: Session) -> Catalog:
            models = s.execute(sa.select(Model.sha256, Model.name).order_by(Model.name)).all()
            devices = s.execute(sa.select(Device.fingerprint, Device.cpu).order_by(Device.id)).all()
            engines = s.scalars(sa.select(Trial.engine).distinct().order_by(Trial.engine)).all()
            scenarios = s.scalars(
                sa.select(Measurement.scenario).distinct().order_by(Measurement.scenario)
            ).all()
            studies = s.scalars(sa.select(Study.name).order_by(Study.updated_at.desc())).all()
            return Catalog(tuple((a, b) for a, b in models), tuple((a, b) for a, b in devices), tuple(engines),
                           tuple(scenarios), tuple(studies))  # fmt: skip

        return self.transaction("cannot read", fetch)

    def list_devices(self) -> list[DeviceRow]:
        """Every stored device, oldest first, with its number of trials."""
        counts = sa.select(Trial.device_id, sa.func.count().label("n")).group_by(Trial.device_id).subquery()
        query = (
            sa.select(Device, counts.c.n)
            .outerjoin(counts, counts.c.device_id == Device.id)
            .order_by(Device.id)
        )

        def fetch(s: Session) -> list[DeviceRow]:
            return [DeviceRow(d.fingerprint, d.cpu, dict(d.info), rows.utc(d.created_at), int(n or 0))
                    for d, n in s.execute(query)]  # fmt: skip

        return self.transaction("cannot read", fetch)

    def has_tables(self, *names: str) -> bool:
        """Whether every one of these tables exists (e.g. Optuna's, which share the database)."""

        def check(s: Session) -> bool:
            inspector = sa.inspect(s.connection())
            return all(inspector.has_table(name) for name in names)

        return self.transaction("cannot read", check)

    def artifact_files_measured(self, path: str | Path) -> list[dict[str, str]]:
        """The files (name -> SHA-256, ``artifact.json`` included) of the artifact at ``path``, as each
        trial stored here measured them: what a cached artifact taken again must still be."""

        def fetch(s: Session) -> list[dict[str, str]]:
            query = sa.select(Trial.artifact_files).where(Trial.artifact_path == str(path),
                                                          Trial.artifact_files.is_not(None))  # fmt: skip
            return [dict(files) for files in s.execute(query).scalars()]

        return self.transaction("cannot read", fetch)

    def model_interface(self, sha256: str) -> dict[str, Any] | None:
        """A stored model's name, SHA-256, inputs and outputs; ``None`` when it is not stored."""

        def fetch(s: Session) -> dict[str, Any] | None:
            m = s.execute(sa.select(Model).where(Model.sha256 == sha256)).scalar_one_or_none()
            return m and {"name": m.name, "sha256": m.sha256, "inputs": m.inputs, "outputs": m.outputs}

        return self.transaction("cannot read", fetch)

    def device_info(self, fingerprint: str) -> dict[str, Any] | None:
        """A stored device's description (CPU, ISA, cores, memory, ...); ``None`` when it is not stored."""

        def fetch(s: Session) -> dict[str, Any] | None:
            query = sa.select(Device.info).where(Device.fingerprint == fingerprint)
            info = s.execute(query).scalar_one_or_none()
            return None if info is None else dict(info)

        return self.transaction("cannot read", fetch)

    def count_trials(self) -> int:
        return self.transaction("cannot read", lambda s: s.scalar(sa.select(sa.func.count()).select_from(Trial)))

    # -- exports ---------------------------------------------------------------------------

    def add_export(self, trial_id: int, *, manifest_sha256: str, format: str, destination: str, signed: bool,
                   command: str | None = None) -> int:  # fmt: skip
        """Record that trial ``trial_id`` was exported with this manifest digest; returns the export's id."""
        self._check_writable("cannot record an export in")

        def insert(s: Session) -> int:
            row = Export(trial_id=trial_id, manifest_sha256=manifest_sha256, format=format,
                         destination=destination, signed=signed, command=mask_secrets(command))  # fmt: skip
            s.add(row)
            s.flush()
            return row.id

        return self.transaction("cannot write to", insert, write=True)

    def exports_of(self, manifest_sha256: str) -> list[ExportRow]:
        """Every recorded export whose manifest has this SHA-256 (oldest first)."""

        def fetch(s: Session) -> list[ExportRow]:
            query = (sa.select(Export, Trial.uid, Trial.study).join(Trial, Export.trial_id == Trial.id)
                     .where(Export.manifest_sha256 == manifest_sha256).order_by(Export.id))  # fmt: skip
            return [ExportRow(e.id, e.trial_id, uid, study, e.manifest_sha256, e.format, e.destination, e.signed,
                              mask_secrets(e.command), rows.utc(e.created_at)) for e, uid, study in s.execute(query)]  # fmt: skip

        return self.transaction("cannot read", fetch)

    # -- gate runs -------------------------------------------------------------------------

    def add_gate_run(self, run: GateRunRecord, *, device: DeviceRecord, command: str | None = None) -> int:
        """Store one gate verdict; return its id."""
        self._check_writable("cannot store a gate run in")

        def insert(s: Session) -> int:
            row = GateRun(device_id=rows.device_id(s, device), command=mask_secrets(command), **asdict(run))
            s.add(row)
            s.flush()
            return row.id

        return self.transaction("cannot store a gate run in", insert, write=True)

    def list_gate_runs(
        self, *, limit: int = 50, verdict: str | None = None, candidate_sha256: str | None = None,
        device: str | None = None,
    ) -> list[GateRunRow]:  # fmt: skip
        """Stored gate verdicts, newest first, optionally filtered by verdict, candidate model or device fingerprint."""
        query = sa.select(GateRun, Device.fingerprint, Device.cpu).join(
            Device, GateRun.device_id == Device.id
        )
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
            return GateRunRow(**stored, id=g.id, device_fingerprint=fingerprint, command=mask_secrets(g.command),
                              created_at=rows.utc(g.created_at), device_cpu=cpu)  # fmt: skip

        def fetch(s: Session) -> list[GateRunRow]:
            return [row(g, fingerprint, cpu) for g, fingerprint, cpu in s.execute(query)]

        return self.transaction("cannot read", fetch)

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
                study = Study(name=name, model_id=rows.model_id(s, model), device_id=rows.device_id(s, device),
                              objective=objective, settings=settings, command=mask_secrets(command))  # fmt: skip
                s.add(study)
            else:
                study.settings, study.command = settings, study.command or mask_secrets(command)
            s.flush()
            return study.id

        what = f"cannot save study {name!r} in"
        try:
            return self.transaction(what, upsert, write=True)
        except sa.exc.IntegrityError:
            # Workers that join one study (--resume) may all find it missing and create it at once,
            # or race on its device or model row; the retry finds the rows the first one stored.
            return self.transaction(what, upsert, write=True)

    def finish_study(self, name: str, *, winner_uid: str | None, summary: dict[str, Any]) -> None:
        """Record the outcome of a study: the winning trial (or none) and the finalists' numbers."""
        self._check_writable(f"cannot save study {name!r} in")

        def update(s: Session) -> None:
            s.execute(sa.update(Study).where(Study.name == name).values(
                winner_uid=winner_uid, summary=summary, updated_at=datetime.now(timezone.utc)))  # fmt: skip

        self.transaction(f"cannot save study {name!r} in", update, write=True)

    def get_study(self, name: str) -> StudyRow | None:
        found = self._studies(sa.select(Study, Model, Device).where(Study.name == name))
        return found[0] if found else None

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

    def _studies(self, query: sa.Select[Any]) -> list[StudyRow]:
        query = query.join(Model, Study.model_id == Model.id).join(Device, Study.device_id == Device.id)

        def row(st: Study, m: Model, d: Device) -> StudyRow:
            return StudyRow(st.id, st.name, st.objective, st.settings, mask_secrets(st.command), st.winner_uid, st.summary, m.name,
                            m.sha256, d.fingerprint, rows.utc(st.created_at), rows.utc(st.updated_at), d.cpu)  # fmt: skip

        def fetch(s: Session) -> list[StudyRow]:
            return [row(st, m, d) for st, m, d in s.execute(query)]

        return self.transaction("cannot read", fetch)

    def _check_writable(self, what: str) -> None:
        if self.readonly:
            raise StoreError(f"{what} results database {self.url}: it is open read-only",
                             fix="open the store without readonly")  # fmt: skip

    # -- plumbing --------------------------------------------------------------------------

    def _rows(self, query: sa.Select[Any], *, samples: bool) -> list[TrialRow]:
        def fetch(s: Session) -> list[TrialRow]:
            return [rows.to_row(*r, samples=samples) for r in s.execute(query)]

        return self.transaction("cannot read", fetch)

    def transaction(self, what: str, fn: Callable[[Session], T], *, write: bool = False) -> T:
        """Run ``fn`` in one transaction of this store and return what it returns: the one way in, for the
        store's own methods and for every room that keeps its rows here (the fleet's ledger).

        Args:
            what: the start of the one-line error, e.g. ``"cannot write to"`` (``"... results database URL: reason"``).
            write: the transaction writes. On SQLite it then begins ``IMMEDIATE``, taking the write lock up front
                (waiting out another writer as long as the busy timeout allows) rather than failing with
                "locked" when a read lock is upgraded half-way through.

        Raises:
            StoreError: the database failed (locked, full, damaged, unreachable) or refused this role. Data
                that breaks the schema (IntegrityError, DataError, ProgrammingError) is a bug: it keeps its
                exception, and a caller may catch it (two processes inserting the same row at once).
        """
        try:
            with Session(self._write_engine if write else self.engine) as s, s.begin():
                return fn(s)
        except sa.exc.DatabaseError as err:
            # The database itself failed (locked, full, damaged, unreachable). Data that breaks the
            # schema (IntegrityError, DataError, ProgrammingError) is a bug and keeps its traceback.
            if connection.is_bug(err):
                raise
            raise self._error(what, err) from err

    def _error(self, what: str, err: Exception) -> StoreError:
        reason, fix = connection.diagnose(err)
        return StoreError(f"{what} results database {self.url}: {reason}", fix=fix)
