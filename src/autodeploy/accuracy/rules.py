"""Whether an output is accurate enough: the pass/fail rule of the accuracy kinds, and the worst output named.

Each output is judged by its measure (:func:`output_measure`, a row of :data:`autodeploy.accuracy.kinds.MEASURES`;
its words and value: :func:`output_metric`) against its limit, all outputs together by :func:`accuracy_verdict` (the
constraint stored with the trial), the user's task metric beside by :func:`with_metric`. :func:`output_drop` and
:func:`accuracy_drop` are the same rule as one number in drop units, within the budget exactly when every output
passes; :func:`worst_output` and :func:`worst` name the output furthest from its limit, with its evidence;
:func:`conversion_fault` tells an engine's broken conversion from its precision's loss; :func:`accuracy_score` is
one 0..1 number for comparing two stored runs (the gate). The records and the limits the budget sets are
:mod:`autodeploy.accuracy.records`'.

Pure functions and frozen dataclasses, stdlib only: importing this module imports no numpy.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from autodeploy.accuracy.kinds import COSINE, EXACT, TOP1, Measure
from autodeploy.accuracy.records import (
    DEFAULT_BIN_TOLERANCE,
    DEFAULT_DECISION_THRESHOLD,
    DEFAULT_MAX_ACCURACY_DROP,
    DEFAULT_MIN_COSINE,
    Accuracy,
    AccuracyVerdict,
    OutputAccuracy,
    sqnr_drop,
    sqnr_for_drop,
    within,
)


def output_measure(o: OutputAccuracy) -> Measure:
    """The measure an output is judged by: its ``kind``'s row (:data:`autodeploy.accuracy.kinds.MEASURES`), or for
    a record stored before kinds, the exact agreement, the top-1 agreement or the cosine, as then."""
    if o.measure is not None:
        return o.measure
    return EXACT if o.exact_agreement is not None else TOP1 if o.top1_agreement is not None else COSINE


def output_metric(o: OutputAccuracy) -> tuple[str, float]:
    """The metric an output is judged by, in words, and its value (NaN where none was measured): those of
    :func:`output_measure`'s row."""
    measure = output_measure(o)
    if o.kind is None:  # stored before kinds, so before near-ties were told apart: the agreement of every flip
        return measure.metric, getattr(o, measure.every or measure.field)
    return measure.metric, measure.value(o)


def output_drop(o: OutputAccuracy, *, max_accuracy_drop: float = DEFAULT_MAX_ACCURACY_DROP,
                min_cosine: float | None = None) -> float:  # fmt: skip
    """The accuracy one output lost, comparable with the budget (``<= max_accuracy_drop``: it passes).

    ``1 - agreement`` or ``1 - F1``; an SQNR through :func:`autodeploy.accuracy.records.sqnr_drop` (its own
    limit ``min_sqnr_db`` where one was set); ``1 - cosine`` (shifted to ``min_cosine`` when given). Non-finite: inf.
    """
    return max(measure_drop(o, max_accuracy_drop=max_accuracy_drop, min_cosine=min_cosine), guard_drop(o))


def measure_drop(o: OutputAccuracy, *, max_accuracy_drop: float = DEFAULT_MAX_ACCURACY_DROP,
                 min_cosine: float | None = None) -> float:  # fmt: skip
    """:func:`output_drop` of the output's measure alone, without the bounds beside it (:func:`guard_drop`)."""
    if not math.isfinite(o.cosine):
        return math.inf
    measure, value = output_measure(o), output_metric(o)[1]
    if math.isnan(value):
        return math.inf
    if measure.db:
        return sqnr_drop(value, o.min_sqnr_db, max_accuracy_drop)
    if measure.cosine_limit and min_cosine is not None:
        return 1.0 - value - (1.0 - min_cosine) + max_accuracy_drop
    return 1.0 - value


def guard_drop(o: OutputAccuracy) -> float:
    """The drop of the bounds beside an output's measure (0 where it has none), in budget units: each item's error
    against its scale (a ``regression``, an embedding known by its shape whose values sit far from zero), mean
    ``<=`` half the budget and largest ``<=`` twice it; the argmax per position where the reference decides (an
    unproven ``sqnr`` that may be a tagger's logits), ``1 - agreement``; the F1 of a map's positives where its values
    look like logits of rare positives, ``1 - F1``. NaN: inf."""
    drops = [0.0]
    if o.error_mean_share is not None and o.error_max_share is not None:
        drops += [2.0 * o.error_mean_share, 0.5 * o.error_max_share]
    if o.kind is not None and output_measure(o).db and not output_measure(o).centred and o.decided_agreement is not None:
        drops.append(1.0 - o.decided_agreement)
    if o.positives_f1 is not None:
        drops.append(1.0 - o.positives_f1)
    return math.inf if any(math.isnan(d) for d in drops) else max(drops)


def _shortfall(o: OutputAccuracy, max_accuracy_drop: float, min_cosine: float) -> float:
    """How far an output is below its limit, in drop units (<= 0: it passes; inf: non-finite)."""
    return output_drop(o, max_accuracy_drop=max_accuracy_drop, min_cosine=min_cosine) - max_accuracy_drop


def _limit(o: OutputAccuracy, max_accuracy_drop: float, min_cosine: float) -> float:
    """The value an output's metric must reach: its own SQNR limit or the budget's, else ``1 - max_accuracy_drop``."""
    measure = output_measure(o)
    if measure.db:
        return o.min_sqnr_db if o.min_sqnr_db is not None else sqnr_for_drop(max_accuracy_drop)
    return min_cosine if measure.cosine_limit else 1 - max_accuracy_drop


def _rule(o: OutputAccuracy, max_accuracy_drop: float, min_cosine: float) -> str:
    measure, limit = output_measure(o), _limit(o, max_accuracy_drop, min_cosine)
    if measure.db:
        text = f"{measure.metric} >= {limit:.3g} {measure.unit}"
    elif measure.probability:
        threshold = o.decision_threshold if o.decision_threshold is not None else DEFAULT_DECISION_THRESHOLD
        text = f"{measure.metric} at {threshold:g} >= {limit:g}"
    elif measure.bins:
        tolerance = o.bin_tolerance if o.bin_tolerance is not None else DEFAULT_BIN_TOLERANCE
        text = f"{measure.metric} within {tolerance:g} bins >= {limit:g}"
    else:
        text = f"{measure.metric} >= {limit:g}"
    return text + _guard_rule(o, max_accuracy_drop)


def _guard_rule(o: OutputAccuracy, max_accuracy_drop: float) -> str:
    """The bounds :func:`guard_drop` adds, in the constraint's words (empty where none)."""
    text = ""
    if o.error_mean_share is not None:
        text += (f" and error <= {max_accuracy_drop / 2:.2%} of its scale on average, "
                 f"{2 * max_accuracy_drop:.2%} at most")  # fmt: skip
    if o.kind is not None and output_measure(o).db and not output_measure(o).centred and o.decided_agreement is not None:
        text += f" and argmax per position agreement where decided >= {1 - max_accuracy_drop:g}"
    if o.positives_f1 is not None:
        text += f" and F1 of its positives (> 0) >= {1 - max_accuracy_drop:g}"
    return text


def accuracy_verdict(
    outputs: Sequence[OutputAccuracy],
    *,
    max_accuracy_drop: float = DEFAULT_MAX_ACCURACY_DROP,
    min_cosine: float = DEFAULT_MIN_COSINE,
) -> AccuracyVerdict:
    """Judge per-output accuracy metrics against the FP32 reference (the rule in :mod:`autodeploy.accuracy.kinds`).

    Args:
        outputs: One entry per output; ``cosine`` is NaN where either array was non-finite.
        max_accuracy_drop: Allowed agreement, F1 and task-accuracy drop, as a fraction; sets the SQNR limit
            (:func:`autodeploy.accuracy.records.sqnr_for_drop`) of outputs without their own.
        min_cosine: Required cosine similarity of the outputs judged by cosine.
    """
    rules = list(dict.fromkeys(_rule(o, max_accuracy_drop, min_cosine) for o in outputs))
    constraint = " and ".join(rules)
    passed = all(within(_shortfall(o, max_accuracy_drop, min_cosine), 0.0) for o in outputs)
    task = task_drops(outputs)
    if task:
        constraint += f" and task accuracy drop <= {max_accuracy_drop:g}"
        passed = passed and within(task[0], max_accuracy_drop)
    return AccuracyVerdict(constraint, bool(passed))


def with_metric(verdict: AccuracyVerdict, name: str, value: float, reference: float,
                max_metric_drop: float | None) -> AccuracyVerdict:  # fmt: skip
    """``verdict`` with the user's task metric (higher is better) judged too: with ``max_metric_drop`` its
    drop from the reference's value must be ``<= max_metric_drop``; without, it is only reported."""
    if max_metric_drop is None:
        return verdict
    constraint = f"{verdict.constraint} and {name} drop <= {max_metric_drop:g}"
    return AccuracyVerdict(constraint, verdict.passed and within(reference - value, max_metric_drop))


#: An engine's fp32 that loses at least this many times the accuracy budget (and at least 10%) is a broken
#: conversion, not a precision's effect: fp32 differs from the reference by rounding alone (60 dB and up),
#: and bf16 rounding stays inside the budget. A TFLite conversion at top-1 0.07 is a conversion fault.
CONVERSION_FACTOR = 10.0


def conversion_fault(precision: str, drop: float | None, max_accuracy_drop: float = DEFAULT_MAX_ACCURACY_DROP) -> bool:
    """Whether a config's accuracy loss is its engine's conversion's fault, not its precision's: it is the
    engine's own fp32 (what every reduced precision of that engine is built from) and it lost at least
    :data:`CONVERSION_FACTOR` times the budget (:func:`accuracy_drop`)."""
    return precision == "fp32" and drop is not None and drop >= max(CONVERSION_FACTOR * max_accuracy_drop, 0.1)


@dataclass(frozen=True)
class WorstOutput:
    """The output furthest below (or nearest to) its limit (:func:`worst_output`), in its metric's own terms.

    ``where`` names it and, when judged per channel group, the group (``output 'output0', axis 1,
    channels 4-21``); ``value`` is NaN where the output was not finite. ``failed``: it breaks its limit.
    """

    output: OutputAccuracy
    where: str
    measure: Measure
    value: float
    limit: float
    failed: bool
    budget: float = DEFAULT_MAX_ACCURACY_DROP
    #: It failed by a bound beside its measure (:func:`guard_drop`), its measure's own value within its limit.
    by_guard: bool = False

    @property
    def metric(self) -> str:
        """Its measure's words (``SQNR``, ``top-1 agreement``)."""
        return self.measure.metric

    @property
    def unit(self) -> str:
        return self.measure.unit

    def evidence(self) -> str:
        """What a failure line adds after the value: the error in the output's own units (an SQNR kind), the bound
        beside the measure that failed (:func:`guard_drop`), and where the kind was not proven, what it was taken
        from and how to declare another. Never a weaker judge that would pass it: a regression whose argmax agrees
        is not told to try top-1 (a box regressor 2.35 px off on a 48 px crop would ship). The one other reading
        offered is one no graph can prove and its users decode by: a Sigmoid map of many bins may be ordered (a
        pitch salience), and then its decoded value is what matters; the line gives that value beside."""
        o, parts = self.output, []
        if self.measure.db and o.error_max_abs is not None:
            parts.append(f"max abs error {o.error_max_abs:.4g}, p99 {o.error_p99_abs:.4g}, in the output's units")
        if self.measure.db and o.moved_channels is not None and o.moved_max_abs is not None:  # another group moved more
            parts.append(f"moved most: {o.moved_channels}, max abs error {o.moved_max_abs:.4g} in the output's units")
        if o.error_mean_share is not None and o.error_max_share is not None:
            parts.append(f"error {o.error_mean_share:.2%} of its scale on average, {o.error_max_share:.2%} at most "
                         f"(limits {self.budget / 2:.2%}, {2 * self.budget:.2%})")  # fmt: skip
        if self.measure.db and not self.measure.centred and o.decided_agreement is not None:
            parts.append(f"its argmax over the last axis is unchanged at {o.decided_agreement:.2%} of positions where "
                         f"the reference decided; if these are classes per position, --accuracy {o.name}=sequence "
                         "judges each item's whole sequence")  # fmt: skip
        if o.positives_f1 is not None:
            parts.append(f"F1 of its positives (> 0: a sigmoid's 0.5) {o.positives_f1:.4f}, read as logits of rare "
                         "positives by its values")  # fmt: skip
        if self.failed and self.measure.probability and o.bins_agreement is not None:
            parts.append(f"if its last axis holds ordered bins (a pitch, an angle), their decoded value agrees at "
                         f"{o.bins_agreement:.2%} of confident positions within {o.bin_tolerance:g} bins: declare "
                         f"--accuracy {o.name}=bins[:TOLERANCE] to judge that instead")  # fmt: skip
        if self.failed and o.proven is False:
            parts.append(f"kind {self.measure.name} taken from {o.basis}: declare another with "
                         f"--accuracy {o.name}=KIND (docs/accuracy.md)")  # fmt: skip
        return "; ".join(parts)


def worst_output(
    outputs: Sequence[OutputAccuracy],
    *,
    max_accuracy_drop: float = DEFAULT_MAX_ACCURACY_DROP,
    min_cosine: float = DEFAULT_MIN_COSINE,
) -> WorstOutput | None:
    """The output furthest below (or nearest to) its limit; ``None`` without outputs."""
    if not outputs:
        return None
    o = max(outputs, key=lambda x: _shortfall(x, max_accuracy_drop, min_cosine))
    measure = output_measure(o)
    value = output_metric(o)[1] if math.isfinite(o.cosine) else math.nan
    where = f"output {o.name!r}" + (f", {o.channels}" if o.channels else "")
    failed = not within(_shortfall(o, max_accuracy_drop, min_cosine), 0.0)
    own = within(measure_drop(o, max_accuracy_drop=max_accuracy_drop, min_cosine=min_cosine), max_accuracy_drop)
    return WorstOutput(o, where, measure, value, _limit(o, max_accuracy_drop, min_cosine), failed, max_accuracy_drop,
                       failed and own)  # fmt: skip


def worst(
    outputs: Sequence[OutputAccuracy],
    *,
    max_accuracy_drop: float = DEFAULT_MAX_ACCURACY_DROP,
    min_cosine: float = DEFAULT_MIN_COSINE,
) -> str:
    """The output furthest below (or nearest to) its limit, with its channels where it was judged per
    channel group: ``output 'y': cosine 0.95``, ``output 'output0', channels 4-21: SQNR 0.0 dB, limit 17 dB``."""
    w = worst_output(outputs, max_accuracy_drop=max_accuracy_drop, min_cosine=min_cosine)
    if w is None:
        return "no outputs"
    if math.isnan(w.value):
        return f"output {w.output.name!r}: NaN or inf"
    evidence = w.evidence()
    tail = (f" ({evidence})" if evidence else "") + _also_failing(outputs, w.output, max_accuracy_drop, min_cosine)
    if w.measure.db:
        return f"{w.where}: {w.metric} {w.value:.1f} dB, limit {w.limit:.3g} dB" + tail
    value = fraction(w.value)
    if w.measure.tokens and w.output.token_agreement is not None:
        return f"{w.where}: {w.metric} {value} (token agreement {fraction(w.output.token_agreement)})" + tail
    every = w.measure.every_flip(w.output)
    if w.measure.per_class and w.output.worst_class is not None:
        return (f"{w.where}: {w.metric} {value} (class {w.output.worst_class}; cells unchanged "
                f"{fraction(every)})" + tail)  # fmt: skip
    if every is not None and every != w.value:  # both numbers under the names the JSON record gives them
        return (f"{w.where}: {w.metric} {value} where the reference decided ({w.measure.field}; every flip: "
                f"{fraction(every)}, {w.measure.every})" + tail)  # fmt: skip
    return f"{w.where}: {w.metric} {value}" + tail


#: The other failing outputs a worst line names, most failed first (then how many more).
ALSO_SHOWN = 2


def _also_failing(outputs: Sequence[OutputAccuracy], shown: OutputAccuracy, max_accuracy_drop: float,
                  min_cosine: float) -> str:  # fmt: skip
    """``; also failing: output 'mask': cell agreement 0.4, limit 0.99``: every other output that breaks its limit,
    by how far (:func:`_shortfall`), so a mask whose IoU fell to 0.40 is not hidden behind a world-coordinate output
    that ranks worse in its own terms. Empty where the worst is the one failure."""
    failing = sorted((o for o in outputs if o is not shown and not within(_shortfall(o, max_accuracy_drop, min_cosine), 0.0)),
                     key=lambda o: -_shortfall(o, max_accuracy_drop, min_cosine))  # fmt: skip
    if not failing:
        return ""
    parts = [_brief(o, max_accuracy_drop, min_cosine) for o in failing[:ALSO_SHOWN]]
    more = len(failing) - ALSO_SHOWN
    return "; also failing: " + "; ".join(parts) + (f"; and {more} more output{'s' * (more > 1)}" if more > 0 else "")


def _brief(o: OutputAccuracy, max_accuracy_drop: float, min_cosine: float) -> str:
    """A failing output in a few words: what broke its limit, its measure or the bound beside it (:func:`guard_drop`)."""
    measure, value, limit = output_measure(o), output_metric(o)[1], _limit(o, max_accuracy_drop, min_cosine)
    where = f"output {o.name!r}" + (f", {o.channels}" if o.channels else "")
    if math.isnan(value) or not math.isfinite(o.cosine):
        return f"{where}: NaN or inf"
    if within(measure_drop(o, max_accuracy_drop=max_accuracy_drop, min_cosine=min_cosine), max_accuracy_drop):
        if o.error_mean_share is not None and o.error_max_share is not None:  # failed by a bound beside its measure
            return f"{where}: error {o.error_mean_share:.2%} of its scale on average, {o.error_max_share:.2%} at most"
        if o.positives_f1 is not None:
            return f"{where}: F1 of its positives {fraction(o.positives_f1)}"
        if o.decided_agreement is not None:
            return f"{where}: argmax agreement where the reference decided {fraction(o.decided_agreement)}"
    if measure.db:
        return f"{where}: {measure.metric} {value:.1f} dB, limit {limit:.3g} dB"
    return f"{where}: {measure.metric} {fraction(value)}, limit {limit:g}"


def fraction(value: float | None) -> str:
    """A fraction (an agreement, an F1, a cosine) in 4 significant digits, but never rounded up to 1 when it is
    below: 0.999998 reads ``0.999998``, not ``1`` (which would say nothing changed)."""
    if value is None or not math.isfinite(value):
        return str(value)
    text = f"{value:.4g}"
    digits = 4
    while value < 1 and float(text) >= 1 and digits < 15:
        digits += 1
        text = f"{value:.{digits}f}".rstrip("0")
    return text


def accuracy_drop(accuracy: Accuracy) -> float:
    """The accuracy lost, as one number in the rule's own terms (0 = identical, 1 = total loss).

    The worst output's :func:`output_drop` (``1 - agreement``, ``1 - F1``, ``10^(-SQNR/10) / 2``,
    ``1 - cosine``) and the task accuracy lost, with labels. Non-finite outputs are a total loss.
    """
    outputs = accuracy.outputs
    if not all(math.isfinite(o.cosine) for o in outputs):
        return 1.0
    drops = [min(output_drop(o), 1.0) if output_measure(o).db else output_drop(o) for o in outputs]
    return max([*drops, *task_drops(outputs)], default=0.0)


def task_drops(outputs: Sequence[OutputAccuracy]) -> list[float]:
    """Each output's task accuracy lost against the reference's, where labels scored it (empty without labels)."""
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

