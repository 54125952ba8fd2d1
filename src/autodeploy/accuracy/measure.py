"""Accuracy of an engine's outputs against the ONNX Runtime FP32 reference (docs/architecture.md).

Each output's kind (:func:`autodeploy.accuracy.kinds.output_kind`) is found from its producing ONNX node
(:func:`producers`), its shape and the reference's values, or taken from the user's override; then
the numbers that kind is judged by are computed beside the columns every output reports. What the graph says
of every output is read once by :func:`graph_facts`, for the harness's worker and the in-house quantizer alike.

Reported for every output, all computed in float64:

* ``max_abs``: largest absolute difference.
* ``mean_rel``: ``mean(|a - b|) / (mean(|b|) + 1e-12)``, the mean absolute error relative to
  the reference's mean magnitude. Unlike the mean of element-wise ``|a - b| / |b|``, it does
  not blow up on reference elements near zero (logits, post-ReLU activations), so one
  near-zero element cannot dominate the number.
* ``cosine``: cosine similarity of the flattened arrays (1.0 when both are all zeros).
* ``top1_agreement``: for classifier-shaped outputs (float ``[N, C]`` with ``C > 1``), the
  fraction of rows whose argmax over the last axis matches the reference's.
* ``exact_agreement``: for integer and boolean outputs (argmax ids, token ids, masks), the
  fraction of elements exactly equal to the reference's: ids have no "close".

By kind:

* ``sqnr``: per channel group (:func:`channel_groups`), ``10 log10(sum ref^2 / sum (out - ref)^2)``
  with the reference's mean kept (as cosine keeps it: a near-constant channel is not failed for
  noise that changes nothing); ``sqnr_db`` is the worst group's, ``channels`` names it.
* ``decision``: ``f1`` of ``out > threshold`` against ``ref > threshold`` (1.0 when neither has a positive).
* ``sequence``: ``token_agreement`` (per-position argmax) and ``sequence_agreement`` (items whose
  whole argmax sequence is unchanged, a reference near-tie, :data:`SEQUENCE_TIE`, not counting; on
  logits, as time-major CTC outputs come, the tie is read on their softmax).
* ``embedding``: ``row_cosine``, the lowest cosine of one row (an item's vector, the last axis) with
  the reference's (:func:`row_cosines`).

NaN or inf in either array makes ``cosine`` NaN and fails the constraint. The pass/fail rule
itself is :func:`autodeploy.accuracy.rules.accuracy_verdict`; this module only measures.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from autodeploy.accuracy.kinds import (
    BINS,
    CELLS,
    DECISION,
    DECLARED_KEY,
    DISTRIBUTIONS,
    EMBEDDING,
    EXACT,
    LINEAR,
    LOGIT,
    REGRESSION,
    SEQUENCE,
    SQNR,
    TOP1,
    Basis,
    Measure,
    OutputFacts,
    Override,
    class_axis,
    judged,
    output_kind,
    parse_override,
    shape_text,
)
from autodeploy.accuracy.records import (
    DEFAULT_BIN_TOLERANCE,
    DEFAULT_DECISION_THRESHOLD,
    DEFAULT_MAX_ACCURACY_DROP,
    DEFAULT_MIN_COSINE,
    Accuracy,
    OutputAccuracy,
)
from autodeploy.accuracy.rules import accuracy_verdict

if TYPE_CHECKING:
    import onnx

_EPS = 1e-12
#: A channel axis is a non-batch axis of at most this many slices (longer ones are positions, anchors, pixels).
MAX_CHANNELS = 1024
#: Adjacent channels whose largest magnitudes (max |ref|) lie within this factor form one group.
GROUP_RATIO = 10.0
#: A changed token counts only where the reference's own token led the candidate's by this much
#: probability: OpenVINO bf16 flips PP-OCRv5 rec tokens whose reference leads were 0.017 and 0.15.
SEQUENCE_TIE = 0.2
#: Classes (top-1, cells) forgive a near-tie flip only while the reference decided (led by SEQUENCE_TIE) at least
#: this share of its items: below it the inputs cannot tell a near-tie from a broken output.
MIN_DECIDED = 0.5
#: A class of a map is judged by its own F1 where it holds at least this many cells on either side (fewer: one flip
#: would be over 10% of it, finer than the inputs can tell).
MIN_CLASS_CELLS = 10
#: An unproven ``sqnr`` output a linear head makes ``[N, T, V]`` with at most this many channels per position is
#: also bound by its argmax per position where the reference decides (a tagger's logits; hidden states are wider).
MAX_GUARD_CLASSES = 64
#: A Sigmoid map with at least this many channels on its last axis may be ordered bins (a pitch salience has 264 to
#: 360): its decoded-bin agreement is reported beside its F1, and a failed one's line tells how to declare it.
MIN_BINS = 32
#: Decoded bins are the weighted mean of the bins within this many of each row's own peak (as pitch trackers decode).
BIN_WINDOW = 2
#: Ops a Sigmoid's values pass through unchanged on their way to an output.
_SHAPE_OPS = ("Identity", "Cast", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Transpose")


def compare(
    outputs: Mapping[str, np.ndarray],
    reference: Mapping[str, np.ndarray],
    *,
    labels: np.ndarray | None = None,
    max_accuracy_drop: float = DEFAULT_MAX_ACCURACY_DROP,
    min_cosine: float = DEFAULT_MIN_COSINE,
    producers: Mapping[str, str] | None = None,
    overrides: Mapping[str, Override] | None = None,
    time_major: Collection[str] = (),
    readers: Mapping[str, str] | None = None,
    beside: Mapping[str, np.ndarray] | None = None,
) -> Accuracy:
    """Compare ``outputs`` with ``reference`` and check the accuracy constraint.

    The constraint is :func:`autodeploy.accuracy.rules.accuracy_verdict` (docs/architecture.md), per output by its
    kind: exact / top-1 / sequence agreement and decision F1 ``>= 1 - max_accuracy_drop``, the worst
    channel group's SQNR ``>= records.sqnr_for_drop(max_accuracy_drop)`` (or the override's limit),
    cosine ``>= min_cosine`` where an override asks for it; with ``labels`` the task accuracy may
    drop by at most ``max_accuracy_drop`` from the reference's. Non-finite values always fail.

    Args:
        outputs: Output name -> array with a leading sample axis ``N``.
        reference: The same names, shapes and ``N`` from the FP32 reference.
        labels: Optional labels, one entry per item. ``N`` integer class ids are scored against the
            argmax of the first classifier-shaped output (in ``reference`` order); labels of any other
            shape, or without such an output, are left to the user's ``--metric``.
        max_accuracy_drop: Allowed top-1 / exact agreement and task-accuracy drop, as a fraction.
        min_cosine: Required cosine similarity of the outputs judged by cosine.
        producers: Output name -> the op that produces it (:func:`producers`); without, the kind
            follows from the shape and values alone.
        overrides: Output name -> the measure (and threshold) the user chose for it.
        time_major: Outputs the engine returned ``[T, B, V]``, its items on axis 1, here ``[N, T, V]``
            (the worker's ``run_all``): CTC logits, judged by their tokens.
        readers: Output name -> what the graph does with it beside returning it (:func:`readers`).
        beside: The reference's other outputs, read but not judged: an output compared alone (the in-house
            quantizer's judge) still finds the scores its boxes are read at (:func:`anchor_pairs`).

    Raises:
        ValueError: names, shapes or sample counts differ, an output has no sample axis,
            there are no samples, ``labels`` have the wrong length, or an override names no output.
    """
    n = _check_inputs(outputs, reference)
    overrides = dict(overrides or {})
    unknown = sorted(set(overrides) - set(reference))
    if unknown:
        raise ValueError(f"--accuracy names output(s) {unknown} the model does not have; its outputs: {sorted(reference)}")
    every = {**(beside or {}), **reference}
    found = {name: facts(np.asarray(ref), (producers or {}).get(name), name in time_major, (readers or {}).get(name))
             for name, ref in every.items()}  # fmt: skip
    pairs = anchor_pairs(found, overrides)
    scores = set(pairs.values())
    results = []
    for name in reference:
        got, ref = np.asarray(outputs[name]), np.asarray(reference[name])
        if name in pairs:  # a detector's regressor: judged where its scores pass, as the detector reads it
            results.append(_anchored(name, got, ref, pairs[name], np.asarray(every[pairs[name]]), found))
        elif name in scores and name not in overrides:
            results.append(_compare_one(name, got, ref, found[name], chosen=_scores_kind(name, found, pairs)))
        else:
            results.append(_compare_one(name, got, ref, found[name], overrides.get(name)))
    if labels is not None:
        results = _with_task_accuracy(results, outputs, reference, labels, n)
    verdict = accuracy_verdict(results, max_accuracy_drop=max_accuracy_drop, min_cosine=min_cosine)
    return Accuracy(outputs=tuple(results), n_samples=n, constraint=verdict.constraint, passed=verdict.passed)


def _check_inputs(outputs: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray]) -> int:
    if not reference:
        raise ValueError("reference has no outputs to compare")
    if set(outputs) != set(reference):
        raise ValueError(
            f"output names differ: got {sorted(outputs)}, reference has {sorted(reference)}; "
            "compare the same model's outputs"
        )
    n = None
    for name in reference:
        got, ref = np.shape(outputs[name]), np.shape(reference[name])
        if got != ref:
            raise ValueError(f"output {name!r}: shape {got} differs from the reference shape {ref}")
        if len(ref) == 0:
            raise ValueError(f"output {name!r} is a scalar; outputs need a leading sample axis")
        if n is not None and ref[0] != n:
            raise ValueError(f"output {name!r} has {ref[0]} samples, other outputs have {n}")
        n = ref[0]
    if n == 0:
        raise ValueError("outputs have 0 samples; accuracy needs at least one evaluation input")
    return int(n)


def _is_classifier(a: np.ndarray) -> bool:
    return a.dtype.kind in "fc" and a.ndim == 2 and a.shape[1] > 1


def _is_discrete(a: np.ndarray) -> bool:
    return a.dtype.kind in "iub"


def is_time_major(value: np.ndarray, axis: int | None, items: int) -> bool:
    """Whether one call's output is ``[T, B, V]``, its ``items`` on axis 1 where the model says ``axis`` 0:
    the layout of CTC logits (PyTorch's ``CTCLoss`` takes ``[T, N, C]``), the batch after the time steps.
    The caller splits it per item on axis 1 and says so to :func:`compare` (``time_major``)."""
    return axis == 0 and value.ndim == 3 and value.shape[0] != items and value.shape[1] == items


def as_tensor(value: object) -> np.ndarray:
    """One call's output as an array: a ZipMap's sequence of ``{class: probability}`` maps (skl2onnx's
    default classifier output, :func:`autodeploy.model.load_model`) becomes the ``[N, classes]``
    probabilities, one column per class in the classes' sorted order; any other value is ``np.asarray``'d.

    Only the comparison reads it so: the runner returns, and the harness times, the maps the model returns.

    Raises:
        ValueError: the maps do not all hold the same classes.
    """
    if not isinstance(value, (list, tuple)) or not value or not all(isinstance(v, Mapping) for v in value):
        return np.asarray(value)
    classes = sorted(value[0])
    if any(sorted(row) != classes for row in value):
        raise ValueError(f"a ZipMap output's maps hold different classes (the first: {classes[:10]})")
    return np.array([[row[c] for c in classes] for row in value], dtype=np.float32)


def facts(ref: np.ndarray, producer: str | None = None, time_major: bool = False,
          reader: str | None = None) -> OutputFacts:  # fmt: skip
    """What :func:`autodeploy.accuracy.kinds.output_kind` needs to know of a reference output (``time_major``:
    the engine returned it with its items on axis 1, as :func:`compare` takes it)."""
    unit = rows = unit_rows = False
    if ref.dtype.kind == "f" and ref.size and np.all(np.isfinite(ref)):
        lo, hi = float(ref.min()), float(ref.max())
        unit = lo >= 0.0 and hi <= 1.0
        if ref.ndim >= 2 and lo >= 0.0:
            rows = bool(np.allclose(ref.astype(np.float64).sum(axis=-1), 1.0, atol=1e-3))
        if ref.ndim >= 2 and lo < 0.0 and all(d == 1 for d in ref.shape[1:-1]):  # one vector per item only
            unit_rows = bool(np.allclose(np.linalg.norm(ref.astype(np.float64), axis=-1), 1.0, atol=1e-3))
    return OutputFacts(ref.dtype.kind, tuple(ref.shape), producer, unit, rows, time_major, unit_rows, reader)


def kinds(reference: Mapping[str, np.ndarray], producers: Mapping[str, str] | None = None,
          overrides: Mapping[str, Override] | None = None, time_major: Collection[str] = (),
          readers: Mapping[str, str] | None = None) -> dict[str, str]:  # fmt: skip
    """Output name -> the name of the measure it is judged by (the override's where given), as records store it."""
    overrides, producers, readers = overrides or {}, producers or {}, readers or {}
    found = {name: facts(np.asarray(ref), producers.get(name), name in time_major, readers.get(name))
             for name, ref in reference.items()}  # fmt: skip
    pairs = anchor_pairs(found, overrides)
    scores = set(pairs.values())

    def measure(name: str) -> Measure:
        if name in overrides:
            return overrides[name].measure
        if name in pairs:
            return REGRESSION
        return _scores_kind(name, found, pairs)[0] if name in scores else output_kind(found[name])

    return {name: measure(name).name for name in reference}


#: A detector's anchor axis holds at least this many priors (BlazeFace 896, PicoDet's coarsest level 100 and up), so
#: a few positions or channels are never taken for anchors.
MIN_ANCHORS = 100


def anchor_pairs(found: Mapping[str, OutputFacts], overrides: Collection[str] = ()) -> dict[str, str]:
    """Regressor -> the score output beside it: a detector's two heads over the same anchors, ``[N, A, k >= 4]`` boxes
    (and keypoints) and ``[N, A, c]`` scores, ``A >= MIN_ANCHORS``, the scores told by a Sigmoid that makes or reads
    them, values in [0, 1], or a single channel; the regressor of no kind proven (what a shape gave it). An anchor
    count shared by more than one score output pairs nothing (which scores read which boxes is then not known).
    MediaPipe's detectors (``regressors`` beside ``classificators``), PicoDet's per-level distances beside class
    scores. What the user declared keeps their kind."""
    heads: dict[tuple[int, int], list[str]] = {}
    for name, f in found.items():
        if f.dtype_kind == "f" and len(f.shape) == 3 and f.shape[1] >= MIN_ANCHORS and name not in overrides:
            heads.setdefault(f.shape[:2], []).append(name)
    pairs = {}
    for names in heads.values():
        score = [n for n in names if _scores(found[n])]
        if len(score) != 1:
            continue
        for name in names:
            f = found[name]
            if name != score[0] and f.shape[-1] >= 4 and not judged(f)[1].proven and not _scores(f):
                pairs[name] = score[0]
    return pairs


def _scores(f: OutputFacts) -> bool:
    return f.producer == "Sigmoid" or f.reader == "Sigmoid" or f.unit_range or f.shape[-1] == 1


def _scores_kind(name: str, found: Mapping[str, OutputFacts], pairs: Mapping[str, str]) -> tuple[Measure, Basis]:
    """A score output beside a regressor: its own proven kind, else probabilities (values in [0, 1]) or logits."""
    measure, basis = judged(found[name])
    if basis.proven:
        return measure, basis
    boxes = next(r for r, s in pairs.items() if s == name)
    beside = f"its shape {shape_text(found[name].shape)} beside regressor {boxes!r} on the same anchors: detection scores"
    if found[name].unit_range:
        return DECISION, Basis(beside, False)
    return LOGIT, Basis(beside + ", logits (signed)", False)


def positive_anchors(scores: np.ndarray) -> np.ndarray:
    """``[N, A]``: the anchors whose best score passes the default cut (probabilities above 0.5; logits above 0)."""
    best = scores.astype(np.float64).max(axis=-1)
    unit = scores.size and float(scores.min()) >= 0.0 and float(scores.max()) <= 1.0
    return best > (DEFAULT_DECISION_THRESHOLD if unit else 0.0)


def _anchored(name: str, got: np.ndarray, ref: np.ndarray, scores_name: str, scores: np.ndarray,
              found: Mapping[str, OutputFacts]) -> OutputAccuracy:  # fmt: skip
    """A detector's regressor as a ``regression`` at the anchors its reference scores pass (:func:`positive_anchors`):
    boxes elsewhere are never read. Where no anchor passes, nothing of it is read (it passes; the scores decide)."""
    mask = positive_anchors(scores)
    where = f"at the {int(mask.sum())} anchors where {scores_name!r} passes"
    basis = Basis(f"its shape {shape_text(ref.shape)} beside scores {scores_name!r} on the same anchors: "
                  "boxes, read where a score passes", False)  # fmt: skip
    if not mask.any():
        return OutputAccuracy(name=name, max_abs=0.0, mean_rel=0.0, cosine=1.0, kind=REGRESSION.name, sqnr_db=math.inf,
                              channels=where, error_mean_share=0.0, error_max_share=0.0, basis=basis.text,
                              proven=False)  # fmt: skip
    part = facts(ref[mask], found[name].producer)
    o = _compare_one(name, got[mask], ref[mask], part, chosen=(REGRESSION, basis))
    return replace(o, channels=f"{where}, {o.channels}" if o.channels else where)


def _compare_one(name: str, got: np.ndarray, ref: np.ndarray, found: OutputFacts, override: Override | None = None,
                 chosen: tuple[Measure, Basis] | None = None) -> OutputAccuracy:  # fmt: skip
    a = got.astype(np.float64).ravel()
    b = ref.astype(np.float64).ravel()
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.abs(a - b)
        max_abs = float(diff.max()) if diff.size else 0.0  # size 0: e.g. shape [N, 0]
        mean_rel = float(diff.mean() / (np.abs(b).mean() + _EPS)) if diff.size else 0.0
    top1 = exact = None
    if _is_classifier(ref):
        top1 = float(np.mean(np.argmax(got, axis=-1) == np.argmax(ref, axis=-1)))
    if _is_discrete(ref):
        exact = float(np.mean(a == b)) if a.size else 1.0
    base = OutputAccuracy(name=name, max_abs=max_abs, mean_rel=mean_rel, cosine=_cosine(a, b),
                          top1_agreement=top1, exact_agreement=exact)  # fmt: skip
    if override is not None:
        measure, basis = override.measure, Basis("declared (the model's metadata or --accuracy)", True)
    else:
        measure, basis = chosen or judged(found)
    threshold = None if override is None else override.threshold
    kind = measure.name  # what the record stores
    base = replace(base, basis=basis.text, proven=basis.proven)
    if measure == EXACT:
        return replace(base, kind=kind, exact_agreement=exact if exact is not None else float(np.mean(a == b)))
    if measure == TOP1:
        if ref.ndim < 2:
            raise ValueError(f"--accuracy {name}=top1: output {name!r} of shape {ref.shape} has no class axis")
        same, changed = _class_changes(*_classes_last(got, ref, class_axis(found)))
        return replace(base, kind=kind, top1_agreement=float(same.mean()), decided_agreement=1 - float(changed.mean()))
    if measure == SEQUENCE:
        if ref.ndim < 3:
            raise ValueError(f"--accuracy {name}=sequence: output {name!r} of shape {ref.shape} is not [N, T, V]")
        same, changed = _token_changes(got, ref)
        per_item = ~changed.reshape(len(changed), -1).any(axis=1)
        return replace(base, kind=kind, token_agreement=float(same.mean()), sequence_agreement=float(per_item.mean()))
    if measure == CELLS:
        if ref.ndim < 3:
            raise ValueError(f"--accuracy {name}=cells: output {name!r} of shape {ref.shape} is not a map [N, ..., C]")
        got_last, ref_last = _classes_last(got, ref, class_axis(found))
        same, changed = _class_changes(got_last, ref_last)
        f1, worst_class = class_f1(np.argmax(got_last, axis=-1), np.argmax(ref_last, axis=-1), changed, ref_last.shape[-1])
        return replace(base, kind=kind, cell_agreement=float(same.mean()), decided_agreement=1 - float(changed.mean()),
                       class_f1=f1, worst_class=worst_class)  # fmt: skip
    if measure == BINS:
        if ref.ndim < 2 or ref.shape[-1] < 2:
            raise ValueError(f"--accuracy {name}=bins: output {name!r} of shape {ref.shape} has no axis of bins")
        tolerance = DEFAULT_BIN_TOLERANCE if threshold is None else threshold
        return replace(base, kind=kind, bins_agreement=bins_agreement(got, ref, tolerance), bin_tolerance=tolerance)
    if measure.probability:
        cut = DEFAULT_DECISION_THRESHOLD if threshold is None else threshold
        at = math.log(cut / (1 - cut)) if measure.sigmoid else cut  # a logit is above logit(p) where sigmoid > p
        base = replace(base, kind=kind, f1=_f1(a > at, b > at), decision_threshold=cut)
        if ref.ndim >= 2 and ref.shape[-1] >= MIN_BINS:  # maybe ordered bins (a pitch salience): reported beside
            agreement = bins_agreement(got, ref, DEFAULT_BIN_TOLERANCE, sigmoid=measure.sigmoid)
            base = replace(base, bins_agreement=agreement, bin_tolerance=DEFAULT_BIN_TOLERANCE)
        return base
    if measure == EMBEDDING:
        if ref.ndim < 2:
            raise ValueError(f"--accuracy {name}=embedding: output {name!r} of shape {ref.shape} has no vector axis")
        base = replace(base, kind=kind, row_cosine=float(row_cosines(got, ref).min()))
        if basis.proven or not offset(ref):
            return base
        # Known by its shape only, and its values sit far from zero (coordinates in pixels): a direction would hide
        # a shift of them all, so their error against their scale is bound too.
        mean_share, max_share = error_shares(got, ref, [list(range(ref.shape[-1]))], ref.ndim - 1)
        return replace(base, error_mean_share=mean_share, error_max_share=max_share)
    if measure.cosine_limit:
        return replace(base, kind=kind)
    db, where, part, moved = _worst_group(got, ref, centred=measure.centred)  # an SQNR: about zero, or each group's mean
    errors = np.abs(got[part].astype(np.float64) - ref[part].astype(np.float64)).ravel()
    if measure == REGRESSION:  # each item's error against the scale of its quantity (the crop its points are in)
        axis = channel_axis(ref)
        groups = range_groups(ref, axis) if axis is not None else [list(range(ref.shape[-1]))]
        mean_share, max_share = error_shares(got, ref, groups, axis if axis is not None else ref.ndim - 1)
        base = replace(base, error_mean_share=mean_share, error_max_share=max_share)
    if measure == SQNR and rare_logits(ref):  # a heatmap's or a mask's logits: what a sigmoid at 0.5 decides too
        base = replace(base, positives_f1=_f1(a > 0, b > 0))
    if measure == SQNR and found.producer in LINEAR and _guarded(ref):  # a tagger's logits, unproven: argmax too
        same, changed = _changes(got, ref, _probabilities(ref))
        base = replace(base, decided_agreement=1 - float(changed.mean()))
    # Reported beside (never suggested as a judge): the whole output's decisions after a sigmoid, as NAME=logit reads them.
    logit_f1 = _f1(a > 0, b > 0) if (b > 0).any() and (b < 0).any() else None
    # ... and, on a map whose last axis is a few channels, their argmax per cell: what NAME=cells would judge.
    cells = None
    if ref.ndim >= 3 and 2 <= ref.shape[-1] <= MAX_CHANNELS:
        cells = float(np.mean(np.argmax(got, axis=-1) == np.argmax(ref, axis=-1)))
    finite = errors.size and np.all(np.isfinite(errors))
    return replace(base, kind=kind, sqnr_db=db, channels=where, min_sqnr_db=threshold, logit_f1=logit_f1,
                   cell_agreement=cells, moved_channels=moved[0] if moved else None,
                   moved_max_abs=moved[1] if moved else None,
                   error_max_abs=float(errors.max()) if finite else None,
                   error_p99_abs=float(np.percentile(errors, 99)) if finite else None)  # fmt: skip


def decoded_bins(probs: np.ndarray) -> np.ndarray:
    """Each row's value in bins (rows over the last axis): the weighted mean of the bins within :data:`BIN_WINDOW`
    of its own peak (a second peak elsewhere, a harmonic, does not pull it)."""
    rows = probs.reshape(-1, probs.shape[-1])
    peak = np.argmax(rows, axis=-1)
    at = np.clip(peak[:, None] + np.arange(-BIN_WINDOW, BIN_WINDOW + 1)[None], 0, rows.shape[-1] - 1)
    weights = np.maximum(np.take_along_axis(rows, at, axis=-1), 0.0)
    return np.sum(weights * at, axis=-1) / np.maximum(weights.sum(axis=-1), _EPS)


def bins_agreement(got: np.ndarray, ref: np.ndarray, tolerance: float, sigmoid: bool = False) -> float:
    """The ``bins`` measure: over the positions where either side's peak probability passes
    :data:`~autodeploy.accuracy.records.DEFAULT_DECISION_THRESHOLD` (voiced), the share where both do and their
    decoded values (:func:`decoded_bins`) lie within ``tolerance`` bins; 1.0 where neither side is confident
    anywhere. Values outside [0, 1] are logits: each side is softmaxed over the bins first (with ``sigmoid``, a
    sigmoid's, as a ``logit`` output is read)."""

    def probabilities(x: np.ndarray) -> np.ndarray:
        x = x.astype(np.float64)
        if sigmoid:
            return 0.5 * (1.0 + np.tanh(0.5 * x))  # the logistic function, without overflow
        return x if x.min(initial=0.0) >= 0 and x.max(initial=0.0) <= 1 else _softmax(x)

    p, q = probabilities(got), probabilities(ref)
    voiced_p = p.reshape(-1, p.shape[-1]).max(axis=-1) > DEFAULT_DECISION_THRESHOLD
    voiced_q = q.reshape(-1, q.shape[-1]).max(axis=-1) > DEFAULT_DECISION_THRESHOLD
    either = voiced_p | voiced_q
    if not either.any():
        return 1.0
    with np.errstate(invalid="ignore"):
        close = np.abs(decoded_bins(p) - decoded_bins(q)) <= tolerance
    return float(np.mean((voiced_p & voiced_q & close)[either]))


def _classes_last(got: np.ndarray, ref: np.ndarray, axis: int | None) -> tuple[np.ndarray, np.ndarray]:
    """Both arrays with their class axis (``axis``; the last where ``None``) moved last."""
    return (got, ref) if axis is None else (np.moveaxis(got, axis, -1), np.moveaxis(ref, axis, -1))


def _token_changes(got: np.ndarray, ref: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per position: whether the argmax agrees, and whether it changed where the reference decided.

    A position whose reference probability of its own token leads that of the candidate's token by
    less than :data:`SEQUENCE_TIE` was a near-tie in the reference itself: reported (token
    agreement counts it) but not a changed sequence. Probabilities are the reference's own values
    where its rows sum to 1, else its softmax (time-major CTC logits, or logits judged by override).
    """
    return _changes(got, ref, _probabilities(ref))


def _changes(got: np.ndarray, ref: np.ndarray, probs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_token_changes` on the reference's probabilities already computed."""
    top, picked = np.argmax(ref, axis=-1), np.argmax(got, axis=-1)
    lead = (np.take_along_axis(probs, top[..., None], -1) - np.take_along_axis(probs, picked[..., None], -1))[..., 0]
    return top == picked, (top != picked) & (lead >= SEQUENCE_TIE)


def _probabilities(ref: np.ndarray) -> np.ndarray:
    """The reference's values where its last-axis rows sum to 1, else their softmax (logits)."""
    probs = ref.astype(np.float64)
    if not (probs.min(initial=0.0) >= 0 and np.allclose(probs.sum(axis=-1), 1.0, atol=1e-3)):
        probs = _softmax(probs)
    return probs


def _softmax(x: np.ndarray) -> np.ndarray:
    """The softmax of float64 logits over the last axis."""
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _class_changes(got: np.ndarray, ref: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_token_changes` for ``top1`` and ``cells``, unless the reference decided under
    :data:`MIN_DECIDED` of its items (cells): on inputs where it leads nowhere (an untrained model, noise),
    a near-tie cannot be told from a broken output, and every flip counts."""
    probs = _probabilities(ref)  # once: the leads and the decided share read the same probabilities
    same, changed = _changes(got, ref, probs)
    if ref.shape[-1] > 1:
        ranked = np.sort(probs, axis=-1)
        if float(np.mean(ranked[..., -1] - ranked[..., -2] >= SEQUENCE_TIE)) < MIN_DECIDED:
            changed = ~same
    return same, changed


def class_f1(picked: np.ndarray, top: np.ndarray, changed: np.ndarray, classes: int) -> tuple[float, int | None]:
    """The lowest F1 of one class's cells against the reference's, and that class (``(1.0, None)`` where no class holds
    :data:`MIN_CLASS_CELLS` cells on either side). ``picked``/``top``: the candidate's and the reference's class per
    cell; a cell that flipped where the reference nearly tied (not ``changed``) keeps the reference's class."""
    got = np.where(changed, picked, top)
    worst, which = 1.0, None
    for c in range(classes):
        mine, theirs = got == c, top == c
        if max(int(mine.sum()), int(theirs.sum())) < MIN_CLASS_CELLS:
            continue
        f1 = _f1(mine, theirs)
        if f1 < worst or which is None:
            worst, which = f1, c
    return worst, which


def error_shares(got: np.ndarray, ref: np.ndarray, groups: list[list[int]], axis: int) -> tuple[float, float]:
    """The worst group's mean and largest absolute error as a share of the output's scale: the larger of its largest
    magnitude and its range over every item and channel (coordinates in pixels of a 64 px crop: about 64; offsets of
    -0.2 to 0.2 in units of a box: 0.4). One scale for the whole output: a box's centre offsets (a few pixels) and its
    size (tens) are pixels alike, and an error means as much on either. Both NaN where an array is not finite."""
    a, b = got.astype(np.float64), ref.astype(np.float64)
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
        return math.nan, math.nan
    scale = max(float(np.abs(b).max(initial=0.0)), float(b.max(initial=0.0) - b.min(initial=0.0)))
    if scale == 0.0 or not b.size:
        return 0.0, 0.0
    worst_mean = worst_max = 0.0
    for channels in groups:
        part = (slice(None),) * axis + (np.array(channels),)
        error = np.abs(a[part] - b[part]) / scale
        worst_mean, worst_max = max(worst_mean, float(error.mean())), max(worst_max, float(error.max()))
    return worst_mean, worst_max


def offset(ref: np.ndarray) -> bool:
    """Whether an output's values sit far from zero against their spread (their mean beyond one standard
    deviation from 0): coordinates in pixels, not an embedding's signed directions."""
    values = ref.astype(np.float64)
    return bool(values.size and np.all(np.isfinite(values)) and abs(values.mean()) > values.std())


#: A map looks like logits of rare positives where at most this share of its values is above 0 ...
RARE_POSITIVES = 0.2
#: ... and its typical value lies this far below 0 (a sigmoid of it under 0.12: background, confidently).
FAR_BELOW = -2.0


def rare_logits(ref: np.ndarray) -> bool:
    """Whether a map (``[N, ...]`` of rank 3 and up) looks like logits of rare positives: some value above 0, at most
    :data:`RARE_POSITIVES` of them, the median at :data:`FAR_BELOW` or lower (a heatmap's or a mask's logits, where
    the far background sets an SQNR and the few positives are what is read)."""
    if ref.ndim < 3 or ref.dtype.kind != "f" or not ref.size or not np.all(np.isfinite(ref)):
        return False
    above = float(np.mean(ref > 0))
    return 0 < above <= RARE_POSITIVES and float(np.median(ref)) <= FAR_BELOW


def _guarded(ref: np.ndarray) -> bool:
    """An ``[N, T, V]`` (or ``[N, T, 1, V]``) output of a few channels per position where the reference decides
    (:data:`MIN_DECIDED` of positions led by :data:`SEQUENCE_TIE` in its softmax): per-position classes, maybe."""
    shape = ref.shape
    if not (len(shape) == 3 or (len(shape) == 4 and shape[2] == 1)) or shape[1] < 2:
        return False
    if not 2 <= shape[-1] <= MAX_GUARD_CLASSES or not np.all(np.isfinite(ref)):
        return False
    ranked = np.sort(_probabilities(ref), axis=-1)
    return float(np.mean(ranked[..., -1] - ranked[..., -2] >= SEQUENCE_TIE)) >= MIN_DECIDED


def row_cosines(got: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """The cosine of each vector along the last axis with the reference's (1.0 where both are zero,
    0.0 where one is, NaN where either is not finite), flattened over the other axes."""
    a = got.astype(np.float64).reshape(-1, ref.shape[-1])
    b = ref.astype(np.float64).reshape(-1, ref.shape[-1])
    with np.errstate(invalid="ignore", over="ignore"):
        scale = np.maximum(np.abs(a).max(axis=1, initial=0.0), np.abs(b).max(axis=1, initial=0.0))
        scale = np.where(scale > 0, scale, 1.0)[:, None]  # scaled first: squares cannot overflow
        a, b = a / scale, b / scale
        na, nb = np.linalg.norm(a, axis=1), np.linalg.norm(b, axis=1)
        both_zero = (na == 0) & (nb == 0)
        cos = np.sum(a * b, axis=1) / np.where(na * nb > 0, na * nb, 1.0)
    cos = np.where(both_zero, 1.0, np.where(na * nb > 0, np.clip(cos, -1.0, 1.0), 0.0))
    finite = np.all(np.isfinite(a), axis=1) & np.all(np.isfinite(b), axis=1)
    return np.where(finite, cos, np.nan)


def _f1(got: np.ndarray, ref: np.ndarray) -> float:
    """F1 of ``got``'s positives against ``ref``'s; 1.0 when neither has any."""
    tp = int(np.count_nonzero(got & ref))
    wrong = int(np.count_nonzero(got ^ ref))
    return 1.0 if tp + wrong == 0 else 2 * tp / (2 * tp + wrong)


def channel_axis(ref: np.ndarray) -> int | None:
    """The axis whose slices carry different quantities, or ``None`` (the output is one group).

    Candidates are the non-batch axes of 2 to :data:`MAX_CHANNELS` slices. In a 2-D ``[N, D]`` or a
    4-D-and-up ``[N, C, ...]`` output it is axis 1 (NC... layouts; the rest are spatial). In 3-D
    ``[N, X, Y]`` it is the candidate whose slices' magnitudes (max |ref|) differ most, as a ratio:
    axis 1 of a detector's ``[N, 4 + C, anchors]`` (pixels beside scores); ties go to axis 1.
    """
    candidates = [ax for ax in range(1, ref.ndim) if 2 <= ref.shape[ax] <= MAX_CHANNELS]
    if ref.ndim != 3:
        return 1 if 1 in candidates else None
    if len(candidates) < 2:
        return candidates[0] if candidates else None
    return max(candidates, key=lambda ax: (_spread(_magnitudes(ref, ax)), -ax))


def _magnitudes(ref: np.ndarray, axis: int) -> np.ndarray:
    others = tuple(i for i in range(ref.ndim) if i != axis)
    return np.abs(ref.astype(np.float64)).max(axis=others) if ref.size else np.zeros(ref.shape[axis])


def _minima(ref: np.ndarray, axis: int) -> np.ndarray:
    others = tuple(i for i in range(ref.ndim) if i != axis)
    return ref.astype(np.float64).min(axis=others) if ref.size else np.zeros(ref.shape[axis])


def _spread(mags: np.ndarray) -> float:
    nonzero = mags[mags > 0]
    return float(nonzero.max() / nonzero.min()) if nonzero.size else 1.0


def channel_groups(ref: np.ndarray, axis: int) -> list[tuple[int, int]]:
    """Runs ``[first, last]`` of adjacent channels whose magnitudes lie within :data:`GROUP_RATIO`
    of each other; a channel that is all zeros joins the run it is in (its noise still counts).

    A probability channel (its reference wholly in [0, 1], as ``decision`` recognises a whole output)
    never shares a run with a signed one (some value below 0), whatever their magnitudes: YOLOX's
    ``[N, anchors, 4 + 1 + C]`` puts raw box offsets and log-sizes (-2 to 2.7) beside objectness and
    class scores (0 to 1), all within 10x, and one group would let the four box channels' SQNR hide
    what int8 did to the scores. Adjacent probability channels stay one run whatever their
    magnitudes: they are one quantity on one scale, where an error means as much on a class that
    scored 0.001 as on one that scored 0.2 (YOLOv8's ``[N, 4 + C, anchors]`` on photos without a
    class's objects: split by magnitude, nudenet's 18 class channels made 11 groups, some judged on
    scores below 0.001, noise that no decision at nudenet's 0.2 reads)."""
    groups: list[tuple[int, int]] = []
    lo = hi = 0.0  # the current run's smallest and largest non-zero magnitude (0: none yet)
    probs = signed = False  # whether the current run holds a probability / a signed channel
    only_probs = False  # whether every non-zero channel of the current run is a probability
    minima = _minima(ref, axis)
    for i, m in enumerate(float(x) for x in _magnitudes(ref, axis)):
        prob, sign = m > 0 and minima[i] >= 0 and m <= 1, minima[i] < 0
        mixes = (prob and signed) or (sign and probs)
        near = m == 0 or lo == 0 or max(hi, m) <= GROUP_RATIO * min(lo, m) or (prob and only_probs)
        if groups and not mixes and near:
            groups[-1] = (groups[-1][0], i)
            if m:
                lo, hi = (min(lo, m) if lo else m), max(hi, m)
            probs, signed, only_probs = probs or prob, signed or sign, only_probs and (prob or m == 0)
            continue
        groups.append((i, i))
        lo = hi = m
        probs, signed, only_probs = prob, sign, prob
    return groups


def sqnr_db(got: np.ndarray, ref: np.ndarray, centred: bool = False) -> float:
    """``10 log10(sum ref^2 / sum (got - ref)^2)``: inf when equal, -inf for noise on a silent reference.

    ``centred``: the signal is the reference's spread about its mean, ``sum (ref - mean)^2`` (the
    ``regression`` kind): an error of 5% of the landmarks' spread is 13 dB, however far from 0 they lie.
    """
    if not (np.all(np.isfinite(got)) and np.all(np.isfinite(ref))):
        return math.nan
    ref = ref.astype(np.float64)
    scale = float(np.abs(ref).max(initial=0.0)) or 1.0  # scaled first: squares cannot overflow
    centre = float(ref.mean()) if centred and ref.size else 0.0
    signal = float(np.sum(((ref - centre) / scale) ** 2))
    noise = float(np.sum(((got.astype(np.float64) - ref) / scale) ** 2))
    if noise == 0.0:
        return math.inf
    return -math.inf if signal == 0.0 else 10.0 * math.log10(signal / noise)


def range_groups(ref: np.ndarray, axis: int) -> list[list[int]]:
    """The ``regression`` kind's channel groups: channels whose magnitudes (max |ref|) lie within
    :data:`GROUP_RATIO` of each other, adjacent or not (all-zero channels join the smallest group).

    A landmark vector interleaves its quantities, ``x, y, z, x, y, z, ...``: by adjacency every ``z`` would
    cut the pixels into groups of one point each, whose spread over the items is only how far the hand
    moved between crops. By range, the 42 pixel coordinates are one group and the 21 depths another, each
    judged against its own spread."""
    mags = _magnitudes(ref, axis)
    order = [int(i) for i in np.argsort(mags, kind="stable")]
    groups: list[list[int]] = []
    low = 0.0
    for i in order:
        m = float(mags[i])
        if groups and (m == 0 or low == 0 or m <= GROUP_RATIO * low):
            groups[-1].append(i)
            low = low or m
            continue
        groups.append([i])
        low = m
    return [sorted(g) for g in groups]


def _channels_text(channels: list[int]) -> str:
    """``channels 4-21`` or ``42 channels (0, 1, 3, 4, 6, ...)``."""
    if channels == list(range(channels[0], channels[-1] + 1)):
        return f"channel {channels[0]}" if len(channels) == 1 else f"channels {channels[0]}-{channels[-1]}"
    shown = ", ".join(str(c) for c in channels[:5])
    return f"{len(channels)} channels ({shown}{', ...' if len(channels) > 5 else ''})"


def _worst_group(got: np.ndarray, ref: np.ndarray, centred: bool = False
                 ) -> tuple[float, str | None, tuple, tuple[str, float] | None]:  # fmt: skip
    """The worst channel group's SQNR, which group it is (``None`` for a single-group output), the index of
    its slice, and the group that moved most in the output's own units where that is another group (its channels and
    its max abs error; ``None`` where the worst moved most). ``centred`` (the ``regression`` kind): about each group's
    mean, the groups by range (:func:`range_groups`).

    The lowest SQNR can be a nearly constant group's (a pose model's auxiliary values, max 0.41, at -2.1 dB) while
    another group of the same output moved 285 px: the line names both."""
    axis = channel_axis(ref)
    if axis is None:
        return sqnr_db(got, ref, centred), None, (), None
    groups = range_groups(ref, axis) if centred else [list(range(a, b + 1)) for a, b in channel_groups(ref, axis)]
    found = []
    for channels in groups:
        part = (slice(None),) * axis + (np.array(channels),)
        found.append((sqnr_db(got[part], ref[part], centred), channels, part, _max_error(got[part], ref[part])))
    db, channels, part, error = min(found, key=lambda x: (not math.isnan(x[0]), x[0]))
    if len(groups) == 1:
        return db, None, part, None
    _, most, _, moved = max(found, key=lambda x: x[3])
    other = (f"axis {axis}, {_channels_text(most)}", moved) if moved > error else None
    return db, f"axis {axis}, {_channels_text(channels)}", part, other


def _max_error(got: np.ndarray, ref: np.ndarray) -> float:
    """The largest absolute error in the output's units (0 where nothing is finite to compare)."""
    errors = np.abs(got.astype(np.float64) - ref.astype(np.float64))
    errors = errors[np.isfinite(errors)]
    return float(errors.max()) if errors.size else 0.0


def onnx_graph(model: onnx.ModelProto | str | Path) -> onnx.ModelProto:
    """The model, its graph without external weights: what :func:`producers`, :func:`readers` and
    :func:`declared` read (load it once and pass it to each)."""
    import onnx

    return model if isinstance(model, onnx.ModelProto) else onnx.load(str(model), load_external_data=False)


def _opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)


def _axis_text(node: onnx.NodeProto, rank: int, default: int) -> str:
    """``""`` where ``node``'s ``axis`` is the last of ``rank`` axes, else ``"(axis=k)"``."""
    axis = next((a.i for a in node.attribute if a.name == "axis"), default)
    return "" if axis == -1 or (rank and axis == rank - 1) else f"(axis={axis})"


def producers(model: onnx.ModelProto | str | Path) -> dict[str, str]:
    """Output name -> the op that produces it: ``Sigmoid`` (also through reshapes and casts),
    ``Softmax`` or ``LogSoftmax`` (over the last axis; otherwise ``Softmax(axis=k)``), or the op's type."""
    model = onnx_graph(model)
    graph = model.graph
    made = {out: node for node in graph.node for out in node.output}
    found = {}
    for output in graph.output:
        node, rank = made.get(output.name), len(output.type.tensor_type.shape.dim)
        while node is not None and node.op_type in _SHAPE_OPS and node.input and node.input[0] in made:
            source = made[node.input[0]]
            if source.op_type != "Sigmoid" and source.op_type not in _SHAPE_OPS:
                break
            node = source
        if node is None:
            continue
        found[output.name] = "LpNormalization" if _l2_normalized(node, made) else node.op_type
        if node.op_type in DISTRIBUTIONS:
            found[output.name] += _axis_text(node, rank, -1 if _opset(model) >= 13 else 1)
    return found


#: Ops an L2 norm passes through on its way to a Div's denominator (an epsilon kept out, a broadcast).
_NORM_WRAPS = ("Max", "Clip", "Add", "Expand", "Unsqueeze", "Reshape", "Identity", "Cast")


def _l2_normalized(div: onnx.NodeProto, made: Mapping[str, onnx.NodeProto]) -> bool:
    """Whether ``div`` is ``x / norm(x)`` (``F.normalize`` and friends as they export): its denominator is the L2
    norm of its numerator, ``ReduceL2(x)`` or ``Sqrt(ReduceSum(x * x))`` (``ReduceSumSquare``, ``Pow(x, 2)``), through
    an epsilon's Max, Clip or Add and a broadcast. An embedding the graph proves, whatever its values' signs."""
    if div.op_type != "Div" or len(div.input) < 2:
        return False
    node = made.get(div.input[1])
    while node is not None and node.op_type in _NORM_WRAPS and node.input:
        node = made.get(node.input[0])
    if node is not None and node.op_type == "Sqrt" and node.input:
        inner = made.get(node.input[0])
        if inner is None or inner.op_type not in ("ReduceSum", "ReduceSumSquare"):
            return False
        if inner.op_type == "ReduceSum":
            square = made.get(inner.input[0])
            if square is None or not (square.op_type == "Mul" and square.input[0] == square.input[1]
                                      or square.op_type == "Pow"):  # fmt: skip
                return False
            return square.input[0] == div.input[0]
        return inner.input[0] == div.input[0]
    return node is not None and node.op_type == "ReduceL2" and node.input[0] == div.input[0]


#: Ops that read an output's classes inside the graph (its argmax: ArgMax itself, or a Softmax or TopK over it).
_CLASS_READERS = ("ArgMax", "TopK", *DISTRIBUTIONS)


def readers(model: onnx.ModelProto | str | Path) -> dict[str, str]:
    """Output name -> what the graph itself does with the output's values beside returning them (also
    through an Identity or Cast): ``ArgMax`` (or ``ArgMax(axis=k)``) where an ArgMax, a TopK or a Softmax
    reads its classes; ``Sigmoid`` where a Sigmoid turns it into probabilities. Outputs nothing reads are left out."""
    model = onnx_graph(model)
    graph = model.graph
    consumers: dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    found = {}
    for output in graph.output:
        rank, names, seen = len(output.type.tensor_type.shape.dim), [output.name], set()
        while names:
            name = names.pop()
            seen.add(name)
            for node in consumers.get(name, ()):
                if node.op_type in ("Identity", "Cast"):
                    names.extend(o for o in node.output if o not in seen)
                elif node.op_type in _CLASS_READERS and output.name not in found:
                    default = 0 if node.op_type == "ArgMax" else -1 if node.op_type == "TopK" or _opset(model) >= 13 else 1
                    found[output.name] = "ArgMax" + _axis_text(node, rank, default)
                elif node.op_type == "Sigmoid":
                    found.setdefault(output.name, "Sigmoid")
    return found


def declared(model: onnx.ModelProto | str | Path) -> dict[str, Override]:
    """Output name -> the measure the model's own metadata declares for it: ``metadata_props`` key
    :data:`DECLARED_KEY`, ``OUTPUT=MEASURE[:THRESHOLD]`` entries separated by commas (the zoo's
    classifiers declare ``logits=top1``: a Gemm alone cannot prove class logits). The user's
    ``--accuracy`` overrides it.

    Raises:
        ValueError: an entry is not of that form.
    """
    model = onnx_graph(model)
    text = next((p.value for p in model.metadata_props if p.key == DECLARED_KEY), "")
    return dict(parse_override(entry.strip()) for entry in text.split(",") if entry.strip())


@dataclass(frozen=True)
class GraphFacts:
    """What a model's graph says of its outputs (:func:`graph_facts`): the op that makes each (:func:`producers`),
    what the graph does with it (:func:`readers`) and the measure the model declares for it (:func:`declared`).
    Empty for a model that is no ONNX graph (a ``.tflite`` or an IR run as given): kinds then follow from shapes
    and values alone."""

    producers: Mapping[str, str] = field(default_factory=dict)
    readers: Mapping[str, str] = field(default_factory=dict)
    declared: Mapping[str, Override] = field(default_factory=dict)

    def of(self, output: str) -> dict[str, Any]:
        """:func:`compare`'s keyword arguments for one output compared alone (its own declaration only)."""
        return {"producers": self.producers, "readers": self.readers,
                "overrides": {k: v for k, v in self.declared.items() if k == output}}  # fmt: skip


def graph_facts(model: onnx.ModelProto | str | Path) -> GraphFacts:
    """The graph facts of every output, the graph read once without its weights (:func:`onnx_graph`): what the
    harness's worker and the in-house quantizer's judge both read, so that the int8 the quantizer chooses is
    judged by the kinds the harness will judge it by.

    Raises:
        ValueError: the model's declaration is not of ``OUTPUT=MEASURE[:THRESHOLD]`` form (:func:`declared`).
    """
    model = onnx_graph(model)
    return GraphFacts(producers(model), readers(model), declared(model))


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
        return float("nan")
    # Scale by the largest magnitude first so float64 dot products cannot overflow.
    scale = max(float(np.abs(a).max(initial=0.0)), float(np.abs(b).max(initial=0.0)))
    if scale == 0.0:
        return 1.0  # both all zeros: identical
    a, b = a / scale, b / scale
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    if na == 0.0 or nb == 0.0:
        return 0.0
    return float(np.clip(np.dot(a, b) / (na * nb), -1.0, 1.0))


def _with_task_accuracy(
    results: list[OutputAccuracy],
    outputs: Mapping[str, np.ndarray],
    reference: Mapping[str, np.ndarray],
    labels: np.ndarray,
    n: int,
) -> list[OutputAccuracy]:
    labels = np.asarray(labels)
    if len(labels) != n:
        raise ValueError(f"labels have {len(labels)} entries, outputs have {n} samples")
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        return results  # not class ids (boxes, sequences, ...): they are the user's --metric's to score
    for i, r in enumerate(results):
        ref = np.asarray(reference[r.name])
        if _is_classifier(ref):
            task = float(np.mean(np.argmax(outputs[r.name], axis=-1) == labels))
            ref_task = float(np.mean(np.argmax(ref, axis=-1) == labels))
            results = list(results)
            results[i] = replace(r, task_accuracy=task, reference_task_accuracy=ref_task)
            return results
    return results  # class ids, but no classifier-shaped output to score them on: the --metric's to use
