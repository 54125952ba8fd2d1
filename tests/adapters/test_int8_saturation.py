"""One rule for "int8 saturates on this CPU" (``adapters/base.py`` ``int8_saturates``), followed by both int8 paths
that choose 7-bit weights from it: ONNX Runtime's static int8 and the in-house quantizer's ``reduce_range=auto``."""

from dataclasses import replace

import pytest

from autodeploy.adapters import registry
from autodeploy.adapters.base import TrialConfig, int8_saturates
from autodeploy.data import synthetic
from autodeploy.device import probe_device
from autodeploy.model import load_model
from tests.models import mlp


def cpu(arch, *isa):
    """This machine's description with another CPU's architecture and ISA flags (what a build is given)."""
    return replace(probe_device(), arch=arch, isa=tuple(isa))


@pytest.mark.parametrize(
    ("device", "saturates"),
    [
        (cpu("x86_64", "avx2", "avx512f"), True),  # VPMADDUBSW adds byte-product pairs in int16
        (cpu("x86_64", "avx2", "avx512f", "avx512_vnni"), False),  # VPDPBUSD adds into int32
        (cpu("x86_64", "avx2", "avx_vnni"), False),
        (cpu("x86_64", "avx2", "amx_tile", "amx_int8"), False),
        (cpu("AMD64", "avx2"), True),  # Windows' name for the same architecture
        (cpu("x86_64"), True),  # before AVX2: ORT cannot saturate there, oneDNN may; 7 bits are the safe side
        (cpu("aarch64", "asimd"), False),  # Arm's dot products add in int32
    ],
)
def test_int8_saturates_on_x86_without_vnni_or_amx(device, saturates):
    assert int8_saturates(device) is saturates


@pytest.mark.parametrize("engine", ["onnxruntime", "inhouse"])
def test_both_int8_builds_take_reduce_range_from_the_one_rule(tmp_path, engine):
    """The same model built for a CPU without VNNI and for one with it: 7-bit weights for the first only."""
    model = load_model(mlp(tmp_path / "m.onnx"))
    calibration = synthetic(model, 16).inputs
    knobs = {"quant_method": "static"} if engine == "onnxruntime" else {}
    config = TrialConfig(engine, "int8", knobs=knobs)
    for name, target in {"plain": cpu("x86_64", "avx2"), "vnni": cpu("x86_64", "avx2", "avx512_vnni")}.items():
        artifact = registry.get(engine).build(model, config, calibration, tmp_path / name, target=target)
        assert artifact.meta["reduce_range"] is (name == "plain") is int8_saturates(target)
