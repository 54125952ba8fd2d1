"""Machine-readable records of what autodeploy measured: one versioned JSON schema, built from the typed records.

Two record kinds, each carrying ``schema`` and ``schema_version``:

- ``autodeploy.trial``: one trial (``bench``, ``results list|show``) with its config, model, device,
  engine version and :class:`~autodeploy.harness.result.Measurement` in its flat form
  (times in ms, memory in MB, throughput in items/s: the unit is in every field name); and (issue 54) what its
  timed phase cost the machine (``measurement.cost``: CPU time per inference, energy where a meter is).
- ``autodeploy.study``: one study's summary (``tune``, ``results studies``): the winner, the runner-up,
  the finalists with the objective's statistic, its unit and 95% CI, the speedup over the ORT fp32
  default (for a model file run as given, over its engine at fp32: ``baseline`` names it, issue 39);
  and (fields added in 0.1, so still schema version 1) where the time went per engine
  (``time_by_engine``), the time budget and what stopped screening, what the winner's confidence
  rests on, the branches the search deprioritized and the slow conversions it skipped, with reasons;
  and (issue 26) the speed-ups paired by round (``speedups``: the optimised statistic's and the
  median's, each with its interval over rounds), which one the study optimised (``optimised``),
  the rounds the winner rests on and whether it is a screening result only (``screening_only``),
  and the one-line ``headline`` that names its statistic (:func:`autodeploy.search.summary.headline`); how busy the machine was
  before the study and over each finalist round, and the round run again for it (``load``); and (issue 25)
  every config a constraint rejected, once, with the value and the limit (``rejected``), and the closest of
  them when no trial meets the constraints (``closest``); and (issue 42) the seconds each speed-up's rounds span
  (``speedups.*.span_s``), when each finalist's rounds started (``round_times``), and the baseline today beside
  its earlier studies on this device (``baseline_history``).
  The dashboard's winners page reads the same record.

The words of a study (the winner line, the speed-up, the load) are :mod:`autodeploy.search.summary`'s, beside the
summary they read; this module turns the typed records into JSON and CSV.

:data:`SCHEMA` is the JSON Schema (draft 2020-12) of both; ``autodeploy schema`` prints it. A change
that removes or renames a field bumps :data:`SCHEMA_VERSION`; adding a field does not.
"""

from __future__ import annotations

import json
import math
import numbers
from collections.abc import Iterable, Mapping
from typing import Any

from autodeploy import objectives
from autodeploy.adapters import registry
from autodeploy.harness.result import Measurement
from autodeploy.harness.stats import MIN_SAMPLES_P90, MIN_SAMPLES_P99
from autodeploy.objectives import NAMES, STATISTICS
from autodeploy.results_db.records import StudyRow, TrialRow
from autodeploy.results_db.states import JobKind, JobState, JobStatus, RunState
from autodeploy.search.summary import StudySummary, baseline_name, headline, limit_text, runner_up

__all__ = ["SCHEMA", "SCHEMA_VERSION", "flatten", "strict", "strict_json", "study_record", "to_csv_rows",
           "trial_record"]  # fmt: skip

SCHEMA_VERSION = 1
# What a study's finalist ``statistic`` is per objective, its unit and whether higher is better, and the
# field-style name of what each finalist round was reduced to: the tables in autodeploy.objectives.


def trial_record(trial: TrialRow) -> dict[str, Any]:
    """The ``autodeploy.trial`` record of a stored trial: as the store reads it back, or as a run just stored it
    (:attr:`StoredTrial.row <autodeploy.results_db.records.StoredTrial.row>`, what :func:`autodeploy.api.bench`
    returned: no time, study, phase or command, and ``inputs`` the harness's note)."""
    config, measurement = trial.config, trial.measurement
    return {
        "schema": "autodeploy.trial",
        "schema_version": SCHEMA_VERSION,
        "id": trial.id,
        "uid": trial.uid,
        "created_at": None if trial.created_at is None else trial.created_at.isoformat(),
        "status": trial.status,
        "failure_kind": trial.failure_kind,
        "failure_message": trial.failure_message,
        "study": trial.study,
        "phase": trial.phase,
        "command": trial.command,
        "model": {"name": trial.model_name, "sha256": trial.model_sha256},
        "device": {"fingerprint": trial.device_fingerprint, "cpu": trial.device_cpu},
        "engine": {"name": config.engine, "version": trial.engine_version},
        "config": config.to_dict(),
        "label": config.label(),
        "shape": None if trial.shape_text == "-" else trial.shape_text,
        "measurement": None if measurement is None else _jsonable(measurement.to_dict(samples=False)),
        "inputs": trial.inputs_note,
    }


def study_record(summary: StudySummary | StudyRow) -> dict[str, Any]:
    """The ``autodeploy.study`` record of a study: fresh from :func:`autodeploy.api.tune`, or as stored."""
    if isinstance(summary, StudySummary):
        s, extra = summary.to_dict(), {"model": None, "device": None, "updated_at": None, "command": None}
    else:  # StudyRow: the stored summary is StudySummary.to_dict() (None until the study finished)
        s = dict(summary.summary or {"name": summary.name, "objective": summary.objective, "trials": {},
                                     "finalists": [], "winner": None, "note": "not finished"})  # fmt: skip
        extra = {"model": {"name": summary.model_name, "sha256": summary.model_sha256},
                 "device": {"fingerprint": summary.device_fingerprint, "cpu": summary.device_cpu},
                 "updated_at": summary.updated_at.isoformat(), "command": summary.command}  # fmt: skip
    objective = s["objective"]
    known = objectives.stored(objective)
    name, unit = (known.statistic, known.unit) if known else ("value", None)
    reduced = STATISTICS.get(s.get("statistic") or "")  # what each finalist round was reduced to
    name = reduced.record if reduced else name
    second = runner_up(s)
    return {
        "schema": "autodeploy.study",
        "schema_version": SCHEMA_VERSION,
        "name": s["name"],
        "objective": objective,
        "statistic": name,
        "statistic_unit": unit,
        **extra,
        "trials": dict(s.get("trials") or {}),
        "winner": None if s.get("winner") is None else _finalist(s["winner"]),
        "runner_up": None if second is None else _finalist(second),
        "finalists": [_finalist(f) for f in s.get("finalists") or ()],
        "tie_with": list(s.get("tie_with") or ()),
        "speedup_vs_baseline": s.get("speedup_vs_baseline"),
        "baseline": baseline_name(s),
        "optimised": s.get("statistic") or None,
        "shapes": [dict(c) for c in s.get("shapes") or ()],
        "speedups": {k: _ratio(r) for k, r in (s.get("speedups") or {}).items()},
        "rounds": s.get("rounds") or 0,
        "screening_only": bool(s.get("screening_only")),
        "headline": headline(s),
        "roofline": _jsonable(s.get("roofline")) if s.get("roofline") else None,
        "limit": limit_text(s),
        "note": s.get("note") or "",
        "inputs": s.get("inputs") or None,
        "confidence": s.get("confidence") or "",
        "time_budget_s": s.get("time_budget_s"),
        "wall_s": s.get("wall_s"),
        "stopped_by": s.get("stopped_by") or "",
        "reference_s": s.get("reference_s"),
        "time_by_engine": {e: dict(row) for e, row in (s.get("time_by_engine") or {}).items()},
        "deprioritized": dict(s.get("deprioritized") or {}),
        "skipped": list(s.get("skipped") or ()),
        "failures": {kind: dict(seen) for kind, seen in (s.get("failures") or {}).items()},
        "rejected": [_rejected(r) for r in s.get("rejected") or ()],
        "closest": None if s.get("closest") is None else _rejected(s["closest"]),
        "load": _jsonable(s.get("load")) if s.get("load") else None,
        "baseline_history": _jsonable(s.get("baseline_history")) if s.get("baseline_history") else None,
    }


def _rejected(r: Mapping[str, Any]) -> dict[str, Any]:
    return {k: r.get(k) for k in ("config", "constraint", "value", "limit", "unit", "reason")}


def _ratio(r: Mapping[str, Any]) -> dict[str, Any]:
    ci = r.get("ci")
    return {"ratio": r["value"], "ci": None if ci is None else [ci[0], ci[1]], "ci_level": r.get("level"),
            "rounds": r.get("rounds"), "left_out": r.get("left_out", 0), "under_load": r.get("under_load", False),
            "span_s": r.get("span_s"), "values": None if r.get("values") is None else list(r["values"])}  # fmt: skip


def _finalist(f: Mapping[str, Any]) -> dict[str, Any]:
    config = dict(f["config"])
    config["knobs"] = dict(config.get("knobs") or {})
    ci = f.get("ci")
    return {"label": f["label"], "config": _jsonable(config), "statistic": f.get("statistic"),
            "statistic_ci": None if ci is None else [ci[0], ci[1]], "n_samples": f.get("n_samples", 0),
            "baseline": bool(f.get("baseline")), "failure": f.get("failure"), "trial_uids": list(f.get("uids") or ()),
            "per_shape": dict(f.get("per_shape") or {}), "rounds": list(f.get("rounds") or ()),
            "pooled": f.get("pooled"), "load_by_round": list(f.get("loads") or ()),
            "round_times": list(f.get("times") or ())}  # fmt: skip


def _jsonable(value: Any) -> Any:
    """Tuples as lists, so a record compares equal to its own JSON round trip."""
    return json.loads(json.dumps(value))


def strict(value: Any) -> Any:
    """``value`` with every non-finite number (an SQNR of a bit-exact output is infinite) as ``None``, so that its
    JSON is strict (RFC 8259 has no ``Infinity`` or ``NaN``; JavaScript, Go and serde reject them) and follows the
    schema's "number or null"."""
    if isinstance(value, Mapping):
        return {k: strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict(v) for v in value]
    if isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral):
        return float(value) if math.isfinite(value) else None
    return value


def strict_json(value: Any, **kwargs: Any) -> str:
    """``json.dumps`` of :func:`strict` ``value``; ``allow_nan=False`` catches a number it missed."""
    return json.dumps(strict(value), allow_nan=False, **kwargs)


def flatten(record: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """One CSV row: nested objects as dotted columns, pairs (CIs) as ``_low``/``_high``, other lists as JSON."""
    row: dict[str, Any] = {}
    for key, value in record.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and key != "knobs":
            row.update(flatten(value, f"{name}."))
        elif key.endswith("_ci") and (value is None or len(value) == 2):
            row[f"{name}_low"], row[f"{name}_high"] = (None, None) if value is None else value
        elif isinstance(value, (list, tuple, Mapping)):
            row[name] = strict_json(value, sort_keys=True)
        else:
            row[name] = value
    return row


def to_csv_rows(records: Iterable[Mapping[str, Any]]) -> tuple[list[str], list[dict[str, Any]]]:
    """Columns (in first-seen order) and flat rows of ``records``; the accuracy detail is JSON in one column."""
    rows = [flatten(r) for r in records]
    columns: dict[str, None] = {}
    for row in rows:
        columns.update(dict.fromkeys(row))
    return list(columns), rows


_NUM = {"type": ["number", "null"]}
_CI = {"type": ["array", "null"], "items": {"type": "number"}, "minItems": 2, "maxItems": 2}
_STR = {"type": ["string", "null"]}
_CONFIG = {
    "type": "object",
    "required": ["engine", "precision", "batch", "threads", "knobs"],
    "properties": {"engine": {"type": "string"}, "precision": {"type": "string"}, "batch": {"type": "integer"},
                   "threads": {"type": ["integer", "null"]}, "knobs": {"type": "object"}},  # fmt: skip
}
_REF = {"type": ["object", "null"], "properties": {"name": _STR, "sha256": _STR, "fingerprint": _STR, "cpu": _STR}}
_OUTPUT = {
    "type": "object",
    "required": ["name", "max_abs", "mean_rel", "cosine"],
    "properties": {"name": {"type": "string"}, "max_abs": {"type": "number"}, "mean_rel": {"type": "number"},
                   "cosine": {"type": "number"}, "top1_agreement": _NUM, "task_accuracy": _NUM,
                   "reference_task_accuracy": _NUM, "exact_agreement": _NUM,
                   "kind": {"type": ["string", "null"], "description": "how the output was judged (autodeploy.accuracy.kinds.MEASURES)"},
                   "sqnr_db": _NUM, "channels": {"type": ["string", "null"]}, "min_sqnr_db": _NUM, "f1": _NUM,
                   "decision_threshold": _NUM, "token_agreement": _NUM, "sequence_agreement": _NUM,
                   "row_cosine": _NUM, "cell_agreement": _NUM, "error_max_abs": _NUM, "error_p99_abs": _NUM,
                   "logit_f1": _NUM},  # fmt: skip
}
_LOAD = {
    "type": ["object", "null"],
    "description": "how busy the machine was over the timed phase (null: not recorded): cores other processes "
                   "(and a VM's steal) kept busy on average, of the logical cores; the 1-min load average and CPU "
                   "clock at its end where readable; under_load: other_cores above autodeploy.harness.load."
                   "UNDER_LOAD_CORES",
    "required": ["other_cores", "cpus", "wall_s", "under_load"],
    "properties": {"other_cores": {"type": "number"}, "cpus": {"type": "integer"}, "wall_s": {"type": "number"},
                   "loadavg_1m": _NUM, "cpu_mhz": _NUM, "under_load": {"type": "boolean"}},  # fmt: skip
}
_ROOFLINE = {
    "type": ["object", "null"],
    "description": "the distance to this device's limit (autodeploy.roofline.Roofline; null: the model's operations "
                   "were not counted): gop, operations of one call at its shape in billions (2 x the MACs of Conv, "
                   "ConvTranspose, MatMul, Gemm, attention); gops, the GOP/s achieved; peak_gops, the fastest "
                   "microbenchmark kernel of that precision on this device (peak_kernel names it); share, gops / "
                   "peak_gops; uncounted, ops whose shapes were not known (gop is then a floor)",
    "required": ["precision", "gop", "gops", "peak_gops", "share"],
    "properties": {"precision": {"type": "string"}, "gop": {"type": "number"}, "gops": {"type": "number"},
                   "peak_gops": _NUM, "share": _NUM, "peak_kernel": _STR,
                   "uncounted": {"type": "array", "items": {"type": "string"}}},  # fmt: skip
}
_COST = {
    "type": ["object", "null"],
    "description": "what the timed phase cost the machine (autodeploy.harness.energy.Cost; absent: measured before "
                   "it was recorded): cpu_s, the worker's user + system CPU seconds over the timed calls (every thread "
                   "of the worker process, the engine's own included), and cpu_ms_per_inference, over items (calls x "
                   "batch); where the machine has an energy meter, each counter's rise in readings (joules, the idle "
                   "draw idle_w measured just before, counted: summed), energy_mj_per_inference above idle and the "
                   "summed counters' source; else no_meter says why none. CPU time is a cost, never energy",
    "required": ["calls", "items", "wall_s", "cpu_s", "cpu_ms_per_inference"],
    "properties": {"calls": {"type": "integer"}, "items": {"type": "integer"}, "wall_s": {"type": "number"},
                   "cpu_s": {"type": "number"}, "cpu_ms_per_inference": _NUM, "energy_mj_per_inference": _NUM,
                   "source": _STR, "no_meter": _STR,
                   "readings": {"type": "array", "items": {
                       "type": "object", "required": ["source", "joules"],
                       "properties": {"source": {"type": "string"}, "joules": {"type": "number"}, "idle_w": _NUM,
                                      "counted": {"type": "boolean"}}}}},  # fmt: skip
}
_SPREAD = {"type": "object", "required": ["median", "low", "high"],
           "properties": {"median": {"type": "number"}, "low": {"type": "number"}, "high": {"type": "number"},
                          "coverage": _NUM}}  # fmt: skip
_STARTS = {
    "type": ["object", "null"],
    "required": ["runs", "process_ms", "import_ms", "load_ms", "first_ms"],
    "properties": {"runs": {"type": "array", "items": {
                       "type": "object", "required": ["process_ms", "import_ms", "load_ms", "first_ms"],
                       "properties": {"process_ms": {"type": "number"}, "import_ms": {"type": "number"},
                                      "load_ms": {"type": "number"}, "first_ms": {"type": "number"}, "cache": _STR}}},
                   "process_ms": _SPREAD, "import_ms": _SPREAD, "load_ms": _SPREAD, "first_ms": _SPREAD},  # fmt: skip
}
_COLD_START = {
    "type": ["object", "null"],
    "description": "the start in fresh processes (autodeploy.harness.cold_start.ColdStart; absent: not asked for): "
                   "per start, process_ms from starting the process to its first result, of which import_ms importing "
                   "the engine, load_ms its open (read and compile or deserialize) and first_ms the first call; each "
                   "as the median of the starts with its order-statistic interval (low..high, coverage). without: "
                   "starts without the engine's compiled cache; cached: starts from it (each run's cache: used, or "
                   "remade and why), made: the first start with it, which made it; cache names the engine's cache "
                   "or why it has none; value_ms: the median process_ms of the cached starts where every one used "
                   "the cache, else of the others (the objective cold-start)",
    "required": ["cache", "starts", "value_ms", "without"],
    "properties": {"cache": {"type": "string"}, "starts": {"type": "integer"}, "value_ms": {"type": "number"},
                   "without": _STARTS, "cached": _STARTS, "made": {"type": ["object", "null"]}},  # fmt: skip
}
_MEASUREMENT = {
    "type": ["object", "null"],
    "description": ("Times in ms, memory in MB, throughput in items/s; "
                    f"p90/p99 are null below {MIN_SAMPLES_P90}/{MIN_SAMPLES_P99} samples."),
    "required": list(Measurement.keys(samples=False)),
    "additionalProperties": False,
    "properties": {
        **{k: _NUM for k in Measurement.keys(samples=False)},
        "scenario": {"type": "string"},
        "batch": {"type": "integer"},
        "n_samples": {"type": "integer"},
        "warmup_calls": {"type": "integer"},
        "unstable": {"type": "boolean"},
        "median_ci": _CI,
        "p90_ci": _CI,
        "p99_ci": _CI,
        "serving": {"type": ["object", "null"], "description": "offline, multi-stream, server: what ran in flight "
                    "as read back from the engine, and the server scenario's rate search"},
        "load": _LOAD,
        "roofline": _ROOFLINE,
        "cost": _COST,
        "cold_start": _COLD_START,
        "accuracy": {
            "type": ["object", "null"],
            "required": ["outputs", "n_samples", "constraint", "passed"],
            "properties": {"outputs": {"type": "array", "items": _OUTPUT}, "n_samples": {"type": "integer"},
                           "constraint": {"type": "string"}, "passed": {"type": "boolean"},
                           "metric": _STR, "metric_value": _NUM, "reference_metric_value": _NUM},  # fmt: skip
        },
    },
}
_TRIAL = {
    "type": "object",
    "required": ["schema", "schema_version", "id", "uid", "status", "model", "device", "engine", "config",
                 "label", "measurement"],  # fmt: skip
    "properties": {
        "schema": {"const": "autodeploy.trial"},
        "schema_version": {"const": SCHEMA_VERSION},
        "id": {"type": "integer"},
        "uid": {"type": "string"},
        "created_at": {**_STR, "description": "ISO 8601, UTC; null for a trial just measured"},
        "status": {"enum": ["ok", "failed"]},
        "failure_kind": _STR,
        "failure_message": _STR,
        "study": _STR,
        "phase": _STR,
        "command": _STR,
        "model": _REF,
        "device": _REF,
        "engine": {"type": "object", "required": ["name", "version"],
                   "properties": {"name": {"type": "string"}, "version": _STR}},  # fmt: skip
        "config": _CONFIG,
        "label": {"type": "string"},
        "shape": {**_STR, "description": "the input shapes it ran at, NAME=DIMS;...; null when not recorded"},
        "measurement": _MEASUREMENT,
        "inputs": {**_STR, "description": "what accuracy was judged on when it was not the user's data (a "
                   "trial just measured; null when stored)"},
    },
}
_FINALIST = {
    "type": "object",
    "required": ["label", "config", "statistic", "statistic_ci", "n_samples", "baseline", "failure", "trial_uids"],
    "properties": {"label": {"type": "string"}, "config": _CONFIG, "statistic": _NUM, "statistic_ci": _CI,
                   "n_samples": {"type": "integer"}, "baseline": {"type": "boolean"}, "failure": _STR,
                   "trial_uids": {"type": "array", "items": {"type": "string"}},
                   "per_shape": {"type": "object", "additionalProperties": _NUM,
                                 "description": "the statistic at each shape of a study over several"},
                   "rounds": {"type": "array", "items": _NUM, "description": "one value per finalist round "
                              "(null: it did not run that round); the winner is chosen on these, paired by round"},
                   "pooled": {**_NUM, "description": "the statistic over every call of every round pooled: "
                              "display only (one noisy round owns its tail)"},
                   "load_by_round": {"type": "array", "items": _NUM, "description": "per finalist round, the cores "
                                     "other processes kept busy while it ran (null: not run, or not read)"},
                   "round_times": {"type": "array", "items": _NUM, "description": "per finalist round, when its run "
                                   "started, seconds since the epoch (null: not run): the rounds are spread over time"}},  # fmt: skip
}
_REJECTED = {
    "type": "object",
    "required": ["config", "constraint", "value", "limit", "unit", "reason"],
    "properties": {"config": {"type": "string", "description": "the config's label"},
                   "constraint": {"enum": ["max_accuracy_drop", "max_memory_mb", "sla_ms"],
                                  "description": "the constraint it misses most"},
                   "value": {**_NUM, "description": "what was measured (for accuracy, the worst output's own measure: "
                             "an SQNR in dB, an agreement or F1 as a fraction); null where not finite"},
                   "limit": {**_NUM, "description": "what that constraint allows, in the same unit"},
                   "unit": {"type": "string", "description": "MB, ms, dB, q/s, or empty for a fraction"},
                   "reason": {"type": "string", "description": "every constraint it breaks, with value and limit, as read"}},
}
_RATIO = {"type": "object", "required": ["ratio", "ci", "ci_level", "rounds"],
          "properties": {"ratio": {"type": "number"}, "ci": _CI, "ci_level": _NUM, "rounds": {"type": ["integer", "null"]},
                         "left_out": {"type": "integer", "description": "paired rounds set aside: the winner's or the "
                                      "baseline's run ran under load"},
                         "under_load": {"type": "boolean", "description": "no paired round ran quiet: the ratio rests "
                                        "on loaded rounds"},
                         "span_s": {**_NUM, "description": "seconds from the first paired round it rests on to the "
                                    "last: how much of the machine's time the interval sampled"},
                         "values": {"type": ["array", "null"], "items": {"type": "number"}, "minItems": 2, "maxItems": 2,
                                    "description": "[baseline, winner]: each one's statistic as its median over the "
                                    "rounds the ratio rests on (the winner line shows these when rounds were left out)"}}}  # fmt: skip
#: The baseline today beside its history on this device (autodeploy.verdict.BaselineHistory); the gate keeps the same
#: object in its stored settings (``baseline_history``).
_HISTORY = {
    "type": ["object", "null"],
    "description": "the baseline's value today beside its earlier studies (or runs) of the same model, config, shape "
                   "and engine version on this device: their range, and whether today lies outside it (judged from "
                   "autodeploy.verdict.HISTORY_MIN_RUNS of them); over_range: the speed-up at either end of that range "
                   "(the gate: the candidate's); null without a stored history",
    "required": ["statistic", "today", "low", "high", "runs", "kind", "outside", "over_range"],
    "properties": {"statistic": {"type": "string"}, "today": {"type": "number"}, "low": {"type": "number"},
                   "high": {"type": "number"}, "runs": {"type": "integer"}, "kind": {"enum": ["studies", "runs"]},
                   "outside": {"type": "boolean"}, "over_range": _CI},
}
_STUDY = {
    "type": "object",
    "required": ["schema", "schema_version", "name", "objective", "statistic", "statistic_unit", "trials",
                 "winner", "finalists", "tie_with", "speedup_vs_baseline", "note"],  # fmt: skip
    "properties": {
        "schema": {"const": "autodeploy.study"},
        "schema_version": {"const": SCHEMA_VERSION},
        "name": {"type": "string"},
        "objective": {"enum": list(NAMES)},
        "statistic": {"type": "string", "description": "what each finalist's statistic is, unit in the name"},
        "statistic_unit": _STR,
        "model": _REF,
        "device": _REF,
        "updated_at": _STR,
        "command": _STR,
        "trials": {"type": "object", "additionalProperties": {"type": "integer"}},
        "winner": {"oneOf": [{"type": "null"}, _FINALIST]},
        "runner_up": {"oneOf": [{"type": "null"}, _FINALIST],
                      "description": "the next finalist after the winner by the statistic"},
        "finalists": {"type": "array", "items": _FINALIST},
        "tie_with": {"type": "array", "items": {"type": "string"}},
        "baseline": {**_STR, "description": f"what every speed-up is over: {registry.BASELINE_NAME}, or for a model "
                     f"file run as given its engine at fp32 ({registry.baseline_name('tflite')})"},
        "speedup_vs_baseline": {**_NUM, "description": "winner over the baseline, >1 is faster: the "
                                "optimised statistic's median per-round ratio (speedups[optimised].ratio)"},
        "optimised": {**_STR, "description": "what each finalist round was reduced to and compared by: p90 | median "
                      f"(latency, median where a round has under {MIN_SAMPLES_P90} calls) | items/s"},
        "shapes": {"type": "array", "description": "the input shapes every statistic is at (several: each one is "
                   "their weighted mean); empty where no shape was fixed", "items": {"type": "object",
                   "required": ["shape", "weight"], "properties": {"shape": {"type": "string"}, "weight": _NUM}}},
        "speedups": {"type": "object", "description": "the winner's speed-up over the baseline per statistic "
                     "(the optimised one and, for latency, the median): the median of the per-round ratios, paired "
                     "by round, with its order-statistic interval and that interval's exact coverage (null when "
                     "screening only)", "additionalProperties": _RATIO},
        "rounds": {"type": "integer", "description": "finalist rounds the winner ran"},
        "screening_only": {"type": "boolean", "description": "fewer than 3 rounds: the winner is a screening result "
                           "and its speed-up has no interval"},
        "headline": {"type": "string", "description": "the winner line, naming its statistic"},
        "roofline": {"type": ["object", "null"], "description": "the winner's distance to this device's limit "
                     "(autodeploy.roofline.distance): label, engine, batch, precision, gop (a call), gops (median of "
                     "its measurements), peak_gops and share of its precision's peak, peak_kernel, uncounted; what_if: "
                     "int8's peak (or, for an int8 winner, its own) at the same share: ms a call and items/s; null "
                     "without counted operations"},
        "limit": {"type": "string", "description": "roofline in words, as tune prints it; empty without one"},
        "note": {"type": "string"},
        "inputs": {**_STR, "description": "what accuracy was judged on when it was not the user's data"},
        "confidence": {"type": "string", "description": "what the winner's numbers rest on"},
        "time_budget_s": {**_NUM, "description": "--time-budget of the run that wrote this summary"},
        "wall_s": {**_NUM, "description": "wall time of that run"},
        "stopped_by": {"type": "string", "description": "trials | time budget | screening time | no improvement | search space"},
        "reference_s": {**_NUM, "description": "the fp32 reference (the baseline's engine), when that run computed it first"},
        "time_by_engine": {
            "type": "object",
            "description": "seconds per engine over the whole study: build, accuracy, timing; worker runs",
            "additionalProperties": {"type": "object", "properties": {"build_s": {"type": "number"},
                                     "accuracy_s": {"type": "number"}, "timing_s": {"type": "number"},
                                     "runs": {"type": "integer"}}},  # fmt: skip
        },
        "deprioritized": {"type": "object", "additionalProperties": {"type": "string"},
                          "description": "engine/precision -> why the search spent no more trials on it"},  # fmt: skip
        "skipped": {"type": "array", "items": {"type": "string"},
                    "description": "slow conversions the time budget could not pay for"},  # fmt: skip
        "load": {"type": ["object", "null"], "description": "how busy the machine was: before (the machine "
                 "watched for 0.5 s before the study), rounds (per finalist round, the most cores other processes kept "
                 "busy over its runs), under_load (those rounds, 1-based, above threshold_cores), reran (a round "
                 "under load run once more: round, other_cores of both runs, kept: first | again, and the "
                 "dropped_uids of the run not kept), pair_rounds (rounds the winner and the baseline then ran alone, paired, "
                 "because too few of their paired rounds ran quiet), unsteady (the winner or the baseline whose quiet rounds "
                 "read values more than autodeploy.harness.load.UNSTEADY_SPREAD apart: config, baseline, low, high)",
                 "properties": {"before": _LOAD, "threshold_cores": {"type": "number"},
                                "rounds": {"type": "array", "items": _NUM},
                                "under_load": {"type": "array", "items": {"type": "integer"}},
                                "reran": {"type": "array", "items": {"type": "object"}},
                                "pair_rounds": {"type": "integer"},
                                "unsteady": {"type": "array", "items": {
                                    "type": "object", "required": ["config", "baseline", "low", "high"],
                                    "properties": {"config": {"type": "string"}, "baseline": {"type": "boolean"},
                                                   "low": {"type": "number"}, "high": {"type": "number"}}}}}},  # fmt: skip
        "failures": {"type": "object", "description": "failed trials by failure kind: count, first config, its reason",
                     "additionalProperties": {"type": "object", "properties": {"count": {"type": "integer"},
                                              "config": {"type": "string"}, "reason": {"type": "string"}}}},  # fmt: skip
        "rejected": {"type": "array", "items": _REJECTED, "description": "every config a constraint rejected, "
                     "once, closest to meeting the constraints first"},
        "closest": {"oneOf": [{"type": "null"}, _REJECTED],
                    "description": "no trial meets the constraints: the rejected config that came closest"},
        "baseline_history": _HISTORY,
    },
}
#: ``autodeploy fleet status --format json``: one fleet job, per device its state and winner (issue 40;
#: made by :func:`autodeploy.fleet.jobs.record`).
_FLEET = {
    "type": "object",
    "required": ["schema", "schema_version", "job", "model", "state", "devices"],
    "properties": {
        "schema": {"const": "autodeploy.fleet"},
        "schema_version": {"const": SCHEMA_VERSION},
        "job": {"type": "integer"},
        "model": {"type": "string"},
        "state": {"enum": [s.value for s in JobState], "description": "as stored: open, or cancelled"},
        "status": {"enum": [s.value for s in JobStatus], "description": "where it stands, from its runs: queued, "
                   "running, done, done with failures (a device failed or was lost), cancelled, no devices"},
        "accepts_late_until": {**_STR, "description": "until when a device registering now takes it too "
                               "(fleet submit --accept-late), else null"},
        "reason": {**_STR, "description": "why the job row is unreadable (changed outside autodeploy), else null"},
        "kind": {"enum": [k.value for k in JobKind], "description": "tune (each device its own study), or profile "
                 "(one given config measured on every device: fleet submit --profile)"},
        "profile": {**_STR, "description": "a profile job's config label, else null"},
        "devices": {"type": "array", "items": {
            "type": "object",
            "required": ["device", "state", "winner", "reason"],
            "properties": {
                "device": {"type": "string"},
                "state": {"enum": [s.value for s in RunState]},
                "winner": {"type": ["object", "null"], "required": ["config", "statistic", "value", "speedup"],
                           "description": "the winner's config label, its statistic (p90, median, items/s) and value, "
                           "its interval (ci), speed-up over the baseline, memory_mb, accuracy and caveats; a profile "
                           "job's: the profiled config's numbers (every statistic in values); null until done (or "
                           "when no config met the constraints)"},
                "phase": {**_STR, "description": "where a running run stands: screening 3/12, finalist round 2/5, "
                          "waiting for the spread, exporting, profiling; else null"},
                "queue_position": {"type": ["integer", "null"], "description": "a queued run's place in its "
                                   "device's line (1: next), else null"},
                "trials_budget": {"type": ["integer", "null"], "description": "the trials the job asks of each device"},
                "fingerprint": {"type": "string", "description": "the device's machine (names sharing it: one machine)"},
                "own_winner": {"type": ["object", "null"], "description": "a profile job: this device's own "
                               "winner in the latest tune job of the model (with its job), else null"},
                "vs_own": {"type": ["object", "null"], "description": "a profile job: the profiled config's cost beside "
                           "the device's own winner in its statistic: ratio > 1 is that many times slower"},
                "reason": {**_STR, "description": "why it failed (agent lost: no heartbeat for N s) or was skipped"},
                "heartbeat_age_s": {"type": "number"},
                "trials": {"type": "integer", "description": "measured screening trials in its study so far"},
                "skipped": {"type": "array", "description": "engines the job asks for that this device lacks, with why"},
                "study": {"type": "string", "description": "its own study: fleet.JOB.DEVICE"},
                "created_at": {**_STR, "description": "when the run was made (ISO 8601, UTC)"},
                "started_at": {**_STR, "description": "when an agent first took it, else null"},
                "finished_at": {**_STR, "description": "when it ended, else null"},
                "duration_s": {"type": ["number", "null"], "description": "from its start to its end, or to now"},
            },
        }},
    },
}
#: JSON Schema of every record above; ``--format json`` prints one record or a list of them.
SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": f"https://autodeploy.invalid/schema/v{SCHEMA_VERSION}.json",
    "title": f"autodeploy records, schema version {SCHEMA_VERSION}",
    "$defs": {"trial": _TRIAL, "study": _STUDY, "fleet": _FLEET},
    "oneOf": [{"$ref": "#/$defs/trial"}, {"$ref": "#/$defs/study"}, {"$ref": "#/$defs/fleet"},
              {"type": "array", "items": {"oneOf": [{"$ref": "#/$defs/trial"}, {"$ref": "#/$defs/study"},
                                                    {"$ref": "#/$defs/fleet"}]}}],  # fmt: skip
}
