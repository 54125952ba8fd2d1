"""The accuracy records and their thresholds: what a comparison with the fp32 reference found, and the budget.

One :class:`OutputAccuracy` per output and their :class:`Accuracy`, made by
:func:`autodeploy.accuracy.measure.compare`, carried by the harness's measurement, read by the in-house
quantizer's judge, the store, the study and the dashboard: frozen dataclasses that round-trip through JSON,
below everything that makes or reads them. Beside them the budget (:data:`DEFAULT_MAX_ACCURACY_DROP`, 1%) and
the limits it sets: the cosine (:func:`cosine_for_drop`), the SQNR of a channel group (:func:`sqnr_for_drop`),
an SQNR as a drop (:func:`sqnr_drop`), and the float slack every limit is compared with (:func:`within`).
The kinds are :mod:`autodeploy.accuracy.kinds`', the pass/fail rule :mod:`autodeploy.accuracy.rules`'.

Stdlib only: importing this module imports no numpy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from autodeploy.accuracy.kinds import Measure, measure_of

#: The default accuracy budget (docs/architecture.md, "Accuracy verdicts"): each output may lose at most 1% of its measure.
DEFAULT_MAX_ACCURACY_DROP = 0.01
#: The default where top-1 does not apply: cosine similarity >= 0.99 (the same 1% budget).
DEFAULT_MIN_COSINE = 1.0 - DEFAULT_MAX_ACCURACY_DROP
#: Probabilities become decisions above this (``decision`` outputs; overridable per output).
DEFAULT_DECISION_THRESHOLD = 0.5
#: Decoded bins (``bins`` outputs; overridable per output) may move this many bins: half of one.
DEFAULT_BIN_TOLERANCE = 0.5
#: Slack for comparing fractions such as 99/100 with limits such as 1 - 0.01 (float rounding).
TOLERANCE = 1e-9


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
    #: How it was judged, the name of a row of :data:`autodeploy.accuracy.kinds.MEASURES` (its row: :attr:`measure`);
    #: ``None`` in records stored before kinds.
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
    #: On an ``sqnr`` output a linear head makes ``[N, T, V]`` (V <= ``accuracy.measure.MAX_GUARD_CLASSES``) where
    #: the reference decides: the same per position, a second bound beside the SQNR (``accuracy.rules.output_drop``).
    decided_agreement: float | None = None
    #: ``cells``: the share of a map's cells (positions) whose class (argmax over the class axis) is unchanged;
    #: on an ``sqnr`` map whose last axis is a few channels, the same over that axis (reported, never a judge suggested).
    cell_agreement: float | None = None
    #: ``sqnr``/``regression``: the judged (worst) group's largest and 99th-percentile absolute error, in
    #: the output's own units (pixels, metres), and the F1 of the whole output's decisions after a sigmoid
    #: (``value > 0`` against ``reference > 0``) where the reference has both signs (reported beside).
    error_max_abs: float | None = None
    error_p99_abs: float | None = None
    logit_f1: float | None = None
    #: ``cells``: the lowest F1 of one class's cells (flips where the reference decided) against the reference's, over
    #: the classes holding ``accuracy.measure.MIN_CLASS_CELLS`` cells on either side, and that class: a class under 1%
    #: of the cells cannot vanish inside a 1% budget.
    class_f1: float | None = None
    worst_class: int | None = None
    #: ``regression`` (and an embedding known only by its shape whose values sit far from zero): the worst group's
    #: mean and largest absolute error as a share of its scale (the larger of its largest magnitude and its range:
    #: the size of the crop its coordinates are in), each item's error counted; bound by half the budget (mean) and
    #: twice it (largest), as a user bounds landmark error against the crop (``accuracy.rules.output_drop``).
    error_mean_share: float | None = None
    error_max_share: float | None = None
    #: ``sqnr`` of a map whose reference looks like logits of rare positives (``accuracy.measure.rare_logits``: a
    #: heatmap's, a mask's): the F1 of its positives (value > 0, a sigmoid's 0.5) against the reference's, a bound
    #: beside the SQNR (far negative background dominates it: a mask's logits reach -1800).
    positives_f1: float | None = None
    #: ``bins``: over the positions either side's peak is confident at, the share where both are and the decoded
    #: values (weighted mean bin about the peak) lie within ``bin_tolerance`` bins of each other. On a ``decision``
    #: or ``logit`` map of ``accuracy.measure.MIN_BINS`` bins and more, the same at the default tolerance, reported
    #: beside (a failed one's line tells how to declare it ``bins``).
    bins_agreement: float | None = None
    bin_tolerance: float | None = None
    #: ``sqnr`` judged per channel group: the group that moved most in the output's own units (its largest absolute
    #: error), where that is not the worst group (``channels``): a nearly constant group can hold the lowest SQNR
    #: while another group moved hundreds of pixels. Its channels (``"axis 1, channels 0-41"``) and that error.
    moved_channels: str | None = None
    moved_max_abs: float | None = None
    #: Why it got its kind (``accuracy.kinds.Basis``): the words, and whether the graph, the dtype, the model's
    #: declaration or the user proved it (else the line tells how to declare another kind).
    basis: str | None = None
    proven: bool | None = None

    @property
    def measure(self) -> Measure | None:
        """The row of its ``kind`` (:func:`autodeploy.accuracy.kinds.measure_of`); ``None`` stored before kinds.

        Raises:
            ValueError: a ``kind`` that names no measure.
        """
        return None if self.kind is None else measure_of(self.kind)


@dataclass(frozen=True)
class Accuracy:
    """Every output's :class:`OutputAccuracy` and whether the accuracy constraint held."""

    outputs: tuple[OutputAccuracy, ...]
    n_samples: int
    #: The constraint checked, per output by its kind (:func:`autodeploy.accuracy.rules.accuracy_verdict`), e.g.
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
