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
