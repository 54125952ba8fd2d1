"""Every query the dashboard runs: SQLAlchemy Core selects over the store, bound parameters only.

Plain functions of an engine (or an Optuna storage) and plain values that return pandas
DataFrames or plain values, so they are tested without Streamlit; ``cache.py`` caches them.
Nothing here writes: the engine comes from a read-only :class:`~autodeploy.results_db.Store`
and the Optuna storage is opened without table creation (read-only on PostgreSQL too).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pandas as pd
import sqlalchemy as sa
from sqlalchemy.orm import aliased

from autodeploy import verdict
from autodeploy.adapters.base import TrialConfig
from autodeploy.harness.result import Accuracy
from autodeploy.results_db.schema import Device, Measurement, Model, Study, Trial
from autodeploy.verdict import accuracy_drop

if TYPE_CHECKING:
    import optuna

#: The CI gate's table (issue 8). A store made before the gate lacks it: the regressions page says so.
GATE_TABLE = "ad_gate_runs"
GATE_LIMIT = 500
#: Tables Optuna's RDB storage creates; their absence means no study was ever run on this database.
OPTUNA_TABLES = ("studies", "trials", "version_info")


@dataclass(frozen=True)
class Filters:
    """What the sidebar selected; ``None`` or empty means no filter."""

    model: str | None = None  # SHA-256
    device: str | None = None  # fingerprint
    engines: tuple[str, ...] = ()
    scenario: str | None = None
    study: str | None = None


@dataclass(frozen=True)
class Options:
    """The values each filter can take, as stored."""

    models: tuple[tuple[str, str], ...]  # (sha256, name)
    devices: tuple[tuple[str, str], ...]  # (fingerprint, cpu)
    engines: tuple[str, ...]
    scenarios: tuple[str, ...]
    studies: tuple[str, ...]


@dataclass(frozen=True)
class Metric:
    """A number to compare configs by, with its confidence-interval columns when the store has them."""

    label: str
    column: str
    ci: tuple[str, str] | None
    higher_is_better: bool


METRICS = {
    "latency": Metric("p90 latency (ms)", "latency_ms", ("latency_ci_low", "latency_ci_high"), False),
    "median": Metric("median latency (ms)", "median_ms", ("median_ci_low", "median_ci_high"), False),
    "throughput": Metric("throughput (items/s)", "throughput", None, True),
}  # fmt: skip
#: The metric that matches a study's objective (server and pareto studies are judged on latency here).
OBJECTIVE_METRIC = {
    "latency": "latency",
    "throughput": "throughput",
    "server": "latency",
    "pareto": "latency",
}

TRIAL_COLUMNS = [
    "trial_id", "uid", "created_at", "study", "phase", "status", "failure_kind", "failure_message",
    "engine", "engine_version", "precision", "batch", "threads", "config_label", "knobs", "artifact_path",
    "model", "model_sha256", "device", "cpu", "scenario", "n_samples", "median_ms", "median_ci_low",
    "median_ci_high", "p90_ms", "p90_ci_low", "p90_ci_high", "p99_ms", "latency_ms", "latency_ci_low",
    "latency_ci_high", "cv", "unstable", "throughput", "peak_rss_mb", "artifact_mb", "accuracy_passed",
    "accuracy_drop", "accuracy_constraint",
]  # fmt: skip


def options(engine: sa.Engine) -> Options:
    with engine.connect() as conn:
        models = conn.execute(sa.select(Model.sha256, Model.name).order_by(Model.name)).all()
        devices = conn.execute(sa.select(Device.fingerprint, Device.cpu).order_by(Device.id)).all()
        engines = conn.scalars(sa.select(Trial.engine).distinct().order_by(Trial.engine)).all()
        scenarios = conn.scalars(
            sa.select(Measurement.scenario).distinct().order_by(Measurement.scenario)
        ).all()
        studies = conn.scalars(sa.select(Study.name).order_by(Study.updated_at.desc())).all()
    return Options(tuple(map(tuple, models)), tuple(map(tuple, devices)), tuple(engines), tuple(scenarios),
                   tuple(studies))  # fmt: skip


# -- trials and their measurements ----------------------------------------------------------


def trials(engine: sa.Engine, filters: Filters = Filters(), *, measured_only: bool = False) -> pd.DataFrame:
    """One row per trial (oldest first) with its first measurement; columns are :data:`TRIAL_COLUMNS`.

    ``latency_ms`` is the p90 where there were samples enough to claim it, else the median
    (as the search ranks trials); ``accuracy_drop`` is the search's own measure of loss.
    """
    other = aliased(Measurement)
    first = (
        sa.select(sa.func.min(other.id)).where(other.trial_id == Trial.id).correlate(Trial).scalar_subquery()
    )
    m = Measurement
    query = (
        sa.select(
            Trial.id.label("trial_id"),
            Trial.uid,
            Trial.created_at,
            Trial.study,
            Trial.phase,
            Trial.status,
            Trial.failure_kind,
            Trial.failure_message,
            Trial.engine,
            Trial.engine_version,
            Trial.precision,
            Trial.batch,
            Trial.threads,
            Trial.config,
            Trial.artifact_path,
            Model.name.label("model"),
            Model.sha256.label("model_sha256"),
            Device.fingerprint.label("device"),
            Device.cpu,
            m.scenario,
            m.n_samples,
            m.median_ms,
            m.median_ci_low,
            m.median_ci_high,
            m.p90_ms,
            m.p90_ci_low,
            m.p90_ci_high,
            m.p99_ms,
            m.cv,
            m.unstable,
            m.throughput,
            m.peak_rss_mb,
            m.artifact_mb,
            m.accuracy,
            m.accuracy_passed,
        )  # fmt: skip
        .join(Model, Trial.model_id == Model.id)
        .join(Device, Trial.device_id == Device.id)
        .outerjoin(m, m.id == first)
        .order_by(Trial.id)
    )
    query = _filtered(query, filters)
    if measured_only:
        query = query.where(m.id.is_not(None))
    with engine.connect() as conn:
        rows = [dict(r) for r in conn.execute(query).mappings()]
    return pd.DataFrame([_trial_row(r) for r in rows], columns=TRIAL_COLUMNS)


def _filtered(query: sa.Select[Any], f: Filters) -> sa.Select[Any]:
    if f.model:
        query = query.where(Model.sha256 == f.model)
    if f.device:
        query = query.where(Device.fingerprint == f.device)
    if f.engines:
        query = query.where(Trial.engine.in_(f.engines))
    if f.scenario:
        query = query.where(Measurement.scenario == f.scenario)
    if f.study:
        query = query.where(Trial.study == f.study)
    return query


def _trial_row(r: dict[str, Any]) -> dict[str, Any]:
    config = TrialConfig.from_dict(r.pop("config"))
    acc = r.pop("accuracy")
    accuracy = None if acc is None else Accuracy.from_dict(acc)
    p90 = r["p90_ms"] is not None
    return {
        **r,
        "config_label": config.label(),
        "knobs": json.dumps(dict(config.knobs), sort_keys=True) if config.knobs else "",
        "latency_ms": r["p90_ms"] if p90 else r["median_ms"],
        "latency_ci_low": r["p90_ci_low"] if p90 else r["median_ci_low"],
        "latency_ci_high": r["p90_ci_high"] if p90 else r["median_ci_high"],
        "accuracy_drop": None if accuracy is None else accuracy_drop(accuracy),
        "accuracy_constraint": None if accuracy is None else accuracy.constraint,
    }


def samples(engine: sa.Engine, trial_ids: tuple[int, ...]) -> pd.DataFrame:
    """The raw per-call latencies of these trials, long form: ``trial_id``, ``latency_ms``."""
    if not trial_ids:
        return pd.DataFrame(columns=["trial_id", "latency_ms"])
    query = sa.select(Measurement.trial_id, Measurement.samples_ms).where(Measurement.trial_id.in_(trial_ids))
    with engine.connect() as conn:
        rows = conn.execute(query).all()
    return pd.DataFrame(
        [(trial_id, float(v)) for trial_id, values in rows for v in values],
        columns=["trial_id", "latency_ms"],
    )


def measured(df: pd.DataFrame) -> pd.Series:
    """Trials with a usable measurement: ``ok``, or ``inaccurate`` (timed fine, judged on accuracy elsewhere).

    Whether an inaccurate trial is acceptable is the study's call (its own accuracy budget),
    so comparisons keep it and show its ``accuracy_drop``; :func:`verdicts` applies the budget.
    """
    return df["latency_ms"].notna() & ((df["status"] == "ok") | (df["failure_kind"] == "inaccurate"))


def best_per_config(df: pd.DataFrame, metric: Metric) -> pd.DataFrame:
    """One row per config label: its best :func:`measured` trial by ``metric`` (most samples on a tie)."""
    ok = df[measured(df) & df[metric.column].notna()]
    ordered = ok.sort_values([metric.column, "n_samples"], ascending=[not metric.higher_is_better, False])
    return ordered.drop_duplicates("config_label").reset_index(drop=True)


# -- studies and devices ------------------------------------------------------------------


def studies(engine: sa.Engine, filters: Filters = Filters()) -> pd.DataFrame:
    """Every study, newest first, with its winner, tie and speed-up vs the ONNX Runtime FP32 default."""
    query = (
        sa.select(
            Study.name,
            Study.objective,
            Study.winner_uid,
            Study.summary,
            Study.command,
            Study.created_at,
            Study.updated_at,
            Model.name.label("model"),
            Model.sha256.label("model_sha256"),
            Device.fingerprint.label("device"),
            Device.cpu,
        )  # fmt: skip
        .join(Model, Study.model_id == Model.id)
        .join(Device, Study.device_id == Device.id)
        .order_by(Study.updated_at.desc())
    )
    if filters.model:
        query = query.where(Model.sha256 == filters.model)
    if filters.device:
        query = query.where(Device.fingerprint == filters.device)
    with engine.connect() as conn:
        rows = [dict(r) for r in conn.execute(query).mappings()]
    columns = ["name", "objective", "model", "device", "cpu", "winner", "tie_with", "speedup_vs_baseline",
               "trials", "note", "winner_uid", "command", "model_sha256", "created_at", "updated_at"]  # fmt: skip
    return pd.DataFrame([_study_row(r) for r in rows], columns=columns)


def _study_row(r: dict[str, Any]) -> dict[str, Any]:
    summary = r.pop("summary") or {}
    winner = summary.get("winner") or {}
    counts = summary.get("trials") or {}
    return {
        **r,
        "winner": winner.get("label"),
        "tie_with": ", ".join(summary.get("tie_with") or []),
        "speedup_vs_baseline": summary.get("speedup_vs_baseline"),
        "trials": ", ".join(f"{v} {k}" for k, v in sorted(counts.items())),
        "note": summary.get("note") or ("" if summary else "not finished"),
    }


def study(engine: sa.Engine, name: str) -> dict[str, Any] | None:
    """One study's settings and summary (finalists, winner, tie), or ``None`` when there is none."""
    query = (
        sa.select(
            Study.name,
            Study.objective,
            Study.settings,
            Study.summary,
            Study.winner_uid,
            Study.command,
            Model.name.label("model"),
            Device.fingerprint.label("device"),
        )  # fmt: skip
        .join(Model, Study.model_id == Model.id)
        .join(Device, Study.device_id == Device.id)
        .where(Study.name == name)
    )
    with engine.connect() as conn:
        row = conn.execute(query).mappings().first()
    return None if row is None else dict(row)


def devices(engine: sa.Engine) -> pd.DataFrame:
    """Every device fingerprint with what the probe saw and how many trials ran on it."""
    counts = sa.select(Trial.device_id, sa.func.count().label("trials")).group_by(Trial.device_id).subquery()
    query = (
        sa.select(Device.fingerprint, Device.cpu, Device.info, Device.created_at, counts.c.trials)
        .outerjoin(counts, counts.c.device_id == Device.id)
        .order_by(Device.id)
    )
    with engine.connect() as conn:
        rows = conn.execute(query).all()
    out = []
    for fingerprint, cpu, info, created_at, n in rows:
        engines = info.get("engines") or {}
        out.append({
            "fingerprint": fingerprint, "cpu": cpu, "cores": info.get("logical_cores"),
            "memory_gb": info.get("memory_gb"), "isa": " ".join(info.get("isa") or []),
            "gpus": ", ".join(str(g.get("name", g)) if isinstance(g, dict) else str(g) for g in info.get("gpus") or []),
            "engines": ", ".join(f"{k} {v}" for k, v in sorted(engines.items())),
            "trials": int(n or 0), "first_seen": created_at,
        })  # fmt: skip
    columns = ["fingerprint", "cpu", "cores", "memory_gb", "isa", "gpus", "engines", "trials", "first_seen"]
    return pd.DataFrame(out, columns=columns)


def gate_runs(engine: sa.Engine, filters: Filters = Filters()) -> pd.DataFrame | None:
    """The regression gate's verdicts, newest first; ``None`` while the store has no gate table.

    The table is read by reflection, so this page follows the gate's schema as it grows;
    ``metrics`` (one dict per judged metric) is flattened by :func:`gate_metrics`.
    """
    if not sa.inspect(engine).has_table(GATE_TABLE):
        return None
    gate = sa.Table(GATE_TABLE, sa.MetaData(), autoload_with=engine)
    query = sa.select(gate, Device.fingerprint.label("device"), Device.cpu).join(
        Device, gate.c.device_id == Device.id
    )
    if filters.device:
        query = query.where(Device.fingerprint == filters.device)
    if filters.model and "candidate_sha256" in gate.c:
        query = query.where(gate.c.candidate_sha256 == filters.model)
    query = query.order_by(gate.c.created_at.desc(), gate.c.id.desc()).limit(GATE_LIMIT)
    with engine.connect() as conn:
        rows = [dict(r) for r in conn.execute(query).mappings()]
    for r in rows:
        metrics = _json(r.get("metrics")) or []
        r["metrics"] = metrics
        r["failing"] = "; ".join(
            f"{m.get('name')}: {m.get('reason')}" for m in metrics if m.get("verdict") != "pass"
        )
        r["notes"] = "; ".join(_json(r.get("notes")) or [])
    return pd.DataFrame(rows)


def gate_metrics(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per (gate run, metric): its verdict, change with CI, p-value and reason."""
    columns = ["run_id", "created_at", "metric", "unit", "verdict", "change", "change_ci_low", "change_ci_high",
               "baseline", "candidate", "p_adjusted", "reason"]  # fmt: skip
    out = []
    for run in runs.itertuples():
        for m in run.metrics:
            ci = m.get("change_ci") or (None, None)
            out.append([run.id, run.created_at, m.get("name"), m.get("unit"), m.get("verdict"), m.get("change"),
                        ci[0], ci[1], m.get("baseline"), m.get("candidate"), m.get("p_adjusted"), m.get("reason")])  # fmt: skip
    return pd.DataFrame(out, columns=columns)


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


# -- Optuna --------------------------------------------------------------------------------


def has_optuna(engine: sa.Engine) -> bool:
    """Whether Optuna's tables are in this database (a study ran here)."""
    inspector = sa.inspect(engine)
    return all(inspector.has_table(t) for t in OPTUNA_TABLES)


def optuna_storage(engine: sa.Engine) -> optuna.storages.RDBStorage:
    """Optuna's storage on the same database, read-only: no table creation, read-only transactions."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    kwargs: dict[str, Any] = {}
    if engine.url.get_backend_name() == "postgresql":
        kwargs = {"connect_args": {"options": "-c default_transaction_read_only=on"}, "pool_pre_ping": True}
    # For SQLite the store's URL is already the read-only URI (mode=ro).
    url = engine.url.render_as_string(hide_password=False)
    return optuna.storages.RDBStorage(url, engine_kwargs=kwargs, skip_table_creation=True)


def optuna_trials(storage: optuna.storages.BaseStorage, name: str) -> pd.DataFrame | None:
    """The Optuna history of study ``name`` (``None`` when Optuna has no such study).

    Columns: number, state, value (the first objective), best_so_far, params, config,
    reason (why a trial was pruned or failed), uid, reused, duration_s.
    """
    import optuna

    if name not in optuna.study.get_all_study_names(storage=storage):
        return None
    st = optuna.load_study(study_name=name, storage=storage)
    minimize = st.directions[0] == optuna.study.StudyDirection.MINIMIZE
    rows, best = [], None
    for t in st.get_trials(deepcopy=False):
        value = t.values[0] if t.values else None
        feasible = value is not None and all(v <= 0 for v in (t.constraints or {}).values())
        if feasible and (best is None or (value < best if minimize else value > best)):
            best = value
        config = t.user_attrs.get("config")
        rows.append({
            "number": t.number, "state": t.state.name.lower(), "value": value, "best_so_far": best,
            "feasible": feasible, "params": json.dumps(t.params, sort_keys=True),
            "config": TrialConfig.from_dict(config).label() if config else "",
            "reason": t.user_attrs.get("pruned_reason") or t.user_attrs.get("failure") or "",
            "uid": t.user_attrs.get("uid", ""), "reused": bool(t.user_attrs.get("reused", False)),
            "duration_s": t.duration.total_seconds() if t.duration else None,
        })  # fmt: skip
    columns = ["number", "state", "value", "best_so_far", "feasible", "params", "config", "reason", "uid",
               "reused", "duration_s"]  # fmt: skip
    return pd.DataFrame(rows, columns=columns)


def param_importance(storage: optuna.storages.BaseStorage, name: str) -> tuple[pd.DataFrame | None, str]:
    """Optuna's parameter importances for the first objective, or ``None`` and the reason there are none."""
    import optuna

    if name not in optuna.study.get_all_study_names(storage=storage):
        return None, f"Optuna has no study named {name!r} in this database"
    st = optuna.load_study(study_name=name, storage=storage)
    complete = st.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    if len(complete) < 2:
        return None, f"parameter importance needs at least 2 complete trials; this study has {len(complete)}"
    varied = sorted(
        {p for t in complete for p in t.params if len({str(u.params.get(p)) for u in complete}) > 1}
    )
    if not varied:
        return None, "every complete trial used the same parameters, so none can matter more than another"
    target = (lambda t: t.values[0]) if len(st.directions) > 1 else None
    try:
        importances = optuna.importance.get_param_importances(st, target=target)
    except ValueError as exc:  # Optuna's own "cannot evaluate" conditions (e.g. conditional params)
        return None, f"Optuna cannot compute parameter importance here: {exc}"
    df = pd.DataFrame(list(importances.items()), columns=["param", "importance"])
    return df.sort_values("importance", ascending=False).reset_index(drop=True), ""


# -- verdicts (the Pareto page) ----------------------------------------------------------------


def verdicts(
    df: pd.DataFrame, constraints: dict[str, Any], winner: str | None, objective: str | None = None
) -> pd.DataFrame:
    """``df`` (from :func:`trials`) with ``verdict`` (winner, pareto, feasible, rejected) and ``reason``.

    A trial is rejected when it failed (its kind and message) or breaks one of the study's
    ``constraints`` (``max_accuracy_drop``, default :data:`~autodeploy.verdict.DEFAULT_MAX_ACCURACY_DROP`;
    ``max_memory_mb``; ``sla_ms``, a latency bound unless ``objective`` is ``server``), judged
    by :mod:`autodeploy.verdict` as the study judges them. Among the rest, ``pareto`` marks those
    no other feasible trial beats on latency, accuracy drop and memory at once; ``winner`` (a
    config label) marks every trial of the winning config.
    """
    limits = verdict.Limits.of(constraints)
    out = df.copy()
    reasons = [_reason(r, limits, objective or "") for r in out.itertuples()]
    out["reason"] = reasons
    out["verdict"] = ["rejected" if reason else "feasible" for reason in reasons]
    feasible = out[out["verdict"] == "feasible"]
    points = feasible[["latency_ms", "accuracy_drop", "peak_rss_mb"]].fillna(0.0).to_numpy().tolist()
    out.loc[feasible.index[verdict.pareto_front(points)], "verdict"] = "pareto"
    if winner is not None:
        out.loc[(out["config_label"] == winner) & (out["verdict"] != "rejected"), "verdict"] = "winner"
    return out


def _reason(r: Any, limits: verdict.Limits, objective: str) -> str:
    if r.status != "ok" and r.failure_kind != "inaccurate":  # inaccurate: the study's budget decides below
        return f"{r.failure_kind}: {r.failure_message or ''}".strip()
    if pd.isna(r.latency_ms):
        return "no measurement"
    measured = verdict.Measured(r.latency_ms, _number(r.accuracy_drop), _number(r.peak_rss_mb))
    return "; ".join(verdict.reasons(measured, limits, objective))


def _number(value: Any) -> float | None:
    return None if value is None or pd.isna(value) else float(value)
