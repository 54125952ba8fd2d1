"""OpenVINO specifics the conformance suite cannot see: precision hints, knobs, NNCF int8, reshape."""

import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from autodeploy import zoo
from autodeploy.adapters.base import NATIVE_ISA, TrialConfig
from autodeploy.adapters.openvino import IR_FILE, OpenVinoEngine
from autodeploy.data import synthetic
from autodeploy.device import probe_device
from autodeploy.errors import UnsupportedConfigError
from autodeploy.model import load_model
from tests.models import mlp

ov = pytest.importorskip("openvino", reason="openvino is not installed; pip install 'autodeploy[openvino]'")

ENGINE = OpenVinoEngine()


@pytest.fixture
def model(tmp_path):
    return load_model(mlp(tmp_path / "m.onnx", in_features=16, classes=8))


def _reference(model, feeds):
    return ReferenceEvaluator(str(model.path)).run(None, feeds)


def _capabilities():
    return ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")


def test_module_import_does_not_import_openvino():
    code = "import sys, autodeploy.adapters.openvino; print('openvino' in sys.modules, 'nncf' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_probe_without_openvino_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "openvino", None)  # makes `import openvino` raise ImportError
    availability = ENGINE.probe(probe_device())
    assert not availability.available
    assert "openvino" in availability.reason and availability.fix == "pip install 'autodeploy[openvino]'"


def test_fp32_really_runs_f32_and_the_ir_stays_f32(model, tmp_path):
    config = TrialConfig("openvino", "fp32", batch=2)
    artifact = ENGINE.build(model, config, None, tmp_path / "a", target=probe_device())
    ir = ov.Core().read_model(str(artifact.path / IR_FILE))
    assert {op.get_output_element_type(0) for op in ir.get_ops() if op.get_type_name() == "Constant"} == {
        ov.Type.f32
    }, "the IR must keep fp32 weights (compress_to_fp16=False)"
    with ENGINE.load(artifact, config, model) as runner:
        assert runner.compiled_model.get_property("INFERENCE_PRECISION_HINT") == ov.Type.f32


@pytest.mark.parametrize("precision, capability", [("bf16", "BF16"), ("fp16", "FP16")])
def test_low_precisions_offered_only_where_the_cpu_plugin_supports_them(
    model, tmp_path, precision, capability
):
    device = probe_device()
    space = ENGINE.space(device, model)
    reported = capability in _capabilities()
    if precision == "bf16":
        # Offered only when OpenVINO and the ISA flags agree; either one missing means unsupported.
        assert (precision in space.precisions) == (reported and any(device.has(f) for f in NATIVE_ISA["bf16"]))
    else:
        assert (precision in space.precisions) == reported
    if precision not in space.precisions:
        assert space.unsupported[precision], "an unsupported precision carries its reason"
        with pytest.raises(UnsupportedConfigError, match=f"cannot run precision '{precision}'"):
            ENGINE.check(device, model, TrialConfig("openvino", precision))
        return
    config = TrialConfig("openvino", precision, batch=2)
    artifact = ENGINE.build(model, config, None, tmp_path / "a", target=probe_device())
    with ENGINE.load(artifact, config, model) as runner:
        hint = runner.compiled_model.get_property("INFERENCE_PRECISION_HINT")
        assert hint == {"bf16": ov.Type.bf16, "fp16": ov.Type.f16}[precision]


def test_bf16_reason_names_the_missing_isa(model):
    bare = probe_device().__class__.from_dict({**probe_device().to_dict(), "isa": ["avx2"]})
    assert ENGINE.space(bare, model).unsupported["bf16"] == (
        "this CPU has no bf16 support (needs AVX512_BF16 or AMX)"
    )


@pytest.mark.parametrize(
    "knobs, threads",
    [
        ({"PERFORMANCE_HINT": "LATENCY"}, 1),
        ({"PERFORMANCE_HINT": "THROUGHPUT", "NUM_STREAMS": 2}, 2),
        ({"PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": 1, "num_requests": 4}, 2),
    ],
)
def test_knobs_reach_the_compiled_model(model, tmp_path, knobs, threads):
    config = TrialConfig("openvino", "fp32", threads=threads, knobs=knobs)
    ENGINE.check(probe_device(), model, config)
    artifact = ENGINE.build(model, config, None, tmp_path / "a", target=probe_device())
    with ENGINE.load(artifact, config, model) as runner:
        compiled = runner.compiled_model
        assert compiled.get_property("PERFORMANCE_HINT") == knobs["PERFORMANCE_HINT"]
        assert compiled.get_property("INFERENCE_NUM_THREADS") == threads
        if "NUM_STREAMS" in knobs:
            assert compiled.get_property("NUM_STREAMS") == knobs["NUM_STREAMS"]


def test_unknown_knob_value_is_pruned(model):
    with pytest.raises(UnsupportedConfigError, match="NUM_STREAMS=3"):
        ENGINE.check(probe_device(), model, TrialConfig("openvino", knobs={"NUM_STREAMS": 3}))


@pytest.mark.slow  # NNCF import and calibration: ~4 s on an idle 2-core machine
def test_int8_ir_is_quantized_and_close_to_fp32(tmp_path):
    model = load_model(zoo.get("tiny-cnn", tmp_path / "zoo"))
    config = TrialConfig("openvino", "int8", batch=8)
    calibration = synthetic(model, 32, seed=1).inputs
    artifact = ENGINE.build(
        model, config, calibration, tmp_path / "a", target=probe_device(), calibration_hash="c1"
    )
    ops = {op.get_type_name() for op in ov.Core().read_model(str(artifact.path / IR_FILE)).get_ops()}
    assert "FakeQuantize" in ops and artifact.meta["quantizer"].startswith("nncf")
    feeds = synthetic(model, 8, seed=2).inputs
    with ENGINE.load(artifact, config, model) as runner:
        got = runner.run(feeds)["logits"]
    want = _reference(model, feeds)[0]
    cosine = float(got.ravel() @ want.ravel() / (np.linalg.norm(got) * np.linalg.norm(want)))
    assert cosine > 0.97  # measured 0.986 on this model and data
    assert (got.argmax(1) == want.argmax(1)).mean() >= 0.75


def test_dynamic_batch_is_reshaped_static_at_the_trial_batch(model, tmp_path):
    config = TrialConfig("openvino", "fp32", batch=3)
    artifact = ENGINE.build(model, config, None, tmp_path / "a", target=probe_device())
    ir = ov.Core().read_model(str(artifact.path / IR_FILE))
    assert ir.is_dynamic(), "the IR keeps the dynamic batch; the static shape is set when loading"
    with ENGINE.load(artifact, config, model) as runner:
        assert runner.compiled_model.input("x").get_shape() == [3, 16]
        for n in (3, 5):  # the trial's batch, then another one (compiled on first use)
            feeds = {"x": synthetic(model, n, seed=n).inputs["x"]}
            got = runner.run(feeds)["logits"]
            np.testing.assert_allclose(got, _reference(model, feeds)[0], rtol=1e-4, atol=1e-4)


def test_outputs_come_back_in_the_onnx_order_by_name(tmp_path):
    # Two outputs declared in the opposite order of their computation.
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["first"]), helper.make_node("Neg", ["x"], ["second"])],
        "two",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [
            helper.make_tensor_value_info("second", TensorProto.FLOAT, ["N", 4]),
            helper.make_tensor_value_info("first", TensorProto.FLOAT, ["N", 4]),
        ],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8
    onnx.save(proto, str(tmp_path / "two.onnx"))
    model = load_model(tmp_path / "two.onnx")
    config = TrialConfig("openvino", batch=2)
    feeds = {"x": np.array([[-1, 2, -3, 4], [5, -6, 7, -8]], np.float32)}
    artifact = ENGINE.build(model, config, None, tmp_path / "a", target=probe_device())
    with ENGINE.load(artifact, config, model) as runner:
        got = runner.run(feeds)
    assert list(got) == ["second", "first"]
    np.testing.assert_array_equal(got["second"], -feeds["x"])
    np.testing.assert_array_equal(got["first"], np.maximum(feeds["x"], 0))


def test_a_recurrent_model_runs_batched_on_its_own_axis(tmp_path):
    """OpenVINO is compiled for ``state[2, 4, 128]`` at batch 4 (not ``[4, 1, 128]``) and matches ORT."""
    from autodeploy.adapters import openvino as ov_adapter
    from autodeploy.harness.run import HarnessSettings, prepare_data, run_trial
    from autodeploy.harness.timing import TimingPolicy
    from tests.models import recurrent

    model = load_model(recurrent(tmp_path / "r.onnx"), {"input": (1, 16), "state": (2, 1, 128)})
    settings = ov_adapter.runtime_settings(TrialConfig("openvino", batch=4), model)
    assert settings["shapes"] == {"input": [4, 16], "sr": [], "state": [2, 4, 128]}
    quick = TimingPolicy(warmup_min_calls=2, warmup_max_s=0.2, min_samples=16, min_duration_s=0.1, max_duration_s=2)
    harness = HarnessSettings(workdir=tmp_path / "work", policy=quick, calibration_items=4, evaluation_items=6)
    data = prepare_data(model, harness, data=synthetic(model, 10, pins={"sr": 8000}))
    result = run_trial(model, TrialConfig("openvino", batch=4), data, harness)
    assert result.ok, result.failure_message
    assert all(o.cosine > 0.9999 for o in result.accuracy.outputs)


@pytest.mark.parametrize("pinned", [False, True])
def test_cpu_pinning_is_a_knob_that_runs_and_is_recorded(model, tmp_path, pinned):
    """``ENABLE_CPU_PINNING`` reaches the compiled model and is read back with the measurement; left out, it is
    not set (the plugin's own default)."""
    from autodeploy.harness.run import HarnessSettings, prepare_data, run_trial
    from autodeploy.harness.timing import TimingPolicy

    config = TrialConfig("openvino", "fp32", threads=1, knobs={"ENABLE_CPU_PINNING": pinned})
    ENGINE.check(probe_device(), model, config)
    assert "ENABLE_CPU_PINNING" in ENGINE.search_knobs  # the search tries it
    policy = TimingPolicy(warmup_min_calls=2, warmup_max_s=0.2, min_samples=16, min_duration_s=0.05)
    settings = HarnessSettings(workdir=tmp_path / "work", policy=policy, timeout_s=60)
    result = run_trial(model, config, prepare_data(model, settings), settings)
    assert result.ok, result.failure_message
    assert result.config.knobs == {"ENABLE_CPU_PINNING": pinned}
    read_back = result.measurement.serving["compiled"]["ENABLE_CPU_PINNING"]  # what the plugin set up
    assert read_back is pinned if sys.platform == "linux" else isinstance(read_back, bool)
    from autodeploy.adapters.openvino import compile_properties

    assert "ENABLE_CPU_PINNING" not in compile_properties(TrialConfig("openvino", "fp32"))


def test_a_cpu_pinning_value_other_than_true_or_false_is_one_line(model):
    with pytest.raises(UnsupportedConfigError) as caught:
        ENGINE.check(probe_device(), model, TrialConfig("openvino", knobs={"ENABLE_CPU_PINNING": "maybe"}))
    assert str(caught.value) == ("openvino knob ENABLE_CPU_PINNING='maybe' is not supported; "
                                 "fix: choose one of False, True")  # fmt: skip
