"""The records of an accuracy comparison: one :class:`OutputAccuracy` per output, their :class:`Accuracy`.

Made by :func:`autodeploy.accuracy.measure.compare`, judged by :mod:`autodeploy.verdict`, carried by the
harness's :class:`~autodeploy.harness.result.Measurement`, read by the in-house quantizer's judge, the store,
the study and the dashboard: so they live below all of them. Frozen dataclasses that round-trip through JSON.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


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
    #: How it was judged (:data:`autodeploy.verdict.MEASURES`); ``None`` in records stored before kinds.
    kind: str | None = None
    #: ``sqnr``: the worst channel group's SQNR in dB, which group (``"axis 1, channels 4-21"``), and
    #: the output's own SQNR limit where the user set one (else the budget's, ``verdict.sqnr_for_drop``).
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
    outputs: tuple[OutputAccuracy, ...]
    n_samples: int
    #: The constraint checked, per output by its kind (``autodeploy.verdict``), e.g.
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

