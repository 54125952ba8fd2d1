"""From a measurement to what Optuna optimizes: objective values and constraint violations.

The rules (accuracy drop, constraints, feasibility) live in :mod:`autodeploy.verdict`;
``accuracy_drop`` is re-exported here for the callers that import it from the search.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from autodeploy import verdict
from autodeploy.verdict import SERVER, Limits, Measured, accuracy_drop

if TYPE_CHECKING:
    from autodeploy.harness.result import Accuracy, TrialResult
    from autodeploy.results_db.records import TrialRow
    from autodeploy.search.config import Constraints

__all__ = ["DIRECTIONS", "OBJECTIVE_LABELS", "Metrics", "accuracy_drop", "rejections", "values", "violations"]

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
        server = ((r.measurement.serving if r.measurement else None) or {}).get("server") or {}
        return cls(r.uid, r.median_ms, r.p90_ms, r.throughput, r.peak_rss_mb, accuracy_drop(r.accuracy),
                   server.get("max_rate_qps"))  # fmt: skip

    @property
    def latency_ms(self) -> float:
        """p90 where there are samples enough to claim it, else the median."""
        return self.p90_ms if self.p90_ms is not None else self.median_ms

    def measured(self, server_rate: float | None = None) -> Measured:
        """What the constraints judge (:mod:`autodeploy.verdict`)."""
        return Measured(self.latency_ms, self.accuracy_drop, self.peak_rss_mb, server_rate)


def values(m: Metrics, objective: str) -> list[float]:
    if objective == "latency":
        return [m.latency_ms]
    if objective == "throughput":
        return [m.throughput or 0.0]
    if objective == "server":
        return [m.server_rate or 0.0]
    return [m.latency_ms, m.accuracy_drop, m.peak_rss_mb or 0.0]


def violations(m: Metrics, constraints: Constraints, objective: str) -> dict[str, float]:
    """One number per constraint, <= 0 when it holds (Optuna's ``Trial.set_constraint`` convention).

    The rule is :func:`autodeploy.verdict.violations`. Every trial of a ``server`` study ran the
    server scenario, so a missing rate there means no rate met the SLA.
    """
    rate = (m.server_rate or 0.0) if objective == SERVER else None
    return verdict.violations(m.measured(rate), Limits.of(constraints), objective)


def rejections(m: Metrics, constraints: Constraints, objective: str,
               accuracy: Accuracy | None = None) -> list[verdict.Rejection]:  # fmt: skip
    """Why the trial is rejected, one per broken constraint of :func:`violations`
    (:func:`autodeploy.verdict.rejections`); ``accuracy`` names the worst output."""
    rate = (m.server_rate or 0.0) if objective == SERVER else None
    return verdict.rejections(m.measured(rate), Limits.of(constraints), objective, accuracy)
