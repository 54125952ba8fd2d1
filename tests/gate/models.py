"""Models for the gate: the same work, and the same work plus a measured amount more."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def matmul_chain(path: Path, *, layers: int, width: int = 128, classes: int = 4, seed: int = 0) -> Path:
    """x[N, width] -> ``layers`` x (MatMul -> Tanh) -> MatMul -> logits[N, classes].

    Latency grows linearly with ``layers``, so ``layers=23`` against ``layers=20`` is a
    regression of about 15% on any machine. The weights of the shared layers are the same
    for every ``layers`` (one seeded stream per layer), so the first layers compute alike.
    """
    nodes, inits, current = [], [], "x"
    for i in range(layers):
        rng = np.random.default_rng([seed, i])
        w = (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        nodes += [helper.make_node("MatMul", [current, f"w{i}"], [f"m{i}"]),
                  helper.make_node("Tanh", [f"m{i}"], [f"h{i}"])]  # fmt: skip
        current = f"h{i}"
    rng = np.random.default_rng([seed, 10_000])
    inits.append(numpy_helper.from_array(rng.standard_normal((width, classes)).astype(np.float32), "head"))
    nodes.append(helper.make_node("MatMul", [current, "head"], ["logits"]))
    graph = helper.make_graph(
        nodes,
        "matmul_chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", width])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", classes])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path
