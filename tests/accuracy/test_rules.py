"""The accuracy rule (:mod:`autodeploy.accuracy.rules`): each output judged by what it is, the worst one named,
the pass rule and the drop agreeing, the gate's score, and a broken conversion told from a precision's loss."""

from __future__ import annotations

import numpy as np
import pytest

from autodeploy.accuracy.records import Accuracy, AccuracyVerdict, OutputAccuracy, within
from autodeploy.accuracy.rules import accuracy_drop, accuracy_score, accuracy_verdict, conversion_fault, worst
from tests.accuracy.test_measure import compare, flip_argmax, logits


def out(name="y", cosine=1.0, top1=None, task=None, ref_task=None, exact=None) -> OutputAccuracy:
    return OutputAccuracy(name, 0.0, 0.0, cosine, top1, task, ref_task, exact)


def accuracy(*outputs: OutputAccuracy) -> Accuracy:
    return Accuracy(outputs, 100, "", True)


def test_each_output_is_judged_by_what_it_is_and_the_worst_is_named():
    """A classifier by top-1, an embedding beside it by SQNR (issue 14: judged per output; issue 25: SQNR)."""
    decided = logits()
    decided[np.arange(len(decided)), np.argmax(decided, axis=1)] += 3.0  # every class decided: each flip counts
    ref = {"logits": decided, "embedding": logits(classes=1)}
    good = {"logits": flip_argmax(ref["logits"], 2), "embedding": ref["embedding"] * 1.001}
    acc = compare(good, ref)
    assert acc.constraint == "top-1 agreement >= 0.99 and SQNR >= 17 dB" and acc.passed
    assert accuracy_drop(acc) == pytest.approx(0.01)
    bad = compare({**good, "embedding": -ref["embedding"]}, ref)  # noise 4x the signal: -6 dB, a total loss
    assert not bad.passed and accuracy_drop(bad) == pytest.approx(1.0)
    assert worst(bad.outputs) == ("output 'embedding': SQNR -6.0 dB, limit 17 dB "
                                  "(max abs error 4.796, p99 4.651, in the output's units; kind sqnr taken from its "
                                  "shape [N, 1], no other kind proven: declare another with --accuracy embedding=KIND "
                                  "(docs/accuracy.md))")
    assert not compare({**good, "logits": flip_argmax(ref["logits"], 3)}, ref).passed


def test_integer_outputs_are_compared_exactly():
    """Ids have no "close": 1 wrong id in 100 is a 1% drop whatever the ids' values; int [N, T] is no classifier."""
    ids = np.arange(200, dtype=np.int64).reshape(100, 2) % 7
    got = ids.copy()
    got[5, 1] += 1
    acc = compare({"ids": got}, {"ids": ids})
    (o,) = acc.outputs
    assert o.exact_agreement == pytest.approx(0.995) and o.top1_agreement is None
    assert acc.constraint == "exact agreement >= 0.99" and acc.passed
    got[6:9, 0] += 1
    worse = compare({"ids": got}, {"ids": ids})
    assert not worse.passed and worst(worse.outputs) == "output 'ids': exact agreement 0.98"


def test_non_classifier_outputs_are_judged_on_cosine():
    v = accuracy_verdict([out(cosine=0.995), out("z", cosine=0.985)])
    assert v == AccuracyVerdict("cosine >= 0.99", False)
    assert accuracy_verdict([out(cosine=0.995)], min_cosine=0.99).passed
    assert accuracy_drop(accuracy(out(cosine=0.995), out("z", cosine=0.985))) == pytest.approx(0.015)


def test_labels_add_the_task_accuracy_drop():
    ref = logits()
    labels = np.argmax(ref, axis=-1)
    acc = compare({"logits": flip_argmax(ref, 2)}, {"logits": ref}, labels=labels)
    assert acc.constraint == "top-1 agreement >= 0.99 and task accuracy drop <= 0.01" and acc.passed
    worse = [out(top1=1.0, task=0.90, ref_task=0.95)]
    assert not accuracy_verdict(worse).passed and accuracy_verdict(worse, max_accuracy_drop=0.05).passed
    assert accuracy_drop(accuracy(*worse)) == pytest.approx(0.05)


@pytest.mark.parametrize("seed", range(20))
def test_the_pass_rule_and_the_drop_agree(seed):
    """With min_cosine = 1 - max_accuracy_drop, compare() passes exactly when accuracy_drop is within the budget."""
    rng = np.random.default_rng(seed)
    outputs = [
        out(f"o{i}", cosine=float(rng.uniform(0.97, 1.0)),
            top1=float(rng.uniform(0.97, 1.0)) if rng.random() < 0.5 else None,
            exact=float(rng.uniform(0.97, 1.0)) if rng.random() < 0.3 else None)
        for i in range(int(rng.integers(1, 4)))
    ]  # fmt: skip
    max_accuracy_drop = float(rng.uniform(0.0, 0.03))
    passed = accuracy_verdict(outputs, max_accuracy_drop=max_accuracy_drop, min_cosine=1 - max_accuracy_drop).passed
    assert passed == within(accuracy_drop(accuracy(*outputs)), max_accuracy_drop)


def test_gate_score_prefers_task_then_top1_then_cosine():
    rows = [{"cosine": 0.9, "top1_agreement": 0.97, "task_accuracy": None}, {"cosine": 0.8}]
    assert accuracy_score(rows) == (0.97, "top-1 agreement vs FP32")
    assert accuracy_score([{"cosine": 0.9, "task_accuracy": 0.5}]) == (0.5, "task accuracy")
    assert accuracy_score([]) == (None, None)
    nan = float("nan")
    assert accuracy_score([{"cosine": 0.9}, {"cosine": nan}]) == (0.0, "cosine vs FP32")
    assert accuracy_score([{"cosine": nan}, {"cosine": 0.9}]) == (0.0, "cosine vs FP32")


def test_a_conversion_fault_is_fp32_losing_ten_times_the_budget():
    """An engine's fp32 at top-1 0.07 is a broken conversion; a reduced precision's loss, or fp32 rounding, is not."""
    assert conversion_fault("fp32", 0.93)
    assert conversion_fault("fp32", 0.10) and not conversion_fault("fp32", 0.099)
    assert not conversion_fault("int8", 0.93) and not conversion_fault("fp16", 0.5)
    assert not conversion_fault("fp32", None)
    assert not conversion_fault("fp32", 0.4, max_accuracy_drop=0.05)  # a 5% budget: fp32 needs 50% lost
