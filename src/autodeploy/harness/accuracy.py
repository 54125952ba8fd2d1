"""Accuracy of an engine's outputs against the ONNX Runtime FP32 reference (DESIGN.md).

Metrics per output, all computed in float64:

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

NaN or inf in either array makes ``cosine`` NaN and fails the constraint. The pass/fail rule
itself is :func:`autodeploy.verdict.accuracy_verdict`; this module only measures.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import numpy as np

from autodeploy.harness.result import Accuracy, OutputAccuracy
from autodeploy.verdict import DEFAULT_MAX_ACCURACY_DROP, DEFAULT_MIN_COSINE, accuracy_verdict

_EPS = 1e-12


def compare(
    outputs: Mapping[str, np.ndarray],
    reference: Mapping[str, np.ndarray],
    *,
    labels: np.ndarray | None = None,
    max_top1_drop: float = DEFAULT_MAX_ACCURACY_DROP,
    min_cosine: float = DEFAULT_MIN_COSINE,
) -> Accuracy:
    """Compare ``outputs`` with ``reference`` and check the accuracy constraint.

    The constraint is :func:`autodeploy.verdict.accuracy_verdict` (DESIGN.md default), per
    output: an integer output's exact agreement and a classifier's top-1 agreement must be
    ``>= 1 - max_top1_drop``, any other output's cosine similarity ``>= min_cosine``; with
    ``labels`` the task accuracy may drop by at most ``max_top1_drop`` from the reference's.
    Non-finite values always fail.

    Args:
        outputs: Output name -> array with a leading sample axis ``N``.
        reference: The same names, shapes and ``N`` from the FP32 reference.
        labels: Optional ``N`` integer class labels; scored against the argmax of the first
            classifier-shaped output (in ``reference`` order).
        max_top1_drop: Allowed top-1 / exact agreement and task-accuracy drop, as a fraction.
        min_cosine: Required cosine similarity of the outputs judged by cosine.

    Raises:
        ValueError: names, shapes or sample counts differ, an output has no sample axis,
            there are no samples, or ``labels`` are given without a classifier-shaped
            output or with the wrong length.
    """
    n = _check_inputs(outputs, reference)
    results = [
        _compare_one(name, np.asarray(outputs[name]), np.asarray(reference[name])) for name in reference
    ]
    if labels is not None:
        results = _with_task_accuracy(results, outputs, reference, labels, n)
    verdict = accuracy_verdict(results, max_drop=max_top1_drop, min_cosine=min_cosine)
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


def _compare_one(name: str, got: np.ndarray, ref: np.ndarray) -> OutputAccuracy:
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
    return OutputAccuracy(
        name=name, max_abs=max_abs, mean_rel=mean_rel, cosine=_cosine(a, b), top1_agreement=top1,
        exact_agreement=exact,
    )


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
    labels = np.asarray(labels).ravel()
    if labels.size != n:
        raise ValueError(f"labels have {labels.size} entries, outputs have {n} samples")
    for i, r in enumerate(results):
        ref = np.asarray(reference[r.name])
        if _is_classifier(ref):
            task = float(np.mean(np.argmax(outputs[r.name], axis=-1) == labels))
            ref_task = float(np.mean(np.argmax(ref, axis=-1) == labels))
            results = list(results)
            results[i] = replace(r, task_accuracy=task, reference_task_accuracy=ref_task)
            return results
    shapes = {k: np.shape(v) for k, v in reference.items()}
    raise ValueError(
        f"labels were given but no output is classifier-shaped [N, classes > 1]; output shapes: {shapes}"
    )
