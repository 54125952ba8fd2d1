"""Classical-ML graphs (the ai.onnx.ml domain, skl2onnx's default output): every engine without a rule for
one of their ops offers no precision, in one line naming the op, decided from the graph before any build;
a conversion that fails anyway heads its reason with the op and the converter's words."""

from __future__ import annotations

import onnx
import pytest
from onnx import TensorProto, helper

from autodeploy.adapters import registry
from autodeploy.adapters.base import TrialConfig, foreign_ops
from autodeploy.device import probe_device
from autodeploy.errors import ConversionError, UnsupportedConfigError
from autodeploy.harness.result import headline, reason
from autodeploy.model import load_model
from tests.models import mlp, zipmap_classifier


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    return load_model(zipmap_classifier(tmp_path_factory.mktemp("ml") / "zipmap.onnx"))


def test_the_ops_outside_the_default_domain_are_read_from_the_graph(classifier, tmp_path):
    assert foreign_ops(classifier) == {"ai.onnx.ml": ["LinearClassifier", "ZipMap"]}
    assert foreign_ops(classifier, {"ai.onnx.ml": ["ZipMap"]}) == {"ai.onnx.ml": ["LinearClassifier"]}
    assert foreign_ops(load_model(mlp(tmp_path / "m.onnx"))) == {}


@pytest.mark.parametrize("engine, words", [
    ("openvino", "openvino has no conversion rule for ai.onnx.ml ops LinearClassifier, ZipMap"),
    ("tflite", "onnx2tf has no converter for ONNX ops LinearClassifier, ZipMap"),
    ("tensorrt", "TensorRT's ONNX parser has no importer for ai.onnx.ml ops LinearClassifier, ZipMap"),
])  # fmt: skip
def test_an_engine_without_the_ops_offers_no_precision_in_one_line_naming_them(classifier, engine, words):
    if engine == "tflite":
        pytest.importorskip("onnx2tf", reason="without the converter tflite names that first")
    space = registry.get(engine).space(probe_device(), classifier)
    assert space.precisions == ()
    reasons = set(space.unsupported.values()) - {"TFLite has no bf16 kernels on CPU; use openvino on a CPU with AMX"}
    assert len(reasons) == 1, reasons
    line = reasons.pop()
    assert line.startswith(words) and "fix: run it on onnxruntime" in line and "\n" not in line
    with pytest.raises(UnsupportedConfigError, match=words):  # bench: refused before any build
        registry.get(engine).check(probe_device(), classifier, TrialConfig(engine, "fp32"))


def test_onnx_runtime_and_the_inhouse_path_on_it_run_the_domain(classifier):
    for engine in ("onnxruntime", "inhouse"):
        assert "fp32" in registry.get(engine).space(probe_device(), classifier).precisions
        registry.get(engine).check(probe_device(), classifier, TrialConfig(engine, "fp32"))
    with pytest.raises(UnsupportedConfigError, match="runtime=openvino: openvino has no conversion rule for "
                       "ai.onnx.ml ops LinearClassifier, ZipMap; fix: use runtime=onnxruntime"):  # fmt: skip
        registry.get("inhouse").check(probe_device(), classifier, TrialConfig("inhouse", knobs={"runtime": "openvino"}))


def test_an_openvino_conversion_failure_heads_with_the_op_and_its_reason(tmp_path):
    """Built anyway (past the space's check), OpenVINO's frontend fails; the stored reason's headline is the
    op it has no rule for, not "Check 'false' failed at src/frontends/..." or "Loading input model"."""
    pytest.importorskip("openvino")
    graph = helper.make_graph(
        [helper.make_node("Scaler", ["x"], ["y"], domain="ai.onnx.ml", offset=[0.0], scale=[2.0])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 1)])
    onnx.save(model, str(tmp_path / "scaler.onnx"))
    info = load_model(tmp_path / "scaler.onnx")
    with pytest.raises(ConversionError) as err:
        registry.get("openvino").build(info, TrialConfig("openvino"), None, tmp_path / "work", target=probe_device())
    line = headline(reason(err.value))
    assert line.startswith("ConversionError: openvino could not convert scaler.onnx: No conversion rule found for "
                           "operations: ai.onnx.ml.Scaler; fix: run it on onnxruntime, which reads the file as given"), line  # fmt: skip
    assert "unconverted_ops_report.cpp" in reason(err.value)  # the whole reason is kept below it


def test_a_failed_onnx2tf_conversion_heads_with_the_op_for_every_precision(tmp_path, monkeypatch):
    """onnx2tf converts once for all TFLite precisions; when every rung fails, the reason opens with the
    first rung's words (the op), not the folder and the ladder."""
    from autodeploy.adapters import tflite

    model = load_model(mlp(tmp_path / "m.onnx"))
    monkeypatch.setattr(tflite, "_convert", lambda *a: "exit 1: onnx2tf has no converter for ONNX op Scaler")
    with pytest.raises(ConversionError) as err:
        tflite._conversion(model, tmp_path)
    line = headline(reason(err.value))
    assert line.startswith("ConversionError: onnx2tf could not convert m to TFLite: onnx2tf has no converter for "
                           "ONNX op Scaler; every TFLite precision needs this conversion"), line  # fmt: skip
    assert "[onnx2tf defaults] the same" in line and "fix: " in line
