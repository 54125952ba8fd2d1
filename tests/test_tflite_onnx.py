"""The .tflite -> ONNX route (tf2onnx) without TensorFlow: what it leaves unconverted, and the one line an engine
that reads ONNX gives when the converter is missing. The conversion itself runs on a real .tflite in
tests/realmodels/test_formats.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from onnx import TensorProto, helper

from autodeploy import sealed, tflite_onnx
from autodeploy.adapters import registry
from autodeploy.adapters.base import TrialConfig
from autodeploy.device import probe_device
from autodeploy.errors import ConversionError, UnsupportedConfigError
from autodeploy.model import ModelInfo, TensorSpec


def _tflite(path: Path) -> ModelInfo:
    x = TensorSpec("x", "float32", (None, 4))
    return ModelInfo(path=path, name="m", sha256="ab" * 32, inputs=(x,), outputs=(x,), opset=0, format="tflite")


def test_ops_left_as_tflite_ops_are_named_once_in_graph_order():
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("TFL_CUMSUM", ["a"], ["b"]),
             helper.make_node("TreeEnsembleClassifier", ["b"], ["c"], domain="ai.onnx.ml"),
             helper.make_node("FusedConv", ["c"], ["d"], domain="com.microsoft"),
             helper.make_node("TFL_CUMSUM", ["d"], ["e"]), helper.make_node("Flex", ["e"], ["y"], domain="tf")]  # fmt: skip
    value = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    graph = helper.make_graph(nodes, "g", [value], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    assert tflite_onnx.unconverted(helper.make_model(graph)) == ["TFL_CUMSUM", "Flex"]


def test_without_tf2onnx_the_engines_that_read_onnx_say_so_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(tflite_onnx, "missing", lambda: "tf2onnx, which turns it into ONNX, is not installed "
                        f"({tflite_onnx.INSTALL})")  # fmt: skip
    model = _tflite(tmp_path / "m.tflite")
    why = registry.get("onnxruntime").unreadable(model)
    assert why == ("onnxruntime: the model is a TFLite flatbuffer; this engine reads ONNX, and tf2onnx, which turns "
                   "it into ONNX, is not installed (pip install 'autodeploy[tflite]')")  # fmt: skip
    assert registry.get("openvino").unreadable(model) is None  # reads the file itself
    with pytest.raises(UnsupportedConfigError, match="^onnxruntime: the model is a TFLite flatbuffer.*not installed"):
        registry.get("onnxruntime").check(probe_device(), model, TrialConfig("onnxruntime"))
    with pytest.raises(ConversionError, match="needs a conversion to ONNX for this engine, and tf2onnx"):
        tflite_onnx.as_onnx(model, tmp_path)


def test_a_converter_failure_is_kept_and_said_again_without_converting(tmp_path, monkeypatch):
    folder = tmp_path / f"{'ab' * 12}-tf2onnx{tflite_onnx.version()}"
    folder.mkdir()
    body = {**tflite_onnx._bound("ab" * 32), "reason": "tf2onnx has no ONNX conversion for TFLite op TFL_CUMSUM "
            "of m.tflite", "timeout_s": None}  # fmt: skip
    sealed.seal(folder / "refused.json", body)  # as the conversion keeps a refusal
    monkeypatch.setattr(tflite_onnx, "_convert_in_child", lambda *a: pytest.fail("converted again"))
    with pytest.raises(ConversionError, match="^tf2onnx has no ONNX conversion for TFLite op TFL_CUMSUM"):
        tflite_onnx.to_onnx(tmp_path / "m.tflite", "ab" * 32, tmp_path)
