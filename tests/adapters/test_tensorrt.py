"""TensorRT parts that need no GPU: probe reasons, profile shapes, plan compatibility, space.

The build and run paths run in the conformance suite on a machine with an NVIDIA GPU and
``autodeploy[tensorrt]``; elsewhere it skips with the probe's reason.
"""

import dataclasses
import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from autodeploy.adapters import tensorrt
from autodeploy.adapters.base import ARTIFACT_FILE, Artifact, TrialConfig
from autodeploy.device import probe_device
from autodeploy.errors import UnsupportedConfigError
from autodeploy.model import load_model
from tests.models import mlp, seq_model

ENGINE = tensorrt.TensorRTEngine()


def _device(gpus=()):
    return dataclasses.replace(probe_device(), gpus=tuple(gpus))


def test_probe_without_gpu_says_why_and_how_to_fix(monkeypatch):
    monkeypatch.setattr(tensorrt.shutil, "which", lambda name: None)
    availability = ENGINE.probe(_device())
    assert not availability.available
    assert availability.reason == "TensorRT needs an NVIDIA GPU; none found (nvidia-smi absent)"
    assert "NVIDIA GPU" in availability.fix


def test_probe_here_matches_the_gpus_found():
    availability = ENGINE.probe(probe_device())
    if not probe_device().gpus:
        assert availability.reason.startswith(tensorrt.NO_GPU_REASON)


def test_probe_with_gpu_but_no_tensorrt_gives_the_install_hint(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_tensorrt(name, *args, **kwargs):
        if name == "tensorrt":
            raise ImportError("No module named 'tensorrt'", name="tensorrt")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_tensorrt)
    availability = ENGINE.probe(_device(["NVIDIA H100 (compute 9.0)"]))
    assert availability.reason == "cannot import tensorrt"
    assert availability.fix == "pip install 'autodeploy[tensorrt]'"


def test_profile_spans_one_to_max_of_batch_and_eight(tmp_path):
    model = load_model(mlp(tmp_path / "m.onnx", in_features=16))
    assert tensorrt.profile_shapes(model, 4) == {"x": ((1, 16), (4, 16), (8, 16))}
    assert tensorrt.profile_shapes(model, 32) == {"x": ((1, 16), (32, 16), (32, 16))}


def test_profile_keeps_a_static_batch_and_uses_fixed_shapes(tmp_path):
    static = load_model(mlp(tmp_path / "s.onnx", batch=2, in_features=16))
    assert tensorrt.profile_shapes(static, 2) == {"x": ((2, 16), (2, 16), (2, 16))}
    fixed = {"input_ids": (1, 64), "attention_mask": (1, 64)}
    shapes = tensorrt.profile_shapes(load_model(seq_model(tmp_path / "q.onnx"), shapes=fixed), 4)
    assert (
        shapes["input_ids"] == ((1, 64), (4, 64), (8, 64)) and shapes["attention_mask"] == shapes["input_ids"]
    )


def _artifact(tmp_path, **meta):
    artifact = Artifact(tmp_path, "tensorrt", "10.3.0", "fp16", "k", (tensorrt.PLAN_FILE,), meta)
    (tmp_path / ARTIFACT_FILE).write_text(json.dumps(artifact.to_dict()))
    return Artifact.read(tmp_path)


def test_plan_check_accepts_the_same_version_and_gpu(tmp_path):
    meta = _artifact(tmp_path, tensorrt="10.3.0", compute_capability="8.9").meta
    tensorrt.check_plan_compatible(meta, "10.3.0", "8.9")


@pytest.mark.parametrize(
    "meta,match",
    [
        (
            {"tensorrt": "10.1.0", "compute_capability": "8.9"},
            "built with TensorRT 10.1.0, this machine has 10.3.0",
        ),
        (
            {"tensorrt": "10.3.0", "compute_capability": "9.0"},
            "built for compute capability 9.0, this GPU is 8.9",
        ),
        ({}, "does not record the TensorRT version"),
    ],
)
def test_plan_check_refuses_another_version_or_gpu(tmp_path, meta, match):
    artifact = _artifact(tmp_path, **meta)
    with pytest.raises(UnsupportedConfigError, match=match) as info:
        tensorrt.check_plan_compatible(artifact.meta, "10.3.0", "8.9")
    assert info.value.fix


def test_compute_capability_from_device_gpus():
    assert tensorrt.compute_capability(["NVIDIA H200 (compute 9.0)"]) == (9, 0)
    assert tensorrt.compute_capability(["some GPU"]) is None
    assert tensorrt.compute_capability([]) is None


def _qdq_model(path):
    w = numpy_helper.from_array(np.ones((4, 4), np.float32), "w")
    scale = numpy_helper.from_array(np.array(0.1, np.float32), "s")
    zero = numpy_helper.from_array(np.array(0, np.int8), "z")
    graph = helper.make_graph(
        [
            helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
            helper.make_node("DequantizeLinear", ["q", "s", "z"], ["dq"]),
            helper.make_node("MatMul", ["dq", "w"], ["y"]),
        ],
        "qdq",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
        [w, scale, zero],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_space_offers_int8_only_for_qdq_models_and_bf16_from_ampere(tmp_path):
    plain = load_model(mlp(tmp_path / "m.onnx"))
    space = ENGINE.space(_device(["NVIDIA T4 (compute 7.5)"]), plain)
    assert space.precisions == ("fp32", "fp16")
    assert "no QuantizeLinear" in space.unsupported["int8"] and "7.5" in space.unsupported["bf16"]
    qdq = load_model(_qdq_model(tmp_path / "q.onnx"))
    assert ENGINE.space(_device(["NVIDIA H200 (compute 9.0)"]), qdq).precisions == (
        "fp32",
        "fp16",
        "bf16",
        "int8",
    )


def test_batch_is_part_of_the_build_key(tmp_path):
    model = load_model(mlp(tmp_path / "m.onnx"))
    keys = {ENGINE.build_key(model, TrialConfig("tensorrt", "fp16", batch=b), "10.3.0", "") for b in (1, 8)}
    assert len(keys) == 2


def test_profile_runs_the_batch_on_the_models_own_axis(tmp_path):
    """``state[2, batch, 128]``: the profile varies axis 1; the scalar ``sr`` keeps one shape."""
    from tests.models import recurrent

    model = load_model(recurrent(tmp_path / "r.onnx"), {"input": (1, 16), "state": (2, 1, 128)})
    shapes = tensorrt.profile_shapes(model, 4)
    assert shapes["state"] == ((2, 1, 128), (2, 4, 128), (2, 8, 128))
    assert shapes["input"] == ((1, 16), (4, 16), (8, 16)) and shapes["sr"] == ((), (), ())
