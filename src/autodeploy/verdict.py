"""What "accurate enough" and "better" mean: the one place these rules live (docs/architecture.md).

Everything that judges a measurement calls this module: the harness's accuracy check
(:func:`accuracy_verdict`), the study's objective and constraints (:func:`accuracy_drop`,
:func:`violations`, :func:`feasible`, :func:`pareto_front`), the bundle manifest
(:func:`constraint_verdicts`), the study summary's rejected configs (:func:`rejections`), the
dashboard's Pareto page (:func:`reasons`, :func:`pareto_front`), the gate (:func:`accuracy_score`, :func:`within`) and the in-house
quantizer's budget (:data:`DEFAULT_MAX_ACCURACY_DROP`).
The records it judges live here too, below everything that makes or reads them: one
:class:`OutputAccuracy` per output and their :class:`Accuracy`, made by :func:`autodeploy.accuracy.measure.compare`.

The rules:

* **Accuracy**, judged per output by what the output *means* (its kind, :func:`output_kind`, found
  from the producing ONNX node, the shape and the reference's values, and overridable per output
  with :func:`parse_override`). Never one number over a whole tensor (docs/architecture.md, "Accuracy verdicts"):

  - ``exact``: integer and boolean outputs (ids), exact agreement ``>= 1 - max_accuracy_drop``.
  - Classes only where proven (:func:`class_axis`): a Softmax or LogSoftmax makes the output, the graph reads its
    argmax (``OutputFacts.reader``), its reference rows are distributions, or the model declares the measure
    (:data:`DECLARED_KEY`). A flip counts only where the reference decided (its own class led the new one by
    ``accuracy.measure.SEQUENCE_TIE``, 0.2 probability), while it decides at least half its items; every flip is
    reported beside. ``top1``: one class vector per item; ``cells``: a map (``[N, H, W, C]``, ``[N, C, H, W]`` by
    ``Softmax(axis=1)``), the share of cells whose class is unchanged; both ``>= 1 - max_accuracy_drop``.
  - ``sequence``: classes over the last axis of ``[N, T, V]`` (or ``[N, T, 1, V]``), proven as above: the share of
    items whose whole argmax sequence is unchanged
    ``>= 1 - max_accuracy_drop``, so below 100 items one changed token in one item fails; a token where
    the reference itself nearly tied (its own token's probability leads the candidate's by less
    than ``accuracy.measure.SEQUENCE_TIE``, 0.2) is no change. The per-position token agreement
    (every flip) is reported beside it. Also time-major logits, raw or not: an output the engine returned
    ``[T, B, V]`` (``T, V > 1``), the call's items on axis 1 where the model declares its batch on axis 0,
    split per item into ``[N, T, V]`` (``OutputFacts.time_major``, found by the worker from the call's item
    count): CTC heads emit that layout (ddddocr's CRNN returns ``[T, 1, 8210]`` Gemm logits, declared
    ``[1, seqlen]``, and decodes the argmax per step), the tie read on their softmax. Not a recurrent
    cell's state (``[layers, B, H]``, produced by ``LSTM``/``GRU``/``RNN``), whose last axis is no vocabulary.
    Batch-major raw ``[N, T, V]`` stays ``sqnr``: no fact the comparison has tells logits over a vocabulary
    from hidden states ``[N, T, D]`` (a MatMul makes both, and D runs 256 to 4096 as V does); such
    logits take ``--accuracy NAME=sequence``.
  - ``logit``: score logits a Sigmoid reads in the graph (or by override): the F1 of the decisions after a
    sigmoid at a probability threshold.
  - ``regression``: any other float vector per item (``[N, K]``, ``[N, 1, K]``: coordinates, offsets, raw scores
    from a linear head): the error SNR per range group about the group's mean (``accuracy.measure.range_groups``),
    ``>= min SQNR``; its failure line gives max and p99 abs error in the output's units.
  - ``decision``: probabilities (produced by a Sigmoid; or, made by no linear op and not a vector per item, a
    reference wholly inside [0, 1]),
    thresholded at :data:`DEFAULT_DECISION_THRESHOLD`: the F1 of the candidate's positives against
    the reference's ``>= 1 - max_accuracy_drop`` (no positives on either side: 1.0), so rare events count.
  - ``embedding``: one vector per item, ``[N, 1, ..., 1, D]`` of rank 4 and up (a 1x1 feature map, as a
    TF conv head exports it: openwakeword's ``[N, 1, 1, 96]``); at any rank, ``[N, D]`` too, a vector made
    by ``LpNormalization`` or whose reference rows all have length 1 with signed values (sentence and face
    embeddings end in ``F.normalize``, exported as ``Div`` by a ``ReduceL2``; class scores are not unit
    length, probabilities are not signed); or any float output by override (an unnormalized sentence
    embedding ``[N, D]``, otherwise a regression): the cosine of each item's vector
    with the reference's, the worst row ``>= 1 - max_accuracy_drop``; a vector's direction is what a
    nearest-neighbour search or a classifier on top reads, and one averaged number would hide one item's.
  - ``sqnr``: every other float output, per channel group: the channel axis and the groups of
    adjacent channels of similar range are found by :mod:`autodeploy.accuracy.measure`; each
    group's SQNR ``10 log10(sum ref^2 / sum (out - ref)^2)`` (the reference's mean kept, as cosine
    keeps it) must be ``>= min SQNR``, the worst group deciding and named. The default limit is
    :func:`sqnr_for_drop` of the budget: the SQNR at which a group's cosine would be
    ``1 - max_accuracy_drop`` (``1 - cos ~= 10^(-SQNR/10) / 2``): 17.0 dB at the 1% budget. The old rule
    asked that cosine of the whole flattened tensor; it now holds for every group.
  - ``cosine``: only by override (or records stored before kinds): cosine ``>= min_cosine``.

  Every output must pass, and with labels the task accuracy may drop by at most ``max_accuracy_drop``.
  Non-finite outputs (NaN cosine) always fail. :func:`worst` names the output (and channels)
  furthest from its limit. :func:`accuracy_drop` is the same rule as one number, each output's
  :func:`output_drop` (``1 - agreement``, ``1 - F1``, ``10^(-SQNR/10) / 2``), so it is within the
  budget exactly when every output passes.
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

Pure functions and frozen dataclasses, stdlib only (and the objectives' table,
:mod:`autodeploy.objectives`): importing this module imports no engine, Optuna, SQLAlchemy or pandas.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from autodeploy.objectives import OBJECTIVES

#: The default accuracy budget (docs/architecture.md, "Accuracy verdicts"): each output may lose at most 1% of its measure.
DEFAULT_MAX_ACCURACY_DROP = 0.01
#: The default where top-1 does not apply: cosine similarity >= 0.99 (the same 1% budget).
DEFAULT_MIN_COSINE = 1.0 - DEFAULT_MAX_ACCURACY_DROP
#: Probabilities become decisions above this (``decision`` outputs; overridable per output).
DEFAULT_DECISION_THRESHOLD = 0.5
#: What an output can be judged by (:func:`output_kind`, ``--accuracy OUTPUT=MEASURE[:THRESHOLD]``).
MEASURES = ("exact", "top1", "sequence", "cells", "decision", "logit", "embedding", "regression", "sqnr", "cosine")
#: The ONNX ``metadata_props`` key in which a model declares how its outputs are judged, in ``--accuracy``'s
#: words (``logits=top1``; entries separated by commas): ``accuracy.measure.declared`` reads it.
DECLARED_KEY = "autodeploy.accuracy"
#: Ops whose output is a distribution over one axis: its argmax is what is read (top-1, tokens, cells).
DISTRIBUTIONS = ("Softmax", "LogSoftmax")
#: Ops of a linear head: an output they make, with no normalising op after them, is a quantity (a
#: regression, raw scores), whatever range its values happen to fall in.
LINEAR = ("Gemm", "MatMul", "Add", "Sub", "Mul", "Conv", "ConvTranspose", "Einsum", "BatchNormalization",
          "MatMulInteger", "QLinearMatMul", "QLinearConv")  # fmt: skip
#: Ops whose time-major output is a state (``[layers, B, hidden]``), not logits over a vocabulary.
RECURRENT = ("LSTM", "GRU", "RNN")
#: The measures whose THRESHOLD an override may set: the decision's probability cut, the SQNR
#: limit in dB, the cosine limit. Agreements take the study's budget.
THRESHOLDED = ("decision", "logit", "sqnr", "regression", "cosine")
#: The SQNR-like measures (in dB): per channel group, about zero (``sqnr``) or about the reference's mean (``regression``).
DB_METRICS = ("SQNR", "error SNR")
#: Slack for comparing fractions such as 99/100 with limits such as 1 - 0.01 (float rounding).
TOLERANCE = 1e-9
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


# -- accuracy ------------------------------------------------------------------------------


# The records judged here: one OutputAccuracy per output, their Accuracy. Made by
# accuracy.measure.compare, carried by the harness's Measurement, read by the in-house quantizer's
# judge, the store, the study and the dashboard. Frozen dataclasses that round-trip through JSON.


@dataclass(frozen=True)
class OutputAccuracy:
    """One output compared with the ONNX Runtime FP32 reference on the evaluation inputs."""

    name: str
    max_abs: float
    mean_rel: float
    cosine: float
    top1_agreement: float | None = None  # for classifier-shaped outputs [N, classes]
    task_accuracy: float | None = None  # when the user gave labels
    reference_task_accuracy: float | None = None
    exact_agreement: float | None = None  # for integer outputs (ids): the fraction of equal elements
    #: How it was judged (:data:`MEASURES`); ``None`` in records stored before kinds.
    kind: str | None = None
    #: ``sqnr``: the worst channel group's SQNR in dB, which group (``"axis 1, channels 4-21"``), and
    #: the output's own SQNR limit where the user set one (else the budget's, :func:`sqnr_for_drop`).
    sqnr_db: float | None = None
    channels: str | None = None
    min_sqnr_db: float | None = None
    #: ``decision``: the F1 of the thresholded positives against the reference's, at this threshold.
    f1: float | None = None
    decision_threshold: float | None = None
    #: ``sequence``: per-position argmax agreement, and the share of items with the whole sequence unchanged.
    token_agreement: float | None = None
    sequence_agreement: float | None = None
    #: ``embedding``: the lowest cosine of one item's vector with the reference's (every row of ``[..., D]``).
    row_cosine: float | None = None
    #: ``top1``/``cells``: the share of items (cells) whose class is unchanged where the reference decided it:
    #: a flip where the reference's own class led the new one by under ``accuracy.measure.SEQUENCE_TIE`` (0.2
    #: probability) is no change, as for tokens. What they are judged by; the plain agreements report every flip.
    decided_agreement: float | None = None
    #: ``cells``: the share of a map's cells (positions) whose class (argmax over the class axis) is unchanged;
    #: on an ``sqnr`` map whose last axis is a few channels, the same over that axis (a failure line's evidence).
    cell_agreement: float | None = None
    #: ``sqnr``/``regression``: the judged (worst) group's largest and 99th-percentile absolute error, in
    #: the output's own units (pixels, metres), and the F1 of the whole output's decisions after a sigmoid
    #: (``value > 0`` against ``reference > 0``) where the reference has both signs: a failure line's evidence.
    error_max_abs: float | None = None
    error_p99_abs: float | None = None
    logit_f1: float | None = None


@dataclass(frozen=True)
class Accuracy:
    """Every output's :class:`OutputAccuracy` and whether the accuracy constraint held."""

    outputs: tuple[OutputAccuracy, ...]
    n_samples: int
    #: The constraint checked, per output by its kind (:func:`accuracy_verdict`), e.g.
    #: ``top-1 agreement >= 0.99 and SQNR >= 17 dB``.
    constraint: str
    passed: bool
    #: The user's task metric (``--metric module:function``), on these outputs and on the reference's.
    metric: str | None = None
    metric_value: float | None = None
    reference_metric_value: float | None = None

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Accuracy:
        return cls(
            outputs=tuple(OutputAccuracy(**o) for o in d["outputs"]),
            n_samples=d["n_samples"],
            constraint=d["constraint"],
            passed=d["passed"],
            metric=d.get("metric"),
            metric_value=d.get("metric_value"),
            reference_metric_value=d.get("reference_metric_value"),
        )


@dataclass(frozen=True)
class AccuracyVerdict:
    """The accuracy constraint checked (human text, stored with the trial) and whether it held."""

    constraint: str
    passed: bool


def cosine_for_drop(max_accuracy_drop: float) -> float:
    """The cosine a drop budget asks of outputs where top-1 does not apply (their drop is ``1 - cosine``)."""
    return 1.0 - max_accuracy_drop


def within(value: float, limit: float) -> bool:
    """``value <= limit`` up to :data:`TOLERANCE`; NaN is never within."""
    return value <= limit + TOLERANCE


def sqnr_for_drop(max_accuracy_drop: float) -> float:
    """The SQNR (dB) a budget asks of every channel group: where its cosine would be ``1 - max_accuracy_drop``
    (``1 - cos ~= noise / (2 signal)`` for small noise): 17.0 dB at 1%."""
    return math.inf if max_accuracy_drop <= 0 else 10.0 * math.log10(1.0 / (2.0 * max_accuracy_drop))


def sqnr_drop(sqnr_db: float, min_db: float | None = None,
              max_accuracy_drop: float = DEFAULT_MAX_ACCURACY_DROP) -> float:  # fmt: skip
    """An SQNR as a drop, ``10^(-SQNR/10) / 2`` (the ``1 - cosine`` it implies), shifted so that a
    per-output limit ``min_db`` maps to ``max_accuracy_drop``: within the budget exactly when ``SQNR >= limit``."""
    if math.isnan(sqnr_db):
        return math.inf
    if min_db is None:
        return 0.5 * 10.0 ** (-sqnr_db / 10.0) if sqnr_db > -300 else math.inf
    return max_accuracy_drop * 10.0 ** ((min_db - sqnr_db) / 10.0) if sqnr_db - min_db > -300 else math.inf


@dataclass(frozen=True)
class OutputFacts:
    """What the comparison found out about one reference output, for :func:`output_kind` to judge.

    ``producer`` is the ONNX op that makes the output (``"Softmax"`` only when over the last axis,
    else e.g. ``"Softmax(axis=1)"``), ``None`` when unknown. ``reader``: what the graph itself does
    with the output's values beside returning them (``"ArgMax"``, ``"ArgMax(axis=1)"`` for an ArgMax,
    Softmax or TopK reading its classes; ``"Sigmoid"``), ``None`` when nothing. ``unit_range``: every
    reference value lies in [0, 1]. ``rows_sum_to_one``: non-negative and every last-axis row sums to 1.
    ``time_major``: the engine returned it ``[T, B, ...]``, the call's items on axis 1 where the model
    declares axis 0; ``shape`` is then already item-leading, ``[N, T, ...]``. ``unit_rows``: one
    vector per item (``[N, 1, ..., D]``), every one of length 1 (L2), some value negative: L2-normalized.
    """

    dtype_kind: str  # numpy's dtype.kind: "f", "i", "u", "b", ...
    shape: tuple[int, ...]
    producer: str | None = None
    unit_range: bool = False
    rows_sum_to_one: bool = False
    time_major: bool = False
    unit_rows: bool = False
    reader: str | None = None


def _op_axis(op: str | None, names: Sequence[str]) -> int | None:
    """The axis of ``"Softmax"`` (-1) or ``"Softmax(axis=1)"`` (1) when ``op`` is one of ``names``, else ``None``."""
    if op is None:
        return None
    name, _, rest = op.partition("(axis=")
    if name not in names:
        return None
    return int(rest.rstrip(")")) if rest else -1


def class_axis(facts: OutputFacts) -> int | None:
    """The axis the graph proves classes on (non-negative): a Softmax or LogSoftmax makes a distribution
    over it, or the graph reads its argmax; the last axis where the reference's rows sum to 1. ``None``: none proven."""
    rank = len(facts.shape)
    axis = _op_axis(facts.producer, DISTRIBUTIONS)
    if axis is None:
        axis = _op_axis(facts.reader, ("ArgMax",))
    if axis is None and facts.rows_sum_to_one:
        axis = -1
    if axis is None or rank < 2:
        return None
    axis = axis % rank
    return axis if axis > 0 and facts.shape[axis] > 1 else None


def output_kind(facts: OutputFacts) -> str:
    """The measure an output is judged by (one of :data:`MEASURES`; the rule in the module docstring)."""
    shape = facts.shape
    if facts.dtype_kind in "iub":
        return "exact"
    one_vector = len(shape) >= 2 and shape[-1] > 1 and all(d == 1 for d in shape[1:-1])
    if one_vector and (facts.producer == "LpNormalization" or facts.unit_rows):
        return "embedding"  # normalized: a direction is all it carries
    axis = class_axis(facts)
    if axis is not None:  # classes, proven by the graph or by rows that are distributions
        places = [d for i, d in enumerate(shape[1:], 1) if i != axis and d > 1]
        if not places:
            return "top1"  # one class vector per item
        if len(places) == 1 and axis == len(shape) - 1:
            return "sequence"  # [N, T, V] (or [N, T, 1, V]): tokens, the whole string is what is read
        return "cells"  # a map [N, H, W, C] or [N, C, H, W]: each cell by its own class
    ctc = facts.time_major and len(shape) == 3 and facts.producer not in RECURRENT
    positions = math.prod(shape[1:-1]) if len(shape) >= 3 else 0
    if ctc and positions > 1 and shape[-1] > 1:
        return "sequence"  # CTC logits [T, B, V], as the model returned them: decoded by argmax per step
    if facts.reader == "Sigmoid":
        return "logit"  # the graph itself turns them into probabilities
    linear = facts.producer in LINEAR
    vector = (len(shape) == 2 and shape[1] > 1) or (len(shape) == 3 and one_vector)
    if facts.producer == "Sigmoid" or (facts.unit_range and not linear and not vector):
        return "decision"
    if one_vector and len(shape) >= 4:
        return "embedding"  # a 1x1 feature map: one vector per item
    if vector:
        return "regression"  # a vector per item from a linear head: coordinates, offsets, raw scores
    return "sqnr"


@dataclass(frozen=True)
class Override:
    """A user's choice of measure for one output (``--accuracy OUTPUT=MEASURE[:THRESHOLD]``)."""

    measure: str
    threshold: float | None = None


def parse_override(text: str) -> tuple[str, Override]:
    """``"OUTPUT=MEASURE[:THRESHOLD]"`` -> ``(OUTPUT, Override)``.

    Raises:
        ValueError: not of that form, an unknown measure, or a threshold on a measure without one.
    """
    name, sep, rule = text.rpartition("=")
    measure, _, threshold = rule.partition(":")
    if not sep or not name or measure not in MEASURES:
        raise ValueError(f"--accuracy {text!r}: expected OUTPUT=MEASURE[:THRESHOLD] with MEASURE one of "
                         f"{', '.join(MEASURES)} (e.g. scores=decision:0.3, output0=sqnr:20)")  # fmt: skip
    if threshold and measure not in THRESHOLDED:
        raise ValueError(f"--accuracy {text!r}: {measure} takes no threshold (the budget sets it); "
                         f"thresholds apply to {', '.join(THRESHOLDED)}")  # fmt: skip
    try:
        value = float(threshold) if threshold else None
    except ValueError:
        raise ValueError(f"--accuracy {text!r}: threshold {threshold!r} is not a number") from None
    if value is not None and not math.isfinite(value):
        raise ValueError(f"--accuracy {text!r}: threshold {threshold!r} is not a finite number")
    if value is not None and measure in ("decision", "logit") and not 0 < value < 1:
        raise ValueError(f"--accuracy {text!r}: a {measure} threshold is a probability, between 0 and 1 (e.g. 0.5)")
    if value is not None and measure == "cosine" and not -1 <= value <= 1:
        raise ValueError(f"--accuracy {text!r}: a cosine limit lies between -1 and 1 (e.g. 0.99)")
    return name, Override(measure, value)


_METRICS = {"exact": ("exact agreement", "exact_agreement"), "top1": ("top-1 agreement", "decided_agreement"),
            "sequence": ("sequence agreement", "sequence_agreement"), "cells": ("cell agreement", "decided_agreement"),
            "decision": ("F1", "f1"), "logit": ("F1 after a sigmoid", "f1"),
            "embedding": ("worst row cosine", "row_cosine"), "regression": ("error SNR", "sqnr_db"),
            "sqnr": ("SQNR", "sqnr_db"), "cosine": ("cosine", "cosine")}  # fmt: skip


def output_metric(o: OutputAccuracy) -> tuple[str, float]:
    """The metric an output is judged by, and its value: by its ``kind`` (:data:`MEASURES`), or for a
    record stored before kinds, ``exact agreement`` / ``top-1 agreement`` / ``cosine`` as then."""
    if o.kind is not None:
        label, attr = _METRICS[o.kind]
        value = getattr(o, attr)
        if value is None and attr == "decided_agreement":  # stored before near-ties were told apart: every flip
            value = o.top1_agreement if o.kind == "top1" else o.cell_agreement
        return label, math.nan if value is None else value
    if o.exact_agreement is not None:
        return "exact agreement", o.exact_agreement
    if o.top1_agreement is not None:
        return "top-1 agreement", o.top1_agreement
    return "cosine", o.cosine


def output_drop(o: OutputAccuracy, *, max_accuracy_drop: float = DEFAULT_MAX_ACCURACY_DROP,
                min_cosine: float | None = None) -> float:  # fmt: skip
    """The accuracy one output lost, comparable with the budget (``<= max_accuracy_drop``: it passes).

    ``1 - agreement`` or ``1 - F1``; an SQNR through :func:`sqnr_drop` (its own limit ``min_sqnr_db``
    where one was set); ``1 - cosine`` (shifted to ``min_cosine`` when given). Non-finite: inf.
    """
    if not math.isfinite(o.cosine):
        return math.inf
    metric, value = output_metric(o)
    if math.isnan(value):
        return math.inf
    if metric in DB_METRICS:
        return sqnr_drop(value, o.min_sqnr_db, max_accuracy_drop)
    if metric == "cosine" and min_cosine is not None:
        return 1.0 - value - (1.0 - min_cosine) + max_accuracy_drop
    return 1.0 - value


def _shortfall(o: OutputAccuracy, max_accuracy_drop: float, min_cosine: float) -> float:
    """How far an output is below its limit, in drop units (<= 0: it passes; inf: non-finite)."""
    return output_drop(o, max_accuracy_drop=max_accuracy_drop, min_cosine=min_cosine) - max_accuracy_drop


def _limit(o: OutputAccuracy, max_accuracy_drop: float, min_cosine: float) -> float:
    """The value an output's metric must reach: its own SQNR limit or the budget's, else ``1 - max_accuracy_drop``."""
    metric = output_metric(o)[0]
    if metric in DB_METRICS:
        return o.min_sqnr_db if o.min_sqnr_db is not None else sqnr_for_drop(max_accuracy_drop)
    return min_cosine if metric == "cosine" else 1 - max_accuracy_drop


def _rule(o: OutputAccuracy, max_accuracy_drop: float, min_cosine: float) -> str:
    metric, limit = output_metric(o)[0], _limit(o, max_accuracy_drop, min_cosine)
    if metric in DB_METRICS:
        return f"{metric} >= {limit:.3g} dB"
    if metric.startswith("F1"):
        threshold = o.decision_threshold if o.decision_threshold is not None else DEFAULT_DECISION_THRESHOLD
        return f"{metric} at {threshold:g} >= {limit:g}"
    return f"{metric} >= {limit:g}"


def accuracy_verdict(
    outputs: Sequence[OutputAccuracy],
    *,
    max_accuracy_drop: float = DEFAULT_MAX_ACCURACY_DROP,
    min_cosine: float = DEFAULT_MIN_COSINE,
) -> AccuracyVerdict:
    """Judge per-output accuracy metrics against the FP32 reference (the rule in the module docstring).

    Args:
        outputs: One entry per output; ``cosine`` is NaN where either array was non-finite.
        max_accuracy_drop: Allowed agreement, F1 and task-accuracy drop, as a fraction; sets the SQNR limit
            (:func:`sqnr_for_drop`) of outputs without their own.
        min_cosine: Required cosine similarity of the outputs judged by cosine.
    """
    rules = list(dict.fromkeys(_rule(o, max_accuracy_drop, min_cosine) for o in outputs))
    constraint = " and ".join(rules)
    passed = all(within(_shortfall(o, max_accuracy_drop, min_cosine), 0.0) for o in outputs)
    task = _task_drops(outputs)
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
    metric: str
    value: float
    limit: float
    failed: bool
    budget: float = DEFAULT_MAX_ACCURACY_DROP

    @property
    def unit(self) -> str:
        return "dB" if self.metric in DB_METRICS else ""

    def evidence(self) -> str:
        """What a failure line adds after the value: the error in the output's own units (an SQNR
        kind), and the measure that would read the output as it is read, where only that agrees."""
        o, parts = self.output, []
        if self.metric in DB_METRICS and o.error_max_abs is not None:
            parts.append(f"max abs error {o.error_max_abs:.4g}, p99 {o.error_p99_abs:.4g}, in the output's units")
        if not self.failed or self.metric not in DB_METRICS:
            return "; ".join(parts)
        if o.kind == "regression" and o.top1_agreement is not None and within(1 - o.top1_agreement, self.budget):
            parts.append(f"its argmax agrees on {o.top1_agreement:.0%} of items: if these are class logits, "
                         f"judge them with --accuracy {o.name}=top1")  # fmt: skip
        elif o.cell_agreement is not None and within(1 - o.cell_agreement, self.budget):
            parts.append(f"its argmax over the last axis agrees on {o.cell_agreement:.2%} of cells: if these are "
                         f"class logits per cell, judge them with --accuracy {o.name}=cells")  # fmt: skip
        elif o.logit_f1 is not None and within(1 - o.logit_f1, self.budget):
            parts.append(f"decisions after a sigmoid agree (F1 {o.logit_f1:.3f}): if these are score logits, "
                         f"judge them with --accuracy {o.name}=logit")  # fmt: skip
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
    metric, value = output_metric(o)
    if not math.isfinite(o.cosine):
        value = math.nan
    where = f"output {o.name!r}" + (f", {o.channels}" if o.channels else "")
    failed = not within(_shortfall(o, max_accuracy_drop, min_cosine), 0.0)
    return WorstOutput(o, where, metric, value, _limit(o, max_accuracy_drop, min_cosine), failed, max_accuracy_drop)


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
    if w.metric in DB_METRICS:
        evidence = w.evidence()
        return f"{w.where}: {w.metric} {w.value:.1f} dB, limit {w.limit:.3g} dB" + (f" ({evidence})" if evidence else "")
    if w.metric == "sequence agreement" and w.output.token_agreement is not None:
        return f"{w.where}: sequence agreement {w.value:.4g} (token agreement {w.output.token_agreement:.4g})"
    every = w.output.top1_agreement if w.metric == "top-1 agreement" else w.output.cell_agreement
    if w.metric in ("top-1 agreement", "cell agreement") and every is not None and every != w.value:
        return f"{w.where}: {w.metric} {w.value:.4g} where the reference decided (every flip: {every:.4g})"
    return f"{w.where}: {w.metric} {w.value:.4g}"


def accuracy_drop(accuracy: Accuracy) -> float:
    """The accuracy lost, as one number in the rule's own terms (0 = identical, 1 = total loss).

    The worst output's :func:`output_drop` (``1 - agreement``, ``1 - F1``, ``10^(-SQNR/10) / 2``,
    ``1 - cosine``) and the task accuracy lost, with labels. Non-finite outputs are a total loss.
    """
    outputs = accuracy.outputs
    if not all(math.isfinite(o.cosine) for o in outputs):
        return 1.0
    drops = [min(output_drop(o), 1.0) if output_metric(o)[0] in DB_METRICS else output_drop(o) for o in outputs]
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


def sla_bounds_latency(objective: str | None) -> bool:
    """Whether the SLA bounds each trial's latency: for every objective but those whose value is the
    highest rate under the SLA (``server``: :attr:`autodeploy.objectives.Objective.sla_bounds_latency`)."""
    known = OBJECTIVES.get(objective or "")
    return known is None or known.sla_bounds_latency


def meets_sla(p99_ms: float, sla_ms: float) -> bool:
    """Whether a rate whose queries' p99 is ``p99_ms`` meets the SLA (the server search's test)."""
    return p99_ms <= sla_ms


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


def constraint_verdicts(m: Measured, limits: Limits, objective: str) -> dict[str, dict[str, Any]]:
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


def rejections(m: Measured, limits: Limits, objective: str,
               accuracy: Accuracy | None = None) -> list[Rejection]:  # fmt: skip
    """Why a trial is rejected, one :class:`Rejection` per broken constraint of :func:`violations`
    (empty when it meets them all). With ``accuracy`` the accuracy reason names the worst output
    and channel group (:func:`worst_output`) with its value and limit."""
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
            value = f"{w.value:.1f}" if w.metric in DB_METRICS else f"{w.value:.4g}"
            unit = f" {w.unit}" if w.unit else ""
            own = w.metric in DB_METRICS and w.output.min_sqnr_db is not None  # the user's --accuracy limit
            evidence = w.evidence()
            reason = (f"{w.where}: {w.metric} {value}{unit} < {w.limit:.3g}{unit}" + ("" if own else f" ({budget})")
                      + (f"; {evidence}" if evidence else ""))  # fmt: skip
        return Rejection("max_accuracy_drop", _finite(w.value), _finite(w.limit), w.unit, reason, miss)
    task = _task_drops(accuracy.outputs) if accuracy else []
    if task and not within(max(task), max_accuracy_drop):
        return Rejection("max_accuracy_drop", max(task), max_accuracy_drop, "",
                         f"task accuracy drop {max(task):.2%} > {max_accuracy_drop:.2%}", miss)  # fmt: skip
    return Rejection("max_accuracy_drop", _finite(m.accuracy_drop), max_accuracy_drop, "",
                     f"accuracy drop {m.accuracy_drop:.2%} > {max_accuracy_drop:.2%}", miss)  # fmt: skip


def reasons(m: Measured, limits: Limits, objective: str) -> list[str]:
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
