"""Issue 36: a kind is proven from the graph, and each kind's rule holds on what it must fail and pass.

Synthetic outputs test the rules themselves (each failing case beside the matching fine one, with noise at
bf16's relative error, 2^-8); small ONNX graphs test what the graph proves (``producers``, ``readers``,
``declared``). The real families (MTCNN's landmarks and probability map, magika) are in ``tests/realmodels``.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from autodeploy import verdict, zoo
from autodeploy.accuracy import rules
from autodeploy.accuracy.kinds import DECLARED_KEY, Override
from autodeploy.accuracy.measure import compare, declared, kinds, producers, readers
from autodeploy.objectives import of as objective_of

BF16 = 2.0**-8


def bf16_like(x: np.ndarray, seed: int = 1) -> np.ndarray:
    return (x * (1 + BF16 * np.random.default_rng(seed).standard_normal(x.shape))).astype(np.float32)


def hand_landmarks(n: int = 16, seed: int = 0) -> np.ndarray:
    """[n, 63]: 21 points x (x, y, z) as a hand-landmark head gives them in a 224 px crop: a hand of
    60-120 px somewhere in the crop, depth in pixels about the wrist (+-25), interleaved x, y, z."""
    rng = np.random.default_rng(seed)
    template = rng.normal(0, 0.5, (21, 2))
    out = np.empty((n, 21, 3))
    for i in range(n):
        centre, scale = rng.uniform(80, 144, 2), rng.uniform(60, 120)
        out[i, :, :2] = centre + scale * template
        out[i, :, 2] = rng.normal(0, 10, 21)
    return out.reshape(n, 63).astype(np.float32)


LINEAR = {"landmarks": "Gemm"}


def test_a_landmark_vector_from_a_linear_head_is_a_regression_judged_in_its_own_units():
    ref = hand_landmarks()
    assert kinds({"landmarks": ref}, LINEAR) == {"landmarks": "regression"}
    assert compare({"landmarks": bf16_like(ref)}, {"landmarks": ref}, producers=LINEAR).passed  # bf16 rounding
    shifted = ref.copy()
    points = shifted.reshape(len(ref), 21, 3)
    points[..., :2] += 0.05 * (ref.max() - ref.min())  # every point moved by 5% of the output's range
    acc = compare({"landmarks": shifted}, {"landmarks": ref}, producers=LINEAR)
    (o,) = acc.outputs
    assert not acc.passed and o.kind == "regression" and o.sqnr_db < 17
    assert o.error_max_abs == pytest.approx(0.05 * (ref.max() - ref.min()), rel=1e-4)
    line = rules.worst(acc.outputs)
    assert line.startswith("output 'landmarks'") and "error SNR" in line and "max abs error" in line
    assert f"{o.error_max_abs:.4g}" in line  # the error in pixels, readable


def test_an_argmax_flip_among_coordinates_neither_passes_nor_rejects_a_landmark_vector():
    """The old rule: top-1 over coordinates. bf16 flips which coordinate is largest (a tie between two
    fingertips' x) and must pass; int8-sized errors keep the argmax and must fail."""
    ref = hand_landmarks()
    top = np.argmax(ref, axis=1)
    tied = ref.copy()
    tied[np.arange(len(ref)), (top + 3) % 63] = ref.max(axis=1) - 0.01  # a near-tie in every item
    flipped = bf16_like(tied)
    flipped[np.arange(len(ref)), (top + 3) % 63] = ref.max(axis=1) + 0.01  # bf16-sized nudge: argmax moves
    ok = compare({"landmarks": flipped}, {"landmarks": tied}, producers=LINEAR)
    assert ok.passed and ok.outputs[0].top1_agreement < 0.9  # the old rule failed it
    noisy = ref + np.random.default_rng(3).normal(0, 12, ref.shape).astype(np.float32)  # 12 px errors
    noisy[np.arange(len(ref)), top] = ref.max(axis=1) + 50  # the argmax kept
    bad = compare({"landmarks": noisy}, {"landmarks": ref}, producers=LINEAR)
    assert not bad.passed and bad.outputs[0].top1_agreement == 1.0


def test_a_failing_regression_whose_argmax_agrees_is_never_told_to_try_top1():
    """A weaker judge that would pass it is never suggested (a box regressor 2.35 px off would ship as "top1"):
    the line says what the kind was taken from and how to declare another."""
    rng = np.random.default_rng(0)
    ref = rng.normal(0, 3, (32, 10)).astype(np.float32)
    ref[np.arange(32), rng.integers(0, 10, 32)] += 20  # decided classes
    got = ref + rng.normal(0, 1.5, ref.shape).astype(np.float32)  # int8-sized logit noise, classes kept
    acc = compare({"logits": got}, {"logits": ref}, producers={"logits": "Gemm"})
    assert not acc.passed and acc.outputs[0].kind == "regression"
    (rejection,) = verdict.rejections(verdict.Measured(1.0, rules.accuracy_drop(acc)), verdict.Limits(), objective_of("latency"), acc)
    assert "=top1" not in rejection.reason and "argmax agrees" not in rejection.reason
    assert "kind regression taken from its shape [N, 10] and a linear head (Gemm)" in rejection.reason
    assert "declare another with --accuracy logits=KIND" in rejection.reason
    assert compare({"logits": got}, {"logits": ref}, overrides={"logits": Override("top1")}).passed


def segmentation(n: int = 4, size: int = 24, seed: int = 0) -> np.ndarray:
    """[n, size, size, 2]: a 2-class softmax map (background, person) with one blob of foreground per item."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[:size, :size]
    logits = np.empty((n, size, size, 2))
    for i in range(n):
        cy, cx, r = rng.uniform(6, size - 6, 2).tolist() + [rng.uniform(4, 8)]
        margin = r - np.hypot(yy - cy, xx - cx)  # > 0 inside the blob
        logits[i, ..., 0], logits[i, ..., 1] = -margin, margin
    e = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)).astype(np.float32)


def test_a_probability_map_is_judged_cell_by_cell_not_as_a_sequence():
    ref = segmentation()
    assert kinds({"mask": ref}, {"mask": "Softmax"}) == {"mask": "cells"}
    assert kinds({"mask": ref}) == {"mask": "cells"}  # rows that sum to 1 on a map: the values say so too
    nchw = np.ascontiguousarray(ref.transpose(0, 3, 1, 2))
    assert kinds({"mask": nchw}, {"mask": "Softmax(axis=1)"}) == {"mask": "cells"}
    almost = ref.copy()
    cells = np.argwhere(np.abs(ref[..., 1] - 0.5) < 0.3)[:2]  # two boundary cells flip: 99.9% agree
    for i, y, x in cells:
        almost[i, y, x] = almost[i, y, x, ::-1]
    acc = compare({"mask": almost}, {"mask": ref}, producers={"mask": "Softmax"})
    (o,) = acc.outputs
    assert o.kind == "cells" and 0.999 <= o.cell_agreement < 1 and acc.passed
    as_sequence = compare({"mask": almost}, {"mask": ref}, overrides={"mask": Override("sequence")})
    assert not as_sequence.passed  # what the old rule did: whole-map equality, 2 of 4 items "changed"
    region = ref.copy()
    region[:, 2:8, 2:8] = region[:, 2:8, 2:8, ::-1]  # a flipped 6x6 region: 6% of the cells
    bad = compare({"mask": region}, {"mask": ref}, producers={"mask": "Softmax"})
    assert not bad.passed and bad.outputs[0].cell_agreement < 0.95
    assert rules.worst(bad.outputs).startswith("output 'mask': worst class F1 of cells 0.84")
    assert "(class 1; cells unchanged 0.93" in rules.worst(bad.outputs)
    nchw_region = np.ascontiguousarray(region.transpose(0, 3, 1, 2))
    across = compare({"mask": nchw_region}, {"mask": nchw}, producers={"mask": "Softmax(axis=1)"})
    assert across.outputs[0].cell_agreement == pytest.approx(bad.outputs[0].cell_agreement)


def test_a_token_sequence_stays_a_sequence():
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 1, (4, 20, 40))
    e = np.exp(logits)
    assert kinds({"text": e / e.sum(-1, keepdims=True)}) == {"text": "sequence"}
    assert kinds({"text": logits}, {"text": "Softmax"}) == {"text": "sequence"}
    assert kinds({"text": logits[:, :, None, :]}, {"text": "Softmax"}) == {"text": "sequence"}  # [N, T, 1, V]


def score_logits(n: int = 8, anchors: int = 896, seed: int = 0) -> np.ndarray:
    """[n, anchors, 1] raw face scores as BlazeFace's ``classificators`` gives them: background far below
    zero (down to thousands), a few faces above it."""
    rng = np.random.default_rng(seed)
    out = -np.abs(rng.lognormal(2.5, 1.2, (n, anchors, 1)))
    out[:, :6] = rng.uniform(1, 6, (n, 6, 1))
    return out.astype(np.float32)


def test_score_logits_fail_sqnr_on_values_nobody_reads_and_the_line_says_how_to_declare_them():
    ref = score_logits()
    rng = np.random.default_rng(1)
    got = ref.copy()
    deep = ref < -20
    got[deep] += rng.normal(0, 0.6, deep.sum()) * np.abs(ref[deep])  # the far background moves a lot, stays negative
    got = np.minimum(got, np.where(ref < 0, -0.1, np.inf)).astype(np.float32)
    acc = compare({"classificators": got}, {"classificators": ref}, producers={"classificators": "Concat"})
    (o,) = acc.outputs
    assert o.kind == "sqnr" and not acc.passed and o.logit_f1 == 1.0
    line = verdict.rejections(verdict.Measured(1.0, rules.accuracy_drop(acc)), verdict.Limits(), objective_of("latency"), acc)[0]
    assert "=logit" not in line.reason  # a weaker judge is never suggested by name for an output that failed
    assert "declare another with --accuracy classificators=KIND" in line.reason
    as_logits = compare({"classificators": got}, {"classificators": ref}, overrides={"classificators": Override("logit")})
    assert as_logits.passed and as_logits.constraint == "F1 after a sigmoid at 0.5 >= 0.99"
    lost = got.copy()
    lost[:, :6] = -1.0  # every face gone
    broken = compare({"classificators": lost}, {"classificators": ref}, overrides={"classificators": Override("logit")})
    assert not broken.passed and broken.outputs[0].f1 == 0.0
    line = rules.worst(compare({"classificators": lost}, {"classificators": ref}).outputs)
    assert "=logit" not in line and "F1 of its positives (> 0: a sigmoid's 0.5) 0.0000" in line


def test_a_logit_threshold_is_a_probability():
    ref = score_logits()
    got = ref.copy()
    got[:, :6] = 0.5  # sigmoid 0.62: over a 0.5 cut, under a 0.7 cut
    assert compare({"s": got}, {"s": ref}, overrides={"s": Override("logit", 0.5)}).passed
    assert not compare({"s": got}, {"s": ref}, overrides={"s": Override("logit", 0.7)}).passed


def test_sigmoid_vectors_are_decisions_and_unit_range_linear_vectors_are_not():
    rng = np.random.default_rng(0)
    probs = rng.uniform(0, 1, (8, 5)).astype(np.float32)
    assert kinds({"p": probs}, {"p": "Sigmoid"}) == {"p": "decision"}  # multi-label probabilities
    assert kinds({"p": probs}, {"p": "Gemm"}) == {"p": "regression"}  # normalized coordinates from a Gemm
    assert kinds({"p": probs}) == {"p": "regression"}  # nothing proves probabilities: the stricter measure
    assert kinds({"p": probs[:, :1]}) == {"p": "decision"}  # one probability per item (silero-vad's [N, 1])


def _model(nodes, outputs, metadata=None) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4, 6])
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["N", 4, 6]) for n in outputs]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], outs), opset_imports=[helper.make_opsetid("", 17)])
    for key, value in (metadata or {}).items():
        model.metadata_props.add(key=key, value=value)
    onnx.checker.check_model(model)
    return model


def test_readers_are_what_the_graph_does_with_an_output():
    model = _model([helper.make_node("Relu", ["x"], ["logits"]), helper.make_node("ArgMax", ["logits"], ["ids"], axis=-1),
                    helper.make_node("Relu", ["x"], ["raw"]), helper.make_node("Identity", ["raw"], ["raw2"]),
                    helper.make_node("Sigmoid", ["raw2"], ["probs"]),
                    helper.make_node("Relu", ["x"], ["seg"]), helper.make_node("ArgMax", ["seg"], ["mask"], axis=1),
                    helper.make_node("Relu", ["x"], ["lone"])],
                   ["logits", "ids", "raw", "probs", "seg", "mask", "lone"])  # fmt: skip
    found = readers(model)
    assert found == {"logits": "ArgMax", "raw": "Sigmoid", "seg": "ArgMax(axis=1)"}
    ref = np.random.default_rng(0).normal(size=(2, 4, 6)).astype(np.float32)
    made = producers(model)
    assert kinds({"logits": ref, "raw": ref, "seg": ref, "lone": ref}, made, readers=found) == {
        "logits": "sequence", "raw": "logit", "seg": "cells", "lone": "sqnr"}
    assert kinds({"logits": ref[:, 0]}, made, readers=found) == {"logits": "top1"}


def test_producers_read_log_softmax_and_its_axis():
    model = _model([helper.make_node("LogSoftmax", ["x"], ["a"], axis=-1), helper.make_node("LogSoftmax", ["x"], ["b"], axis=1)],
                   ["a", "b"])  # fmt: skip
    assert producers(model) == {"a": "LogSoftmax", "b": "LogSoftmax(axis=1)"}


def test_a_model_declares_its_measures_in_its_metadata():
    model = _model([helper.make_node("Relu", ["x"], ["y"])], ["y"], {DECLARED_KEY: "y=top1, y2=decision:0.3"})
    assert declared(model) == {"y": Override("top1"), "y2": Override("decision", 0.3)}
    assert declared(_model([helper.make_node("Relu", ["x"], ["y"])], ["y"])) == {}
    with pytest.raises(ValueError, match="--accuracy"):
        declared(_model([helper.make_node("Relu", ["x"], ["y"])], ["y"], {DECLARED_KEY: "y=mse"}))


def test_the_zoo_classifiers_declare_their_logits(tmp_path):
    path = zoo.get("tiny-cnn", cache_dir=tmp_path)
    assert declared(path) == {"logits": Override("top1")}
    assert producers(path) == {"logits": "Gemm"}  # what the graph alone says: a linear head


def test_a_raw_logit_map_failing_sqnr_with_its_cells_agreeing_is_not_told_to_try_cells():
    """MTCNN P-Net without its Softmax: a [N, H, W, 2] map of raw class logits, nothing in the graph says so."""
    probs = segmentation()
    logits = np.log(probs).astype(np.float32)
    got = logits + np.random.default_rng(4).normal(0, 0.4, logits.shape).astype(np.float32) * np.abs(logits)
    got[np.argmax(got, -1) != np.argmax(logits, -1)] = logits[np.argmax(got, -1) != np.argmax(logits, -1)]
    acc = compare({"map": got}, {"map": logits}, producers={"map": "Transpose"})
    (o,) = acc.outputs
    assert o.kind == "sqnr" and not acc.passed and o.cell_agreement == 1.0
    assert "=cells" not in rules.worst(acc.outputs) and "--accuracy map=KIND" in rules.worst(acc.outputs)
    assert compare({"map": got}, {"map": logits}, overrides={"map": Override("cells")}).passed


def test_near_ties_are_forgiven_only_where_the_reference_decides_most_items():
    """A flip where the reference hesitated is no change; but on inputs where it decides nothing (an untrained
    model, noise), that rule would pass any output: there every flip counts."""
    rng = np.random.default_rng(0)
    flat = rng.normal(0, 0.1, (16, 10)).astype(np.float32)  # softmax leads of a few hundredths: nothing decided
    rolled = np.roll(flat, 1, axis=1)  # every argmax moved: a broken head
    acc = compare({"logits": rolled}, {"logits": flat}, readers={"logits": "ArgMax"})
    assert not acc.passed and acc.outputs[0].decided_agreement == acc.outputs[0].top1_agreement < 0.2
    decided = flat.copy()
    decided[np.arange(16), np.argmax(flat, axis=1)] += 4.0  # every item decided ...
    decided[0] = flat[0]  # ... but one
    one_tie = decided.copy()
    second = np.argsort(flat[0])[-2]
    one_tie[0, second] = flat[0].max() + 0.01  # that one flips to its runner-up
    ok = compare({"logits": one_tie}, {"logits": decided}, readers={"logits": "ArgMax"})
    assert ok.passed and ok.outputs[0].decided_agreement == 1.0 and ok.outputs[0].top1_agreement == 15 / 16


def test_per_position_logits_of_a_linear_head_are_also_bound_by_their_argmax():
    """Symptom 4: a tagger's ``[N, 64, 15]`` logits from a MatMul (the caller takes the argmax; no Softmax proves it)
    stay ``sqnr``, but where the reference decides, its argmax per position is a second bound: noise that keeps the
    SQNR over its limit and changes one tag in twenty fails, naming ``--accuracy NAME=sequence``; small noise passes."""
    rng = np.random.default_rng(0)
    tags = rng.integers(0, 15, (48, 64))
    ref = rng.normal(0, 1, (48, 64, 15)).astype(np.float32)
    ref[np.arange(48)[:, None], np.arange(64)[None], tags] += 12.0  # decided tags, the spread the SQNR measures
    acc = compare({"tags": ref + rng.normal(0, 0.02, ref.shape).astype(np.float32)}, {"tags": ref},
                  producers={"tags": "Add"})  # fmt: skip
    (o,) = acc.outputs
    assert o.kind == "sqnr" and acc.passed and o.decided_agreement == 1.0
    assert "argmax per position agreement where decided >= 0.99" in acc.constraint
    swapped = ref.copy()
    flip = rng.random((48, 64)) < 0.02
    i, t = np.nonzero(flip)
    swapped[i, t, tags[i, t]] -= 6.5  # the next tag now leads by 1: two in a hundred tags change
    swapped[i, t, (tags[i, t] + 1) % 15] += 6.5
    bad = compare({"tags": swapped}, {"tags": ref}, producers={"tags": "Add"})
    (o,) = bad.outputs
    assert o.sqnr_db > 17  # what judged it before: a pass
    assert not bad.passed and o.decided_agreement < 0.99
    assert "--accuracy tags=sequence" in rules.worst(bad.outputs)
    hidden = compare({"h": swapped}, {"h": ref}, producers={"h": "Transpose"})  # not a linear head: SQNR alone
    assert hidden.outputs[0].decided_agreement is None


def test_a_regressor_beside_scores_on_the_same_anchors_is_judged_where_they_pass():
    from autodeploy.accuracy.measure import anchor_pairs, facts

    rng = np.random.default_rng(0)
    boxes = rng.normal(0, 40, (4, 300, 8)).astype(np.float32)
    scores = score_logits(4, 300)
    ref = {"boxes": boxes, "scores": scores}
    found = {k: facts(v) for k, v in ref.items()}
    assert anchor_pairs(found) == {"boxes": "scores"}
    assert kinds(ref) == {"boxes": "regression", "scores": "logit"}
    assert anchor_pairs(found, {"boxes"}) == {}  # the user's declaration keeps its kind
    two = {**found, "more": facts(score_logits(4, 300, seed=1))}
    assert anchor_pairs(two) == {}  # two score heads on those anchors: which reads which boxes is not known
    assert anchor_pairs({"x": facts(boxes[:, :50])}) == {}  # 50 positions are no anchors
    background = boxes.copy()
    background[scores[..., 0] <= 0] *= 3  # every box no score passes moved: never read
    acc = compare({"boxes": background, "scores": scores}, ref)
    assert acc.passed and "anchors where 'scores' passes" in acc.outputs[0].channels
    nothing = {"boxes": boxes, "scores": np.full_like(scores, -5.0)}
    quiet = compare({"boxes": background, "scores": nothing["scores"]}, nothing)
    assert quiet.outputs[0].sqnr_db == np.inf and quiet.passed  # no anchor passes: nothing of the boxes is read


def test_a_map_of_rare_positive_logits_is_also_bound_by_its_positives():
    """A heatmap's or a mask's logits (no Sigmoid in the graph; far negative background, a few cells above 0): the
    background sets the SQNR, so a lost blob hides in it. Where the values look so, the F1 of the positives (> 0) is
    a bound beside the SQNR; a map of other values (signed offsets about 0) has none."""
    from autodeploy.accuracy.measure import rare_logits

    rng = np.random.default_rng(0)
    heat = rng.uniform(-60, -5, (8, 32, 32, 3)).astype(np.float32)
    heat[:, 10:14, 10:14, 1] = rng.uniform(1, 6, (8, 4, 4))  # one blob per item
    assert rare_logits(heat) and not rare_logits(rng.normal(0, 1, heat.shape))
    gone = heat.copy()
    gone[:2, 10:14, 10:14, 1] = -1.0  # two items lose their blob: the SQNR barely moves
    acc = compare({"heat": gone}, {"heat": heat})
    (o,) = acc.outputs
    assert o.kind == "sqnr" and o.sqnr_db > 17 and not acc.passed and o.positives_f1 < 0.9
    assert "F1 of its positives (> 0) >= 0.99" in acc.constraint
    assert compare({"heat": bf16_like(heat)}, {"heat": heat}).passed


def _peaks(frames: int, bins: int, centres: np.ndarray, width: float = 1.5) -> np.ndarray:
    """[1, frames, bins]: a Gaussian bump per frame at ``centres`` (in bins, fractional), peak 0.9: a pitch salience."""
    at = np.arange(bins)[None, :]
    return (0.9 * np.exp(-0.5 * ((at - centres[:, None]) / width) ** 2))[None].astype(np.float32)


def test_ordered_bins_are_judged_by_the_value_they_decode_to():
    from autodeploy.accuracy.kinds import parse_override

    centres = np.linspace(40.0, 200.0, 300)
    ref = _peaks(300, 264, centres)
    bins = {"overrides": {"pitch": parse_override("pitch=bins:0.3")[1]}}
    assert compare({"pitch": bf16_like(ref)}, {"pitch": ref}, **bins).passed
    bent = centres.copy()
    bent[::20] += 0.8  # 5% of the frames 0.8 bin off (27 cents at 3 bins a semitone), every peak above 0.5
    acc = compare({"pitch": _peaks(300, 264, bent)}, {"pitch": ref}, **bins)
    (o,) = acc.outputs
    assert not acc.passed and o.bins_agreement == pytest.approx(0.95) and o.bin_tolerance == 0.3
    assert "decoded bin agreement within 0.3 bins >= 0.99" in acc.constraint
    unvoiced = ref.copy()
    unvoiced[0, ::20] *= 0.5  # the same frames' confidence lost (peak 0.45), their pitch kept
    assert compare({"pitch": unvoiced}, {"pitch": ref}, **bins).outputs[0].bins_agreement == pytest.approx(0.95)
    # Logits (a classifier over ordered bins) are softmaxed first; nothing confident on either side agrees.
    logits = np.log(ref + 1e-3) * 4
    assert compare({"pitch": logits}, {"pitch": logits}, **bins).outputs[0].bins_agreement == 1.0
    quiet = np.full_like(ref, 0.1)
    assert compare({"pitch": quiet * 1.2}, {"pitch": quiet}, **bins).outputs[0].bins_agreement == 1.0


def test_a_bins_tolerance_is_a_positive_number_of_bins():
    from autodeploy.accuracy.kinds import parse_override

    assert parse_override("pitch=bins")[1].threshold is None  # the default, half a bin
    with pytest.raises(ValueError, match="a bins tolerance is a number of bins above 0"):
        parse_override("pitch=bins:0")
    with pytest.raises(ValueError, match="has no axis of bins"):
        compare({"y": np.ones(4, np.float32)}, {"y": np.ones(4, np.float32)}, overrides={"y": Override("bins")})
