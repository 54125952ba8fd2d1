"""An int8 build that quantized nothing is refused as what it is: the fp32 graph under another name."""

from __future__ import annotations

import pytest

from autodeploy.adapters.base import require_quantized
from autodeploy.errors import UnsupportedConfigError


def test_an_artifact_with_an_int8_op_is_int8():
    require_quantized("onnxruntime", ["QuantizeLinear", "Conv", "DequantizeLinear"], ["Conv"])
    require_quantized("openvino", ["Parameter", "FakeQuantize", "Convolution"], ["Convolution"])
    require_quantized("onnxruntime", ["DynamicQuantizeLinear", "MatMulInteger"], ["MatMul"])


def test_an_artifact_without_one_names_the_ops_that_have_no_int8_kernel():
    with pytest.raises(UnsupportedConfigError) as caught:
        require_quantized("onnxruntime", ["TreeEnsembleClassifier", "Identity"],
                          ["TreeEnsembleClassifier", "Identity", "Cast", "TreeEnsembleClassifier"])  # fmt: skip
    text = str(caught.value)
    assert "onnxruntime int8 is identical to fp32: no op of kinds TreeEnsembleClassifier has an int8 kernel" in text
    assert "Identity" not in text and "Cast" not in text  # plumbing is not named
    assert caught.value.fix == "use fp32: it is the same graph"
    with pytest.raises(UnsupportedConfigError, match="Add, Mul, Relu, Sigmoid, Exp, Div and 1 more"):
        require_quantized("inhouse", [], ["Add", "Add", "Mul", "Relu", "Sigmoid", "Exp", "Div", "Tanh"])
