"""Issue 36 on families the kind rules were not written for: each real output is judged for what it is, bf16
passes, and the same model with a broken head fails.

MTCNN's O-Net returns 5 facial landmarks ``[N, 10]`` and box offsets ``[N, 4]`` from MatMul + Add (regressions,
once judged by the argmax over coordinates) beside a face Softmax; its P-Net a face probability map
``[N, H, W, 2]`` (once judged as a token sequence); magika 214 file-type probabilities made by a Softmax spelt
out as Exp / ReduceSum / Div (rows that are distributions). A broken head is the model with one head's
bias moved: what a bad conversion or a collapsed quantization does to that output.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from autodeploy.accuracy.kinds import Override
from autodeploy.accuracy.measure import compare, kinds, producers, readers
from autodeploy.accuracy.rules import worst
from autodeploy.adapters import registry
from autodeploy.adapters.base import TrialConfig
from autodeploy.device import probe_device
from autodeploy.harness.run import run_trial
from tests.realmodels.corpus import MODELS
from tests.realmodels.test_corpus import ITEMS, _prepare

pytestmark = pytest.mark.slow

BY_NAME = {m.name: m for m in MODELS}


def _ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds), strict=True))


def _with_bias(model: onnx.ModelProto, name: str, change) -> onnx.ModelProto:
    """``model`` with the initializer ``name`` replaced by ``change(values)``."""
    edited = onnx.ModelProto()
    edited.CopyFrom(model)
    (init,) = [i for i in edited.graph.initializer if i.name == name]
    init.CopyFrom(numpy_helper.from_array(change(numpy_helper.to_array(init)).astype(np.float32), name))
    return edited


def _real(name: str, photos, corpus_dir):
    prepared = _prepare(BY_NAME[name], photos, corpus_dir)
    model = onnx.load(str(prepared.model.path))
    feeds = BY_NAME[name].make(photos, ITEMS)
    return prepared, model, feeds, _ort(model, feeds)


def _bf16(prepared):
    engine = registry.get("openvino")
    if not engine.probe(probe_device()).available or "bf16" not in engine.space(probe_device(), prepared.model).precisions:
        pytest.skip("OpenVINO bf16 needs a CPU with AVX-512 BF16 or AMX and the [openvino] extra")
    return run_trial(prepared.model, TrialConfig("openvino", "bf16", batch=1, threads=1), prepared.data, prepared.settings)


@pytest.mark.parametrize(("name", "expected"), [
    ("mtcnn-onet", {"dense_5": "regression", "dense_6": "regression", "softmax_2": "top1"}),
    ("mtcnn-pnet", {"conv2d_4": "sqnr", "softmax": "cells"}),
    ("mtcnn-pnet-logits", {"conv2d_4": "sqnr", "push_transpose_out_2": "sqnr"}),
    ("magika", {"target_label": "top1"}),
])  # fmt: skip
def test_no_coordinate_is_judged_by_top1_and_no_map_as_a_sequence(name, expected, photos, corpus_dir):
    _, model, _, reference = _real(name, photos, corpus_dir)
    assert kinds(reference, producers(model), readers=readers(model)) == expected


def test_onet_landmarks_a_moved_head_fails_in_its_own_units_and_bf16_passes(photos, corpus_dir):
    prepared, model, feeds, reference = _real("mtcnn-onet", photos, corpus_dir)
    span = float(np.ptp(reference["dense_6"]))
    moved = _ort(_with_bias(model, "dense_6/bias:0", lambda b: b + 0.05 * span), feeds)  # every point 5% of the range
    made, read = producers(model), readers(model)
    acc = compare(moved, reference, producers=made, readers=read)
    landmarks = next(o for o in acc.outputs if o.name == "dense_6")
    assert not acc.passed and landmarks.kind == "regression" and landmarks.sqnr_db < 17
    assert landmarks.error_max_abs == pytest.approx(0.05 * span, rel=1e-3)
    assert "dense_6" in worst(acc.outputs) and "max abs error" in worst(acc.outputs)
    plain = compare(moved, reference, overrides={"dense_6": Override("sqnr")}, producers=made, readers=read)
    assert next(o for o in plain.outputs if o.name == "dense_6").sqnr_db > 17  # about zero it would have passed
    bf16 = _bf16(prepared)
    assert bf16.accuracy is not None and bf16.accuracy.passed, bf16.failure_message
    assert {o.name: o.kind for o in bf16.accuracy.outputs}["dense_6"] == "regression"


def test_pnet_map_a_shifted_class_head_fails_cell_by_cell_and_bf16_passes(photos, corpus_dir):
    prepared, model, feeds, reference = _real("mtcnn-pnet", photos, corpus_dir)
    shifted = _ort(_with_bias(model, "conv2d_3/bias:0", lambda b: b + np.array([-1.0, 1.0])), feeds)  # towards "face"
    acc = compare(shifted, reference, producers=producers(model), readers=readers(model))
    face = next(o for o in acc.outputs if o.name == "softmax")
    assert not acc.passed and face.kind == "cells" and face.cell_agreement < 0.99
    bf16 = _bf16(prepared)
    assert bf16.accuracy is not None and bf16.accuracy.passed, bf16.failure_message
    assert {o.name: o.kind for o in bf16.accuracy.outputs}["softmax"] == "cells"


def test_magika_a_mislabelled_head_fails_top1_and_bf16_passes(photos, corpus_dir):
    """bf16 flips one file, a JSON of numbers, on which the reference itself hesitated (0.33 against 0.24 for
    the class bf16 picks): a near-tie, as tokens have, counted in the plain agreement and not in the verdict."""
    prepared, model, feeds, reference = _real("magika", photos, corpus_dir)
    assert np.allclose(reference["target_label"].sum(axis=1), 1.0, atol=1e-3)  # the rows are distributions
    assert len(set(np.argmax(reference["target_label"], axis=1).tolist())) >= 6  # many file types, not one
    made = {out: node for node in model.graph.node for out in node.output}
    node = made["target_label"]
    while node.op_type != "MatMul":  # Div <- Exp <- Sub <- Add <- MatMul: the last dense layer
        node = made[node.input[0]]
    a, b = np.argmax(reference["target_label"], axis=1)[:2]  # two file types the reference tells apart

    def swapped(w: np.ndarray) -> np.ndarray:  # the weights of two classes exchanged: a mislabelled head
        w = w.copy()
        w[:, [a, b]] = w[:, [b, a]]
        return w

    acc = compare(_ort(_with_bias(model, node.input[1], swapped), feeds), reference, producers=producers(model),
                  readers=readers(model))  # fmt: skip
    assert not acc.passed and acc.outputs[0].decided_agreement < 0.99
    bf16 = _bf16(prepared)
    assert bf16.accuracy is not None and bf16.accuracy.passed, bf16.failure_message
    (o,) = bf16.accuracy.outputs
    assert o.kind == "top1" and o.decided_agreement == 1.0 and o.top1_agreement >= 0.9
