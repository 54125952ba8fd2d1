import numpy as np
import pytest

from autodeploy.accuracy.measure import compare as _compare
from autodeploy.accuracy.records import Accuracy


def compare(outputs, reference, **kw):
    """:func:`autodeploy.accuracy.measure.compare`, the outputs named ``logits`` here being class logits,
    as a graph that reads their argmax proves (a float ``[N, C]`` alone is judged as a regression)."""
    return _compare(outputs, reference, readers={"logits": "ArgMax"}, **kw)


def logits(n: int = 200, classes: int = 10, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, classes)).astype(np.float32)


def flip_argmax(x: np.ndarray, rows: int) -> np.ndarray:
    """Copy of x whose argmax changes in the first ``rows`` rows."""
    y = x.copy()
    for i in range(rows):
        j = (int(np.argmax(y[i])) + 1) % y.shape[1]
        y[i, j] = y[i].max() + 1.0
    return y


def test_identical_outputs_pass():
    ref = {"logits": logits(), "features": logits(classes=1)}
    acc = compare({k: v.copy() for k, v in ref.items()}, ref)
    assert isinstance(acc, Accuracy) and acc.passed and acc.n_samples == 200
    by_name = {o.name: o for o in acc.outputs}
    assert by_name["logits"].cosine == pytest.approx(1.0)
    assert by_name["logits"].max_abs == 0.0 and by_name["logits"].mean_rel == 0.0
    assert by_name["logits"].top1_agreement == 1.0
    assert by_name["features"].top1_agreement is None  # [N, 1] is not a classifier
    assert acc.constraint == "top-1 agreement >= 0.99 and SQNR >= 17 dB"  # per output, by its kind
    assert Accuracy.from_dict(__import__("dataclasses").asdict(acc)) == acc


def test_five_percent_flipped_argmax_fails_top1():
    ref = logits()
    acc = compare({"logits": flip_argmax(ref, 10)}, {"logits": ref})
    assert acc.outputs[0].top1_agreement == pytest.approx(0.95)
    assert not acc.passed


def test_one_percent_flipped_argmax_passes_top1():
    ref = logits()
    acc = compare({"logits": flip_argmax(ref, 2)}, {"logits": ref})
    assert acc.outputs[0].top1_agreement == pytest.approx(0.99) and acc.passed


def test_non_classifier_uses_sqnr_per_channel_and_reports_cosine():
    """Issue 25: a float map is judged per channel group by SQNR; cosine stays a reported column."""
    rng = np.random.default_rng(1)
    ref = rng.normal(size=(8, 3, 16, 16))
    small = compare({"y": ref + 0.01 * rng.normal(size=ref.shape)}, {"y": ref})
    assert small.constraint == "SQNR >= 17 dB" and small.outputs[0].kind == "sqnr"
    assert small.passed and small.outputs[0].cosine > 0.999 and small.outputs[0].sqnr_db == pytest.approx(40, abs=1)
    assert small.outputs[0].max_abs > 0 and 0 < small.outputs[0].mean_rel < 0.05
    big = compare({"y": ref + 0.5 * rng.normal(size=ref.shape)}, {"y": ref})
    assert not big.passed and big.outputs[0].cosine < 0.99 and big.outputs[0].sqnr_db < 17
    assert compare({"y": ref}, {"y": ref}, min_cosine=0.999999).passed


def test_all_zero_outputs_have_cosine_one():
    z = np.zeros((4, 3, 3))
    acc = compare({"y": z}, {"y": z.copy()})
    assert acc.outputs[0].cosine == 1.0 and acc.passed


def test_labels_give_task_accuracy():
    ref = logits(n=100)
    labels = np.argmax(ref, axis=1)
    labels[:20] = (labels[:20] + 1) % 10  # the reference is right on 80 of 100
    out = ref.copy()
    out[50:51] = flip_argmax(ref[50:51], 1)  # one right answer becomes wrong
    acc = compare({"logits": out, "emb": ref[:, :1]}, {"logits": ref, "emb": ref[:, :1]}, labels=labels)
    o = acc.outputs[0]
    assert o.reference_task_accuracy == pytest.approx(0.80)
    assert o.task_accuracy == pytest.approx(0.79) and o.top1_agreement == pytest.approx(0.99)
    assert acc.passed and "task accuracy drop <= 0.01" in acc.constraint


def test_task_accuracy_drop_fails():
    ref = logits(n=100)
    labels = np.argmax(ref, axis=1)
    # 2% of rows change: agreement 0.98 passes a 3% budget, but accuracy drops by 0.02.
    acc = compare({"logits": flip_argmax(ref, 2)}, {"logits": ref}, labels=labels, max_accuracy_drop=0.015)
    assert acc.outputs[0].task_accuracy == pytest.approx(0.98) and not acc.passed
    assert compare({"logits": flip_argmax(ref, 2)}, {"logits": ref}, labels=labels, max_accuracy_drop=0.03).passed


def test_labels_without_a_classifier_are_the_metrics_and_a_wrong_length_raises():
    # Issue 25: labels of a detector (or any output) reach --metric; they failed every trial here before.
    ref = np.zeros((5, 4, 4))
    for labels in (np.zeros(5, dtype=int), np.zeros((5, 4), dtype=np.float32)):
        result = compare({"y": ref}, {"y": ref}, labels=labels)
        assert result.passed and result.outputs[0].task_accuracy is None
    boxes = compare({"l": logits(5)}, {"l": logits(5)}, labels=np.zeros((5, 4), dtype=np.float32))
    assert boxes.outputs[0].task_accuracy is None  # not class ids: no built-in task accuracy
    with pytest.raises(ValueError, match="labels have 3"):
        compare({"l": logits(5)}, {"l": logits(5)}, labels=np.zeros(3, dtype=int))


def test_shape_mismatch_raises_naming_output_and_shapes():
    with pytest.raises(ValueError, match=r"'logits'.*\(4, 10\).*\(5, 10\)"):
        compare({"logits": logits(4)}, {"logits": logits(5)})


def test_name_mismatch_raises():
    with pytest.raises(ValueError, match="output names differ"):
        compare({"a": logits()}, {"b": logits()})


def test_nan_fails():
    ref = logits()
    out = ref.copy()
    out[3, 2] = np.nan
    acc = compare({"logits": out}, {"logits": ref})
    assert np.isnan(acc.outputs[0].cosine) and not acc.passed
    y = np.ones((4, 8))
    bad = y.copy()
    bad[0, 0] = np.inf
    acc = compare({"y": bad[:, :1]}, {"y": y[:, :1]})
    assert np.isnan(acc.outputs[0].cosine) and not acc.passed
