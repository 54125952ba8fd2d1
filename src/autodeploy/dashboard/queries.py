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
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Any

import pandas as pd

from autodeploy import objectives, verdict
from autodeploy.accuracy.records import Accuracy
from autodeploy.accuracy.rules import accuracy_drop
from autodeploy.adapters.base import TrialConfig
from autodeploy.adapters.registry import BASELINE_CONFIG, BASELINE_NAME
from autodeploy.harness.result import JUDGED, Measurement, headline
from autodeploy.harness.stats import latency_claim
from autodeploy.objectives import MEDIAN, OBJECTIVES
from autodeploy.report import study_record
from autodeploy.results_db.records import Catalog, TrialFilter, TrialRow
from autodeploy.results_db.store import Store
from autodeploy.search.summary import speedup_text
from autodeploy.units import fmt_ms_ci

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
    #: The study statistic (:attr:`autodeploy.objectives.Objective.statistic`) this metric is, if any: then a
    #: finalist's re-measured value stands for the config.
    statistic: str | None = None


#: The objectives whose statistics are per-trial metrics here (their ``trial_metric``).
_LATENCY, _THROUGHPUT = objectives.of("latency"), objectives.of("throughput")
METRICS = {
    _LATENCY.trial_metric: Metric(_LATENCY.statistic_label, "latency_ms", ("latency_ci_low", "latency_ci_high"),
                                  False, _LATENCY.statistic),
    MEDIAN.name: Metric(f"{MEDIAN.name} latency ({MEDIAN.unit})", MEDIAN.field, ("median_ci_low", "median_ci_high"),
                        False),
    _THROUGHPUT.trial_metric: Metric(_THROUGHPUT.statistic_label, "throughput", None, True, _THROUGHPUT.statistic),
}  # fmt: skip
#: The per-trial latency (p90, else the median), which the devices and Pareto pages plot.
LATENCY_METRIC = METRICS[_LATENCY.trial_metric]
#: The metric that matches a study's objective (server and pareto studies are judged on latency here).
OBJECTIVE_METRIC = {name: o.trial_metric for name, o in OBJECTIVES.items()}

#: The ONNX Runtime fp32 default every speed-up of an ONNX model is over (the study re-measures it beside the
#: finalists); a study names its own baseline (``finalists``' ``baseline``: LiteRT fp32 for a ``.tflite``).
BASELINE_LABEL = BASELINE_CONFIG.label()
#: Fewer samples than this make a bootstrap CI a rough guide; fewer trials make parameter importance one.
FEW_SAMPLES = 30
FEW_TRIALS = 20

#: Record fields the pages call by shorter names (a trial's ``id`` is ``trial_id``).
RENAMED = {"model_name": "model", "device_fingerprint": "device", "device_cpu": "cpu"}
TRIAL_RENAMED = {**RENAMED, "id": "trial_id"}
#: Columns the dashboard adds to the stored ones.
DERIVED = ("config_label", "shape", "knobs", "latency_ms", "latency_ci_low", "latency_ci_high", "accuracy_passed",
           "accuracy_drop", "accuracy_constraint", "accuracy_record", "other_cores", "under_load", "gop", "gops",
           "peak_gops", "share_of_peak", "cpu_s_per_1k", "energy_j_per_1k", "energy_source")  # fmt: skip


def options(store: Store) -> Options:
    return store.catalog()


# -- trials and their measurements ----------------------------------------------------------


def trials(store: Store, filters: Filters = Filters(), *, measured_only: bool = False) -> pd.DataFrame:
    """One row per trial (oldest first) with its first measurement; columns are :func:`trial_columns`.

    ``latency_ms`` is the p90 where there were samples enough to claim it, else the median
    (as the search ranks trials); ``accuracy_drop`` is the search's own measure of loss.
    """
    rows = store.trials(_where(filters, measured_only))
    return pd.DataFrame([_trial_row(r) for r in rows], columns=trial_columns())


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


def trial_counts(store: Store, filters: Filters = Filters()) -> dict[str, int]:
    """How many trials match ``filters``, per status (``ok``, ``failed``), counted by the database."""
    return store.trial_counts(_where(filters))


def _where(filters: Filters, measured_only: bool = False) -> TrialFilter:
    return TrialFilter(model_sha256=filters.model, device=filters.device, engines=filters.engines,
                       scenario=filters.scenario, study=filters.study, measured_only=measured_only)  # fmt: skip


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
        if key not in ("accuracy", "serving", "load", "roofline", "cost"):
            out.update(_split(key, value))
    if m.load is not None:  # how busy the machine was while it ran (harness/load.py); empty before it was read
        out.update(other_cores=m.load.other_cores, under_load=m.load.under_load)
    if m.roofline is not None:  # its distance to this device's limit (roofline.py); empty before it was counted
        line = m.roofline
        out.update(gop=line.gop, gops=line.gops, peak_gops=line.peak_gops, share_of_peak=line.share)
    if m.cost is not None:  # per 1,000 inferences (harness/energy.py): CPU s always, J where a meter is
        out.update(cpu_s_per_1k=m.cost.cpu_ms, energy_j_per_1k=m.cost.energy_mj, energy_source=m.cost.source or None)
    latency, latency_ci = latency_claim(m.latency)
    low, high = latency_ci or (None, None)
    out.update(latency_ms=latency, latency_ci_low=low, latency_ci_high=high)
    if m.accuracy is not None:
        out.update(accuracy_passed=m.accuracy.passed, accuracy_drop=accuracy_drop(m.accuracy),
                   accuracy_constraint=m.accuracy.constraint,
                   accuracy_record=json.dumps(asdict(m.accuracy)))  # a reason names the worst output (_reason)  # fmt: skip
    return out


def roofline(df: pd.DataFrame) -> pd.DataFrame:
    """One row per config × shape with a share of peak: its fastest measured run's GOP/s and share of its precision's
    peak on this device (:mod:`autodeploy.roofline`), highest share first, for :func:`charts.roofline`."""
    ok = df[measured(df) & df["share_of_peak"].notna()] if "share_of_peak" in df else df.iloc[0:0]
    best = ok.sort_values(["share_of_peak", "n_samples"], ascending=[False, False])
    best = best.drop_duplicates([*GROUP, "config_label", "shape"]).reset_index(drop=True)
    return best[["config_label", "engine", "precision", "shape", "gop", "gops", "peak_gops", "share_of_peak",
                 "median_ms", "accuracy_passed", "trial_id"]]  # fmt: skip


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
    return df["latency_ms"].notna() & ((df["status"] == "ok") | df["failure_kind"].isin(JUDGED))


#: What keeps configs apart: a config of another model or device is another bar.
GROUP = ["model_sha256", "device"]


def best_per_config(df: pd.DataFrame, metric: Metric) -> pd.DataFrame:
    """One row per model × device × config × shape: its best :func:`measured` trial by ``metric`` (most samples on a tie)."""
    ok = df[measured(df) & df[metric.column].notna()]
    ordered = ok.sort_values([metric.column, "n_samples"], ascending=[not metric.higher_is_better, False])
    return ordered.drop_duplicates([*GROUP, "config_label", "shape"]).reset_index(drop=True)


def one_per_config(df: pd.DataFrame) -> pd.DataFrame:
    """One trial per model × device × config × shape: its fastest :func:`measured` run (finalist runs first), else a failure."""
    order = df.assign(_failed=~measured(df), _screening=df["phase"] != "finalist")
    order = order.sort_values(["_failed", "_screening", "latency_ms"])
    return order.drop_duplicates([*GROUP, "config_label", "shape"]).drop(columns=["_failed", "_screening"])


def groups(store: Store, filters: Filters = Filters(), *, measured_only: bool = False) -> pd.DataFrame:
    """The model × device pairs of the trials ``filters`` select (by model name), each with a label
    (``model on cpu (fingerprint)``): counted by the database, no trial rows read."""
    pairs = pd.DataFrame(store.trial_pairs(_where(filters, measured_only)), columns=["model_sha256", "model", "device", "cpu"])
    return pairs.assign(label=pairs["model"] + " on " + pairs["cpu"] + " (" + pairs["device"].str[:8] + ")")


def rank_by_finalists(best: pd.DataFrame, finalists: pd.DataFrame, metric: Metric) -> pd.DataFrame:
    """``best`` (one model × device, from :func:`best_per_config`) ranked as the study ranked it.

    ``finalists`` are one study's rows of :func:`finalists`. Where ``metric`` is the study's
    statistic, a finalist's value and CI become its re-measured ones (the median of its per-round
    values and their interval over rounds, as ``tune`` printed them), the study's winner goes on top and the other finalists follow by
    value, then every other config by its best trial. Adds ``role`` (winner, runner-up, tie,
    baseline, finalist or empty), ``source`` (where the number comes from), ``baseline`` (the study's
    baseline: its baseline finalist, LiteRT fp32 for a ``.tflite``; without one, the ORT fp32 default) and
    ``baseline_name``.
    """
    out = best.copy()
    roles = dict(zip(finalists["label"], finalists["role"], strict=True))
    named = finalists[finalists["baseline"].fillna(False).astype(bool)] if "baseline" in finalists else finalists.iloc[0:0]
    base = set(named["label"]) or {BASELINE_LABEL}
    out["baseline"] = out["config_label"].isin(base)
    out["baseline_name"] = named["baseline_name"].iloc[0] if len(named) and "baseline_name" in named else BASELINE_NAME
    out["role"] = [roles.get(label, "baseline" if label in base else "") for label in out["config_label"]]
    out["source"] = "best trial"
    remeasured = finalists[finalists["value"].notna() & (finalists["n_samples"] > 0)].set_index("label")
    same = not remeasured.empty and remeasured["statistic"].iloc[0] == metric.statistic
    if same:
        hit = out["config_label"].isin(remeasured.index)
        labels = out.loc[hit, "config_label"]
        out.loc[hit, metric.column] = remeasured.loc[labels, "value"].to_numpy()
        if metric.ci is not None:
            # a finalist that left after one round has no interval: NaN, not None, in a float column
            out.loc[hit, metric.ci[0]] = remeasured.loc[labels, "ci_low"].astype(float).to_numpy()
            out.loc[hit, metric.ci[1]] = remeasured.loc[labels, "ci_high"].astype(float).to_numpy()
        out.loc[hit, "n_samples"] = remeasured.loc[labels, "n_samples"].to_numpy()
        out.loc[hit, "source"] = "finalists, re-measured"
    tier = [0 if same and r == "winner" else 1 if same and s != "best trial" else 2
            for r, s in zip(out["role"], out["source"], strict=True)]  # fmt: skip
    out = out.assign(_tier=tier).sort_values(["_tier", metric.column], ascending=[True, not metric.higher_is_better])
    return out.drop(columns="_tier").reset_index(drop=True)


# -- studies and devices ------------------------------------------------------------------


def studies(store: Store, filters: Filters = Filters()) -> pd.DataFrame:
    """Every study, newest first, with its winner, tie and speed-up vs the ONNX Runtime FP32 default."""
    rows = store.list_studies(limit=None, model_sha256=filters.model, device=filters.device)
    columns = ["name", "objective", "model", "device", "cpu", "winner", "tie_with", "speedup_vs_baseline", "speedup",
               "headline", "screening_only", "trials", "note", "constraints", "limits", "rejected", "winner_uid",
               "command", "model_sha256", "created_at", "updated_at"]  # fmt: skip
    return pd.DataFrame([_study_row(_renamed(asdict(r)), study_record(r) if r.summary else {}) for r in rows],
                        columns=columns)  # fmt: skip


def _renamed(d: dict[str, Any]) -> dict[str, Any]:
    return {RENAMED.get(k, k): v for k, v in d.items()}


def _study_row(r: dict[str, Any], record: dict[str, Any]) -> dict[str, Any]:
    summary = r.pop("summary") or {}
    winner = summary.get("winner") or {}
    counts = summary.get("trials") or {}
    constraints = (r.pop("settings") or {}).get("constraints") or {}
    return {
        **r,
        "constraints": constraints,  # as stored: judged() reads each trial's limits from it
        "limits": limits_text(constraints, r["objective"]),
        "rejected": len(record.get("rejected") or ()),  # configs the study's constraints rejected
        "winner": winner.get("label"),
        "tie_with": ", ".join(summary.get("tie_with") or []),
        "speedup_vs_baseline": summary.get("speedup_vs_baseline"),
        "speedup": speedup_text(record) if record else "-",  # names its statistic, with its interval over rounds
        "headline": record.get("headline", ""),
        "screening_only": bool(record.get("screening_only")),
        "trials": ", ".join(f"{v} {k}" for k, v in sorted(counts.items())),
        "note": summary.get("note") or ("" if summary else "not finished"),
    }


def finalists(store: Store, filters: Filters = Filters()) -> pd.DataFrame:
    """One row per finalist of every finished study, newest study first, as ``tune`` reported them.

    Read from the study's record (:func:`autodeploy.report.study_record`, the one ``results
    studies --format json`` prints): ``value`` is the study's statistic (``statistic``, unit in the
    name) with its 95% CI, re-measured interleaved where the objective allows; ``role`` is winner,
    runner-up, tie, baseline (the ORT fp32 default; for a ``.tflite`` LiteRT fp32, ``baseline_name``) or finalist. ``verdict`` is ``rejected``, with the
    study's own ``reason``, for a finalist the study's constraints rejected (a baseline over a memory
    cap; every finalist of a study where no config met them: best-so-far, not winners), else ``feasible``.
    """
    rows = []
    if filters.study is not None:
        studies = [s for s in [store.get_study(filters.study)] if s is not None]
    else:
        studies = store.list_studies(limit=None, model_sha256=filters.model, device=filters.device)
    for row in studies:
        record = study_record(row)
        rejected = {r["config"]: r["reason"] for r in record["rejected"]}  # the study's own verdicts
        for f in record["finalists"]:
            ci = f["statistic_ci"] or (None, None)
            rows.append({"study": row.name, "objective": row.objective, "model": row.model_name,
                         "model_sha256": row.model_sha256, "device": row.device_fingerprint, "cpu": row.device_cpu,
                         "statistic": record["statistic"], "unit": record["statistic_unit"], "label": f["label"],
                         "engine": f["config"]["engine"], "precision": f["config"]["precision"],
                         "value": f["statistic"], "ci_low": ci[0], "ci_high": ci[1], "n_samples": f["n_samples"],
                         "baseline": f["baseline"], "baseline_name": record["baseline"], "failure": f["failure"],
                         "role": _role(f, record),
                         "verdict": REJECTED if f["label"] in rejected else FEASIBLE,
                         "reason": rejected.get(f["label"], "")})  # fmt: skip
    columns = ["study", "objective", "model", "model_sha256", "device", "cpu", "statistic", "unit", "label", "engine",
               "precision", "value", "ci_low", "ci_high", "n_samples", "baseline", "baseline_name", "failure", "role", "verdict",
               "reason"]  # fmt: skip
    return pd.DataFrame(rows, columns=columns)


def _role(finalist: dict[str, Any], record: dict[str, Any]) -> str:
    label = finalist["label"]
    if record["winner"] is not None and label == record["winner"]["label"]:
        return "winner"
    if record["runner_up"] is not None and label == record["runner_up"]["label"]:
        return "runner-up"
    if label in record["tie_with"]:
        return "tie"
    return "baseline" if finalist["baseline"] else "finalist"


def winners(store: Store, filters: Filters = Filters()) -> pd.DataFrame:
    """Per model × device × objective, the newest finished study's winner, its speed-up and the runner-up.

    Every number is the study record's (:func:`autodeploy.report.study_record`), so the page
    agrees with ``tune`` and ``results studies``: the finalists' re-measured values, the speed-up
    over the ONNX Runtime fp32 default re-measured beside them (``>1`` is faster). ``limits`` are the
    study's constraints as read (:func:`limits_text`), ``rejected`` how many configs they rejected.
    """
    rows = []
    for row in store.list_studies(limit=None, model_sha256=filters.model, device=filters.device):
        if row.summary is None:  # running or stopped: no finalists yet
            continue
        record = study_record(row)
        winner, second = record["winner"] or {}, record["runner_up"] or {}
        unit = record["statistic_unit"]
        rows.append({"model": row.model_name, "cpu": row.device_cpu, "objective": row.objective,
                     "winner": winner.get("label"), "winner_value": _value_text(winner, unit),
                     "speedup_vs_baseline": record["speedup_vs_baseline"], "speedup": speedup_text(record),
                     "headline": record["headline"], "screening_only": record["screening_only"],
                     "limit": record["limit"],
                     "runner_up": second.get("label"), "runner_up_value": _value_text(second, unit),
                     "tie_with": ", ".join(record["tie_with"]), "study": row.name, "note": record["note"],
                     "limits": limits_text((row.settings or {}).get("constraints"), row.objective),
                     "rejected": len(record["rejected"]),
                     "statistic": record["statistic"], "winner_statistic": winner.get("statistic"),
                     "runner_up_statistic": second.get("statistic"), "model_sha256": row.model_sha256,
                     "device": row.device_fingerprint, "updated_at": row.updated_at})  # fmt: skip
    columns = ["model", "cpu", "objective", "winner", "winner_value", "speedup_vs_baseline", "speedup", "headline",
               "screening_only", "limit", "runner_up",
               "runner_up_value", "tie_with", "study", "note", "limits", "rejected", "statistic", "winner_statistic", "runner_up_statistic",
               "model_sha256", "device", "updated_at"]  # fmt: skip
    df = pd.DataFrame(rows, columns=columns)  # newest first: the first study of each group is the one shown
    return df.drop_duplicates(["model_sha256", "device", "objective"]).sort_values(["model", "cpu"]).reset_index(drop=True)


def study_finalists(finalists: pd.DataFrame, model_sha256: str, device: str, metric: Metric) -> pd.DataFrame:
    """The finalists of the newest finished study of this model × device whose statistic is ``metric``'s:
    the study whose ranking and roles a chart of that pair shows (none: a throughput study's winner
    is not marked on a latency chart)."""
    mine = finalists[(finalists["model_sha256"] == model_sha256) & (finalists["device"] == device)
                     & (finalists["statistic"] == metric.statistic)]  # fmt: skip
    if mine.empty:
        return mine
    return mine[mine["study"] == mine["study"].iloc[0]].reset_index(drop=True)


def finalist_bars(finalists: pd.DataFrame, objective: str) -> tuple[pd.DataFrame, Metric]:
    """One study's finalists as bars for :func:`charts.ci_bars`: winner on top, then by value; and their metric."""
    known = objectives.stored(objective)
    name, label = (known.statistic, known.statistic_label) if known else ("value", "value")
    higher = known is not None and known.higher_is_better
    metric = Metric(label, "value", ("ci_low", "ci_high"), higher, name)
    done = finalists[finalists["value"].notna()].assign(_top=lambda f: f["role"] != "winner")
    done = done.sort_values(["_top", "value"], ascending=[True, not higher]).drop(columns="_top")
    return done.rename(columns={"label": "config_label"}).reset_index(drop=True), metric


def _value_text(finalist: dict[str, Any], unit: str | None) -> str:
    """``91.85 µs [90.1, 93.2]`` for times, ``1234.5 [1200.0, 1250.1] items/s`` for rates, ``-`` without one."""
    value, ci = finalist.get("statistic"), finalist.get("statistic_ci")
    if value is None:
        return "-"
    if unit == "ms":
        return fmt_ms_ci(value, ci)
    bounds = "" if ci is None else f" [{ci[0]:.1f}, {ci[1]:.1f}]"
    return f"{value:.1f}{bounds} {unit or ''}".rstrip()


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


# -- verdicts: the study's constraints, judged by autodeploy.verdict ------------------------------

#: A row's ``verdict`` when it meets every constraint of its study, and when it breaks one (or failed).
FEASIBLE, REJECTED = "feasible", "rejected"


def limits_text(constraints: Mapping[str, Any] | None, objective: str | None) -> str:
    """A study's constraints as read: ``accuracy drop ≤ 1.00%, memory ≤ 64 MB, latency ≤ 5 ms``.

    The SLA bounds each trial's latency, except in a ``server`` study, whose objective is the highest
    rate whose p99 meets it (:func:`autodeploy.verdict.sla_bounds_latency`).
    """
    limits = verdict.Limits.of(constraints)
    out = [f"accuracy drop ≤ {limits.max_accuracy_drop:.2%}"]
    if limits.max_memory_mb is not None:
        out.append(f"memory ≤ {limits.max_memory_mb:g} MB")
    if limits.sla_ms is not None:
        out.append(f"{'latency' if verdict.sla_bounds_latency(objectives.stored(objective)) else 'p99'} ≤ {limits.sla_ms:g} ms")
    return ", ".join(out)


def judged(df: pd.DataFrame, studies: pd.DataFrame) -> pd.DataFrame:
    """``df`` (rows of :func:`trials`, e.g. :func:`best_per_config`'s) with ``verdict`` (feasible or
    rejected) and ``reason`` (empty when feasible), every row by its own study's constraints and objective.

    ``studies`` is :func:`studies` (its ``constraints`` and ``objective``); a trial of no study (a
    bench), or of a study not in it, is judged by the default :class:`~autodeploy.verdict.Limits`.
    The rule is :func:`verdicts`' (:mod:`autodeploy.verdict`'s), so Compare, Devices and Trials
    reject what the Pareto page and the study reject.
    """
    rules = {name: (verdict.Limits.of(c), objectives.stored(objective))
             for name, c, objective in zip(studies["name"], studies["constraints"], studies["objective"], strict=True)}  # fmt: skip
    default = (verdict.Limits(), None)
    reasons = [_reason(r, *rules.get(r.study, default)) for r in df.itertuples()]
    return df.assign(verdict=[REJECTED if reason else FEASIBLE for reason in reasons], reason=reasons)


def verdicts(
    df: pd.DataFrame, constraints: dict[str, Any], winner: str | None, objective: str | None = None
) -> pd.DataFrame:
    """``df`` (from :func:`trials`) with ``verdict`` (winner, pareto, feasible, rejected) and ``reason``.

    A trial is rejected when it failed (its kind and message) or breaks one of the study's
    ``constraints`` (``max_accuracy_drop``, default :data:`~autodeploy.accuracy.records.DEFAULT_MAX_ACCURACY_DROP`;
    ``max_memory_mb``; ``sla_ms``, a latency bound unless ``objective`` is ``server``), judged
    by :mod:`autodeploy.verdict` as the study judges them. Among the rest, ``pareto`` marks those
    no other feasible trial beats on latency, accuracy drop and memory at once; ``winner`` (a
    config label) marks the winning config's rows (one, given :func:`one_per_config`).
    """
    limits, known = verdict.Limits.of(constraints), objectives.stored(objective)
    out = df.copy()
    reasons = [_reason(r, limits, known) for r in out.itertuples()]
    out["reason"] = reasons
    out["verdict"] = [REJECTED if reason else FEASIBLE for reason in reasons]
    feasible = out[out["verdict"] == FEASIBLE]
    points = feasible[["latency_ms", "accuracy_drop", "peak_rss_mb"]].fillna(0.0).to_numpy().tolist()
    out.loc[feasible.index[verdict.pareto_front(points)], "verdict"] = "pareto"
    if winner is not None:
        out.loc[(out["config_label"] == winner) & (out["verdict"] != REJECTED), "verdict"] = "winner"
    return out


def _reason(r: Any, limits: verdict.Limits, objective: objectives.Objective | None) -> str:
    if r.status != "ok" and r.failure_kind not in JUDGED:  # measured, then judged: the study's budget decides below
        return f"{r.failure_kind}: {headline(r.failure_message)}".strip()
    if pd.isna(r.latency_ms):
        return "no measurement"
    measured = verdict.Measured(r.latency_ms, _number(r.accuracy_drop), _number(r.peak_rss_mb))
    record = getattr(r, "accuracy_record", None)
    accuracy = Accuracy.from_dict(json.loads(record)) if isinstance(record, str) else None
    return "; ".join(x.reason for x in verdict.rejections(measured, limits, objective, accuracy))


def _number(value: Any) -> float | None:
    return None if value is None or pd.isna(value) else float(value)


# -- fleet: jobs × devices, and the devices (records of autodeploy.fleet.jobs) -----------------------------------

#: The units a rate objective's winner names as its statistic when it has no round statistic (``q/s``).
_RATE_UNITS = frozenset(u for o in OBJECTIVES.values() if o.unit != "ms" for u in (o.unit, o.shown_unit))
#: What a fleet row holds (:func:`fleet_rows`): the job's, then its device's run, then the winner's (a profile job:
#: the profiled config's result) and, in a profile job, the device's own winner's (``own_*``).
FLEET_COLUMNS = ["job", "kind", "profile", "model", "model_sha256", "job_status", "device", "fingerprint", "state",
                 "phase", "queue_position", "trials", "trials_budget", "label", "config", "knobs", "engine",
                 "statistic", "unit", "value", "ci_low", "ci_high", "value_text", "speedup", "caveats", "own_label",
                 "own_config", "own_statistic", "own_value", "own_value_text", "value_as_own", "ratio", "reason", "skipped",
                 "attempts", "started_at", "duration_s", "heartbeat_age_s", "study"]  # fmt: skip


@dataclass(frozen=True)
class FleetFilters:
    """The Fleet page's own filters; empty means no filter."""

    jobs: tuple[int, ...] = ()
    devices: tuple[str, ...] = ()
    states: tuple[str, ...] = ()


def split_label(label: str) -> tuple[str, str]:
    """A config label (:meth:`TrialConfig.label`) as its short part, ``engine/precision/bN/tT``, and its knobs
    (``""`` without)."""
    parts = label.split("/", 4)
    return "/".join(parts[:4]), parts[4] if len(parts) > 4 else ""


def statistic_unit(statistic: str | None) -> str:
    """The unit of a fleet winner's value: its round statistic's (:data:`objectives.STATISTICS`: ``p90`` ms,
    ``items/s``), else the rate it names (``q/s``), else ms."""
    if statistic in objectives.STATISTICS:
        return objectives.STATISTICS[statistic].unit
    return statistic if statistic in _RATE_UNITS else "ms"


def vs_own_text(ratio: float | None, statistic: str | None) -> str:
    """A profiled config beside the device's own winner (``ratio`` > 1: that many times slower, as
    :func:`autodeploy.fleet.jobs.vs_own` gives it): ``1.45x slower (p90)``; ``""`` without a ratio."""
    if ratio is None or pd.isna(ratio) or ratio <= 0:
        return ""
    return f"{ratio:.2f}x slower ({statistic})" if ratio >= 1 else f"{1 / ratio:.2f}x faster ({statistic})"


def fleet_rows(records: list[dict[str, Any]], fingerprints: Mapping[str, str] | None = None) -> list[dict[str, Any]]:  # fmt: skip
    """One row (:data:`FLEET_COLUMNS`) per job × device of ``fleet status`` records (:func:`autodeploy.fleet.jobs.status`).

    A key a record lacks (one written before it was, or a kind of job without it) reads ``None``; a device's
    fingerprint is its record's, else ``fingerprints``' (by device name, from :func:`autodeploy.fleet.jobs.devices`).
    """
    rows = []
    for r in records:
        job = {"job": r["job"], "kind": r.get("kind") or "tune", "profile": r.get("profile"), "model": r["model"],
               "model_sha256": r.get("model_sha256"), "job_status": r["status"]}  # fmt: skip
        for d in r["devices"]:
            run = {"device": d["device"], "fingerprint": d.get("fingerprint") or (fingerprints or {}).get(d["device"]),
                   "state": d["state"], "phase": d.get("phase"), "queue_position": d.get("queue_position"),
                   "trials": d.get("trials"), "trials_budget": d.get("trials_budget"), "reason": d.get("reason"),
                   "skipped": "; ".join(f"{s['engine']}: {s['reason']}" for s in d.get("skipped") or []),
                   "attempts": d.get("attempts"), "started_at": d.get("started_at"), "duration_s": d.get("duration_s"),
                   "heartbeat_age_s": d.get("heartbeat_age_s"), "study": d["study"]}  # fmt: skip
            rows.append({**job, **run, **_winner_columns(d.get("winner"), d.get("own_winner"), d.get("vs_own"))})  # fmt: skip
    return rows


def _winner_columns(winner: dict[str, Any] | None, own: dict[str, Any] | None,
                    vs_own: dict[str, Any] | None) -> dict[str, Any]:  # fmt: skip
    """A winner's columns (a profile job's measured config) and its device's own winner's, with their ratio
    (``vs_own``: :func:`autodeploy.fleet.jobs.vs_own`) and the profiled value in the own winner's statistic."""
    w, o = winner or {}, own or {}
    config, knobs = split_label(w["config"]) if w.get("config") else (None, None)
    low, high = (w.get("ci") or (None, None))[:2]  # the interval, where the record has one
    as_own = (w.get("values") or {}).get(o.get("statistic")) or (w.get("value") if o.get("statistic") == w.get("statistic") else None)  # fmt: skip
    return {"label": w.get("config"), "config": config, "knobs": knobs, "engine": config.split("/")[0] if config else None,
            "statistic": w.get("statistic"), "unit": statistic_unit(w.get("statistic")) if w else None,
            "value": w.get("value"), "ci_low": low, "ci_high": high, "value_text": w.get("value_text"),
            "speedup": w.get("speedup"), "caveats": ", ".join(w.get("caveats") or []), "own_label": o.get("config"),
            "own_config": split_label(o["config"])[0] if o.get("config") else None, "own_statistic": o.get("statistic"),
            "own_value": o.get("value"), "own_value_text": o.get("value_text"), "value_as_own": as_own if o else None,
            "ratio": (vs_own or {}).get("ratio")}  # fmt: skip


def fleet_filtered(rows: list[dict[str, Any]], page: FleetFilters, sidebar: Filters = Filters()) -> list[dict[str, Any]]:  # fmt: skip
    """The rows ``page``'s filters and the sidebar's (model, device fingerprint, the winner's engine) keep."""
    checks = [(page.jobs, "job", page.jobs), (page.devices, "device", page.devices), (page.states, "state", page.states),
              (sidebar.model, "model_sha256", (sidebar.model,)), (sidebar.device, "fingerprint", (sidebar.device,)),
              (sidebar.engines, "engine", sidebar.engines)]  # fmt: skip
    return [r for r in rows if all(r[column] in allowed for given, column, allowed in checks if given)]


def fleet_devices(records: list[dict[str, Any]]) -> pd.DataFrame:
    """The fleet's devices (:func:`autodeploy.fleet.jobs.devices`), those of one machine (one fingerprint) together:
    the engines available with their versions, and those missing."""
    rows = []
    for d in records:
        engines = {name: str(probe) for name, probe in (d.get("engines") or {}).items()}
        run = d.get("running") or {}
        rows.append({"device": d["name"], "tags": ", ".join(d.get("tags") or []), "fingerprint": d.get("fingerprint"),
                     "same_machine_as": ", ".join(d.get("same_machine_as") or []), "cpu": d.get("cpu"),
                     "isa": " ".join(d.get("isa") or []),
                     "engines": ", ".join(f"{n} {_version(p)}".strip() for n, p in sorted(engines.items()) if p.startswith("available")),
                     "missing": ", ".join(n for n, p in sorted(engines.items()) if not p.startswith("available")),
                     "version": d.get("version"), "heartbeat_age_s": d.get("heartbeat_age_s"), "online": d.get("online"),
                     "run_job": run.get("job"), "run_study": run.get("study"), "run_trials": run.get("trials"),
                     "retired": bool(d.get("retired_at"))})  # fmt: skip
    columns = ["device", "tags", "fingerprint", "same_machine_as", "cpu", "isa", "engines", "missing", "version",
               "heartbeat_age_s", "online", "run_job", "run_study", "run_trials", "retired"]  # fmt: skip
    return pd.DataFrame(rows, columns=columns).sort_values(["fingerprint", "device"], kind="stable", ignore_index=True)  # fmt: skip


def _version(probe: str) -> str:
    """The version in an engine's probe text (``available (1.20.1)``: ``1.20.1``), ``""`` without one."""
    inside = probe.partition("(")[2].partition(")")[0]
    return inside if probe.startswith("available (") else ""
