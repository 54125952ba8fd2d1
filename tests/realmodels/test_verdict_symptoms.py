"""The accuracy verdict's symptoms of issue 49, each on a real model of that kind (the held-out mediapipe families,
the corpus's P-Net and speech embedding), against the check a user of that model applies: error in pixels against
the crop, F1 of the minority class, an embedding's direction. Each failed on e2384ec.

Outputs are the model's own (LiteRT fp32 on real photos, ONNX Runtime fp32 on the corpus's inputs); a config's
effect is stood in for by a controlled change to them (a shift, bf16 rounding, flipped cells), so each case sits
plainly on one side of the user's check. ``benchmarks/verdict_agreement.py`` measures the same on real configs.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

from autodeploy.accuracy import kinds, rules
from autodeploy.accuracy.measure import compare, graph_facts
from tests.realmodels.corpus import HELD_OUT, MODELS, RealModel

pytestmark = pytest.mark.slow

ITEMS = 16


def _real(models: tuple[RealModel, ...], name: str, folder: Path) -> Path:
    real = next(m for m in models if m.name == name)
    path = real.extract(folder)
    if isinstance(path, str):
        pytest.skip(path)
    return path


def _litert(path: Path, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """LiteRT fp32 outputs, one item per call (the reference of a ``.tflite``), stacked item-leading."""
    interpreter = pytest.importorskip("ai_edge_litert.interpreter").Interpreter(model_path=str(path))
    interpreter.allocate_tensors()
    ins = {d["name"]: d["index"] for d in interpreter.get_input_details()}
    outs = {d["name"]: d["index"] for d in interpreter.get_output_details()}
    (name, items), = feeds.items()
    rows: dict[str, list[np.ndarray]] = {k: [] for k in outs}
    for item in items:
        interpreter.set_tensor(ins[name], item[None].astype(np.float32))
        interpreter.invoke()
        for k, i in outs.items():
            rows[k].append(interpreter.get_tensor(i)[0].copy())
    return {k: np.stack(v) for k, v in rows.items()}


def _corpus(name: str, photos, corpus_dir) -> tuple[Path, dict[str, np.ndarray]]:
    """A corpus model and its ONNX Runtime fp32 outputs (the reference), one item per call, stacked item-leading."""
    import onnxruntime

    path = _real(MODELS, name, corpus_dir)
    feeds = next(m for m in MODELS if m.name == name).make(photos, ITEMS)
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (feed,) = feeds
    outs = [session.run(None, {feed: x[None]}) for x in feeds[feed]]
    return path, {o.name: np.concatenate([r[i] for r in outs]) for i, o in enumerate(session.get_outputs())}


def _facts_of_tflite(path: Path, folder: Path):
    """The graph facts of a ``.tflite``, read from the ONNX tf2onnx makes of it (as the harness's worker does)."""
    from autodeploy import tflite_onnx

    if tflite_onnx.missing():
        pytest.skip(tflite_onnx.missing())
    onnx_path, _ = tflite_onnx.to_onnx(path, hashlib.sha256(path.read_bytes()).hexdigest(), folder / "tf2onnx")
    return graph_facts(onnx_path)


def _bf16(a: np.ndarray) -> np.ndarray:
    return (a.astype(np.float32).view(np.uint32) + 0x8000 & 0xFFFF0000).view(np.float32)


def _held_out(name: str, photos, corpus_dir) -> tuple[Path, dict[str, np.ndarray]]:
    path = _real(HELD_OUT, name, corpus_dir)
    real = next(m for m in HELD_OUT if m.name == name)
    return path, _litert(path, real.make(photos, ITEMS))


def test_a_tflite_face_mesh_is_judged_in_pixels_not_by_its_direction(photos, corpus_dir):
    """Symptom 1: 468 x (x, y, z) in pixels of 192, shaped ``[N, 1, 1, 1404]``, was judged by row cosine (a vector per
    item): a whole mesh 12 px off passed at cosine 0.999. Its error is now bound against its scale too."""
    path, ref = _held_out("mediapipe-face-landmark", photos, corpus_dir)
    facts = _facts_of_tflite(path, corpus_dir)
    mesh = "conv2d_21"
    assert ref[mesh].shape == (ITEMS, 1, 1, 1404)
    shifted = {**ref, mesh: ref[mesh] + 12.0}  # 6% of the 192 px crop: no user ships it
    acc = compare(shifted, ref, **facts.of(mesh))
    (o,) = [x for x in acc.outputs if x.name == mesh]
    assert o.row_cosine > 0.99  # the direction alone still passes it, as before
    assert not acc.passed and o.error_mean_share > 0.01
    assert "of its scale on average" in rules.worst(acc.outputs)
    point = ref[mesh].copy()
    point[3, 0, 0, 300] += 8.0  # one point 8 px off (4% of the crop), the rest exact
    assert not compare({**ref, mesh: point}, ref, **facts.of(mesh)).passed
    assert compare({k: _bf16(v) for k, v in ref.items()}, ref, **facts.of(mesh)).passed  # bf16 rounding: < 0.5 px


def test_iris_landmarks_are_judged_against_the_crop_not_the_items_spread(photos, corpus_dir):
    """Symptom 2: error SNR about the items' mean passes more easily the more the crops vary. The iris centre 2 px
    off on a 64 px crop (3%) in every item fails; bf16 rounding (hundredths of a pixel) passes."""
    path, ref = _held_out("mediapipe-iris-landmark", photos, corpus_dir)
    facts = _facts_of_tflite(path, corpus_dir)
    iris = "output_iris"
    moved = ref[iris].copy()
    moved[:, 0:2] += 2.0  # the centre's x and y
    acc = compare({**ref, iris: moved}, ref, **facts.of(iris))
    (o,) = [x for x in acc.outputs if x.name == iris]
    assert o.kind == "regression" and not acc.passed
    assert o.error_max_share > 0.02
    assert compare({k: _bf16(v) for k, v in ref.items()}, ref, **facts.of(iris)).passed


def test_a_sparse_face_class_cannot_vanish_inside_the_budget(photos, corpus_dir):
    """Symptom 3: MTCNN P-Net's face map (a Softmax over 2 classes) where faces are a small share of the cells; flipping
    a fifth of the face cells back to background keeps 99% of all cells, and fails by the face class's F1."""
    path, ref = _corpus("mtcnn-pnet", photos, corpus_dir)
    facts = graph_facts(path)
    prob = "softmax"
    faces = np.argwhere(ref[prob][..., 1] > 0.8)
    share = len(faces) / ref[prob][..., 0].size
    assert 0 < share < 0.2, share
    lost = ref[prob].copy()
    for i, y, x in faces[::5]:  # every fifth confident face cell becomes background
        lost[i, y, x] = lost[i, y, x, ::-1]
    acc = compare({**ref, prob: lost}, ref, **facts.of(prob))
    (o,) = [x for x in acc.outputs if x.name == prob]
    assert o.kind == "cells" and o.worst_class == 1 and not acc.passed
    assert o.class_f1 < 0.98 and o.decided_agreement >= 0.99  # the old rule, the share of all cells, passed it
    assert compare({k: _bf16(v) for k, v in ref.items()}, ref, **facts.of(prob)).passed


def test_an_embedding_normalized_after_a_relu_is_proven_by_the_graph(photos, corpus_dir, tmp_path):
    """Symptom 5: ``x / norm(x)`` after a ReLU (no LpNormalization; no negative value for the values to tell a
    direction by) was judged a regression and a good int8 rejected. The graph proves it an embedding."""
    import onnx
    import onnxruntime
    from onnx import TensorProto, helper, numpy_helper

    path = _real(MODELS, "openwakeword-embedding", corpus_dir)
    real = next(m for m in MODELS if m.name == "openwakeword-embedding")
    model = onnx.load(str(path))
    graph, source = model.graph, model.graph.output[0].name
    graph.initializer.append(numpy_helper.from_array(np.array(1e-12, np.float32), "eps"))
    graph.node.extend([helper.make_node("Flatten", [source], ["flat"], axis=1),
                       helper.make_node("Relu", ["flat"], ["positive"]),
                       helper.make_node("Mul", ["positive", "positive"], ["squared"]),
                       helper.make_node("ReduceSum", ["squared"], ["sum"], keepdims=1, axes=[1]),
                       helper.make_node("Sqrt", ["sum"], ["norm"]),
                       helper.make_node("Add", ["norm", "eps"], ["denominator"]),
                       helper.make_node("Div", ["positive", "denominator"], ["speaker"])])  # fmt: skip
    graph.output[0].CopyFrom(helper.make_tensor_value_info("speaker", TensorProto.FLOAT, [None, 96]))
    if model.opset_import[0].version >= 13:  # ReduceSum takes its axes as an input from opset 13
        graph.initializer.append(numpy_helper.from_array(np.array([1], np.int64), "axes"))
        graph.node[-4].CopyFrom(helper.make_node("ReduceSum", ["squared", "axes"], ["sum"], keepdims=1))
    edited = tmp_path / "speaker.onnx"
    onnx.save(model, str(edited))
    feeds = real.make(photos, ITEMS)
    session = onnxruntime.InferenceSession(str(edited), providers=["CPUExecutionProvider"])
    (name,) = feeds
    ref = {"speaker": np.concatenate([session.run(None, {name: x[None]})[0] for x in feeds[name]])}
    assert ref["speaker"].min() >= 0 and np.allclose(np.linalg.norm(ref["speaker"], axis=1), 1, atol=1e-4)
    facts = graph_facts(edited)
    assert facts.producers["speaker"] == "LpNormalization"
    rng = np.random.default_rng(0)
    fine = ref["speaker"] + rng.normal(0, 0.004, ref["speaker"].shape).astype(np.float32)  # int8-sized, cosine > 0.99
    fine = np.maximum(fine, 0) / np.linalg.norm(np.maximum(fine, 0), axis=1, keepdims=True)
    acc = compare({"speaker": fine}, ref, **facts.of("speaker"))
    assert acc.outputs[0].kind == "embedding" and acc.passed and acc.outputs[0].proven
    bent = fine.copy()
    bent[2] = np.roll(bent[2], 7)  # one speaker's vector scrambled
    assert not compare({"speaker": bent}, ref, **facts.of("speaker")).passed


def test_a_detectors_boxes_are_judged_where_its_scores_pass(photos, corpus_dir):
    """BlazeFace's ``regressors [N, 896, 16]`` beside ``classificators [N, 896, 1]``: judged over all 896 anchors, an
    error at the few anchors a face passes hid among the background's. Paired on the anchor axis, the boxes are judged
    where the reference's score passes and the scores by the F1 of their decisions."""
    path, ref = _held_out("mediapipe-face-detection", photos, corpus_dir)
    facts = _facts_of_tflite(path, corpus_dir)
    kw = {"producers": facts.producers, "readers": facts.readers}
    boxes, scores = ref["regressors"], ref["classificators"]
    faces = scores[..., 0] > 0
    assert 0 < faces.sum() < 0.05 * faces.size
    moved = boxes.copy()
    moved[faces] += 4.0  # every face's box and keypoints 4 px off (3% of the 128 px input)
    acc = compare({**ref, "regressors": moved}, ref, **kw)
    (o,) = [x for x in acc.outputs if x.name == "regressors"]
    assert o.kind == "regression" and f"at the {int(faces.sum())} anchors" in o.channels and not acc.passed
    (s,) = [x for x in acc.outputs if x.name == "classificators"]
    assert s.kind == "logit" and s.f1 == 1.0
    assert compare({k: _bf16(v) for k, v in ref.items()}, ref, **kw).passed
    lost = scores.copy()
    lost[faces] = -1.0  # every face's score below the cut
    assert not compare({**ref, "classificators": lost}, ref, **kw).passed


def test_a_failing_box_regressor_is_never_told_to_try_a_weaker_judge(photos, corpus_dir):
    """Symptom 6: MTCNN O-Net's box offsets ``[N, 4]`` (shares of the 48 px crop) 2.35 px off in every item failed, and
    the line said "its argmax agrees on 100% of items: ... judge them with --accuracy NAME=top1", which would ship
    it. The line now names the error against the crop and how to declare a kind, never a judge that passes it."""
    path, ref = _corpus("mtcnn-onet", photos, corpus_dir)
    facts = graph_facts(path)
    boxes = "dense_5"
    assert ref[boxes].shape == (ITEMS, 4)
    off = {**ref, boxes: ref[boxes] + 2.35 / 48}
    acc = compare(off, ref, producers=facts.producers, readers=facts.readers)
    (o,) = [x for x in acc.outputs if x.name == boxes]
    assert o.kind == "regression" and not acc.passed and o.top1_agreement == 1.0  # its argmax still agrees
    line = rules.worst([o])
    assert "=top1" not in line and "argmax agrees" not in line
    assert f"declare another with --accuracy {boxes}=KIND" in line and "of its scale on average" in line


def test_a_pitch_salience_declared_bins_is_judged_by_the_pitch_it_decodes_to(photos, corpus_dir):
    """Symptom 5: basic-pitch's contour (a Sigmoid over 264 bins a third of a semitone apart, per frame) judged as
    ``decision`` passes a salience whose decoded pitch moved more than 10 cents on 2% of the voiced frames, because
    its peaks stay above 0.5; and its failure line offered nothing better. Declared ``bins:0.3`` (10 cents), the
    decoded pitch is judged, as the package decodes it (a weighted mean about each frame's peak)."""
    path, ref = _corpus("basic-pitch", photos, corpus_dir)
    facts = graph_facts(path)
    contour = "StatefulPartitionedCall:0"
    salience = ref[contour]
    assert salience.shape[-1] == 264 and (salience.max(-1) > 0.5).sum() > 100  # enough confident (voiced) frames
    noisy = np.clip(salience + np.random.default_rng(0).standard_normal(salience.shape) * 0.01, 0, 1)  # seeded
    moved = {**ref, contour: noisy.astype(np.float32)}
    default = compare(moved, ref, **facts.of(contour))
    (o,) = [x for x in default.outputs if x.name == contour]
    assert o.kind == "decision" and o.f1 >= 0.99  # the decisions at 0.5 hold: it passes as decisions
    assert o.bins_agreement < 0.99  # ... while the decoded pitch moved (reported beside, at half a bin)
    bins = {**facts.of(contour), "overrides": {contour: kinds.Override("bins", 0.3)}}  # --accuracy NAME=bins:0.3
    declared = compare(moved, ref, **bins)
    assert not declared.passed and "decoded bin agreement" in rules.worst(declared.outputs)
    assert compare({k: _bf16(v) for k, v in ref.items()}, ref, **bins).passed  # bf16 rounding: within the budget
    # A failed decision line tells how to judge the decoded value, and gives it.
    whole_bin = {**ref, contour: np.roll(salience, 1, axis=-1)}
    line = rules.worst(compare(whole_bin, ref, **facts.of(contour)).outputs)
    assert f"--accuracy {contour}=bins[:TOLERANCE]" in line and "decoded value agrees at" in line


def test_the_worst_line_names_the_group_that_moved_most_and_every_other_failing_output(photos, corpus_dir):
    """Issue 52 item 10: the ``worst:`` headline named the lowest-dB channel group even when it was nearly constant
    (a pose model's 6 auxiliary values, max 0.41, at -2.1 dB) while x and y of the same output moved 285 px, and named
    one failing output while another (a person mask whose IoU fell to 0.40) went unsaid. Here the iris model's eye
    contours: their depths (the small group, 7 px at most) get noise of half their spread, and one crop's points
    move 20 px (31% of the 64 px crop); the iris itself moves 2 px."""
    path, ref = _held_out("mediapipe-iris-landmark", photos, corpus_dir)
    facts = _facts_of_tflite(path, corpus_dir)
    eyes, iris = "output_eyes_contours_and_brows", "output_iris"
    depths = [c for c in range(ref[eyes].shape[1]) if np.abs(ref[eyes][:, c]).max() < 10]  # the z of each point
    moved = ref[eyes].copy()
    moved[:, depths] += np.random.default_rng(0).normal(0, 0.5 * ref[eyes][:, depths].std(), (ITEMS, len(depths)))
    moved[0, [c for c in range(ref[eyes].shape[1]) if c % 3 != 2]] += 20.0  # one crop's x and y
    shifted = ref[iris].copy()
    shifted[:, 0:2] += 2.0
    acc = compare({eyes: moved, iris: shifted}, ref, producers=facts.producers, readers=facts.readers)
    (o,) = [x for x in acc.outputs if x.name == eyes]
    assert o.error_max_abs < 10 and o.moved_max_abs == pytest.approx(20.0, abs=1e-3), (o.error_max_abs, o.moved_max_abs)
    line = rules.worst(acc.outputs)
    assert line.startswith(f"output {eyes!r}, {o.channels}: error SNR"), line  # the worst group by its SQNR ...
    assert f"moved most: {o.moved_channels}, max abs error 20 in the output's units" in line  # ... and the 20 px
    assert f"also failing: output {iris!r}: error " in line and "of its scale on average" in line, line
    assert rules.worst([x for x in acc.outputs if x.name == iris]).count("also failing") == 0
