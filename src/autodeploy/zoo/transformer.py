"""The ``bert-small`` zoo model: a BERT-shaped encoder with random weights.

LayerNorm and GELU are written out op by op, the way older exporters emit them, so that the
LayerNormalization and GELU fusion passes have real patterns to match.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from onnx import TensorProto

from autodeploy.zoo._graph import Graph, float_tensor, tensor

if TYPE_CHECKING:
    import onnx

VOCAB, SEQ, HIDDEN, LAYERS, HEADS, FFN = 1000, 128, 256, 4, 4, 1024
HEAD_DIM = HIDDEN // HEADS
INIT_STD = 0.02  # BERT's initializer_range


def linear(g: Graph, x: str, n_in: int, n_out: int) -> str:
    """MatMul [in, out] + Add bias on a [N, S, in] tensor."""
    name = g.unique("linear")
    w = g.normal(f"{name}.weight", (n_in, n_out), std=INIT_STD)
    b = g.normal(f"{name}.bias", (n_out,), std=INIT_STD)
    return g.op("Add", g.op("MatMul", x, w, name=name), b)


def layer_norm(g: Graph, x: str, eps: float = 1e-12) -> str:
    """(x - mean) / sqrt(var + eps) * gamma + beta over the last axis, decomposed."""
    name = g.unique("layernorm")
    mean = g.op("ReduceMean", x, axes=[-1])  # opset 17 still takes axes as an attribute
    centered = g.op("Sub", x, mean)
    var = g.op("ReduceMean", g.op("Pow", centered, g.scalar(2.0)), axes=[-1])
    std = g.op("Sqrt", g.op("Add", var, g.scalar(eps)))
    gamma = g.uniform(f"{name}.weight", (HIDDEN,), 0.9, 1.1)
    beta = g.normal(f"{name}.bias", (HIDDEN,), std=INIT_STD)
    return g.op("Add", g.op("Mul", g.op("Div", centered, std), gamma), beta)


def gelu(g: Graph, x: str) -> str:
    """x * 0.5 * (1 + erf(x / sqrt(2))), decomposed."""
    erf = g.op("Erf", g.op("Div", x, g.scalar(float(np.sqrt(2.0)))))
    return g.op("Mul", g.op("Mul", x, g.op("Add", erf, g.scalar(1.0))), g.scalar(0.5))


def split_heads(g: Graph, x: str, perm: list[int]) -> str:
    """[N, S, H] -> [N, S, heads, head_dim] -> transposed by ``perm``."""
    shape = g.const("heads_shape", [0, 0, HEADS, HEAD_DIM], np.int64)  # 0 keeps N and S as they are
    return g.op("Transpose", g.op("Reshape", x, shape), perm=perm)


def attention(g: Graph, x: str, mask_bias: str) -> str:
    """Multi-head self-attention with the additive mask; returns the output projection."""
    q = split_heads(g, linear(g, x, HIDDEN, HIDDEN), [0, 2, 1, 3])  # [N, heads, S, d]
    k = split_heads(g, linear(g, x, HIDDEN, HIDDEN), [0, 2, 3, 1])  # [N, heads, d, S]
    v = split_heads(g, linear(g, x, HIDDEN, HIDDEN), [0, 2, 1, 3])
    scores = g.op("Div", g.op("MatMul", q, k), g.scalar(float(np.sqrt(HEAD_DIM))))
    probs = g.op("Softmax", g.op("Add", scores, mask_bias), axis=-1)
    context = g.op("Transpose", g.op("MatMul", probs, v), perm=[0, 2, 1, 3])
    context = g.op("Reshape", context, g.const("merge_shape", [0, 0, HIDDEN], np.int64))
    return linear(g, context, HIDDEN, HIDDEN)


def encoder_layer(g: Graph, x: str, mask_bias: str) -> str:
    """Post-LN BERT layer: LN(x + attention(x)), then LN(h + FFN(h))."""
    h = layer_norm(g, g.op("Add", x, attention(g, x, mask_bias)))
    ffn = linear(g, gelu(g, linear(g, h, HIDDEN, FFN)), FFN, HIDDEN)
    return layer_norm(g, g.op("Add", h, ffn))


def embeddings(g: Graph) -> str:
    """Word embedding Gather + position embedding Gather, added, then LayerNorm."""
    words = g.op("Gather", g.normal("embeddings.word", (VOCAB, HIDDEN), INIT_STD), "input_ids")
    positions = g.const("position_ids", np.arange(SEQ)[None, :], np.int64)
    pos = g.op("Gather", g.normal("embeddings.position", (SEQ, HIDDEN), INIT_STD), positions)
    return layer_norm(g, g.op("Add", words, pos))


def mask_bias(g: Graph) -> str:
    """attention_mask [N, S] (1 = attend) -> (1 - mask) * -10000 as [N, 1, 1, S] for broadcasting."""
    mask = g.op("Cast", "attention_mask", to=TensorProto.FLOAT)
    bias = g.op("Mul", g.op("Sub", g.scalar(1.0), mask), g.scalar(-10000.0))
    return g.op("Unsqueeze", bias, g.const("mask_axes", [1, 2], np.int64))


def pooler(g: Graph, x: str) -> str:
    """Tanh(Gemm(first token)) as ``pooled`` [N, H]."""
    first = g.op("Gather", x, g.scalar(0, np.int64), axis=1)
    w = g.rng.standard_normal((HIDDEN, HIDDEN), dtype=np.float32) * np.float32(INIT_STD)
    return g.op("Tanh", g.gemm(first, HIDDEN, HIDDEN, w=w), name="pooled")


def bert_small() -> onnx.ModelProto:
    """BERT-shaped encoder: vocab 1000, seq 128, hidden 256, 4 layers, 4 heads, FFN 1024."""
    g = Graph("bert-small", seed=4)
    x = embeddings(g)
    bias = mask_bias(g)
    for _ in range(LAYERS):
        x = encoder_layer(g, x, bias)
    x = g.op("Identity", x, name="last_hidden_state")
    pooler(g, x)
    inputs = [
        tensor("input_ids", TensorProto.INT64, ["N", SEQ]),
        tensor("attention_mask", TensorProto.INT64, ["N", SEQ]),
    ]
    outputs = [float_tensor("last_hidden_state", ["N", SEQ, HIDDEN]), float_tensor("pooled", ["N", HIDDEN])]
    return g.model(inputs, outputs, doc="BERT-shaped encoder with decomposed LayerNorm and GELU")
