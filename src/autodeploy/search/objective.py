"""From a measurement to what Optuna optimizes: objective values and constraint violations."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from autodeploy.harness.result import Accuracy, TrialResult
    from autodeploy.results_db.store import TrialRow
    from autodeploy.search.config import Constraints

DIRECTIONS: dict[str, list[str]] = {
    "latency": ["minimize"],  # single-stream p90, ms
    "throughput": ["maximize"],  # items/s at the trial's batch
    "server": ["maximize"],  # highest Poisson rate (queries/s) whose p99 meets the SLA
    "pareto": ["minimize", "minimize", "minimize"],  # p90 ms × accuracy drop × peak memory MB
}
OBJECTIVE_LABELS = {"latency": "p90 ms", "throughput": "items/s", "server": "max q/s under SLA",
                    "pareto": "p90 ms, accuracy drop, MB"}  # fmt: skip


@dataclass(frozen=True)
class Metrics:
    """The numbers a study needs from one measured trial, fresh or taken from the store."""

    uid: str
    median_ms: float
    p90_ms: float | None
    throughput: float | None
    peak_rss_mb: float | None
    accuracy_drop: float
    server_rate: float | None = None

    @classmethod
    def of_result(cls, r: TrialResult) -> Metrics:
        assert r.latency is not None and r.accuracy is not None
        server = r.extra.get("server") or {}
        return cls(r.uid, r.latency.median, r.latency.p90, r.throughput, r.peak_rss_mb,
                   accuracy_drop(r.accuracy), server.get("max_rate_qps"))  # fmt: skip

    @classmethod
    def of_row(cls, r: TrialRow) -> Metrics:
        assert r.median_ms is not None and r.accuracy is not None
        return cls(r.uid, r.median_ms, r.p90_ms, r.throughput, r.peak_rss_mb, accuracy_drop(r.accuracy))

    @property
    def latency_ms(self) -> float:
        """p90 where there are samples enough to claim it, else the median."""
        return self.p90_ms if self.p90_ms is not None else self.median_ms


def accuracy_drop(accuracy: Accuracy) -> float:
    """The worst output's loss: 1 - top-1 agreement for classifiers (and task accuracy lost, with labels), else 1 - cosine."""
    drops = []
    for o in accuracy.outputs:
        drop = 1.0 - o.top1_agreement if o.top1_agreement is not None else 1.0 - o.cosine
        if o.task_accuracy is not None and o.reference_task_accuracy is not None:
            drop = max(drop, o.reference_task_accuracy - o.task_accuracy)
        drops.append(drop if drop == drop else 1.0)  # NaN (non-finite outputs) is a total loss
    return max(drops, default=0.0)


def values(m: Metrics, objective: str) -> list[float]:
    if objective == "latency":
        return [m.latency_ms]
    if objective == "throughput":
        return [m.throughput or 0.0]
    if objective == "server":
        return [m.server_rate or 0.0]
    return [m.latency_ms, m.accuracy_drop, m.peak_rss_mb or 0.0]


def violations(m: Metrics, constraints: Constraints, objective: str) -> dict[str, float]:
    """One number per constraint, <= 0 when it holds (Optuna's ``Trial.set_constraint`` convention)."""
    out = {"accuracy_drop": m.accuracy_drop - constraints.max_accuracy_drop}
    if constraints.max_memory_mb is not None:
        out["memory_mb"] = (m.peak_rss_mb or 0.0) - constraints.max_memory_mb
    if constraints.sla_ms is not None and objective != "server":
        out["latency_ms"] = m.latency_ms - constraints.sla_ms
    if objective == "server":
        out["server_rate"] = 0.0 if (m.server_rate or 0.0) > 0 else 1.0  # no rate meets the SLA
    return out
