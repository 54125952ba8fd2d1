"""ONNX Runtime's adapter on what real exports look like (the conformance suite covers the rest)."""

import os
import re

import numpy as np
import onnx
import pytest

from autodeploy.adapters import registry
from autodeploy.adapters.base import TrialConfig
from autodeploy.data import synthetic
from autodeploy.device import probe_device
from autodeploy.errors import UnsupportedConfigError
from autodeploy.model import load_model
from autodeploy.runtime.onnxruntime import Unsupported, affinities
from tests.models import mlp


@pytest.mark.parametrize("method", ["static", "dynamic"])
def test_int8_of_an_opset_12_export_loads_and_runs(tmp_path, method):
    """Per-channel QDQ of an opset-12 model wrote DequantizeLinear `axis` (opset 13+): ORT refused its own
    output ("Unrecognized attribute: axis"). The adapter converts to opset 13 first."""
    path = tmp_path / "old.onnx"
    proto = onnx.load(str(mlp(tmp_path / "m.onnx")))
    proto.opset_import[0].version = 12  # MatMul, Add and Relu read the same at opset 12
    onnx.save(proto, str(path))
    model = load_model(path)
    assert model.opset == 12
    config = TrialConfig("onnxruntime", "int8", knobs={"quant_method": method})
    engine = registry.get("onnxruntime")
    calibration = synthetic(model, 16).inputs
    artifact = engine.build(model, config, calibration, tmp_path / "work", target=probe_device())
    runner = engine.load(artifact, config, model)
    feeds = {"x": calibration["x"][:4]}
    (logits,) = runner.run(feeds).values()
    runner.close()
    assert logits.shape == (4, 4) and np.isfinite(logits).all()


def test_static_int8_quantizes_activations_to_uint8_for_x86_integer_dot_products(tmp_path):
    """x86's int8 dot products multiply u8 by s8 (VNNI's VPDPBUSD): s8 activations made ORT's int8 slower
    than fp32 here. Without VNNI the weights use 7 bits (reduce_range), ORT's fix for saturation."""
    from onnx import numpy_helper

    from autodeploy.adapters.base import int8_saturates
    from autodeploy.device import probe_device

    model = load_model(mlp(tmp_path / "m.onnx"))
    config = TrialConfig("onnxruntime", "int8", knobs={"quant_method": "static"})
    artifact = registry.get("onnxruntime").build(
        model, config, synthetic(model, 16).inputs, tmp_path / "work", target=probe_device()
    )
    proto = onnx.load(str(artifact.path / "model.onnx"))
    inits = {i.name: numpy_helper.to_array(i) for i in proto.graph.initializer}
    q_zero_points = [inits[n.input[2]] for n in proto.graph.node if n.op_type == "QuantizeLinear"]
    assert q_zero_points and all(z.dtype == np.uint8 for z in q_zero_points)
    dequantized = [
        inits[n.input[0]] for n in proto.graph.node if n.op_type == "DequantizeLinear" and n.input[0] in inits
    ]
    weights = [w for w in dequantized if w.ndim == 2]  # the MatMul weights (biases are int32)
    assert weights and all(w.dtype == np.int8 for w in weights)
    reduce_range = int8_saturates(probe_device())
    assert artifact.meta["reduce_range"] is reduce_range and artifact.meta["activations"] == "u8"
    assert max(int(np.abs(w.astype(np.int32)).max()) for w in weights) <= (64 if reduce_range else 127)


CPUS = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))


@pytest.mark.skipif(len(CPUS) < 2, reason="pinning needs 2 CPUs this process may run on")
def test_intra_op_thread_affinities_pin_the_pool_and_are_recorded(tmp_path):
    """``one_cpu_each``: ORT's session entry names one CPU per pool thread (1-based, the caller's thread
    unpinned), a real measurement runs with it and records the entry as applied."""
    from autodeploy.harness.run import HarnessSettings, prepare_data, run_trial
    from autodeploy.harness.timing import TimingPolicy

    model = load_model(mlp(tmp_path / "m.onnx"))
    config = TrialConfig("onnxruntime", threads=2, knobs={"intra_op_thread_affinities": "one_cpu_each"})
    engine = registry.get("onnxruntime")
    engine.check(probe_device(), model, config)
    assert "intra_op_thread_affinities" in engine.search_knobs  # the search tries it
    assert affinities({"intra_op_thread_affinities": "one_cpu_each", "intra_op_num_threads": 2}) == str(CPUS[1] + 1)
    assert affinities({"intra_op_num_threads": 2}) is None  # off unless asked
    policy = TimingPolicy(warmup_min_calls=2, warmup_max_s=0.2, min_samples=16, min_duration_s=0.05)
    settings = HarnessSettings(workdir=tmp_path / "work", policy=policy, timeout_s=60)
    result = run_trial(model, config, prepare_data(model, settings), settings)
    assert result.ok, result.failure_message
    assert result.measurement.serving == {"compiled": {"session.intra_op_thread_affinities": str(CPUS[1] + 1)}}
    assert result.config.knobs == {"intra_op_thread_affinities": "one_cpu_each"}


@pytest.mark.parametrize("threads, knobs, message", [
    (1, {"intra_op_thread_affinities": "one_cpu_each"}, "needs 2 or more threads, got 1"),
    (None, {"intra_op_thread_affinities": "one_cpu_each"}, "needs 2 or more threads, got the default"),
    (2, {"intra_op_thread_affinities": "1;2"}, "knob intra_op_thread_affinities='1;2' is not supported; fix: choose "
                                               "one of none, one_cpu_each"),
    (2, {"intra_op_thread_affinities": "one_cpu_each", "sessions": "per_request"}, "pin its pool to the same CPUs"),
])  # fmt: skip
def test_thread_affinities_that_cannot_run_are_one_line(tmp_path, threads, knobs, message):
    model = load_model(mlp(tmp_path / "m.onnx"))
    with pytest.raises(UnsupportedConfigError, match=re.escape(message)) as caught:
        registry.get("onnxruntime").check(probe_device(), model, TrialConfig("onnxruntime", threads=threads, knobs=knobs))
    assert "\n" not in str(caught.value) and "fix: " in str(caught.value)
    with pytest.raises(Unsupported, match="this process may run on"):  # a bundle on a smaller machine
        affinities({"intra_op_thread_affinities": "one_cpu_each", "intra_op_num_threads": len(CPUS) + 1})


def test_static_int8_of_convs_sharing_a_bias_whose_copies_collide_with_a_tensor_loads(tmp_path):
    """basic-pitch (a TF export) feeds one zero bias to 17 Convs; ORT's quantizer gives each Conv a copy
    named bias + a counter ("conv1d_25" + "2"), which was a Conv's output name: the copy replaced that
    activation and ORT refused the model ("Transpose ... perm {0, 2, 3, 1}, input shape = {36}")."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal((3, 3, 3, 3)).astype(np.float32) * 0.3, f"w{i}")
               for i in range(3)]  # fmt: skip
    bias = numpy_helper.from_array(np.zeros(3, np.float32), "b")
    conv = {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}
    graph = helper.make_graph(
        # The first Conv's output is named as the quantizer's second copy of the shared bias "b".
        [helper.make_node("Conv", ["x", "w0", "b"], ["b1"], name="conv_a", **conv),
         helper.make_node("Conv", ["b1", "w1", "b"], ["h"], name="conv_b", **conv),
         helper.make_node("Conv", ["h", "w2", "b"], ["y"], name="conv_c", **conv)],
        "shared_bias",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3, 8, 8])],
        [*weights, bias],
    )  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "m.onnx")
    model = load_model(tmp_path / "m.onnx")
    config = TrialConfig("onnxruntime", "int8", knobs={"quant_method": "static"})
    engine = registry.get("onnxruntime")
    calibration = synthetic(model, 16).inputs
    artifact = engine.build(model, config, calibration, tmp_path / "work", target=probe_device())
    runner = engine.load(artifact, config, model)
    (y,) = runner.run({"x": calibration["x"][:2]}).values()
    runner.close()
    assert y.shape == (2, 3, 8, 8) and np.isfinite(y).all()
