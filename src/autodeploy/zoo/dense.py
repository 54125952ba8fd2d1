"""The ``mlp`` zoo model: fully connected layers, both as Gemm and as MatMul + Add."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from autodeploy.zoo._graph import Graph, float_tensor

if TYPE_CHECKING:
    import onnx


def matmul_add(g: Graph, x: str, n_in: int, n_out: int) -> str:
    """Fully connected layer as MatMul [in, out] + Add, the form exporters use for 3-D inputs."""
    name = g.unique("fc")
    w = g.normal(f"{name}.weight", (n_in, n_out), std=np.sqrt(2.0 / n_in))
    b = g.normal(f"{name}.bias", (n_out,), std=0.02)
    return g.op("Add", g.op("MatMul", x, w, name=name), b)


def mlp() -> onnx.ModelProto:
    """[N,256] -> Gemm 256->128 -> Relu -> MatMul+Add 128->64 -> Relu -> Gemm 64->10 logits."""
    g = Graph("mlp", seed=3)
    x = g.op("Relu", g.gemm("input", 256, 128))
    x = g.op("Relu", matmul_add(g, x, 128, 64))
    g.gemm(x, 64, 10, name="logits")
    return g.model(
        [float_tensor("input", ["N", 256])],
        [float_tensor("logits", ["N", 10])],
        doc="MLP: Gemm and MatMul+Add layers with Relu",
    )
