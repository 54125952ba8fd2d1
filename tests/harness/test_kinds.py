"""Issue 25: each output judged by what it means, and the verdicts that must fail do.

The arrays here are synthetic on purpose: they test the verdict function itself (a zeroed channel
group, one flipped token, dropped onsets), each beside the matching case that is fine, with noise at
bf16's relative error (2^-8). The last test runs real reduced precisions on a detector through the harness.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from autodeploy.accuracy import rules
from autodeploy.accuracy.kinds import Override, parse_override
from autodeploy.accuracy.measure import channel_axis, channel_groups, compare, kinds, producers

BF16 = 2.0**-8


def bf16_like(x: np.ndarray, seed: int = 1) -> np.ndarray:
    return (x * (1 + BF16 * np.random.default_rng(seed).standard_normal(x.shape))).astype(np.float32)


def detections(n: int = 8, classes: int = 16, anchors: int = 400, seed: int = 0) -> np.ndarray:
    """[n, 4 + classes, anchors]: box coordinates in pixels (0-320), then sparse class scores (0-1)."""
    rng = np.random.default_rng(seed)
    boxes = rng.uniform(0, 320, (n, 4, anchors))
    scores = 1 / (1 + np.exp(-rng.normal(-4, 2, (n, classes, anchors))))
    return np.concatenate([boxes, scores], axis=1).astype(np.float32)


def test_a_zeroed_class_group_fails_and_is_named_though_the_flattened_cosine_passes():
    ref = detections()
    got = ref.copy()
    got[:, 4:] = 0.0  # every class score gone, the boxes intact
    acc = compare({"output0": got}, {"output0": ref})
    (o,) = acc.outputs
    assert o.cosine > 0.999  # what the old rule judged: a pass
    assert o.kind == "sqnr" and o.channels == "axis 1, channels 4-19" and o.sqnr_db == pytest.approx(0.0)
    assert not acc.passed and acc.constraint == "SQNR >= 17 dB"
    assert rules.worst(acc.outputs) == ("output 'output0', axis 1, channels 4-19: SQNR 0.0 dB, limit 17 dB "
                                          "(max abs error 0.9958, p99 0.6673, in the output's units; kind sqnr taken from its shape "
                                         "[N, 20, 400], no other kind proven: declare another with --accuracy output0=KIND "
                                         "(docs/accuracy.md))")
    assert rules.accuracy_drop(acc) == pytest.approx(0.5)


def test_scores_on_a_coarse_shared_int8_grid_fail_like_ort_static_int8():
    ref = detections()
    step = 320 / 255  # one scale for the whole output: every score becomes 0 or 1.25
    acc = compare({"output0": (np.round(ref / step) * step).astype(np.float32)}, {"output0": ref})
    (o,) = acc.outputs
    assert o.cosine > 0.999 and not acc.passed and o.channels == "axis 1, channels 4-19" and o.sqnr_db < 3


def test_bf16_noise_on_a_detector_passes():
    ref = detections()
    acc = compare({"output0": bf16_like(ref)}, {"output0": ref})
    assert acc.passed and acc.outputs[0].sqnr_db > 40


def test_the_channel_axis_and_groups():
    ref = detections(anchors=400)
    assert channel_axis(ref) == 1 and channel_groups(ref, 1) == [(0, 3), (4, 19)]
    small = detections(anchors=100)  # anchors fit the channel size limit too: the ranges decide
    assert channel_axis(small) == 1
    assert channel_axis(np.zeros((2, 3, 8, 8))) == 1 and channel_axis(np.zeros((2, 1, 8, 8))) is None
    assert channel_axis(np.transpose(ref, (0, 2, 1))[:, :1000]) == 2  # [N, anchors, 4 + C]
    zeros = np.ones((1, 4, 5))
    zeros[:, 1] = 0  # an all-zero channel joins the group it is in
    assert channel_groups(zeros, 1) == [(0, 3)]


def yolox(n: int = 8, anchors: int = 3549, seed: int = 0) -> np.ndarray:
    """[n, anchors, 6] as ddddocr's YOLOX ``common_det.onnx`` gives it: raw box offsets and log-sizes
    (-2 to 2.7), then objectness and one class score (0 to 1): every channel within 10x of the others."""
    rng = np.random.default_rng(seed)
    boxes = np.clip(rng.normal(0.2, 0.7, (n, anchors, 4)), -2.0, 2.7)
    scores = 1 / (1 + np.exp(-rng.normal(-5, 2.5, (n, anchors, 2))))
    return np.concatenate([boxes, scores], axis=2).astype(np.float32)


def test_probability_channels_never_share_a_group_with_signed_ones():
    ref = yolox()
    assert channel_axis(ref) == 2 and channel_groups(ref, 2) == [(0, 3), (4, 5)]
    got = ref.copy()
    got[..., 4:] = 0.0  # the scores gone: 4 of 6 channels intact would hide it in one group
    acc = compare({"output": got}, {"output": ref})
    assert acc.outputs[0].cosine > 0.99 and not acc.passed and acc.outputs[0].channels == "axis 2, channels 4-5"
    assert compare({"output": bf16_like(ref)}, {"output": ref}).passed
    relu = np.abs(ref[..., :4])
    relu[..., 1] *= 0.4  # non-negative features, one channel inside [0, 1]: no probabilities beside signed ones
    assert channel_groups(relu, 2) == [(0, 3)]


def yolov8(n: int = 8, classes: int = 18, anchors: int = 2100, seed: int = 0) -> np.ndarray:
    """[n, 4 + classes, anchors] as nudenet's YOLOv8n gives it on photos without people: boxes in pixels
    (0-320), then class scores that stay low and differ by orders of magnitude between classes
    (0.2 on one, 0.0005 on another)."""
    rng = np.random.default_rng(seed)
    boxes = rng.uniform(1, 317, (n, 4, anchors))
    peaks = 10.0 ** rng.uniform(-3.3, -0.7, classes)  # each class's highest score
    scores = peaks[None, :, None] * rng.beta(0.5, 8, (n, classes, anchors))
    return np.concatenate([boxes, scores], axis=1).astype(np.float32)


def test_class_probabilities_of_any_magnitude_are_one_group_beside_the_boxes():
    ref = yolov8()
    assert channel_axis(ref) == 1 and channel_groups(ref, 1) == [(0, 3), (4, 21)]
    assert compare({"output0": bf16_like(ref)}, {"output0": ref}).passed
    got = ref.copy()
    got[:, 4:] += 0.02  # an int8-sized step on every score: the boxes keep 60 dB, the scores do not
    acc = compare({"output0": got}, {"output0": ref})
    assert not acc.passed and acc.outputs[0].channels == "axis 1, channels 4-21"
    signed = ref.copy()
    signed[:, 10] -= 0.5  # a signed channel among them still starts a group of its own
    assert channel_groups(signed, 1) == [(0, 3), (4, 9), (10, 10), (11, 21)]


def speech_embeddings(n: int = 16, dim: int = 96, seed: int = 0) -> np.ndarray:
    """[n, 1, 1, dim] like openwakeword's speech embeddings on espeak-ng speech: a direction shared by
    every window (pairwise cosines 0.6-0.8), norms near 160, values from -50 to 70."""
    rng = np.random.default_rng(seed)
    shared = rng.normal(0, 1, dim)
    vectors = 1.2 * shared + rng.normal(0, 1, (n, dim))
    vectors *= 160 / np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors[:, None, None, :].astype(np.float32)


def test_embeddings_are_judged_row_by_row_so_one_bent_vector_fails():
    ref = speech_embeddings()
    assert kinds({"conv2d_19": ref}) == {"conv2d_19": "embedding"}
    fine = compare({"conv2d_19": bf16_like(ref)}, {"conv2d_19": ref})
    assert fine.passed and fine.outputs[0].row_cosine > 0.9999 and fine.constraint == "worst row cosine >= 0.99"
    got = ref.copy()
    noise = np.random.default_rng(2).normal(0, 1, 96)
    got[5, 0, 0] += 0.25 * noise * np.linalg.norm(ref[5]) / np.linalg.norm(noise)  # one item's vector turned ~14 deg
    acc = compare({"conv2d_19": got}, {"conv2d_19": ref})
    (o,) = acc.outputs
    assert 0.96 < o.row_cosine < 0.98 and not acc.passed
    assert o.cosine > 0.99  # averaged over the 16 items, the old rule passed it
    sqnr = compare({"conv2d_19": got}, {"conv2d_19": ref}, overrides={"conv2d_19": Override("sqnr")})
    assert sqnr.passed  # so does one SQNR over the whole tensor (about 24 dB)
    assert rules.worst(acc.outputs) == ("output 'conv2d_19': worst row cosine 0.9693 (kind embedding taken from its "
                                        "shape [N, 1, 1, 96]: one vector per item: declare another with "
                                        "--accuracy conv2d_19=KIND (docs/accuracy.md))")
    assert rules.accuracy_drop(acc) == pytest.approx(1 - o.row_cosine)


def test_what_is_and_is_not_an_embedding():
    assert kinds({"e": np.linspace(-3, 3, 4 * 8).reshape(4, 1, 1, 8)}) == {"e": "embedding"}
    assert kinds({"p": np.full((4, 1, 1, 8), 0.5)}) == {"p": "decision"}  # probabilities stay decisions
    one = np.linspace(-3, 3, 4 * 30)
    assert kinds({"logits": one.reshape(4, 1, 30)}) == {"logits": "regression"}  # one vector per item
    assert kinds({"classes": one.reshape(4, 30)}) == {"classes": "regression"}  # a vector: classes only if proven
    assert kinds({"classes": one.reshape(4, 30)}, readers={"classes": "ArgMax"}) == {"classes": "top1"}
    assert kinds({"map": np.linspace(-3, 3, 4).reshape(4, 1, 1, 1)}) == {"map": "sqnr"}
    flat = speech_embeddings()[:, 0, 0]  # a sentence embedding [N, D]: class scores to the shape, so by override
    acc = compare({"v": bf16_like(flat)}, {"v": flat}, overrides={"v": Override("embedding")})
    assert acc.outputs[0].kind == "embedding" and acc.passed
    with pytest.raises(ValueError, match="has no vector axis"):
        compare({"v": flat[:, 0]}, {"v": flat[:, 0]}, overrides={"v": Override("embedding")})
    zero, as_embedding = np.zeros((2, 1, 1, 4), np.float32), {"z": Override("embedding")}
    assert compare({"z": zero}, {"z": zero}, overrides=as_embedding).outputs[0].row_cosine == 1.0  # silence kept
    assert compare({"z": zero + 0.1}, {"z": zero}, overrides=as_embedding).outputs[0].row_cosine == 0.0


def test_a_normalized_vector_per_item_is_an_embedding_without_an_override():
    """A sentence or face embedding ends in F.normalize: [N, D] rows of length 1 with signed values. Its
    argmax is no class (top-1 would judge which of 96 near-equal dimensions is largest), its direction is
    what is read: judged row by row, one bent vector fails. Class scores and probabilities stay top-1."""
    flat = speech_embeddings()[:, 0, 0]
    unit = flat / np.linalg.norm(flat, axis=1, keepdims=True)
    assert kinds({"v": unit, "w": unit[:, None, :]}) == {"v": "embedding", "w": "embedding"}
    assert compare({"v": bf16_like(unit)}, {"v": unit}).passed
    bent = unit.copy()
    noise = np.random.default_rng(2).normal(0, 1, unit.shape[1])
    bent[5] += 0.25 * noise / np.linalg.norm(noise)  # one item's vector turned ~14 degrees
    acc = compare({"v": bent}, {"v": unit})
    assert not acc.passed and acc.outputs[0].kind == "embedding" and 0.96 < acc.outputs[0].row_cosine < 0.98
    assert kinds({"flat": flat})["flat"] == "regression"  # not normalized: a vector judged by its error
    confident = np.full((4, 10), 1e-5)
    confident[:, 3] = 1 - 9e-5  # nearly one-hot probabilities: length 1 too, but not signed
    logits = np.linspace(-3, 3, 4 * 10).reshape(4, 10)
    assert kinds({"p": confident, "logits": logits}, {"logits": "Softmax"}) == {"p": "top1", "logits": "top1"}


def test_a_vector_made_by_lp_normalization_is_an_embedding(tmp_path):
    """The op says so too: ReLU features normalized by LpNormalization are unit length but never negative."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 16])
    w = helper.make_tensor("w", TensorProto.FLOAT, [8, 16], np.random.default_rng(0).normal(0, 1, 128).tolist())
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("LpNormalization", ["r"], ["y"], axis=-1, p=2)]  # fmt: skip
    model = helper.make_model(helper.make_graph(nodes, "emb", [x], [y], [w]), opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    import onnxruntime as ort

    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (ref,) = session.run(None, {"x": np.random.default_rng(1).normal(0, 1, (6, 8)).astype(np.float32)})
    assert ref.min() >= 0 and np.allclose(np.linalg.norm(ref, axis=1), 1, atol=1e-5)
    assert producers(model) == {"y": "LpNormalization"}
    assert kinds({"y": ref}, producers(model)) == {"y": "embedding"}
    assert kinds({"y": ref}) == {"y": "regression"}  # the values alone: a vector, no classes proven


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def tokens(n: int = 16, positions: int = 46, vocab: int = 30, seed: int = 0) -> np.ndarray:
    """Logits [n, positions, vocab] with a decided token at each position (a margin of 4 or more)."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(0, 1, (n, positions, vocab))
    ids = rng.integers(0, vocab, (n, positions))
    np.put_along_axis(logits, ids[..., None], 6.0, axis=-1)
    return logits.astype(np.float32)


def test_one_flipped_token_in_one_of_16_items_fails():
    logits = tokens()
    ref = softmax(logits)
    flipped = logits.copy()
    t = int(np.argmax(logits[5, 17]))
    flipped[5, 17, (t + 1) % 30] = 9.0  # one token of one item
    acc = compare({"probs": softmax(flipped)}, {"probs": ref})
    (o,) = acc.outputs
    assert o.kind == "sequence" and o.cosine > 0.99  # the old rule: a pass
    assert o.token_agreement == pytest.approx(1 - 1 / (16 * 46)) and o.sequence_agreement == pytest.approx(15 / 16)
    assert not acc.passed and acc.constraint == "sequence agreement >= 0.99"
    assert rules.worst(acc.outputs).startswith("output 'probs': sequence agreement 0.9375")


def test_bf16_noise_on_a_sequence_and_a_reference_near_tie_pass():
    logits = tokens()
    acc = compare({"probs": softmax(bf16_like(logits))}, {"probs": softmax(logits)})
    assert acc.passed and acc.outputs[0].sequence_agreement == 1.0
    tie = logits.copy()
    tie[2, 3] = 0.0
    tie[2, 3, :2] = (3.0, 2.99)  # the reference itself barely chose token 0 here
    swapped = tie.copy()
    swapped[2, 3, :2] = (2.99, 3.0)
    near = compare({"probs": softmax(swapped)}, {"probs": softmax(tie)})
    assert near.passed and near.outputs[0].token_agreement < 1.0  # reported, not a changed sequence


def test_time_major_ctc_logits_are_judged_by_their_tokens():
    """Raw logits an engine returned ``[T, B, V]`` (ddddocr's CRNN), item-leading here: one changed token
    in one of 16 items fails though the SQNR passes, a reference near-tie does not; batch-major the same
    logits stay ``sqnr`` (hidden states look alike), and ``--accuracy logits=sequence`` still works."""
    logits = tokens(vocab=300)
    flipped = logits.copy()
    t = int(np.argmax(logits[5, 17]))
    flipped[5, 17, (t + 1) % 300] = 7.0  # one token of one item, the logit just past the reference's 6
    assert kinds({"logits": logits}, {"logits": "Reshape"}, time_major={"logits"}) == {"logits": "sequence"}
    acc = compare({"logits": flipped}, {"logits": logits},
                  producers={"logits": "Reshape"}, time_major=["logits"])  # fmt: skip
    (o,) = acc.outputs
    assert o.kind == "sequence" and o.sequence_agreement == pytest.approx(15 / 16)
    assert o.token_agreement == pytest.approx(1 - 1 / (16 * 46)) and not acc.passed
    assert compare({"logits": flipped}, {"logits": logits}).passed  # the old rule: sqnr, a pass
    tie = logits.copy()
    tie[2, 3] = 0.0
    tie[2, 3, :2] = (3.0, 2.99)  # the reference itself barely chose token 0 here
    swapped = tie.copy()
    swapped[2, 3, :2] = (2.99, 3.0)
    near = compare({"logits": swapped}, {"logits": tie}, time_major={"logits"})
    assert near.passed and near.outputs[0].kind == "sequence" and near.outputs[0].token_agreement < 1.0
    assert kinds({"logits": logits}) == {"logits": "sqnr"}  # batch-major raw logits: no fact says tokens
    assert kinds({"h": logits}, {"h": "GRU"}, time_major={"h"}) == {"h": "sqnr"}  # a recurrent state
    by_hand = compare({"logits": flipped}, {"logits": logits}, overrides={"logits": Override("sequence")})
    assert by_hand.outputs[0].kind == "sequence" and not by_hand.passed


def piano_roll(n: int = 4, frames: int = 400, notes: int = 88, seed: int = 0) -> np.ndarray:
    """[n, frames, notes] note probabilities: near 0 mostly, sparse onsets, many of them just above 0.5."""
    rng = np.random.default_rng(seed)
    roll = rng.uniform(0.0, 0.05, (n, frames, notes))
    on = rng.random((n, frames, notes)) < 0.02
    roll[on] = rng.uniform(0.52, 0.99, on.sum())
    return roll.astype(np.float32)


def test_dropped_onsets_in_a_sparse_probability_map_fail():
    ref = piano_roll()
    got = ref.copy()
    weak = (ref > 0.5) & (ref < 0.6)
    got[weak] = 0.48  # the weak onsets fall just under the threshold
    acc = compare({"notes": got}, {"notes": ref})
    (o,) = acc.outputs
    assert o.kind == "decision" and o.decision_threshold == 0.5 and o.cosine > 0.99
    assert o.f1 < 0.95 and not acc.passed and acc.constraint == "F1 at 0.5 >= 0.99"
    fine = compare({"notes": bf16_like(ref)}, {"notes": ref})
    assert fine.passed and fine.outputs[0].f1 > 0.99
    silent = np.zeros_like(ref)
    assert compare({"notes": silent + 0.1}, {"notes": silent}).passed  # no positives on either side


def test_class_score_vectors_keep_top1_even_as_probabilities():
    probs = softmax(tokens(n=100)[:, 0])
    assert kinds({"p": probs}) == {"p": "top1"}
    assert kinds({"ids": np.zeros((4, 3), np.int64)}) == {"ids": "exact"}


def test_producers_are_read_from_the_graph(tmp_path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 5, 7])
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["N", 5, 7]) for n in ("p", "s", "c", "q")]
    graph = helper.make_graph([helper.make_node("Sigmoid", ["x"], ["p0"]), helper.make_node("Identity", ["p0"], ["p"]),
                               helper.make_node("Softmax", ["x"], ["s"], axis=-1),
                               helper.make_node("Softmax", ["x"], ["c"], axis=1),
                               helper.make_node("Relu", ["x"], ["q"])], "g", [x], outs)  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, str(tmp_path / "g.onnx"))
    found = producers(tmp_path / "g.onnx")
    assert found == {"p": "Sigmoid", "s": "Softmax", "c": "Softmax(axis=1)", "q": "Relu"}
    ref = np.random.default_rng(0).normal(size=(2, 5, 7)).astype(np.float32)
    assert kinds({"p": ref, "s": ref, "c": ref, "q": ref}, found) == {
        "p": "decision", "s": "sequence", "c": "cells", "q": "sqnr"}  # c: a class per position along axis 1


def test_overrides_choose_the_measure_and_its_threshold():
    assert parse_override("scores=decision:0.3") == ("scores", Override("decision", 0.3))
    assert parse_override("a=b=sqnr") == ("a=b", Override("sqnr", None))
    for bad in ("scores", "scores=mse", "x=top1:0.5", "x=sqnr:loud", "x=sqnr:nan", "x=sqnr:inf", "x=sqnr:-inf",
                "x=decision:0", "x=decision:1.5", "x=logit:1", "x=cosine:1.01", "x=cosine:-2"):
        with pytest.raises(ValueError, match="--accuracy"):
            parse_override(bad)
    ref = piano_roll()
    got = ref * 0.9  # onsets in 0.52-0.55 fall under 0.5; a 0.3 cut keeps every decision
    assert not compare({"n": got}, {"n": ref}).passed
    assert compare({"n": got}, {"n": ref}, overrides={"n": Override("decision", 0.3)}).passed
    loose = compare({"n": got}, {"n": ref}, overrides={"n": Override("sqnr", 15.0)})
    assert loose.passed and loose.constraint == "SQNR >= 15 dB" and loose.outputs[0].sqnr_db == pytest.approx(20, abs=0.5)
    with pytest.raises(ValueError, match="does not have"):
        compare({"n": got}, {"n": ref}, overrides={"m": Override("sqnr")})


@pytest.fixture(scope="module")
def detector_run(tmp_path_factory):
    """The detector of tests/models.py on crops of real photos, through the harness's workers."""
    from autodeploy.data import Dataset
    from autodeploy.harness.run import HarnessSettings, prepare_data
    from autodeploy.harness.timing import TimingPolicy
    from autodeploy.images import sample_crops
    from autodeploy.model import load_model
    from tests.models import detector

    pytest.importorskip("sklearn", reason="scikit-learn (the dev extras) gives the photos")
    folder = tmp_path_factory.mktemp("detector")
    model = load_model(detector(folder / "det.onnx"))
    crops = sample_crops(32, 32, 32).astype(np.float32).transpose(0, 3, 1, 2) / 255
    quick = TimingPolicy(warmup_min_calls=2, warmup_max_s=0.5, min_samples=5, min_duration_s=0.05, max_duration_s=0.5)
    settings = HarnessSettings(workdir=folder / "work", policy=quick, timeout_s=120, calibration_items=16,
                               evaluation_items=16)  # fmt: skip
    return model, settings, prepare_data(model, settings, data=Dataset({"x": np.ascontiguousarray(crops)}))


@pytest.mark.parametrize(("engine", "precision", "knobs"), [
    ("onnxruntime", "fp32", {}), ("openvino", "bf16", {}),
    ("onnxruntime", "int8", {"quant_method": "dynamic"}),  # Concat's output stays float
    ("onnxruntime", "int8", {"quant_method": "static"}),  # the head (after the last MatMul) stays float: 35 dB
    # QDQ after Concat too: one scale, 320 / 255, for pixels and scores
    ("onnxruntime", "int8", {"quant_method": "static", "quant_head": "int8"}),
])  # fmt: skip
def test_a_detector_through_the_harness_static_int8_fails_naming_the_class_channels(detector_run, engine,
                                                                                     precision, knobs):
    from autodeploy.adapters import registry
    from autodeploy.adapters.base import TrialConfig
    from autodeploy.device import probe_device
    from autodeploy.harness.run import run_trial
    from autodeploy.search.space import unsupported_reason

    model, settings, data = detector_run
    method = "int8 head" if knobs.get("quant_head") == "int8" else knobs.get("quant_method")
    config = TrialConfig(engine, precision, batch=1, threads=1, knobs=knobs)
    availability = registry.get(engine).probe(probe_device())
    reason = None if availability.available else str(availability)
    reason = reason or unsupported_reason(config, probe_device(), model)
    if reason:
        pytest.skip(reason)
    result = run_trial(model, config, data, settings)
    (o,) = result.accuracy.outputs
    assert o.kind == "sqnr" and o.cosine > 0.99  # the flattened cosine the old rule passed
    if method == "int8 head":  # measured: class scores at 2.5 dB, flattened cosine 0.99999
        assert result.failure_kind == "inaccurate" and o.channels == "axis 1, channels 4-11" and o.sqnr_db < 10
        assert "output 'output0', axis 1, channels 4-11: SQNR" in result.failure_message
    else:  # measured: fp32 identical, bf16, dynamic int8 and static int8 with a float head above 30 dB
        assert result.ok, result.failure_message
        assert o.sqnr_db > 25
