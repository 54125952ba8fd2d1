"""Tiny ONNX models built in code for tests (the zoo has the bigger ones)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def mlp(path: Path, *, batch: int | str = "N", in_features: int = 8, classes: int = 4, seed: int = 0) -> Path:
    """x[batch, in_features] -> MatMul -> Add -> Relu -> MatMul -> logits[batch, classes]."""
    rng = np.random.default_rng(seed)
    w1 = numpy_helper.from_array(rng.standard_normal((in_features, 16)).astype(np.float32), "w1")
    b1 = numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), "b1")
    w2 = numpy_helper.from_array(rng.standard_normal((16, classes)).astype(np.float32), "w2")
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w1"], ["h0"]),
            helper.make_node("Add", ["h0", "b1"], ["h1"]),
            helper.make_node("Relu", ["h1"], ["h2"]),
            helper.make_node("MatMul", ["h2", "w2"], ["logits"]),
        ],
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, in_features])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch, classes])],
        [w1, b1, w2],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def seq_model(path: Path) -> Path:
    """ids[N, S] int64 and mask[N, S] int64 with a dynamic sequence dim -> float sum[N, S]."""
    graph = helper.make_graph(
        [
            helper.make_node("Mul", ["ids", "mask"], ["m"]),
            helper.make_node("Cast", ["m"], ["out"], to=TensorProto.FLOAT),
        ],
        "seq",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["N", "S"]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["N", "S"]),
        ],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["N", "S"])],
    )
    graph.node[0].input[:] = ["input_ids", "attention_mask"]
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def with_external_data(path: Path, location: str) -> Path:
    """An MLP whose weights live in external data at ``location`` (relative to the model)."""
    mlp(path)
    model = onnx.load(str(path))
    onnx.save_model(
        model,
        str(path),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="weights.bin",
        size_threshold=0,
    )
    model = onnx.load(str(path), load_external_data=False)
    for tensor in model.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = location
    onnx.save(model, str(path))
    return path


def recurrent(path: Path) -> Path:
    """A VAD-shaped recurrent model: ``input[batch, sequence]``, a scalar ``sr`` and
    ``state[2, batch, 128]`` → ``output[batch, 1]`` and ``stateN[2, batch, 128]``.

    ``output = sum(input) + sr + sum(state)`` per item, ``stateN = 2 * state``.
    """
    two = numpy_helper.from_array(np.array(2.0, np.float32), "two")
    graph = helper.make_graph(
        [
            helper.make_node("ReduceSum", ["input", "ax1"], ["s_in"], keepdims=1),
            helper.make_node("Cast", ["sr"], ["sr_f"], to=TensorProto.FLOAT),
            helper.make_node("ReduceSum", ["state", "ax02"], ["s_state"], keepdims=0),
            helper.make_node("Unsqueeze", ["s_state", "ax1"], ["s_state2"]),
            helper.make_node("Add", ["s_in", "sr_f"], ["t"]),
            helper.make_node("Add", ["t", "s_state2"], ["output"]),
            helper.make_node("Mul", ["state", "two"], ["stateN"]),
        ],
        "recurrent",
        [
            helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", "sequence"]),
            helper.make_tensor_value_info("sr", TensorProto.INT64, []),
            helper.make_tensor_value_info("state", TensorProto.FLOAT, [2, "batch", 128]),
        ],
        [
            helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", 1]),
            helper.make_tensor_value_info("stateN", TensorProto.FLOAT, [2, "batch", 128]),
        ],
        [
            two,
            numpy_helper.from_array(np.array([1], np.int64), "ax1"),
            numpy_helper.from_array(np.array([0, 2], np.int64), "ax02"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def paddle_like(path: Path) -> Path:
    """A Paddle2ONNX-style conv: ``x[-1, 3, -1, -1]`` → ``y[-1, 4, -1, -1]`` (``-1``: dynamic),
    plus an input ``scale`` with an initializer default (optional)."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    scale = numpy_helper.from_array(np.array(1.0, np.float32), "scale")
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
            helper.make_node("Mul", ["c", "scale"], ["y"]),
        ],
        "paddle_like",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 3, -1, -1]),
            helper.make_tensor_value_info("scale", TensorProto.FLOAT, []),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [-1, 4, -1, -1])],
        [w, scale],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))  # the checker accepts -1 dims; no check here to keep the export's form
    return path


def detector(path: Path, *, classes: int = 8, seed: int = 0) -> Path:
    """An anchor-free detector's head on 32x32 RGB: x[N, 3, 32, 32] -> output0[N, 4 + classes, 64].

    Patch features (a stride-4 Conv) give 64 anchors; per anchor 4 box coordinates in pixels
    (``Sigmoid(.) * 320``) then ``classes`` scores (``Sigmoid``), concatenated into one output as
    YOLOv8's export does: one tensor whose channels carry quantities 320x apart.
    """
    rng = np.random.default_rng(seed)
    conv = numpy_helper.from_array((rng.standard_normal((16, 3, 4, 4)) * 0.3).astype(np.float32), "conv")
    wb = numpy_helper.from_array((rng.standard_normal((16, 4)) * 0.5).astype(np.float32), "wb")
    ws = numpy_helper.from_array((rng.standard_normal((16, classes)) * 1.5).astype(np.float32), "ws")
    bs = numpy_helper.from_array(np.full(classes, -2.0, np.float32), "bs")  # most anchors: low scores
    scale = numpy_helper.from_array(np.array(320.0, np.float32), "scale")
    shape = numpy_helper.from_array(np.array([0, 16, 64], np.int64), "shape")
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "conv"], ["f"], kernel_shape=[4, 4], strides=[4, 4]),
            helper.make_node("Relu", ["f"], ["fr"]),
            helper.make_node("Reshape", ["fr", "shape"], ["f3"]),
            helper.make_node("Transpose", ["f3"], ["ft"], perm=[0, 2, 1]),  # [N, 64 anchors, 16]
            helper.make_node("MatMul", ["ft", "wb"], ["b0"]),
            helper.make_node("Sigmoid", ["b0"], ["b1"]),
            helper.make_node("Mul", ["b1", "scale"], ["boxes"]),
            helper.make_node("MatMul", ["ft", "ws"], ["s0"]),
            helper.make_node("Add", ["s0", "bs"], ["s1"]),
            helper.make_node("Sigmoid", ["s1"], ["scores"]),
            helper.make_node("Concat", ["boxes", "scores"], ["cat"], axis=-1),
            helper.make_node("Transpose", ["cat"], ["output0"], perm=[0, 2, 1]),
        ],
        "detector",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 32, 32])],
        [helper.make_tensor_value_info("output0", TensorProto.FLOAT, ["N", 4 + classes, 64])],
        [conv, wb, ws, bs, scale, shape],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def lp_pool(path: Path) -> Path:
    """A graph onnx2tf cannot convert on any rung: it has no converter for LpPool (ONNX Runtime runs it)."""
    node = helper.make_node("LpPool", ["x"], ["y"], kernel_shape=[2, 2], strides=[2, 2], p=2)
    graph = helper.make_graph([node], "lp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 4, 4])])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)
    onnx.save(model, str(path))
    return path


def zipmap_classifier(path: Path, *, batch: int | str = "N", features: int = 4, classes: int = 3,
                      string_labels: bool = False) -> Path:  # fmt: skip
    """skl2onnx's default classifier, by hand: x -> ai.onnx.ml LinearClassifier (softmax post-transform) ->
    ``label[batch]`` and its probabilities through ZipMap: ``probabilities`` is ``seq(map(int64, float))``
    (``map(string, float)`` with ``string_labels``)."""
    rng = np.random.default_rng(0)
    labels = {"classlabels_strings": [f"c{i}" for i in range(classes)]} if string_labels else \
        {"classlabels_ints": list(range(classes))}  # fmt: skip
    zip_labels = {"classlabels_strings": labels["classlabels_strings"]} if string_labels else \
        {"classlabels_int64s": list(range(classes))}  # fmt: skip
    graph = helper.make_graph(
        [
            helper.make_node("LinearClassifier", ["x"], ["label", "scores"], domain="ai.onnx.ml",
                             coefficients=rng.standard_normal(classes * features).tolist(),
                             intercepts=[0.0] * classes, post_transform="SOFTMAX", **labels),  # fmt: skip
            helper.make_node("ZipMap", ["scores"], ["probabilities"], domain="ai.onnx.ml", **zip_labels),
        ],
        "zipmap",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, features])],
        [helper.make_tensor_value_info("label", TensorProto.STRING if string_labels else TensorProto.INT64, [batch]),
         helper.make_value_info("probabilities", helper.make_sequence_type_proto(helper.make_map_type_proto(
             TensorProto.STRING if string_labels else TensorProto.INT64,
             helper.make_tensor_type_proto(TensorProto.FLOAT, None))))],  # fmt: skip
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 1)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path
