"""The in-house runtimes' table (``inhouse/placement.py``): the planner, the quantizer's config and the engine
read a runtime's row, never its name."""

from __future__ import annotations

from dataclasses import replace

import onnx
import pytest

from autodeploy.adapters.base import TrialConfig
from autodeploy.adapters.inhouse import float_precision
from autodeploy.inhouse.passes import TARGETS
from autodeploy.inhouse.placement import PLACEMENTS
from autodeploy.inhouse.quantize import QuantConfig, qdq
from tests.models import mlp


def test_a_runtime_is_planned_by_its_row_not_its_name(tmp_path, monkeypatch):
    model = qdq.name_nodes(onnx.load(str(mlp(tmp_path / "m.onnx"))))
    plans = {name: qdq.plan(model, name) for name in PLACEMENTS}
    assert plans["onnxruntime"] != plans["openvino"], "the rows differ, and so do their plans"
    for name, row in list(PLACEMENTS.items()):
        monkeypatch.setitem(PLACEMENTS, f"like-{name}", row)
        assert replace(qdq.plan(model, f"like-{name}"), placement=name) == plans[name]
    with pytest.raises(ValueError, match="placement must be one of onnxruntime, openvino"):
        qdq.plan(model, "litert")


def test_the_float_remainder_follows_the_runtimes_row(monkeypatch):
    config = TrialConfig("inhouse", "int8", knobs={"float_precision": "bf16"})  # on ONNX Runtime, the default
    assert float_precision(config, ("avx512_bf16",)) == "f32", "ONNX Runtime's row: f32 only"
    with pytest.raises(ValueError, match="float_precision bf16 needs placement openvino"):
        QuantConfig(placement="onnxruntime", float_precision="bf16")
    monkeypatch.setitem(PLACEMENTS, "onnxruntime", replace(PLACEMENTS["onnxruntime"], float_precisions=("f32", "bf16")))
    assert float_precision(config, ("avx512_bf16",)) == "bf16"
    assert QuantConfig(placement="onnxruntime", float_precision="bf16").float_precision == "bf16"


def test_every_row_names_a_pass_target_and_takes_f32():
    for name, row in PLACEMENTS.items():
        assert row.fp32_passes in TARGETS and "f32" in row.float_precisions, name
