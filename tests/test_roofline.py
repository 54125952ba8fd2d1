"""Operations counted from the graph (``roofline.count_ops``) against MACs worked out by hand, and the records
every result's distance to the limit is read from (``Roofline``, ``Peaks``, ``distance``)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from autodeploy.adapters.registry import runs_on_gpu
from autodeploy.roofline import (
    Kernel,
    OpCount,
    Peaks,
    Roofline,
    count_ops,
    distance,
    distance_text,
    roofline,
    share_text,
)


def _model(nodes, inputs, weights=(), opset=17, domains=()):
    """A model of ``nodes``; ``inputs`` as ``(name, dims)``, ``weights`` as ``(name, dims)`` random initializers."""
    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, d) for n, d in inputs],
        [helper.make_tensor_value_info(nodes[-1].output[0], TensorProto.FLOAT, None)],
        [numpy_helper.from_array(rng.standard_normal(d).astype(np.float32), n) for n, d in weights],
    )
    opsets = [helper.make_opsetid("", opset), *(helper.make_opsetid(d, 1) for d in domains)]
    return helper.make_model(graph, opset_imports=opsets)


def _macs(model, shapes=None) -> int:
    count = count_ops(model, shapes)
    assert count.uncounted == ()
    assert count.ops == 2 * count.macs  # ops are 2 x MACs, the unit of every GOP/s
    return count.macs


def test_conv_counts_every_output_times_its_kernel_including_stride_and_padding():
    same = _model([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], [("x", [2, 3, 32, 32])],
                  [("w", [16, 3, 3, 3])])
    assert _macs(same) == 2 * 16 * 32 * 32 * (3 * 3 * 3)  # 884,736
    strided = _model([helper.make_node("Conv", ["x", "w"], ["y"], strides=[2, 2])], [("x", [1, 3, 33, 33])],
                     [("w", [8, 3, 3, 3])])
    assert _macs(strided) == 8 * 16 * 16 * 27  # out 16x16


def test_grouped_and_depthwise_conv_count_only_their_groups_channels():
    grouped = _model([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1], group=2)],
                     [("x", [1, 8, 16, 16])], [("w", [16, 4, 3, 3])])
    assert _macs(grouped) == 16 * 16 * 16 * (4 * 9)  # each output sums 8/2 channels x 3x3
    depthwise = _model([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1], group=8)],
                       [("x", [1, 8, 16, 16])], [("w", [8, 1, 3, 3])])
    assert _macs(depthwise) == 8 * 16 * 16 * 9


def test_conv_transpose_scatters_every_input_into_its_groups_outputs():
    plain = _model([helper.make_node("ConvTranspose", ["x", "w"], ["y"], strides=[2, 2])], [("x", [1, 8, 10, 10])],
                   [("w", [8, 4, 3, 3])])
    assert _macs(plain) == 8 * 10 * 10 * (4 * 9)  # 28,800
    grouped = _model([helper.make_node("ConvTranspose", ["x", "w"], ["y"], strides=[2, 2], group=2)],
                     [("x", [1, 8, 10, 10])], [("w", [8, 2, 3, 3])])
    assert _macs(grouped) == 8 * 10 * 10 * (2 * 9)


def test_gemm_reads_k_from_a_as_transposed():
    plain = _model([helper.make_node("Gemm", ["a", "b"], ["y"], transB=1)], [("a", [4, 64])], [("b", [32, 64])])
    assert _macs(plain) == 4 * 32 * 64
    transposed = _model([helper.make_node("Gemm", ["a", "b"], ["y"], transA=1)], [("a", [64, 4])], [("b", [64, 32])])
    assert _macs(transposed) == 4 * 32 * 64


def test_matmul_with_broadcast_batch_dims_and_a_large_weight():
    batched = _model([helper.make_node("MatMul", ["a", "b"], ["y"])], [("a", [2, 3, 5, 7]), ("b", [3, 7, 11])])
    assert _macs(batched) == 2 * 3 * 5 * 11 * 7  # batch dims broadcast to [2, 3]
    # A weight over 1024 elements goes to shape inference without its values; a small Reshape target keeps them.
    reshaped = _model([helper.make_node("Reshape", ["x", "shape"], ["r"]), helper.make_node("MatMul", ["r", "w"], ["y"])],
                      [("x", [2, 12 * 64])], [("w", [64, 40])])
    reshaped.graph.initializer.append(numpy_helper.from_array(np.array([2, 12, 64], np.int64), "shape"))
    assert _macs(reshaped) == 2 * 12 * 40 * 64


def test_attention_counts_scores_and_weighted_values():
    # ONNX Attention (opset 23): Q K^T is B*H*Sq*Skv*Dh, softmax(.) V is B*H*Sq*Skv*Dv.
    onnx_attention = _model([helper.make_node("Attention", ["q", "k", "v"], ["y"])],
                            [("q", [2, 4, 10, 8]), ("k", [2, 4, 12, 8]), ("v", [2, 4, 12, 6])], opset=23)
    assert _macs(onnx_attention) == 2 * 4 * 10 * 12 * 8 + 2 * 4 * 10 * 12 * 6
    # ONNX Runtime's MultiHeadAttention, 4 heads over [B, S, H*d]: the same products, read from its inputs.
    mha = _model([helper.make_node("MultiHeadAttention", ["q", "k", "v"], ["y"], domain="com.microsoft", num_heads=4)],
                 [("q", [2, 10, 32]), ("k", [2, 12, 32]), ("v", [2, 12, 24])], domains=("com.microsoft",))
    assert _macs(mha) == 2 * 10 * 12 * 32 + 2 * 10 * 12 * 24
    # Attention written out as MatMuls (the zoo's bert-small): Q [1,4,16,8] x K^T [1,4,8,16], then x V [1,4,16,8].
    spelled = _model([helper.make_node("MatMul", ["q", "kt"], ["s"]), helper.make_node("MatMul", ["s", "v"], ["y"])],
                     [("q", [1, 4, 16, 8]), ("kt", [1, 4, 8, 16]), ("v", [1, 4, 16, 8])])
    assert _macs(spelled) == 2 * (4 * 16 * 16 * 8)


def test_lstm_counts_its_gates_over_steps():
    lstm = _model([helper.make_node("LSTM", ["x", "w", "r"], ["y"], hidden_size=16)], [("x", [7, 2, 10])],
                  [("w", [1, 64, 10]), ("r", [1, 64, 16])])
    assert _macs(lstm) == 7 * 2 * (4 * 16) * (10 + 16)


def test_an_open_dim_leaves_its_ops_uncounted_until_the_measured_shape_fixes_it():
    model = _model([helper.make_node("Gemm", ["a", "b"], ["y"], name="fc")], [("a", ["N", 64])], [("b", [64, 32])])
    open_count = count_ops(model)
    assert open_count.macs == 0 and open_count.uncounted == ("Gemm fc",)
    assert _macs(model, {"a": [3, 64]}) == 3 * 32 * 64


def test_roofline_of_a_measurement_and_its_share_of_peak():
    count = OpCount(macs=4_000_000_000)  # 8 GOP a call
    peaks = Peaks("f", (Kernel("openvino", "bf16", "MatMul 1024x1024", 400.0), Kernel("onnxruntime", "int8", "Conv", 800.0),
                        Kernel("openvino", "int8", "MatMul", 750.0)))  # fmt: skip
    line = roofline(count, precision="bf16", batch=1, scenario="single-stream", median_ms=25.0,
                    throughput=None, peaks=peaks)  # fmt: skip
    assert line is not None and line.gops == pytest.approx(320.0) and line.share == pytest.approx(0.8)
    assert line.peak_kernel == "openvino MatMul 1024x1024"
    assert Roofline.from_dict(line.to_dict()) == line
    # offline: the rate sustained, per item's operations
    offline = roofline(count, precision="bf16", batch=4, scenario="offline", median_ms=100.0,
                       throughput=80.0, peaks=peaks)  # fmt: skip
    assert offline is not None and offline.gops == pytest.approx(8.0 / 4 * 80.0)
    # a GPU engine (its own declaration, Engine.gpu) gets its GOP/s, never a share of the CPU's peak; int8-dynamic
    # is held to int8's peak
    assert runs_on_gpu("tensorrt") and not runs_on_gpu("openvino") and not runs_on_gpu("no-such-engine")
    gpu = roofline(count, precision="fp16", batch=1, scenario="single-stream", median_ms=1.0, throughput=None,
                   peaks=peaks, gpu=runs_on_gpu("tensorrt"))  # fmt: skip
    assert gpu is not None and gpu.share is None
    assert "a GPU engine" in share_text(gpu, gpu=True) and "no fp16 peak" in share_text(gpu)
    gpu_limit = distance([gpu], peaks, label="tensorrt/fp16/b1/tdefault", engine="tensorrt", batch=1)
    assert "what_if" not in gpu_limit and "a GPU engine" in distance_text(gpu_limit, gpu=True)
    assert peaks.peak("int8-dynamic") == 800.0 and peaks.precisions() == ("bf16", "int8")
    assert roofline(OpCount(0), precision="fp32", batch=1, scenario="single-stream", median_ms=1.0,
                    throughput=None, peaks=peaks) is None  # fmt: skip


def test_the_winners_distance_says_what_int8_at_the_same_share_would_take():
    peaks = Peaks("f", (Kernel("openvino", "bf16", "MatMul", 400.0), Kernel("openvino", "int8", "MatMul", 800.0)))
    lines = [Roofline("bf16", 8.0, gops, 400.0, "openvino MatMul") for gops in (300.0, 352.0, 360.0)]
    d = distance(lines, peaks, label="openvino/bf16/b1/t2", engine="openvino", batch=1)
    assert d["share"] == pytest.approx(0.88)  # the median of its measurements: 352 of 400
    assert d["what_if"]["ms"] == pytest.approx(8.0 / (0.88 * 800.0) * 1e3)  # 11.36 ms
    text = distance_text(d)
    assert text.startswith("openvino/bf16 runs at 88% of this device's bf16 peak (352 of 400 GOP/s)")
    assert "a passing int8 at the same share would take about 11.36 ms a call" in text
    assert "items/s" in distance_text(d, items_per_s=True)
    # an int8 winner is held to its own peak
    own = distance([Roofline("int8", 8.0, 400.0, 800.0, "openvino MatMul")], peaks, label="x", engine="openvino", batch=1)
    assert own["what_if"]["share"] == 1.0 and "at that peak it would take about 10.00 ms" in distance_text(own)
    assert distance([], peaks, label="x", engine="openvino", batch=1) == {} and distance_text({}) == ""
    assert math.isfinite(d["what_if"]["items_per_s"])
