"""ONNX Runtime's adapter on what real exports look like (the conformance suite covers the rest)."""

import numpy as np
import onnx
import pytest

from autodeploy.adapters import registry
from autodeploy.adapters.base import TrialConfig
from autodeploy.data import synthetic
from autodeploy.model import load_model
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
    artifact = engine.build(model, config, calibration, tmp_path / "work")
    runner = engine.load(artifact, config, model)
    feeds = {"x": calibration["x"][:4]}
    (logits,) = runner.run(feeds).values()
    runner.close()
    assert logits.shape == (4, 4) and np.isfinite(logits).all()
