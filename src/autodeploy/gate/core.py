"""The gate pipeline: measure both arms interleaved (or the candidate against stored history),
judge every metric, and return one :class:`GateResult` with its verdict and exit code."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

import numpy as np

from autodeploy.gate.measure import (
    Arm,
    Progress,
    Round,
    Rounds,
    check_same_inputs,
    history_rounds,
    run_rounds,
)
from autodeploy.gate.stats import (
    CHANGE_CI_LEVEL,
    Criteria,
    MetricVerdict,
    judge_accuracy,
    judge_latency,
    overall,
)
from autodeploy.harness.run import HarnessSettings, prepare_data
from autodeploy.objectives import DEFAULT_SCENARIO, MEDIAN, P10, STATISTICS
from autodeploy.units import fmt_ms, fmt_ms_range
from autodeploy.verdict import BaselineHistory, against_history

if TYPE_CHECKING:
    from autodeploy.results_db.records import GateRunRecord
    from autodeploy.results_db.store import Store
    from autodeploy.runtime.device import DeviceInfo

#: Latency metrics the gate can judge: the per-round statistic each one takes (a :class:`Round`'s field), the
#: latency rows of the statistics table.
LATENCY_METRICS = {s.name: s.field for s in STATISTICS.values() if s.unit == MEDIAN.unit}
#: p10 and median by default. Measured over 150 fresh worker processes per model on a 2-core shared VM:
#: across fresh processes of the same model, per-run p10 varies by 3-5% (CV), the median by 6-11%
#: (a few slow processes), p90 by 11-16%; p90 needs several times the rounds to judge at 5%.
DEFAULT_METRICS = (P10.name, MEDIAN.name)
#: Process exit status per verdict; bad input and errors that stop the gate use 64 and 70 (sysexits).
EXIT_CODES = {"pass": 0, "fail": 1, "inconclusive": 2}
EXIT_USAGE = 64
EXIT_ERROR = 70
INTERLEAVED, AGAINST_DB = "interleaved", "against-db"
WEAKER = "weaker: against stored history"


@dataclass(frozen=True)
class GateSettings:
    """How the gate runs and judges (validated by the caller)."""

    rounds: int = 16
    metrics: tuple[str, ...] = DEFAULT_METRICS
    criteria: Criteria = field(default_factory=Criteria)
    against_db: bool = False
    history_limit: int = 50

    def to_dict(self) -> dict[str, Any]:
        c = self.criteria
        return {"rounds": self.rounds, "metrics": list(self.metrics), "max_regression": c.max_regression,
                "max_accuracy_drop": c.max_accuracy_drop, "alpha": c.alpha, "min_samples": c.min_rounds,
                "change_ci_level": CHANGE_CI_LEVEL, "against_db": self.against_db, "history_limit": self.history_limit}  # fmt: skip


@dataclass(frozen=True)
class GateResult:
    """The verdict, every metric's statistics, and every round that produced them."""

    verdict: str
    mode: str
    baseline: dict[str, Any]
    candidate: dict[str, Any]
    metrics: tuple[MetricVerdict, ...]
    rounds: Rounds
    device: dict[str, str]
    settings: dict[str, Any]
    notes: tuple[str, ...]
    wall_s: float
    created_at: datetime
    #: The baseline's median today beside its earlier runs on this device (:meth:`BaselineHistory.to_dict`; ``None``:
    #: no store, no history, or against stored history): stored in the run's settings as ``baseline_history``.
    history: dict[str, Any] | None = None

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.verdict]

    @property
    def weaker(self) -> bool:
        return self.mode == AGAINST_DB

    def to_record(self) -> GateRunRecord:
        from autodeploy.results_db.records import GateRunRecord

        rounds = {
            role: [r.to_dict() for r in getattr(self.rounds, role)] for role in ("baseline", "candidate")
        }
        return GateRunRecord(
            mode=self.mode, verdict=self.verdict,
            baseline_ref=self.baseline["ref"], baseline_sha256=self.baseline["sha256"],
            baseline_config=self.baseline["config"],
            candidate_ref=self.candidate["ref"], candidate_sha256=self.candidate["sha256"],
            candidate_config=self.candidate["config"],
            settings={**self.settings, "rounds_measured": rounds,
                      **({"baseline_history": self.history} if self.history else {})},
            metrics=[m.to_dict() for m in self.metrics], notes=list(self.notes), wall_s=self.wall_s,
        )  # fmt: skip


def run_gate(
    baseline: Arm,
    candidate: Arm,
    settings: GateSettings,
    harness: HarnessSettings,
    *,
    device: DeviceInfo,
    store: Store | None = None,
    progress: Progress | None = None,
) -> GateResult:
    """Measure and judge. With ``settings.against_db`` the baseline is not run: its rounds are the
    stored trials of its model and config on this device (``store`` is required then). Otherwise, given a
    ``store``, the baseline's median today is set beside its earlier runs on this device (:func:`baseline_history`),
    and a note says so when it lies outside their range; the verdict is the interleaved rounds' alone.

    Raises:
        UsageError: the arms take different inputs.
        TrialFailed: the FP32 reference could not be computed.
    """
    start = time.monotonic()
    check_same_inputs(baseline, candidate)
    notes = [*baseline.notes, *candidate.notes]
    source = baseline if not settings.against_db else candidate
    data = prepare_data(source.model, harness, data=source.data, calibration=source.calibration)
    if settings.against_db:
        assert store is not None, "against_db needs a store"
        rounds = run_rounds([candidate], settings.rounds, data, harness, progress)
        rounds.baseline = history_rounds(store, baseline, device.fingerprint, limit=settings.history_limit)
        notes.insert(0, f"{WEAKER}: the baseline is {len(rounds.baseline)} stored trials of {baseline.model.name} "
                     f"({baseline.config.label()}) on this device, measured at other times; machine drift "
                     "between then and now is not cancelled as in an interleaved run")  # fmt: skip
    else:
        rounds = run_rounds([baseline, candidate], settings.rounds, data, harness, progress)
    history = None
    if store is not None and not settings.against_db:
        history = baseline_history(store, baseline, rounds, device.fingerprint, limit=settings.history_limit)
        if history is not None and history.outside:
            notes.append(history_note(history, baseline.config.label()))
    metrics = evaluate(rounds, settings)
    return GateResult(
        verdict=overall(metrics), mode=AGAINST_DB if settings.against_db else INTERLEAVED,
        baseline=baseline.describe(), candidate=candidate.describe(), metrics=tuple(metrics), rounds=rounds,
        device={"fingerprint": device.fingerprint, "cpu": device.cpu_model}, settings=settings.to_dict(),
        notes=tuple(notes), wall_s=time.monotonic() - start, created_at=datetime.now(timezone.utc),
        history=None if history is None else history.to_dict(),
    )  # fmt: skip


def baseline_history(store: Store, arm: Arm, rounds: Rounds, fingerprint: str, *, limit: int) -> BaselineHistory | None:
    """The baseline arm's median latency today (the median over its rounds) beside its earlier runs on this device:
    the stored trials of its model, config, shape and engine version (``bench``, ``tune``; one value per study) and
    the earlier interleaved gate runs of the same baseline (one value per run), at most ``limit`` of those. The
    candidate's median today gives the change over that range (:func:`history_note`)."""
    from statistics import median

    from autodeploy.results_db.history import gate_history, trial_history
    from autodeploy.results_db.records import TrialFilter
    from autodeploy.shapes import ShapeCase

    ok = {role: [r for r in getattr(rounds, role) if r.ok and r.median_ms is not None] for role in ("baseline", "candidate")}
    if not ok["baseline"]:
        return None
    where = TrialFilter(model_sha256=arm.model.sha256, device=fingerprint, config_key=arm.config.key(),
                        shape_key=ShapeCase(dict(arm.model.shapes)).key(), scenario=DEFAULT_SCENARIO.name,
                        engine_version=ok["baseline"][0].engine_version)  # fmt: skip
    studies, _ = trial_history(store, where, MEDIAN.name)
    runs = gate_history(store, device=fingerprint, baseline_sha256=arm.model.sha256, config_key=arm.config.key(), limit=limit)
    candidate = float(median(r.median_ms for r in ok["candidate"])) if ok["candidate"] else None  # type: ignore[misc]
    return against_history(MEDIAN.name, float(median(r.median_ms for r in ok["baseline"])), [*studies, *runs],  # type: ignore[misc]
                           kind="runs", winner=candidate)  # fmt: skip


def history_note(history: BaselineHistory, label: str) -> str:
    """``the baseline (onnxruntime/fp32/b1/t1) read median 8.700 ms today; 4.900–8.700 ms in 6 earlier runs on this
    device: over that range the candidate's median changes by -41.2% to +4.1%``."""
    text = (f"the baseline ({label}) read median {fmt_ms(history.today)} today; {fmt_ms_range(history.low, history.high)} "
            f"in {history.runs} earlier run{'s' if history.runs != 1 else ''} on this device")
    if history.over_range is None:
        return text
    low, high = (1 / s - 1 for s in reversed(history.over_range))  # a speed-up s is a change of 1/s - 1
    return text + f": over that range the candidate's median changes by {low:+.1%} to {high:+.1%}"


def evaluate(rounds: Rounds, settings: GateSettings) -> list[MetricVerdict]:
    """Every metric's verdict from the rounds: failed runs, latency metrics, accuracy."""
    ok_b = [r for r in rounds.baseline if r.ok]
    ok_c = [r for r in rounds.candidate if r.ok]
    out = _runs_verdict(rounds)
    latency = []
    for name in settings.metrics:
        attr = LATENCY_METRICS[name]
        values = [[getattr(r, attr) for r in ok if getattr(r, attr) is not None] for ok in (ok_b, ok_c)]
        latency.append((f"latency {name}", values[0], values[1]))
    out += judge_latency(latency, settings.criteria)
    acc_b = [r for r in ok_b if r.accuracy is not None]
    acc_c = [r for r in ok_c if r.accuracy is not None]
    if acc_b and acc_c:
        # Deterministic per run on fixed inputs: the median over rounds only guards against a stray run.
        b, c = float(np.median([r.accuracy for r in acc_b])), float(np.median([r.accuracy for r in acc_c]))
        name = f"accuracy ({acc_c[0].accuracy_metric})"
        out.append(judge_accuracy(name, b, c, settings.criteria, n_items=acc_c[0].eval_items))
    return out


def _runs_verdict(rounds: Rounds) -> list[MetricVerdict]:
    """A crashing or failing candidate fails the gate; a failing baseline makes it inconclusive."""
    out = []
    for role, verdict in (("candidate", "fail"), ("baseline", "inconclusive")):
        done: list[Round] = getattr(rounds, role)
        failed = [r for r in done if not r.ok]
        if failed:
            reason = f"{role}: {len(failed)} of {len(done)} runs failed; first: {failed[0].failure}"
            out.append(MetricVerdict(name=f"{role} runs", unit="runs", verdict=verdict, reason=reason,
                                     test="worker status", threshold=0.0, n_baseline=0, n_candidate=0))  # fmt: skip
    return out
