"""What an output means, and so what it is judged by: the accuracy kinds (docs/architecture.md, "Accuracy verdicts").

Each output is judged by what it *means*: its kind (:func:`output_kind`), found from what the ONNX graph says of
it (:class:`OutputFacts`: the op that makes it, what reads it), its shape and the reference's values, gathered by
:mod:`autodeploy.accuracy.measure`; the model may declare it (:data:`DECLARED_KEY`) and the user override it per
output (:func:`parse_override`). Never one number over a whole tensor:

- ``exact``: integer and boolean outputs (ids), exact agreement ``>= 1 - max_accuracy_drop``.
- Classes only where proven (:func:`class_axis`): a Softmax or LogSoftmax makes the output, the graph reads its
  argmax (``OutputFacts.reader``), its reference rows are distributions, or the model declares the measure
  (:data:`DECLARED_KEY`). A flip counts only where the reference decided (its own class led the new one by
  ``accuracy.measure.SEQUENCE_TIE``, 0.2 probability), while it decides at least half its items; every flip is
  reported beside. ``top1``: one class vector per item, the share of items whose class is unchanged; ``cells``: a
  map (``[N, H, W, C]``, ``[N, C, H, W]`` by ``Softmax(axis=1)``), the worst class's F1 of the cells (classes
  holding ``accuracy.measure.MIN_CLASS_CELLS`` cells on either side: a class under 1% of the cells cannot vanish
  inside a 1% budget); both ``>= 1 - max_accuracy_drop``.
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
  ``>= min SQNR``, and each item's error against the output's scale (``accuracy.measure.error_shares``), mean
  ``<=`` half the budget, largest ``<=`` twice it; its failure line gives max and p99 abs error in the output's
  units. A detector's regressor ``[N, A, k]`` beside one score output on the same anchors is judged so at the
  anchors where the reference's score passes, its scores as ``logit`` or ``decision`` (``accuracy.measure.anchor_pairs``).
- ``decision``: probabilities (produced by a Sigmoid; or, made by no linear op and not a vector per item, a
  reference wholly inside [0, 1]),
  thresholded at :data:`autodeploy.accuracy.records.DEFAULT_DECISION_THRESHOLD`: the F1 of the candidate's
  positives against the reference's ``>= 1 - max_accuracy_drop`` (no positives on either side: 1.0), so rare
  events count.
- ``embedding`` (known by its shape alone and its values far from zero: also the ``regression`` error bound): one vector per item, ``[N, 1, ..., 1, D]`` of rank 4 and up (a 1x1 feature map, as a
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
  :func:`autodeploy.accuracy.records.sqnr_for_drop` of the budget: the SQNR at which a group's cosine
  would be ``1 - max_accuracy_drop`` (``1 - cos ~= 10^(-SQNR/10) / 2``): 17.0 dB at the 1% budget. The old rule
  asked that cosine of the whole flattened tensor; it now holds for every group. Bounds beside it where the values
  suggest a reading the shape cannot prove: a linear head's ``[N, T, V <= 64]`` whose reference decides, its argmax
  per position; a map that looks like logits of rare positives, the F1 of its positives (``accuracy.rules.guard_drop``).
- ``bins``: only by override (``--accuracy NAME=bins[:TOLERANCE]``): a distribution over ordered bins on the last
  axis per position (a pitch salience, an angle or depth classifier), judged by the value it decodes to, as its
  users read it: the weighted mean bin within two bins of each row's own peak, where the peak is confident (a
  probability above :data:`autodeploy.accuracy.records.DEFAULT_DECISION_THRESHOLD`; logits softmaxed first). Over
  the positions either side finds confident, the share where both do and the decoded values lie within TOLERANCE
  bins (:data:`autodeploy.accuracy.records.DEFAULT_BIN_TOLERANCE`, half a bin) ``>= 1 - max_accuracy_drop``:
  a voicing lost or a pitch moved counts, a near-tie between two neighbouring bins does not. No graph proves bins
  are ordered, so a failed Sigmoid map of as many bins is told how to declare it (``accuracy.rules``).
- ``cosine``: only by override (or records stored before kinds): cosine ``>= min_cosine``.

Every output must pass, and with labels the task accuracy may drop by at most ``max_accuracy_drop``.
Non-finite outputs (NaN cosine) always fail. The pass/fail rule is :mod:`autodeploy.accuracy.rules`':
:func:`~autodeploy.accuracy.rules.accuracy_verdict` judges, :func:`~autodeploy.accuracy.rules.worst` names the
output (and channels) furthest from its limit, :func:`~autodeploy.accuracy.rules.accuracy_drop` is the same rule
as one number, each output's :func:`~autodeploy.accuracy.rules.output_drop` (``1 - agreement``, ``1 - F1``,
``10^(-SQNR/10) / 2``), so it is within the budget exactly when every output passes.

Each measure is a row of :data:`MEASURES` (:class:`Measure`: its words, the record's field holding its value,
what its threshold is, its unit) that the rules, the comparison, the quantizer and the CLI read; a name is parsed
into its row once (:func:`measure_of`, :func:`parse_override`, ``OutputAccuracy.measure`` for a stored record's).
Records keep the name. Nothing outside this file compares a measure's name or keys a dict literal by them
(``tests/test_measure_names.py``).

Pure functions and frozen dataclasses, stdlib only: importing this module imports no numpy or ONNX.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

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


@dataclass(frozen=True)
class Measure:
    """One accuracy measure: what an output can be judged by, and how (the rules in the module docstring).

    ``name`` is what records store (``OutputAccuracy.kind``) and ``--accuracy`` takes; ``metric`` the words
    the constraint, the tables and the failure lines print; ``field`` the
    :class:`~autodeploy.accuracy.records.OutputAccuracy` field holding its value.
    """

    name: str
    metric: str
    field: str
    #: Where the judged value counts only the flips where the reference decided: the field counting every flip
    #: (reported beside; the value itself in records stored before near-ties were told apart).
    every: str | None = None
    #: Its value is in dB, judged against an SQNR limit (the override's, else the budget's ``sqnr_for_drop``).
    db: bool = False
    #: An SQNR about each channel group's mean (the ``regression`` kind: groups by range), not about zero.
    centred: bool = False
    #: Judged by the F1 of decisions at a probability cut (``decision_threshold``; the override's THRESHOLD).
    probability: bool = False
    #: ... decisions after a sigmoid: its values are logits, above ``logit(cut)`` where their sigmoid is above it.
    sigmoid: bool = False
    #: Judged against the study's ``min_cosine`` (the override's THRESHOLD) rather than the budget.
    cosine_limit: bool = False
    #: One class vector per item: its plain top-1 agreement (every flip) is the one the tables show.
    per_item: bool = False
    #: A sequence: its per-position token agreement is reported beside the whole sequences'.
    tokens: bool = False
    #: Judged by its worst class's F1 (the class named), the cells unchanged reported beside.
    per_class: bool = False
    #: Judged by the value its ordered bins decode to, within a tolerance in bins (the override's THRESHOLD).
    bins: bool = False

    @property
    def thresholded(self) -> bool:
        """Whether an override may set its THRESHOLD: the probability cut, the SQNR limit in dB, the cosine limit.
        Agreements take the study's budget; decoded bins a tolerance in bins."""
        return self.db or self.probability or self.cosine_limit or self.bins

    @property
    def unit(self) -> str:
        """Its value's unit as printed after it (``dB``), empty for a fraction."""
        return "dB" if self.db else ""

    def value(self, record: object) -> float:
        """Its value in an :class:`~autodeploy.accuracy.records.OutputAccuracy` (NaN where none was measured)."""
        value = getattr(record, self.field)
        if value is None and self.every is not None:  # stored before near-ties were told apart: every flip
            value = getattr(record, self.every)
        return math.nan if value is None else value

    def every_flip(self, record: object) -> float | None:
        """The agreement counting every flip, where the judged value counts only decided ones (else ``None``)."""
        return None if self.every is None else getattr(record, self.every)


#: What an output can be judged by (:func:`output_kind`, ``--accuracy OUTPUT=MEASURE[:THRESHOLD]``), by name.
MEASURES: dict[str, Measure] = {m.name: m for m in (
    Measure("exact", "exact agreement", "exact_agreement"),
    Measure("top1", "top-1 agreement", "decided_agreement", every="top1_agreement", per_item=True),
    Measure("sequence", "sequence agreement", "sequence_agreement", tokens=True),
    Measure("cells", "worst class F1 of cells", "class_f1", every="cell_agreement", per_class=True),
    Measure("decision", "F1", "f1", probability=True),
    Measure("logit", "F1 after a sigmoid", "f1", probability=True, sigmoid=True),
    Measure("embedding", "worst row cosine", "row_cosine"),
    Measure("regression", "error SNR", "sqnr_db", db=True, centred=True),
    Measure("sqnr", "SQNR", "sqnr_db", db=True),
    Measure("cosine", "cosine", "cosine", cosine_limit=True),
    Measure("bins", "decoded bin agreement", "bins_agreement", bins=True),
)}  # fmt: skip
#: The rows the code names (:func:`output_kind`'s answers, the computations of ``accuracy.measure.compare``).
EXACT, TOP1, SEQUENCE, CELLS, DECISION, LOGIT, EMBEDDING, REGRESSION, SQNR, COSINE, BINS = MEASURES.values()


def measure_of(name: str) -> Measure:
    """The measure called ``name``.

    Raises:
        ValueError: no such measure, naming the known ones.
    """
    try:
        return MEASURES[name]
    except KeyError:
        raise ValueError(f"unknown accuracy measure {name!r}: expected one of {', '.join(MEASURES)}") from None  # fmt: skip


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


def output_kind(facts: OutputFacts) -> Measure:
    """The measure an output is judged by (a row of :data:`MEASURES`; the rule in the module docstring)."""
    return judged(facts)[0]


def judged(facts: OutputFacts) -> tuple[Measure, Basis]:
    """:func:`output_kind` and why: what proved the kind (:class:`Basis`: the graph, the dtype, the values, or only
    the shape), for the verdict line to say and, where unproven, to tell how to declare another."""
    shape = facts.shape
    if facts.dtype_kind in "iub":
        return EXACT, Basis(f"{_dtype_words(facts.dtype_kind)} values", True)
    one_vector = len(shape) >= 2 and shape[-1] > 1 and all(d == 1 for d in shape[1:-1])
    if one_vector and facts.producer == "LpNormalization":
        return EMBEDDING, Basis("the graph: an L2 normalization makes it", True)
    if one_vector and facts.unit_rows:
        return EMBEDDING, Basis("its values: every item's vector has length 1", False)
    axis = class_axis(facts)
    if axis is not None:  # classes, proven by the graph or by rows that are distributions
        basis = _class_basis(facts)
        places = [d for i, d in enumerate(shape[1:], 1) if i != axis and d > 1]
        if not places:
            return TOP1, basis  # one class vector per item
        if len(places) == 1 and axis == len(shape) - 1:
            return SEQUENCE, basis  # [N, T, V] (or [N, T, 1, V]): tokens, the whole string is what is read
        return CELLS, basis  # a map [N, H, W, C] or [N, C, H, W]: each cell by its own class
    ctc = facts.time_major and len(shape) == 3 and facts.producer not in RECURRENT
    positions = math.prod(shape[1:-1]) if len(shape) >= 3 else 0
    if ctc and positions > 1 and shape[-1] > 1:
        return SEQUENCE, Basis("the call's layout: time-major [T, B, V] logits, as CTC heads return them", True)
    if facts.reader == "Sigmoid":
        return LOGIT, Basis("the graph: a Sigmoid reads it", True)  # the graph itself turns them into probabilities
    linear = facts.producer in LINEAR
    vector = (len(shape) == 2 and shape[1] > 1) or (len(shape) == 3 and one_vector)
    if facts.producer == "Sigmoid":
        return DECISION, Basis("the graph: a Sigmoid makes it", True)
    if facts.unit_range and not linear and not vector:
        return DECISION, Basis("its values: all within [0, 1]", False)
    if one_vector and len(shape) >= 4:
        return EMBEDDING, Basis(f"its shape {shape_text(shape)}: one vector per item", False)  # a 1x1 feature map
    made = f" and a linear head ({facts.producer})" if linear else ""
    if vector:  # a vector per item from a linear head: coordinates, offsets, raw scores
        return REGRESSION, Basis(f"its shape {shape_text(shape)}{made}: a vector of quantities per item", False)
    return SQNR, Basis(f"its shape {shape_text(shape)}{made}, no other kind proven", False)


@dataclass(frozen=True)
class Basis:
    """Why an output got its kind (:func:`judged`): ``text`` for the verdict line ("the graph: a Softmax makes it",
    "its shape [N, 63]: ..."); ``proven`` where the graph, the dtype, the model's declaration or the user said it.
    An unproven kind's line tells how to declare another (``--accuracy NAME=KIND``)."""

    text: str
    proven: bool


def _class_basis(facts: OutputFacts) -> Basis:
    if _op_axis(facts.producer, DISTRIBUTIONS) is not None:
        return Basis(f"the graph: a {facts.producer.partition('(')[0]} makes it", True)  # type: ignore[union-attr]
    if _op_axis(facts.reader, ("ArgMax",)) is not None:
        return Basis("the graph: its argmax is read", True)
    return Basis("its values: every row sums to 1", False)


def _dtype_words(kind: str) -> str:
    return {"b": "boolean", "u": "integer", "i": "integer"}.get(kind, kind)


def shape_text(shape: tuple[int, ...]) -> str:
    """``[N, 1, 1, 1404]``: a shape as a verdict line names it, the items' axis as ``N``."""
    return "[" + ", ".join(["N", *(str(d) for d in shape[1:])]) + "]"


@dataclass(frozen=True)
class Override:
    """A user's choice of measure for one output (``--accuracy OUTPUT=MEASURE[:THRESHOLD]``). A measure given by
    name is parsed into its row (``Override("sqnr")``; an unknown name raises :func:`measure_of`'s ``ValueError``)."""

    measure: Measure
    threshold: float | None = None

    def __post_init__(self) -> None:
        if isinstance(self.measure, str):
            object.__setattr__(self, "measure", measure_of(self.measure))


def parse_override(text: str) -> tuple[str, Override]:
    """``"OUTPUT=MEASURE[:THRESHOLD]"`` -> ``(OUTPUT, Override)``.

    Raises:
        ValueError: not of that form, an unknown measure, or a threshold on a measure without one.
    """
    name, sep, rule = text.rpartition("=")
    word, _, threshold = rule.partition(":")
    measure = MEASURES.get(word)
    if not sep or not name or measure is None:
        raise ValueError(f"--accuracy {text!r}: expected OUTPUT=MEASURE[:THRESHOLD] with MEASURE one of "
                         f"{', '.join(MEASURES)} (e.g. scores=decision:0.3, output0=sqnr:20, pitch=bins:0.3)")  # fmt: skip
    if threshold and not measure.thresholded:
        raise ValueError(f"--accuracy {text!r}: {word} takes no threshold (the budget sets it); "
                         f"thresholds apply to {', '.join(m.name for m in MEASURES.values() if m.thresholded)}")  # fmt: skip
    try:
        value = float(threshold) if threshold else None
    except ValueError:
        raise ValueError(f"--accuracy {text!r}: threshold {threshold!r} is not a number") from None
    if value is not None and not math.isfinite(value):
        raise ValueError(f"--accuracy {text!r}: threshold {threshold!r} is not a finite number")
    if value is not None and measure.probability and not 0 < value < 1:
        raise ValueError(f"--accuracy {text!r}: a {word} threshold is a probability, between 0 and 1 (e.g. 0.5)")  # fmt: skip
    if value is not None and measure.bins and not value > 0:
        raise ValueError(f"--accuracy {text!r}: a bins tolerance is a number of bins above 0 (e.g. 0.3)")
    if value is not None and measure.cosine_limit and not -1 <= value <= 1:
        raise ValueError(f"--accuracy {text!r}: a cosine limit lies between -1 and 1 (e.g. 0.99)")
    return name, Override(measure, value)
