"""What "accurate enough" and "better" mean: the one place these rules live (DESIGN.md).

Everything that judges a measurement calls this module: the harness's accuracy check
(:func:`accuracy_verdict`), the study's objective and constraints (:func:`accuracy_drop`,
:func:`violations`, :func:`feasible`, :func:`pareto_front`), the bundle manifest
(:func:`constraint_verdicts`), the dashboard's Pareto page (:func:`reasons`,
:func:`pareto_front`), the gate (:func:`accuracy_score`, :func:`within`) and the in-house
quantizer's budget (:data:`DEFAULT_MAX_ACCURACY_DROP`).

The rules:

* **Accuracy**, judged per output by what the output is (:func:`output_metric`): an integer
  output (ids) by its exact agreement, a classifier-shaped one by its top-1 agreement, both
  ``>= 1 - max_drop``; any other (detection maps, boxes, embeddings, regression) by its cosine
  similarity ``>= min_cosine``. Every output must pass, and with labels the task accuracy may
  drop by at most ``max_drop``. Non-finite outputs (NaN cosine) always fail. :func:`worst`
  names the output furthest from its limit. :func:`accuracy_drop` is the same rule as one
  number: with ``min_cosine = 1 - max_drop`` it passes exactly when the drop is within the budget.
* **Constraints** (Optuna's ``Trial.set_constraint`` convention: a value ``<= 0`` holds):
  accuracy drop, peak memory, and the SLA. The SLA bounds latency for every objective except
  ``server``, whose objective *is* the highest rate under the SLA; there it is a constraint
  that some rate meets it.
* **Pareto**: every value is minimized; a point is on the front when no other point is at
  least as good everywhere and better somewhere.

Pure functions and frozen dataclasses, stdlib only: importing this module imports no
engine, Optuna, SQLAlchemy or pandas.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from autodeploy.harness.result import Accuracy, OutputAccuracy

#: The default accuracy budget (DESIGN.md): top-1 agreement drop <= 1%.
DEFAULT_MAX_ACCURACY_DROP = 0.01
#: The default where top-1 does not apply: cosine similarity >= 0.99 (the same 1% budget).
DEFAULT_MIN_COSINE = 1.0 - DEFAULT_MAX_ACCURACY_DROP
#: Slack for comparing fractions such as 99/100 with limits such as 1 - 0.01 (float rounding).
TOLERANCE = 1e-9
#: The objective whose value is the highest rate under the SLA (see :func:`violations`).
SERVER = "server"


# -- accuracy ------------------------------------------------------------------------------


@dataclass(frozen=True)
class AccuracyVerdict:
    """The accuracy constraint checked (human text, stored with the trial) and whether it held."""

    constraint: str
    passed: bool


def cosine_for_drop(max_drop: float) -> float:
    """The cosine a drop budget asks of outputs where top-1 does not apply (their drop is ``1 - cosine``)."""
    return 1.0 - max_drop


def within(value: float, limit: float) -> bool:
    """``value <= limit`` up to :data:`TOLERANCE`; NaN is never within."""
    return value <= limit + TOLERANCE


def output_metric(o: OutputAccuracy) -> tuple[str, float]:
    """The metric an output is judged by, and its value: ``exact agreement`` (integer outputs),
    ``top-1 agreement`` (classifier-shaped ones) or ``cosine`` (every other output)."""
    if o.exact_agreement is not None:
        return "exact agreement", o.exact_agreement
    if o.top1_agreement is not None:
        return "top-1 agreement", o.top1_agreement
    return "cosine", o.cosine


def _shortfall(o: OutputAccuracy, max_drop: float, min_cosine: float) -> float:
    """How far an output is below its limit (<= 0: it passes; inf: non-finite)."""
    if not math.isfinite(o.cosine):
        return math.inf
    metric, value = output_metric(o)
    limit = min_cosine if metric == "cosine" else 1.0 - max_drop
    return limit - value


def accuracy_verdict(
    outputs: Sequence[OutputAccuracy],
    *,
    max_drop: float = DEFAULT_MAX_ACCURACY_DROP,
    min_cosine: float = DEFAULT_MIN_COSINE,
) -> AccuracyVerdict:
    """Judge per-output accuracy metrics against the FP32 reference (the rule in the module docstring).

    Args:
        outputs: One entry per output; ``cosine`` is NaN where either array was non-finite.
        max_drop: Allowed top-1 / exact agreement and task-accuracy drop, as a fraction.
        min_cosine: Required cosine similarity of the outputs judged by cosine.
    """
    metrics = list(dict.fromkeys(output_metric(o)[0] for o in outputs))
    rules = [f"{m} >= {min_cosine if m == 'cosine' else 1 - max_drop:g}" for m in metrics]
    constraint = " and ".join(rules)
    passed = all(within(_shortfall(o, max_drop, min_cosine), 0.0) for o in outputs)
    task = _task_drops(outputs)
    if task:
        constraint += f" and task accuracy drop <= {max_drop:g}"
        passed = passed and within(task[0], max_drop)
    return AccuracyVerdict(constraint, bool(passed))


def with_metric(verdict: AccuracyVerdict, name: str, value: float, reference: float,
                max_drop: float | None) -> AccuracyVerdict:  # fmt: skip
    """``verdict`` with the user's task metric (higher is better) judged too: with ``max_drop`` its
    drop from the reference's value must be ``<= max_drop``; without, it is only reported."""
    if max_drop is None:
        return verdict
    constraint = f"{verdict.constraint} and {name} drop <= {max_drop:g}"
    return AccuracyVerdict(constraint, verdict.passed and within(reference - value, max_drop))


def worst(
    outputs: Sequence[OutputAccuracy],
    *,
    max_drop: float = DEFAULT_MAX_ACCURACY_DROP,
    min_cosine: float = DEFAULT_MIN_COSINE,
) -> str:
    """The output furthest below (or nearest to) its limit, as ``output 'y': cosine 0.95``."""
    if not outputs:
        return "no outputs"
    o = max(outputs, key=lambda x: _shortfall(x, max_drop, min_cosine))
    metric, value = output_metric(o)
    return f"output {o.name!r}: {metric} {value:.4g}" if math.isfinite(o.cosine) else f"output {o.name!r}: NaN or inf"


def accuracy_drop(accuracy: Accuracy) -> float:
    """The accuracy lost, as one number in the rule's own terms (0 = identical, 1 = total loss).

    The worst output's drop by its own metric (:func:`output_metric`: ``1 - agreement`` or
    ``1 - cosine``) and the task accuracy lost, with labels. Non-finite outputs are a total loss.
    """
    outputs = accuracy.outputs
    if not all(math.isfinite(o.cosine) for o in outputs):
        return 1.0
    drops = [1.0 - output_metric(o)[1] for o in outputs]
    return max([*drops, *_task_drops(outputs)], default=0.0)


def _task_drops(outputs: Sequence[OutputAccuracy]) -> list[float]:
    return [o.reference_task_accuracy - o.task_accuracy for o in outputs
            if o.task_accuracy is not None and o.reference_task_accuracy is not None]  # fmt: skip


def accuracy_score(outputs: Sequence[Mapping[str, Any]]) -> tuple[float | None, str | None]:
    """One 0..1 score (higher is better) for comparing two runs, and what it is: the worst output's
    task accuracy where there are labels, else its top-1 agreement with FP32 for classifiers,
    else its cosine similarity with FP32. A non-finite value scores 0 (a total loss, as in
    :func:`accuracy_drop`). ``(None, None)`` without outputs."""
    for key, label in (("task_accuracy", "task accuracy"), ("top1_agreement", "top-1 agreement vs FP32"),
                       ("exact_agreement", "exact agreement vs FP32"), ("cosine", "cosine vs FP32")):  # fmt: skip
        values = [o[key] if math.isfinite(o[key]) else 0.0 for o in outputs if o.get(key) is not None]
        if values:
            return float(min(values)), label
    return None, None


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
    ``accuracy_drop`` is :func:`accuracy_drop`. ``server_rate`` is the highest rate (queries/s)
    whose p99 met the SLA, 0.0 when none did; ``None`` where it was not recorded (the store keeps
    no server rate), and then its constraint is not judged.
    """

    latency_ms: float
    accuracy_drop: float | None
    peak_rss_mb: float | None = None
    server_rate: float | None = None


def violations(m: Measured, limits: Limits, objective: str) -> dict[str, float]:
    """One number per constraint that applies, ``<= 0`` when it holds (``Trial.set_constraint``).

    Keys: ``accuracy_drop`` (when measured), ``memory_mb`` (with a memory limit; unmeasured
    memory counts as 0), ``latency_ms`` (with an SLA, for every objective but ``server``) and
    ``server_rate`` (``server`` with a recorded rate: 0.0 when a rate met the SLA, else 1.0).
    A value within :data:`TOLERANCE` of its limit counts as exactly at it.
    """
    out: dict[str, float] = {}
    if m.accuracy_drop is not None:
        out["accuracy_drop"] = _excess(m.accuracy_drop, limits.max_accuracy_drop)
    if limits.max_memory_mb is not None:
        out["memory_mb"] = _excess(m.peak_rss_mb or 0.0, limits.max_memory_mb)
    if limits.sla_ms is not None and objective != SERVER:
        out["latency_ms"] = _excess(m.latency_ms, limits.sla_ms)
    if objective == SERVER and m.server_rate is not None:
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


def constraint_verdicts(m: Measured, limits: Limits, objective: str) -> dict[str, dict[str, Any]]:
    """Per constraint of :func:`violations`: ``{"limit", "measured", "passed"}`` (the bundle manifest's form)."""
    value = {"accuracy_drop": (limits.max_accuracy_drop, m.accuracy_drop),
             "memory_mb": (limits.max_memory_mb, m.peak_rss_mb),
             "latency_ms": (limits.sla_ms, m.latency_ms),
             "server_rate": (None, m.server_rate)}  # fmt: skip
    return {key: {"limit": value[key][0], "measured": value[key][1], "passed": v <= 0}
            for key, v in violations(m, limits, objective).items()}  # fmt: skip


def reasons(m: Measured, limits: Limits, objective: str) -> list[str]:
    """Why a trial is rejected, one phrase per broken constraint (empty when it meets them all)."""
    found = violations(m, limits, objective)
    out = []
    if found.get("accuracy_drop", 0.0) > 0:
        out.append(f"accuracy drop {m.accuracy_drop:.2%} > {limits.max_accuracy_drop:.2%}")
    if found.get("memory_mb", 0.0) > 0:
        out.append(f"memory {m.peak_rss_mb:.1f} MB > {limits.max_memory_mb:g} MB")
    if found.get("latency_ms", 0.0) > 0:
        out.append(f"latency {m.latency_ms:.3f} ms > SLA {limits.sla_ms:g} ms")
    if found.get("server_rate", 0.0) > 0:
        out.append(f"no rate meets the SLA of {limits.sla_ms:g} ms")
    return out


# -- Pareto --------------------------------------------------------------------------------


def dominates(a: Sequence[float], b: Sequence[float]) -> bool:
    """``a`` is at least as good as ``b`` in every value and better in one (all minimized)."""
    return all(x <= y for x, y in zip(a, b, strict=True)) and any(x < y for x, y in zip(a, b, strict=True))


def pareto_front(points: Sequence[Sequence[float]]) -> list[int]:
    """Indices of the points no other point dominates, in input order."""
    return [i for i, p in enumerate(points) if not any(dominates(q, p) for q in points)]
