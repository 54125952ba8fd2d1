"""The INT8 quantizer: calibration methods, QDQ layout, accuracy on real data, the fallback."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from autodeploy.inhouse.passes import optimize
from autodeploy.inhouse.quantize import QuantConfig, calibrate, qdq, quantize
from tests.models import mlp


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, feeds
    )[0]


@pytest.fixture
def small(tmp_path):
    return onnx.load(str(mlp(tmp_path / "m.onnx", in_features=16, classes=8)))


def _assert_weights_dequantized(q: onnx.ModelProto) -> None:
    """Every Gemm/Conv/weight-MatMul reads int8 weights through DequantizeLinear; nothing dangles."""
    producers = {o: n for n in q.graph.node for o in n.output}
    int8 = {t.name for t in q.graph.initializer if t.data_type == onnx.TensorProto.INT8}
    used = {i for n in q.graph.node for i in n.input} | {o.name for o in q.graph.output}
    for node in q.graph.node:
        assert all(o in used for o in node.output), f"{node.name} is dangling"
        if node.op_type in ("Gemm", "Conv", "MatMul"):
            dq = producers.get(node.input[1])
            assert dq is not None and dq.op_type == "DequantizeLinear" and dq.input[0] in int8, node.name


def test_activation_qparams_cover_the_range_and_zero():
    q = qdq.activation_qparams(0.0, 6.0, symmetric=False)
    assert q.zero_point == 0 and q.unsigned and q.scale == pytest.approx(6.0 / 255)
    q = qdq.activation_qparams(-1.0, 1.0, symmetric=False)
    assert q.zero_point == 128 and q.scale == pytest.approx(2.0 / 255)
    q = qdq.activation_qparams(-1.0, 3.0, symmetric=True)
    assert q.zero_point == 0 and not q.unsigned and q.scale == pytest.approx(3.0 / 127)
    assert qdq.activation_qparams(0.0, 0.0, symmetric=False) == qdq.QParams(1.0, 0, True)


def test_weights_are_per_channel_symmetric():
    w = np.array([[1.0, -0.5], [0.1, 0.2]], np.float32)
    q, scale = qdq.quantize_weight(w, axis=0)
    np.testing.assert_allclose(scale, [1 / 127, 0.2 / 127], rtol=1e-6)
    assert q.dtype == np.int8 and q[0, 0] == 127 and q[1, 1] == 127


def test_reduce_range_uses_seven_bit_weights():
    w = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    q, _ = qdq.quantize_weight(w, axis=0, qmax=qdq.REDUCED_WEIGHT_MAX)
    assert np.abs(q).max() == 63


def test_percentile_and_entropy_clip_outliers():
    rng = np.random.default_rng(0)
    values = np.concatenate([rng.standard_normal(100_000), [50.0]]).astype(np.float32)
    hist, _ = np.histogram(np.abs(values), calibrate.BINS, (0, 50.0))
    assert calibrate.kl_threshold(hist, 50.0) < 10
    lo, hi = calibrate._percentile_range(np.histogram(values, calibrate.BINS, (values.min(), 50.0))[0],
                                         float(values.min()), 50.0, 99.9)  # fmt: skip
    assert hi < 10 and lo < 0


@pytest.mark.parametrize("method", calibrate.METHODS)
@pytest.mark.parametrize("symmetric", [False, True])
def test_qdq_model_is_valid_and_close(small, method, symmetric):
    rng = np.random.default_rng(1)
    cal = {"x": rng.standard_normal((64, 16)).astype(np.float32)}
    model, _ = optimize(small)
    q, report = quantize(model, cal, QuantConfig(calibration=method, activation_symmetric=symmetric))
    onnx.checker.check_model(q)
    ops = [n.op_type for n in q.graph.node]
    assert ops.count("QuantizeLinear") == report.quantized_tensors > 0
    assert any(t.data_type == onnx.TensorProto.INT8 for t in q.graph.initializer)
    assert any(t.data_type == onnx.TensorProto.INT32 for t in q.graph.initializer), "int32 bias"
    _assert_weights_dequantized(q)
    feeds = {"x": rng.standard_normal((16, 16)).astype(np.float32)}
    got, want = _run(q, feeds).ravel(), _run(small, feeds).ravel()
    # The conformance suite's bar for this 16-wide random MLP.
    assert got @ want / (np.linalg.norm(got) * np.linalg.norm(want)) > 0.95


def test_relu_is_folded_into_asymmetric_quantization(small):
    cal = {"x": np.random.default_rng(1).standard_normal((32, 16)).astype(np.float32)}
    model, _ = optimize(small)
    q, _ = quantize(model, cal, QuantConfig(activation_symmetric=False))
    assert "Relu" not in [n.op_type for n in q.graph.node]
    q, _ = quantize(model, cal, QuantConfig(activation_symmetric=True))
    assert "Relu" in [n.op_type for n in q.graph.node]


def test_fallback_search_keeps_the_fewest_most_sensitive_layers():
    from autodeploy.inhouse import quantize as q

    sensitivity = {f"layer{i}": 10.0 - i for i in range(10)}  # layer0 is the most sensitive
    built = []

    def build(keep):
        built.append(list(keep))
        return onnx.ModelProto()

    def judge(model):  # the budget holds once the 3 most sensitive layers are float
        return len(built[-1]) >= 3 and built[-1][:3] == ["layer0", "layer1", "layer2"], {"score": 1.0}

    _, _, kept = q._fallback(None, sensitivity, build, judge, QuantConfig(max_float_fraction=0.5))
    assert kept == ("layer0", "layer1", "layer2")
    assert len(built) <= 6, "doubling then bisection, not a linear scan"


def test_unreachable_budget_keeps_all_int8_and_says_so(small):
    cal = {"x": np.random.default_rng(1).standard_normal((64, 16)).astype(np.float32)}
    model, _ = optimize(small)
    q, report = quantize(model, cal, QuantConfig(accuracy_budget=-1.0))  # needs top-1 agreement >= 2
    assert set(report.sensitivity) == set(qdq.plan(qdq.name_nodes(model)).weighted)
    assert not report.budget_met and report.kept_float == ()
    onnx.checker.check_model(q)


def test_digits_int8_within_one_point_of_fp32():
    pytest.importorskip("sklearn")
    from autodeploy import zoo
    from autodeploy.inhouse.engine import _saturating_cpu

    data = zoo.dataset("digits")
    model = onnx.load(str(zoo.get("digits")))
    x, labels = data["inputs"]["pixels"], data["labels"]
    config = QuantConfig(calibration="percentile", reduce_range=_saturating_cpu())  # the engine's "auto"
    q, report = quantize(optimize(model)[0], data["calibration"], config)
    fp32, int8 = _run(model, {"pixels": x}).argmax(1), _run(q, {"pixels": x}).argmax(1)
    assert (int8 == labels).mean() >= (fp32 == labels).mean() - 0.01
    assert (int8 == fp32).mean() >= 0.99, "top-1 agreement (ORT's own static QDQ reaches 98.5%)"
    assert report.budget_met


def test_qdq_model_runs_in_openvino(small):
    ov = pytest.importorskip("openvino")
    rng = np.random.default_rng(1)
    model, _ = optimize(small)
    q, _ = quantize(model, {"x": rng.standard_normal((64, 16)).astype(np.float32)})
    compiled = ov.Core().compile_model(ov.Core().read_model(q.SerializeToString(), b""), "CPU")
    feeds = rng.standard_normal((4, 16)).astype(np.float32)
    got = compiled({"x": feeds})[0]
    np.testing.assert_allclose(got, _run(q, {"x": feeds}), rtol=0.05, atol=0.05 * np.abs(got).max())
