"""Between the schema's rows and the store's records: inserting a trial, and the one trial query.

:func:`insert_trial` writes a :class:`~autodeploy.harness.result.TrialResult` as its rows;
:func:`trial_query` selects the trials a :class:`~autodeploy.results_db.records.TrialFilter`
names, and :func:`to_row` reads each back as a :class:`~autodeploy.results_db.records.TrialRow`.
SQLAlchemy Core expressions only: every value is a bound parameter.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session, aliased, defer

from autodeploy.adapters.base import TrialConfig
from autodeploy.harness.result import Measurement as MeasurementRecord
from autodeploy.harness.result import TrialResult
from autodeploy.redact import mask_secrets
from autodeploy.results_db.records import DeviceRecord, ModelRecord, TrialFilter, TrialRow
from autodeploy.results_db.schema import Device, Measurement, Model, Trial


def insert_trial(
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
        model_id=model_id(s, model),
        device_id=device_id(s, device),
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
        command=mask_secrets(command),  # a --db URL's password is never stored
        artifact_path=result.artifact_path,
        artifact_files=result.artifact_files or None,
        shape_key=shape_key,
        shapes=None if shapes is None else {k: [int(d) for d in v] for k, v in shapes.items()},
        inputs=None if inputs is None else dict(inputs),
    )
    s.add(trial)
    s.flush()
    if result.measurement is not None:
        s.add(Measurement(trial_id=trial.id, **measurement_columns(result.measurement)))
        s.flush()
    return trial.id


def device_id(s: Session, device: DeviceRecord) -> int:
    found = s.scalar(sa.select(Device.id).where(Device.fingerprint == device.fingerprint))
    if found is not None:
        return found
    row = Device(fingerprint=device.fingerprint, cpu=device.cpu, info=dict(device.info))
    s.add(row)
    s.flush()
    return row.id


def model_id(s: Session, model: ModelRecord) -> int:
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


def measurement_columns(m: MeasurementRecord) -> dict[str, Any]:
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
    columns["roofline"] = None if m.roofline is None else m.roofline.to_dict()
    columns["cost"] = None if m.cost is None else m.cost.to_dict()
    columns["cold_start"] = None if m.cold_start is None else m.cold_start.to_dict()
    columns["accuracy_passed"] = None if m.accuracy is None else m.accuracy.passed
    return columns


def measurement_record(ms: Measurement, *, samples: bool) -> MeasurementRecord:
    """The inverse of :func:`measurement_columns` (``samples_ms`` only when loaded: the column is deferred otherwise)."""
    d: dict[str, Any] = {}
    for key in MeasurementRecord.keys(samples=samples):
        if key.endswith("_ci"):
            d[key] = _pair(getattr(ms, f"{key}_low"), getattr(ms, f"{key}_high"))
        else:
            d[key] = getattr(ms, key)
    return MeasurementRecord.from_dict({**d, "serving": ms.serving, "load": ms.load, "roofline": ms.roofline,
                                        "cost": ms.cost, "cold_start": ms.cold_start})  # fmt: skip


def trial_query(where: TrialFilter, *, samples: bool) -> sa.Select[Any]:
    """The trials ``where`` selects, each joined to its model, device and first measurement, in its
    order and limit (the raw samples loaded only when ``samples``: the column is large)."""
    query = filtered(joined(Trial, Model, Device, Measurement), where)
    if not samples:
        query = query.options(defer(Measurement.samples_ms))
    if where.newest_first:
        query = query.order_by(Trial.created_at.desc(), Trial.id.desc())
    else:
        query = query.order_by(Trial.id)
    return query.limit(where.limit)  # None: no limit


def joined(*columns: Any) -> sa.Select[Any]:
    """``columns`` over trials joined to their model, device and first measurement (``None`` when unmeasured).

    A trial has one measurement today; the (trial, scenario) key allows more later, so the first
    one is joined, to keep one row per trial.
    """
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


#: The filter fields that select by equality, and the column each compares (a value left empty selects all).
_EQUAL = {
    "uid": Trial.uid, "model_sha256": Model.sha256, "device": Device.fingerprint, "engine_version": Trial.engine_version,
    "config_key": Trial.config_key, "status": Trial.status, "study": Trial.study, "phase": Trial.phase,
    "scenario": Measurement.scenario,
}  # fmt: skip


def filtered(query: sa.Select[Any], where: TrialFilter) -> sa.Select[Any]:
    """``query`` (over :func:`joined`'s joins) narrowed to the trials ``where`` selects."""
    conditions = [column == getattr(where, name) for name, column in _EQUAL.items() if getattr(where, name)]
    if where.id is not None:
        conditions.append(Trial.id == where.id)
    if where.model:  # a name, or a SHA-256 prefix (LIKE wildcards in it escaped)
        conditions.append(sa.or_(Model.name == where.model,
                                 Model.sha256.startswith(where.model.lower(), autoescape=True)))  # fmt: skip
    if where.engines:
        conditions.append(Trial.engine.in_(where.engines))
    if where.shape_key is not None:
        same = Trial.shape_key == where.shape_key
        conditions.append(sa.or_(same, Trial.shape_key.is_(None)) if where.shape_key == "" else same)
    if where.measured_only:
        conditions.append(Measurement.id.is_not(None))
    return query.where(*conditions)


def utc(ts: datetime) -> datetime:
    # SQLite hands back naive datetimes; we only ever write UTC.
    return ts.replace(tzinfo=timezone.utc) if ts.tzinfo is None else ts.astimezone(timezone.utc)


def _pair(low: float | None, high: float | None) -> tuple[float, float] | None:
    return None if low is None or high is None else (low, high)


def to_row(t: Trial, m: Model, d: Device, ms: Measurement | None, *, samples: bool) -> TrialRow:
    return TrialRow(
        id=t.id, uid=t.uid, created_at=utc(t.created_at), status=t.status, failure_kind=t.failure_kind,
        failure_message=t.failure_message, study=t.study, phase=t.phase, command=mask_secrets(t.command),
        artifact_path=t.artifact_path, engine_version=t.engine_version, config=TrialConfig.from_dict(t.config),
        config_key=t.config_key, model_name=m.name, model_sha256=m.sha256, device_cpu=d.cpu,
        device_fingerprint=d.fingerprint, measurement=None if ms is None else measurement_record(ms, samples=samples),
        artifact_files=dict(t.artifact_files or {}), shape_key=t.shape_key,
        shapes=None if t.shapes is None else dict(t.shapes), inputs=None if t.inputs is None else dict(t.inputs),
    )  # fmt: skip
