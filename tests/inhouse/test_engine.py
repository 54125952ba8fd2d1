"""What the ``inhouse`` engine adds to the conformance suite: its report, knobs and OpenVINO runtime."""

import json

import numpy as np
import pytest

from autodeploy.adapters import registry
from autodeploy.adapters.base import TrialConfig
from autodeploy.adapters.inhouse import REPORT_FILE
from autodeploy.data import synthetic
from autodeploy.device import probe_device
from autodeploy.errors import UnsupportedConfigError
from autodeploy.model import load_model
from tests.models import mlp


@pytest.fixture
def model(tmp_path):
    return load_model(mlp(tmp_path / "m.onnx", in_features=16, classes=8))


def test_registered_and_builds_report(model, tmp_path):
    engine = registry.get("inhouse")
    assert engine.probe(probe_device()).available
    config = TrialConfig("inhouse", "int8", knobs={"calibration": "entropy", "activation_symmetric": True})
    engine.check(probe_device(), model, config)
    artifact = engine.build(
        model, config, synthetic(model, 64, seed=1).inputs, tmp_path / "a", target=probe_device()
    )
    report = json.loads((artifact.path / REPORT_FILE).read_text())
    assert report["quantization"]["calibration"] == "entropy"
    assert report["quantization"]["activation_symmetric"] is True
    assert report["quantization"]["bias_correction"] is True, "on unless the knob turns it off"
    assert report["quantization"]["biases_corrected"] > 0
    assert report["memory"]["arena_bytes"] <= report["memory"]["no_reuse_bytes"]
    assert any(p["name"] == "matmul-add-to-gemm" and p["rewrites"] == 1 for p in report["passes"]["passes"])
    assert artifact.meta["calibration"] == "entropy" and "matmul-add-to-gemm" in artifact.meta["passes"]


def test_calibration_knob_changes_the_build_key(model):
    engine = registry.get("inhouse")
    a = engine.build_key(model, TrialConfig("inhouse", "int8", knobs={"calibration": "minmax"}), "v", "c")
    b = engine.build_key(model, TrialConfig("inhouse", "int8", knobs={"calibration": "entropy"}), "v", "c")
    c = engine.build_key(model, TrialConfig("inhouse", "int8", knobs={"graph_optimization_level": "ORT_ENABLE_BASIC"}), "v", "c")  # fmt: skip
    assert a != b and c == engine.build_key(model, TrialConfig("inhouse", "int8"), "v", "c")


def test_qdq_model_runs_on_openvino_runtime(model, tmp_path):
    pytest.importorskip("openvino")
    engine = registry.get("inhouse")
    config = TrialConfig("inhouse", "int8", batch=4, knobs={"runtime": "openvino"})
    engine.check(probe_device(), model, config)
    artifact = engine.build(
        model, config, synthetic(model, 64, seed=1).inputs, tmp_path / "a", target=probe_device()
    )
    feeds = {"x": synthetic(model, 4, seed=2).inputs["x"]}
    with engine.load(artifact, config, model) as runner:
        got = runner.run(feeds)["logits"]
    ort_config = TrialConfig("inhouse", "int8", batch=4)
    with engine.load(artifact, ort_config, model) as runner:
        want = runner.run(feeds)["logits"]
    np.testing.assert_allclose(got, want, rtol=0.05, atol=0.05 * np.abs(want).max())


def test_int8_calibrates_a_recurrent_model_on_its_own_batch_axis(tmp_path):
    """``state[2, batch, 128]`` and a scalar ``sr``: calibration batches follow the model's axes."""
    from autodeploy.adapters import registry
    from autodeploy.adapters.base import TrialConfig
    from autodeploy.data import synthetic
    from autodeploy.model import load_model
    from tests.models import recurrent

    model = load_model(recurrent(tmp_path / "r.onnx"), {"input": (1, 16), "state": (2, 1, 128)})
    engine = registry.get("inhouse")
    config = TrialConfig("inhouse", "int8", knobs={"fallback": False})
    calibration = synthetic(model, 8, pins={"sr": 16000}).inputs
    artifact = engine.build(model, config, calibration, tmp_path / "work", target=probe_device())
    with engine.load(artifact, config, model) as runner:
        out = runner.run({"input": calibration["input"][:2], "sr": np.array(16000, np.int64),
                          "state": np.moveaxis(calibration["state"][:2], 0, 1)})  # fmt: skip
    assert out["stateN"].shape == (2, 2, 128) and out["output"].shape == (2, 1)


def test_float_precision_is_built_in_and_sets_openvinos_hint_for_the_float_remainder(model, tmp_path):
    pytest.importorskip("openvino")
    from autodeploy.adapters.inhouse import float_precision

    engine = registry.get("inhouse")
    data = synthetic(model, 64, seed=1).inputs

    def built(name: str, **knobs):
        config = TrialConfig("inhouse", "int8", knobs={"runtime": "openvino", **knobs})
        engine.check(probe_device(), model, config)
        artifact = engine.build(model, config, data, tmp_path / name, target=probe_device())
        hint = engine.runtime_settings(artifact, config, model)["properties"]["INFERENCE_PRECISION_HINT"]
        report = json.loads((artifact.path / REPORT_FILE).read_text())["quantization"]
        return artifact, config, hint, report

    artifact, config, hint, report = built("f32", float_precision="f32")
    assert hint == "f32" == artifact.meta["float_precision"] == report["float_precision"]
    assert engine.requirements(artifact, config, probe_device().to_dict()) == {}
    _, _, hint, _ = built("default")
    assert hint == "f32", "the default remainder is f32"
    _, _, hint, _ = built("off", fallback=False, float_precision="auto")
    assert hint == "f32", "auto without the fallback: nothing judges bf16, so the remainder stays f32"
    auto = TrialConfig("inhouse", "int8", knobs={"runtime": "openvino", "float_precision": "auto"})
    assert float_precision(auto, ()) == "f32", "no bf16 ISA: the remainder stays f32"
    assert float_precision(auto, ("avx512_bf16",)) in ("bf16", "f32")
    assert float_precision(TrialConfig("inhouse", "int8"), ("avx512_bf16",)) == "f32", "ONNX Runtime: no bf16"
    native = any(probe_device().has(f) for f in ("avx512_bf16", "amx_bf16"))
    if not native:  # a CPU without bf16 refuses an explicit bf16 with the reason
        bf16 = TrialConfig("inhouse", "int8", knobs={"runtime": "openvino", "float_precision": "bf16"})
        with pytest.raises(UnsupportedConfigError, match="float_precision"):
            engine.check(probe_device(), model, bf16)
        return
    artifact, config, hint, report = built("bf16", float_precision="bf16")
    assert hint == "bf16" == artifact.meta["float_precision"] == report["float_precision"]
    assert engine.requirements(artifact, config, probe_device().to_dict())["isa_any_of"]
    assert engine.build_key(model, config, "v", "c") != engine.build_key(
        model,
        TrialConfig("inhouse", "int8", knobs={"runtime": "openvino", "float_precision": "f32"}),
        "v",
        "c",
    )


def test_int8_is_calibrated_and_judged_at_the_trials_batch(tmp_path):
    # A dynamic-batch model whose graph only holds at batch 1 (as a detector's decode head with batch-1
    # constants is for OpenVINO's compiler): the quantizer ran it at batch 8 and the build failed.
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "one"], ["flat"]), helper.make_node("MatMul", ["flat", "w"], ["h"]),
         helper.make_node("Relu", ["h"], ["logits"])],
        "batch_one_head",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 8])],
        [numpy_helper.from_array(np.array([1, 16], np.int64), "one"),
         numpy_helper.from_array(rng.standard_normal((16, 8)).astype(np.float32), "w")],
    )  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "b1.onnx")
    info = load_model(tmp_path / "b1.onnx")
    engine = registry.get("inhouse")
    artifact = engine.build(info, TrialConfig("inhouse", "int8", batch=1), synthetic(info, 32, seed=1).inputs,
                            tmp_path / "a", target=probe_device())  # fmt: skip
    report = json.loads((artifact.path / REPORT_FILE).read_text())
    assert report["quantization"]["calibration_items"] == 32 and report["quantization"]["quantized_nodes"]


@pytest.mark.parametrize("batch", [1, 4])
def test_int8_on_openvino_compiles_a_head_that_adds_batch_one_anchors(tmp_path, batch):
    # A detector's decode head adds its anchors, Unsqueeze(anchors[2, A]) -> [1, 2, A], to box distances
    # [N, 2, A]: QDQ on both operands made OpenVINO's compiler throw in the quantizer's judge
    # ("[AddTransformation] ... opset1::Add ... f32[1,2,4608] ... index < m_inputs.size()"), at any batch.
    import importlib.util

    import onnx
    from onnx import TensorProto, helper, numpy_helper

    if importlib.util.find_spec("openvino") is None:
        pytest.skip("openvino is not installed")
    rng = np.random.default_rng(0)
    anchors = 48 * 48 * 2  # 2 x anchors over 8192 elements: constant folding (onnxscript's limit) leaves it
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["c"], ["r"]),
         helper.make_node("Reshape", ["r", "shape"], ["distances"]),
         helper.make_node("Unsqueeze", ["anchors", "zero"], ["anchors_1"]),
         helper.make_node("Add", ["anchors_1", "distances"], ["boxes"]),
         helper.make_node("Mul", ["boxes", "stride"], ["y"])],
        "decode_head",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 48, 48])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2, anchors])],
        [numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32) * 0.3, "w"),
         numpy_helper.from_array(np.zeros(4, np.float32), "b"),
         numpy_helper.from_array(np.array([-1, 2, anchors], np.int64), "shape"),
         numpy_helper.from_array(rng.uniform(0, 8, (2, anchors)).astype(np.float32), "anchors"),
         numpy_helper.from_array(np.array([0], np.int64), "zero"),
         numpy_helper.from_array(np.array(8.0, np.float32), "stride")],
    )  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "head.onnx")
    info = load_model(tmp_path / "head.onnx")
    engine = registry.get("inhouse")
    config = TrialConfig("inhouse", "int8", batch=batch, knobs={"runtime": "openvino"})
    data = synthetic(info, 16, seed=1).inputs
    artifact = engine.build(info, config, data, tmp_path / "a", target=probe_device())
    quantized = onnx.load(str(artifact.path / "model.onnx"))
    add = next(n for n in quantized.graph.node if n.op_type == "Add")
    assert not any("DequantizeLinear" in i for i in add.input), "an Add of a constant operand stays float"
    assert any(n.op_type == "QuantizeLinear" for n in quantized.graph.node), "the Conv is still int8"
    runner = engine.load(artifact, config, info)
    (y,) = runner.run({"x": data["x"][:batch]}).values()
    runner.close()
    assert y.shape == (batch, 2, anchors) and np.isfinite(y).all()
