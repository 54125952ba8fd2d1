"""What the dashboard shows: the store's records as pandas DataFrames, ready for the pages.

Plain functions of a read-only :class:`~autodeploy.results_db.Store` (or an Optuna storage)
and plain values, so they are tested without Streamlit; ``cache.py`` caches them. Every read
goes through the store's API (bound parameters, no SQL here); the columns come from the
records (:class:`~autodeploy.results_db.TrialRow`, :class:`~autodeploy.harness.result.Measurement`),
renamed only where the pages use shorter words. The Optuna storage is opened without table
creation (read-only on PostgreSQL too).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Any

import pandas as pd

from autodeploy import verdict
from autodeploy.adapters.base import TrialConfig
from autodeploy.harness.result import Measurement
from autodeploy.results_db.store import Catalog, Store, TrialFilter, TrialRow
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


#: The values each filter can take, as stored.
Options = Catalog


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

#: Record fields the pages call by shorter names (a trial's ``id`` is ``trial_id``).
RENAMED = {"model_name": "model", "device_fingerprint": "device", "device_cpu": "cpu"}
TRIAL_RENAMED = {**RENAMED, "id": "trial_id"}
#: Columns the dashboard adds to the stored ones.
DERIVED = ("config_label", "shape", "knobs", "latency_ms", "latency_ci_low", "latency_ci_high", "accuracy_passed",
           "accuracy_drop", "accuracy_constraint")  # fmt: skip


def options(store: Store) -> Options:
    return store.catalog()


# -- trials and their measurements ----------------------------------------------------------


def trials(store: Store, filters: Filters = Filters(), *, measured_only: bool = False) -> pd.DataFrame:
    """One row per trial (oldest first) with its first measurement; columns are :func:`trial_columns`.

    ``latency_ms`` is the p90 where there were samples enough to claim it, else the median
    (as the search ranks trials); ``accuracy_drop`` is the search's own measure of loss.
    """
    where = TrialFilter(filters.model, filters.device, filters.engines, filters.scenario, filters.study,
                        measured_only=measured_only)  # fmt: skip
    return pd.DataFrame([_trial_row(r) for r in store.find_trials(where)], columns=trial_columns())


#: TrialRow fields that are not columns: records flattened below, and the artifact's file hashes.
NOT_COLUMNS = ("config", "measurement", "artifact_files", "shapes")


def trial_columns() -> list[str]:
    """The trial table's columns: the stored trial, its config, its measurement (each CI pair as
    ``*_low``/``*_high``; no samples, accuracy as three numbers), then :data:`DERIVED`."""
    trial = [TRIAL_RENAMED.get(f.name, f.name) for f in fields(TrialRow) if f.name not in NOT_COLUMNS]
    config = [name for name in _config_fields() if name != "knobs"]
    measured = [c for k in Measurement.keys(samples=False) if k != "accuracy" for c in _split(k, None)]
    return list(dict.fromkeys([*trial, *config, *measured, *DERIVED]))


def _config_fields() -> list[str]:
    return [f.name for f in fields(TrialConfig)]


def _split(key: str, value: Any) -> dict[str, Any]:
    """A flat measurement entry as columns: a ``*_ci`` pair becomes ``*_ci_low`` and ``*_ci_high``."""
    if not key.endswith("_ci"):
        return {key: value}
    low, high = value or (None, None)
    return {f"{key}_low": low, f"{key}_high": high}


def _trial_row(row: TrialRow) -> dict[str, Any]:
    out = {TRIAL_RENAMED.get(f.name, f.name): getattr(row, f.name) for f in fields(row)
           if f.name not in NOT_COLUMNS}  # fmt: skip
    config, m = row.config, row.measurement
    out.update({name: getattr(config, name) for name in _config_fields() if name != "knobs"})
    out.update(config_label=config.label(), shape=row.shape_text, knobs=json.dumps(dict(config.knobs), sort_keys=True) if config.knobs else "")
    if m is None:
        return out
    for key, value in m.to_dict(samples=False).items():
        if key != "accuracy":
            out.update(_split(key, value))
    lat = m.latency
    p90 = lat.p90 is not None
    latency_ci = (lat.p90_ci if p90 else lat.median_ci) or (None, None)
    out.update(latency_ms=lat.p90 if p90 else lat.median, latency_ci_low=latency_ci[0], latency_ci_high=latency_ci[1])
    if m.accuracy is not None:
        out.update(accuracy_passed=m.accuracy.passed, accuracy_drop=accuracy_drop(m.accuracy),
                   accuracy_constraint=m.accuracy.constraint)  # fmt: skip
    return out


def samples(store: Store, trial_ids: tuple[int, ...]) -> pd.DataFrame:
    """The raw per-call latencies of these trials, long form: ``trial_id``, ``latency_ms``."""
    by_trial = store.samples(trial_ids) if trial_ids else {}
    return pd.DataFrame(
        [(trial_id, float(v)) for trial_id, values in by_trial.items() for v in values],
        columns=["trial_id", "latency_ms"],
    )


def measured(df: pd.DataFrame) -> pd.Series:
    """Trials with a usable measurement: ``ok``, or ``inaccurate`` (timed fine, judged on accuracy elsewhere).

    Whether an inaccurate trial is acceptable is the study's call (its own accuracy budget),
    so comparisons keep it and show its ``accuracy_drop``; :func:`verdicts` applies the budget.
    """
    return df["latency_ms"].notna() & ((df["status"] == "ok") | (df["failure_kind"] == "inaccurate"))


def best_per_config(df: pd.DataFrame, metric: Metric) -> pd.DataFrame:
    """One row per config label and shape: its best :func:`measured` trial by ``metric`` (most samples on a tie)."""
    ok = df[measured(df) & df[metric.column].notna()]
    ordered = ok.sort_values([metric.column, "n_samples"], ascending=[not metric.higher_is_better, False])
    return ordered.drop_duplicates(["config_label", "shape"]).reset_index(drop=True)


# -- studies and devices ------------------------------------------------------------------


def studies(store: Store, filters: Filters = Filters()) -> pd.DataFrame:
    """Every study, newest first, with its winner, tie and speed-up vs the ONNX Runtime FP32 default."""
    rows = store.list_studies(limit=None, model_sha256=filters.model, device=filters.device)
    columns = ["name", "objective", "model", "device", "cpu", "winner", "tie_with", "speedup_vs_baseline",
               "trials", "note", "winner_uid", "command", "model_sha256", "created_at", "updated_at"]  # fmt: skip
    return pd.DataFrame([_study_row(_renamed(asdict(r))) for r in rows], columns=columns)


def _renamed(d: dict[str, Any]) -> dict[str, Any]:
    return {RENAMED.get(k, k): v for k, v in d.items()}


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


def study(store: Store, name: str) -> dict[str, Any] | None:
    """One study's settings and summary (finalists, winner, tie), or ``None`` when there is none."""
    row = store.get_study(name)
    return None if row is None else _renamed(asdict(row))


def devices(store: Store) -> pd.DataFrame:
    """Every device fingerprint with what the probe saw and how many trials ran on it."""
    out = []
    for d in store.list_devices():
        info, engines = d.info, d.info.get("engines") or {}
        out.append({
            "fingerprint": d.fingerprint, "cpu": d.cpu, "cores": info.get("logical_cores"),
            "memory_gb": info.get("memory_gb"), "isa": " ".join(info.get("isa") or []),
            "gpus": ", ".join(str(g.get("name", g)) if isinstance(g, dict) else str(g) for g in info.get("gpus") or []),
            "engines": ", ".join(f"{k} {v}" for k, v in sorted(engines.items())),
            "trials": d.trials, "first_seen": d.created_at,
        })  # fmt: skip
    columns = ["fingerprint", "cpu", "cores", "memory_gb", "isa", "gpus", "engines", "trials", "first_seen"]
    return pd.DataFrame(out, columns=columns)


def gate_runs(store: Store, filters: Filters = Filters()) -> pd.DataFrame | None:
    """The regression gate's verdicts, newest first; ``None`` while the store has no gate table.

    ``metrics`` (one dict per judged metric) is flattened by :func:`gate_metrics`.
    """
    if not store.has_tables(GATE_TABLE):
        return None
    runs = store.list_gate_runs(limit=GATE_LIMIT, candidate_sha256=filters.model, device=filters.device)
    rows = []
    for run in runs:
        r = _renamed(asdict(run))
        r["failing"] = "; ".join(
            f"{m.get('name')}: {m.get('reason')}" for m in run.metrics if m.get("verdict") != "pass"
        )
        r["notes"] = "; ".join(run.notes)
        rows.append(r)
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


# -- Optuna --------------------------------------------------------------------------------


def has_optuna(store: Store) -> bool:
    """Whether Optuna's tables are in this database (a study ran here)."""
    return store.has_tables(*OPTUNA_TABLES)


def optuna_storage(store: Store) -> optuna.storages.RDBStorage:
    """Optuna's storage on the same database, read-only: no table creation, read-only transactions."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    kwargs: dict[str, Any] = {}
    url = store.engine.url
    if url.get_backend_name() == "postgresql":
        kwargs = {"connect_args": {"options": "-c default_transaction_read_only=on"}, "pool_pre_ping": True}
    # For SQLite the store's URL is already the read-only URI (mode=ro).
    return optuna.storages.RDBStorage(url.render_as_string(hide_password=False), engine_kwargs=kwargs,
                                      skip_table_creation=True)  # fmt: skip


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
