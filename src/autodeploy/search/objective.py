"""From a measurement to what Optuna optimizes: objective values and constraint violations.

What each objective means (scenario, measures, statistic, directions, words) is the table in
:mod:`autodeploy.objectives`; :func:`values` reads the measures its row names off :class:`Metrics`. The rules
(constraints, feasibility) live in :mod:`autodeploy.verdict`, the accuracy drop in
:func:`autodeploy.accuracy.rules.accuracy_drop`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from autodeploy import verdict
from autodeploy.accuracy.records import Accuracy
from autodeploy.accuracy.rules import accuracy_drop
from autodeploy.harness.stats import claimed
from autodeploy.objectives import Objective
from autodeploy.verdict import Limits, Measured, sla_bounds_latency

if TYPE_CHECKING:
    from autodeploy.harness.result import Measurement, TrialResult
    from autodeploy.results_db.records import TrialRow
    from autodeploy.search.config import Constraints

__all__ = ["Metrics", "has_measures", "rejections", "values", "violations"]


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
    #: The worker's CPU ms and the energy (mJ, idle subtracted) per inference (``harness/energy.py``'s ``Cost``);
    #: ``None`` where not measured: no meter, or a trial stored before revision 0013.
    cpu_ms: float | None = None
    energy_mj: float | None = None
    #: The median time from a new process to its first result (``harness/cold_start.py`` ``ColdStart.value_ms``);
    #: ``None`` where not measured (asked for only by the objective ``cold-start``).
    cold_start_ms: float | None = None

    @classmethod
    def of_result(cls, r: TrialResult) -> Metrics:
        assert r.latency is not None and r.accuracy is not None
        server = r.extra.get("server") or {}
        cost = r.measurement.cost if r.measurement is not None else None
        return cls(r.uid, r.latency.median, r.latency.p90, r.throughput, r.peak_rss_mb,
                   accuracy_drop(r.accuracy), server.get("max_rate_qps"), cost and cost.cpu_ms,
                   cost and cost.energy_mj, cold_start_ms(r.measurement))  # fmt: skip

    @classmethod
    def of_row(cls, r: TrialRow) -> Metrics:
        assert r.median_ms is not None and r.accuracy is not None
        server = ((r.measurement.serving if r.measurement else None) or {}).get("server") or {}
        cost = r.measurement.cost if r.measurement is not None else None
        return cls(r.uid, r.median_ms, r.p90_ms, r.throughput, r.peak_rss_mb, accuracy_drop(r.accuracy),
                   server.get("max_rate_qps"), cost and cost.cpu_ms, cost and cost.energy_mj,
                   cold_start_ms(r.measurement))  # fmt: skip

    @property
    def latency_ms(self) -> float:
        """p90 where there are samples enough to claim it, else the median (:func:`~autodeploy.harness.stats.claimed`)."""
        return claimed(self.p90_ms, self.median_ms)

    def measured(self, server_rate: float | None = None) -> Measured:
        """What the constraints judge (:mod:`autodeploy.verdict`)."""
        return Measured(self.latency_ms, self.accuracy_drop, self.peak_rss_mb, server_rate)


def cold_start_ms(measurement: Measurement | None) -> float | None:
    """A measurement's cold start (:attr:`~autodeploy.harness.cold_start.ColdStart.value_ms`), ``None`` where not
    measured."""
    cold = None if measurement is None else measurement.cold_start
    return None if cold is None else cold.value_ms


def has_measures(m: Metrics, objective: Objective) -> bool:
    """Whether ``m`` holds every measure ``objective`` optimizes: a stored trial made before one was measured
    (CPU time, before revision 0013) would count it as 0, the best, and is measured again instead."""
    return all(getattr(m, name) is not None for name in objective.measures)


def values(m: Metrics, objective: Objective) -> list[float]:
    """The values Optuna optimizes, one per direction of the objective: the fields of ``m`` its row names
    (:attr:`autodeploy.objectives.Objective.measures`), one not measured as 0."""
    return [getattr(m, name) or 0.0 for name in objective.measures]


def violations(m: Metrics, constraints: Constraints, objective: Objective) -> dict[str, float]:
    """One number per constraint, <= 0 when it holds (Optuna's ``Trial.set_constraint`` convention).

    The rule is :func:`autodeploy.verdict.violations`. Every trial of a ``server`` study ran the
    server scenario, so a missing rate there means no rate met the SLA.
    """
    rate = None if sla_bounds_latency(objective) else (m.server_rate or 0.0)
    return verdict.violations(m.measured(rate), Limits.of(constraints), objective)


def rejections(m: Metrics, constraints: Constraints, objective: Objective,
               accuracy: Accuracy | None = None) -> list[verdict.Rejection]:  # fmt: skip
    """Why the trial is rejected, one per broken constraint of :func:`violations`
    (:func:`autodeploy.verdict.rejections`); ``accuracy`` names the worst output."""
    rate = None if sla_bounds_latency(objective) else (m.server_rate or 0.0)
    return verdict.rejections(m.measured(rate), Limits.of(constraints), objective, accuracy)
