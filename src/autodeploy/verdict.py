"""What "feasible" and "better" mean: the one place these rules live (docs/architecture.md).

Everything that judges a trial against a study's limits calls this module: the study's objective and constraints
(:func:`violations`, :func:`feasible`, :func:`pareto_front`), the bundle manifest (:func:`constraint_verdicts`),
the study summary's rejected configs (:func:`rejections`), the dashboard's Pareto page (:func:`reasons`,
:func:`pareto_front`), the finalists' rounds (:data:`TIE_TOLERANCE`, :data:`FIRST_ROUND_MARGIN`) and the
baseline's history (:func:`against_history`). What "accurate enough" means for one output is
:mod:`autodeploy.accuracy`'s (its kinds, records, budget and rule); this module takes it as one number, the
drop (:func:`autodeploy.accuracy.rules.accuracy_drop`), and names the worst output in a rejection.

The rules:

* **Accuracy**: the drop within the budget, ``max_accuracy_drop``
  (:data:`autodeploy.accuracy.records.DEFAULT_MAX_ACCURACY_DROP`, 1%): within it exactly when every output
  passes its kind's limit (:mod:`autodeploy.accuracy.kinds`, :func:`autodeploy.accuracy.rules.accuracy_verdict`).
* **Constraints** (Optuna's ``Trial.set_constraint`` convention: a value ``<= 0`` holds):
  accuracy drop, peak memory, and the SLA. The SLA bounds latency for every objective except
  ``server``, whose objective *is* the highest rate under the SLA; there it is a constraint
  that some rate meets it.
  A rate meets the SLA when its p99 is at most the SLA (:func:`meets_sla`, the server search's test).
* **Pareto**: every value is minimized; a point is on the front when no other point is at
  least as good everywhere and better somewhere.
* **Better**, between finalists compared paired by round: a tie is a median per-round ratio within
  :data:`TIE_TOLERANCE` of 1 whose interval holds 1; after one round only a gap of
  :data:`FIRST_ROUND_MARGIN` (or the machine's own swing) puts a finalist out (:mod:`autodeploy.search.study` applies them).
* **The baseline against its history** on this device (:func:`against_history`): today's baseline outside the range
  its earlier studies read (at least :data:`HISTORY_MIN_RUNS` of them) is said, with both numbers, and the speed-up
  is given over that range as well (the study's winner line, the gate's notes).

Pure functions and frozen dataclasses, stdlib only (and the objectives' table, :mod:`autodeploy.objectives`, and
the accuracy records and rules): importing this module imports no engine, numpy, Optuna, SQLAlchemy or pandas.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from autodeploy.accuracy.records import (
    DEFAULT_MAX_ACCURACY_DROP,
    TOLERANCE,
    Accuracy,
    cosine_for_drop,
    within,
)
from autodeploy.accuracy.rules import fraction, task_drops, worst_output
from autodeploy.objectives import Objective

#: A finalist whose median per-round ratio to the best is within this fraction of 1, and whose paired
#: interval of that ratio holds 1, ties with it (and the cheaper one wins). An interval holding 1 alone
#: would tie configs far apart when the rounds are noisy (all cores on a busy machine).
TIE_TOLERANCE = 0.03
#: After the finalists' first round a config leaves the rounds only when it is at least this fraction
#: slower than the leader in that round (so too when one round is all the two have in common quiet), and
#: more where the machine moved one config further than that between two of its runs
#: (``search/winner.py`` ``one_pair_margin``): two equal configs can read as far apart as one config
#: reads from itself. After later rounds, when it is slower in every round so far and the paired interval
#: of its ratio to the leader lies above 1 (it is wholly behind).
FIRST_ROUND_MARGIN = 0.10


# -- constraints ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Limits:
    """A study's constraints. ``None`` means no limit."""

    max_accuracy_drop: float = DEFAULT_MAX_ACCURACY_DROP
    max_memory_mb: float | None = None
    sla_ms: float | None = None

    @classmethod
    def of(cls, constraints: Mapping[str, Any] | Any | None) -> Limits:
        """From a stored settings dict (missing or ``None`` entries take the defaults) or any object
        with the same attributes (e.g. the study config's ``Constraints``)."""
        if constraints is None:
            return cls()
        get = (
            constraints.get if isinstance(constraints, Mapping) else (lambda k: getattr(constraints, k, None))
        )
        drop = get("max_accuracy_drop")
        return cls(
            DEFAULT_MAX_ACCURACY_DROP if drop is None else float(drop), get("max_memory_mb"), get("sla_ms")
        )


@dataclass(frozen=True)
class Measured:
    """What the constraints judge of one trial. ``None``: not measured.

    ``latency_ms`` is the p90 where there were samples enough to claim it, else the median.
    ``accuracy_drop`` is :func:`autodeploy.accuracy.rules.accuracy_drop`. ``server_rate`` is the highest rate (queries/s)
    whose p99 met the SLA, 0.0 when none did; ``None`` where it was not recorded (the store keeps
    no server rate), and then its constraint is not judged.
    """

    latency_ms: float
    accuracy_drop: float | None
    peak_rss_mb: float | None = None
    server_rate: float | None = None


def sla_bounds_latency(objective: Objective | None) -> bool:
    """Whether the SLA bounds each trial's latency: for every objective but those whose value is the
    highest rate under the SLA (``server``: :attr:`autodeploy.objectives.Objective.sla_bounds_latency`), and where
    the objective is not known (``None``: a bench, a record this version has no row for)."""
    return objective is None or objective.sla_bounds_latency


def meets_sla(p99_ms: float, sla_ms: float) -> bool:
    """Whether a rate whose queries' p99 is ``p99_ms`` meets the SLA (the server search's test)."""
    return p99_ms <= sla_ms


def violations(m: Measured, limits: Limits, objective: Objective | None) -> dict[str, float]:
    """One number per constraint that applies, ``<= 0`` when it holds (``Trial.set_constraint``).

    Keys: ``accuracy_drop`` (when measured), ``memory_mb`` (with a memory limit; unmeasured
    memory counts as 0), ``latency_ms`` (with an SLA, for every objective but ``server``) and
    ``server_rate`` (``server`` with a recorded rate: 0.0 when a rate met the SLA, else 1.0).
    A value within :data:`autodeploy.accuracy.records.TOLERANCE` of its limit counts as exactly at it.
    """
    out: dict[str, float] = {}
    if m.accuracy_drop is not None:
        out["accuracy_drop"] = _excess(m.accuracy_drop, limits.max_accuracy_drop)
    if limits.max_memory_mb is not None:
        out["memory_mb"] = _excess(m.peak_rss_mb or 0.0, limits.max_memory_mb)
    if limits.sla_ms is not None and sla_bounds_latency(objective):
        out["latency_ms"] = _excess(m.latency_ms, limits.sla_ms)
    if not sla_bounds_latency(objective) and m.server_rate is not None:
        out["server_rate"] = 0.0 if m.server_rate > 0 else 1.0
    return out


def _excess(value: float, limit: float) -> float:
    excess = value - limit
    if math.isnan(excess):
        return math.inf  # an unmeasurable value never meets a limit
    return 0.0 if abs(excess) <= TOLERANCE else excess


def feasible(found: Mapping[str, float]) -> bool:
    """Whether every constraint holds (every violation ``<= 0``)."""
    return all(v <= 0 for v in found.values())


def constraint_verdicts(m: Measured, limits: Limits, objective: Objective | None) -> dict[str, dict[str, Any]]:
    """Per constraint of :func:`violations`: ``{"limit", "measured", "passed"}`` (the bundle manifest's form)."""
    value = {"accuracy_drop": (limits.max_accuracy_drop, m.accuracy_drop),
             "memory_mb": (limits.max_memory_mb, m.peak_rss_mb),
             "latency_ms": (limits.sla_ms, m.latency_ms),
             "server_rate": (None, m.server_rate)}  # fmt: skip
    return {key: {"limit": value[key][0], "measured": value[key][1], "passed": v <= 0}
            for key, v in violations(m, limits, objective).items()}  # fmt: skip


@dataclass(frozen=True)
class Rejection:
    """One constraint a trial breaks, in the constraint's own terms (:func:`rejections`).

    ``constraint`` names the limit as the study config does (``max_accuracy_drop``, ``max_memory_mb``,
    ``sla_ms``). ``value`` and ``limit`` are what was measured and what was allowed, in ``unit``: for
    accuracy the worst output's own measure (an SQNR in dB, an agreement or F1 as a fraction), the
    drop itself where no output is named; ``None`` where not finite. ``miss`` is how far past its
    limit, as a fraction of the limit (in drop units for accuracy): it ranks the closest config.
    """

    constraint: str
    value: float | None
    limit: float | None
    unit: str
    reason: str
    miss: float


def rejections(m: Measured, limits: Limits, objective: Objective | None,
               accuracy: Accuracy | None = None) -> list[Rejection]:  # fmt: skip
    """Why a trial is rejected, one :class:`Rejection` per broken constraint of :func:`violations`
    (empty when it meets them all). With ``accuracy`` the accuracy reason names the worst output
    and channel group (:func:`autodeploy.accuracy.rules.worst_output`) with its value and limit."""
    found = violations(m, limits, objective)
    out = []
    if (excess := found.get("accuracy_drop", 0.0)) > 0:
        out.append(_accuracy_rejection(m, limits, accuracy, _relative(excess, limits.max_accuracy_drop)))
    if (excess := found.get("memory_mb", 0.0)) > 0:
        out.append(Rejection("max_memory_mb", m.peak_rss_mb, limits.max_memory_mb, "MB",
                             f"peak memory {mb_text(m.peak_rss_mb or 0.0)} MB > {limits.max_memory_mb:g} MB",
                             _relative(excess, limits.max_memory_mb)))  # fmt: skip
    if (excess := found.get("latency_ms", 0.0)) > 0:
        out.append(Rejection("sla_ms", m.latency_ms, limits.sla_ms, "ms",
                             f"latency {m.latency_ms:.3f} ms > SLA {limits.sla_ms:g} ms",
                             _relative(excess, limits.sla_ms)))  # fmt: skip
    if found.get("server_rate", 0.0) > 0:
        out.append(Rejection("sla_ms", None, limits.sla_ms, "ms",  # no rate's p99 to name: none met it
                             f"no rate meets the SLA of {limits.sla_ms:g} ms", 1.0))  # fmt: skip
    return out


def mb_text(mb: float) -> str:
    """Megabytes as read in a reason: one decimal, two significant digits below 1 MB (a tiny model's 0.00093)."""
    return f"{mb:.1f}" if mb >= 1 else f"{mb:.2g}"


def _relative(excess: float, limit: float | None) -> float:
    return excess / limit if limit else excess


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def _accuracy_rejection(m: Measured, limits: Limits, accuracy: Accuracy | None, miss: float) -> Rejection:
    """The accuracy budget broken: by the worst output when one fails its limit, else by the task
    accuracy (labels), else by the drop as one number (a record without its outputs)."""
    max_accuracy_drop = limits.max_accuracy_drop
    budget = f"max accuracy drop {max_accuracy_drop * 100:g}%"
    min_cosine = cosine_for_drop(max_accuracy_drop)
    w = worst_output(accuracy.outputs, max_accuracy_drop=max_accuracy_drop, min_cosine=min_cosine) if accuracy else None
    if w is not None and w.failed:
        if math.isnan(w.value):
            reason = f"{w.where}: NaN or inf ({budget})"
        else:
            value = f"{w.value:.1f}" if w.measure.db else fraction(w.value)
            unit = f" {w.unit}" if w.unit else ""
            own = w.measure.db and w.output.min_sqnr_db is not None  # the user's --accuracy limit
            evidence = w.evidence()
            compared = "within" if w.by_guard else "<"  # by_guard: the bound beside the measure failed (evidence)
            reason = (f"{w.where}: {w.metric} {value}{unit} {compared} {w.limit:.3g}{unit}" + ("" if own else f" ({budget})")
                      + (f"; {evidence}" if evidence else ""))  # fmt: skip
        return Rejection("max_accuracy_drop", _finite(w.value), _finite(w.limit), w.unit, reason, miss)
    task = task_drops(accuracy.outputs) if accuracy else []
    if task and not within(max(task), max_accuracy_drop):
        return Rejection("max_accuracy_drop", max(task), max_accuracy_drop, "",
                         f"task accuracy drop {max(task):.2%} > {max_accuracy_drop:.2%}", miss)  # fmt: skip
    return Rejection("max_accuracy_drop", _finite(m.accuracy_drop), max_accuracy_drop, "",
                     f"accuracy drop {m.accuracy_drop:.2%} > {max_accuracy_drop:.2%}", miss)  # fmt: skip


def reasons(m: Measured, limits: Limits, objective: Objective | None) -> list[str]:
    """Why a trial is rejected, one phrase per broken constraint (empty when it meets them all)."""
    return [r.reason for r in rejections(m, limits, objective)]


# -- Pareto --------------------------------------------------------------------------------


def dominates(a: Sequence[float], b: Sequence[float]) -> bool:
    """``a`` is at least as good as ``b`` in every value and better in one (all minimized)."""
    return all(x <= y for x, y in zip(a, b, strict=True)) and any(x < y for x, y in zip(a, b, strict=True))


def pareto_front(points: Sequence[Sequence[float]]) -> list[int]:
    """Indices of the points no other point dominates, in input order."""
    return [i for i, p in enumerate(points) if not any(dominates(q, p) for q in points)]


# -- the baseline against its history --------------------------------------------------------------

#: Today's baseline is judged against its history on this device once that history holds this many earlier
#: studies (or runs): one or two give no range worth the name, and today's value lies off a point almost surely.
HISTORY_MIN_RUNS = 3


@dataclass(frozen=True)
class BaselineHistory:
    """The baseline today beside what it read before on the same device, model, config and shape.

    ``low``..``high`` is the range of ``runs`` earlier values (one per earlier study, or per stored run outside a
    study: ``kind``), in ``statistic`` (ms, or items/s) as ``today`` is. ``outside``: today lies outside that range
    and the range rests on at least :data:`HISTORY_MIN_RUNS` values. ``over_range``: where it is outside, the
    winner's (the gate's candidate's) speed-up over the baseline at either end of the range, lowest first.
    """

    statistic: str
    today: float
    low: float
    high: float
    runs: int
    kind: str = "studies"  # or "runs"
    outside: bool = False
    over_range: tuple[float, float] | None = None

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["over_range"] = None if self.over_range is None else list(self.over_range)
        return out


def against_history(statistic: str, today: float | None, earlier: Sequence[float | None], *, kind: str = "studies",
                    higher_is_better: bool = False, winner: float | None = None) -> BaselineHistory | None:  # fmt: skip
    """Today's baseline value beside its ``earlier`` ones (``None`` where there are none, or no value today).

    The speed-up over the range (``over_range``) is ``baseline / winner`` for times, ``winner / baseline`` for
    rates (``higher_is_better``), at each end of the range. A host that moves a run 2x for minutes moves the
    speed-up with it; the range of the studies before says how far this device has moved it already.
    """
    known = [float(v) for v in earlier if v is not None and math.isfinite(v) and v > 0]
    if not known or today is None or not today > 0:
        return None
    low, high = min(known), max(known)
    outside = len(known) >= HISTORY_MIN_RUNS and not low <= today <= high
    over = None
    if outside and winner is not None and winner > 0:
        ends = (winner / high, winner / low) if higher_is_better else (low / winner, high / winner)
        over = (min(ends), max(ends))
    return BaselineHistory(statistic, float(today), low, high, len(known), kind, outside, over)
