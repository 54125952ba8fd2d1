"""The records the results store takes and gives back: frozen dataclasses, no SQL.

What goes in (:class:`ModelRecord`, :class:`DeviceRecord`, :class:`GateRunRecord`), what comes
out (:class:`TrialRow`, :class:`StudyRow`, :class:`GateRunRow`, :class:`ExportRow`,
:class:`DeviceRow`, :class:`Catalog`), a trial a run just stored (:class:`StoredTrial`, whose ``row``
is its :class:`TrialRow`), and which trials to read (:class:`TrialFilter`). They are
kept apart from :mod:`~autodeploy.results_db.store` so that readers of results (reports, the
search, the dashboard) can name them without the SQL machinery.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from autodeploy.adapters.base import TrialConfig
from autodeploy.errors import UsageError
from autodeploy.harness.result import STATUSES, MeasuredShortcuts, TrialResult
from autodeploy.harness.result import Measurement as MeasurementRecord

if TYPE_CHECKING:
    from autodeploy.model import ModelInfo
    from autodeploy.runtime.device import DeviceInfo


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

    The measurement's ``samples_ms`` is ``None`` unless the query asked for samples. A trial a run just
    stored is one too (:attr:`StoredTrial.row`), with what that run knows of it.
    """

    id: int
    uid: str
    created_at: datetime | None  # None: a trial just stored, not read back (StoredTrial.row)
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
    #: What accuracy was judged on when it was not the user's data (the harness's note, ``result.extra["inputs"]``):
    #: known to the run that measured it (:attr:`StoredTrial.row`); the store does not keep it (``None`` read back).
    inputs_note: str | None = None

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
class StoredTrial:
    """One trial a run measured and stored (what :func:`autodeploy.api.bench` returns): its id in the store, and the
    run's own result, model and device. ``Store.trial(TrialFilter(id=id))`` reads the same trial back.

    :attr:`row` is it as a :class:`TrialRow`, the one record of a stored trial that readers (the JSON record, the
    tables) take. ``result.ok`` is false when the trial failed (``result.failure_kind`` says how); it is stored
    all the same.
    """

    id: int
    result: TrialResult
    model: ModelInfo
    device: DeviceInfo
    shape_key: str = ""  # the shapes fixed for it (``x=1x3x48x320``), "" for none

    @property
    def ok(self) -> bool:
        return self.result.ok

    @property
    def config(self) -> TrialConfig:
        return self.result.config

    @property
    def row(self) -> TrialRow:
        """This trial as a :class:`TrialRow`, from what the run knows: its time, study, phase, command and the
        shapes as fed are left ``None`` (read the trial back for them); ``inputs_note`` is the harness's."""
        r = self.result
        return TrialRow(id=self.id, uid=r.uid, created_at=None, status=r.status, failure_kind=r.failure_kind,
                        failure_message=r.failure_message, study=None, phase=None, command=None,
                        artifact_path=r.artifact_path, engine_version=r.engine_version, config=r.config,
                        config_key=r.config.key(), model_name=self.model.name, model_sha256=self.model.sha256,
                        device_cpu=self.device.cpu_model, device_fingerprint=self.device.fingerprint,
                        measurement=r.measurement, artifact_files=dict(r.artifact_files), shape_key=self.shape_key,
                        inputs_note=r.extra.get("inputs"))  # fmt: skip


@dataclass(frozen=True)
class TrialFilter:
    """Which trials :meth:`Store.trials <autodeploy.results_db.store.Store.trials>` reads, and in which order.

    The one way to ask the store for trials: by id or uid, by what ran (model, device, config,
    engine version, shape, scenario), by outcome, or by study. A field left at its default
    (``None``, empty, ``False``) selects every trial; the fields given must all hold. Values
    become bound parameters, never SQL text. ``limit`` and ``newest_first`` shape the rows read;
    the store's counts ignore them.

    Raises:
        UsageError: an unknown ``status`` or a ``limit`` below 1 (one line with the fix).
    """

    id: int | None = None
    uid: str | None = None  # as the harness chose it: exact and case-sensitive
    model: str | None = None  # a model name, or a prefix of its SHA-256, as users type it
    model_sha256: str | None = None  # exactly this model
    device: str | None = None  # fingerprint
    engines: tuple[str, ...] = ()  # any of these
    engine_version: str | None = None
    config_key: str | None = None  # :meth:`TrialConfig.key`
    #: The fixed shapes' :meth:`ShapeCase.key`; ``""`` (none fixed) also matches trials stored before shapes were.
    shape_key: str | None = None
    status: str | None = None  # "ok" or "failed"
    study: str | None = None
    phase: str | None = None  # a study's "screening" or "finalist"
    scenario: str | None = None  # of the measurement
    #: Only trials with a measurement: a trial that failed after it was measured (``inaccurate``) counts.
    measured_only: bool = False
    newest_first: bool = False  # else oldest first, the order they ran
    limit: int | None = None  # at most this many rows

    def __post_init__(self) -> None:
        if self.status and self.status not in STATUSES:
            raise UsageError(f"unknown trial status {self.status!r}; choose from {', '.join(STATUSES)}")
        if self.limit is not None and self.limit < 1:
            raise UsageError(f"cannot read {self.limit} trials", fix="ask for a limit of 1 or more")


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
