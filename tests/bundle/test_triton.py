"""Triton model repositories: layout and the config.pbtxt fields taken from the winner (no server here)."""

import json
import re

import pytest

from autodeploy.adapters.base import Artifact
from autodeploy.bundle import BundleError, export, triton

MODEL = {"name": "zoo:mlp", "sha256": "0" * 64, "shapes": {},
         "inputs": [{"name": "x", "dtype": "float32", "shape": ["N", 8]}],
         "outputs": [{"name": "logits", "dtype": "float32", "shape": ["N", 4]}]}  # fmt: skip


def fake_manifest(engine, precision="fp32", batch=4, threads=2, knobs=None, model=MODEL):
    return {"engine": {"name": engine, "version": "1"}, "model": model,
            "settings": {"engine": engine, "precision": precision, "batch": batch, "threads": threads, "knobs": knobs or {}},
            "measurements": {"median_ms": 1.5}, "device": {"cpu": "CPU", "fingerprint": "f" * 16}}  # fmt: skip


def art(engine):
    return Artifact(path=None, engine=engine, engine_version="1", precision="fp32", key="k", files=())


def field(text, name):
    return re.findall(rf"^\s*{name}: (.+)$", text, re.M)


def test_real_ort_trial_becomes_a_repository(stored, tmp_path):
    repo = triton.write_repository(stored.source(), tmp_path / "repo", model_name="mlp")
    assert sorted(p.relative_to(repo).as_posix() for p in repo.rglob("*") if p.is_file()) == [
        "mlp/1/model.onnx", "mlp/config.pbtxt", "mlp/manifest.json"]  # fmt: skip
    assert (repo / "mlp/1/model.onnx").read_bytes() == (stored.artifact.path / "model.onnx").read_bytes()
    text = (repo / "mlp/config.pbtxt").read_text()
    assert field(text, "name")[0] == '"mlp"' and field(text, "platform") == ['"onnxruntime_onnx"']
    assert field(text, "backend") == ['"onnxruntime"'] and field(text, "max_batch_size") == ["2"]
    assert field(text, "preferred_batch_size") == ["[ 2 ]"] and field(text, "kind") == ["KIND_CPU"]
    assert field(text, "count") == ["1"] and field(text, "dims") == ["[ 8 ]", "[ 4 ]"]
    assert field(text, "data_type") == ["TYPE_FP32", "TYPE_FP32"]
    assert 'key: "intra_op_thread_count"\n  value: {\n    string_value: "1"' in text
    assert 'key: "execution_mode"\n  value: {\n    string_value: "1"' in text  # ORT_PARALLEL
    assert "optimization" not in text  # ORT_ENABLE_ALL is the backend's default
    assert text.count("{") == text.count("}") and text.count("[") == text.count("]")
    manifest = json.loads((repo / "mlp/manifest.json").read_text())
    assert manifest["format"] == "triton" and "1/model.onnx" in manifest["files"]


def test_ort_graph_level_and_inter_op_threads():
    m = fake_manifest(
        "onnxruntime", knobs={"graph_optimization_level": "ORT_ENABLE_BASIC", "inter_op_num_threads": 2}
    )
    text = triton.config_pbtxt(m, "m", art("onnxruntime"))
    assert "optimization {\n  graph {\n    level: -1\n  }\n}" in text
    assert 'key: "inter_op_thread_count"\n  value: {\n    string_value: "2"' in text


def test_openvino_config_carries_streams_threads_hint_and_bf16():
    m = fake_manifest("openvino", "bf16", batch=8, threads=4,
                      knobs={"NUM_STREAMS": 2, "PERFORMANCE_HINT": "THROUGHPUT", "num_requests": 4})  # fmt: skip
    text = triton.config_pbtxt(m, "m", art("openvino"))
    assert field(text, "backend") == ['"openvino"'] and not field(text, "platform")
    assert field(text, "max_batch_size") == ["8"] and field(text, "count") == ["4"]
    for key, value in (("INFERENCE_NUM_THREADS", "4"), ("NUM_STREAMS", "2"), ("PERFORMANCE_HINT", "THROUGHPUT"),
                       ("HINT_BF16", "YES")):  # fmt: skip
        assert f'key: "{key}"\n  value: {{\n    string_value: "{value}"' in text


def test_tensorrt_config_uses_the_plan_profile_and_a_gpu_instance():
    text = triton.config_pbtxt(fake_manifest("tensorrt", "fp16", batch=2, threads=None), "m", art("tensorrt"))
    assert field(text, "platform") == ['"tensorrt_plan"'] and field(text, "kind") == ["KIND_GPU"]
    assert field(text, "max_batch_size") == ["8"] and "parameters" not in text


def test_static_batch_model_gets_full_shapes_and_no_dynamic_batching():
    static = {**MODEL, "inputs": [{"name": "x", "dtype": "int64", "shape": [1, 3, "S"]}],
              "outputs": [{"name": "y", "dtype": "bool", "shape": [1, 3]}]}  # fmt: skip
    text = triton.config_pbtxt(fake_manifest("onnxruntime", batch=1, model=static), "m", art("onnxruntime"))
    assert field(text, "max_batch_size") == ["0"] and "dynamic_batching" not in text
    assert field(text, "dims") == ["[ 1, 3, -1 ]", "[ 1, 3 ]"] and field(text, "data_type") == [
        "TYPE_INT64",
        "TYPE_BOOL",
    ]


def test_tflite_winner_is_refused_with_the_alternative(stored, tmp_path):
    import dataclasses

    source = stored.source()
    config = dataclasses.replace(source.trial.config, engine="tflite")
    tfl = dataclasses.replace(source, trial=dataclasses.replace(source.trial, config=config))
    with pytest.raises(
        BundleError, match="Triton has no backend for tflite winners.*ship the bundle instead"
    ):
        triton.write_repository(tfl, tmp_path / "repo")
    assert not (tmp_path / "repo").exists()


def test_model_names_are_safe_folder_names():
    assert triton.model_name_of("zoo:mlp") == "zoo-mlp" and triton.model_name_of("../x") == "x"
    assert export  # the repository is written through the same atomic staging as bundles


def test_a_batch_off_axis_0_gets_full_shapes_and_no_dynamic_batching():
    """``state[2, batch, 128]``: Triton batches axis 0 only, so the repository says no batching
    (Triton would otherwise stack requests on the wrong axis)."""
    recurrent = {**MODEL, "shapes": {"input": [1, 16], "state": [2, 1, 128]},
                 "inputs": [{"name": "input", "dtype": "float32", "shape": ["batch", "sequence"]},
                            {"name": "state", "dtype": "float32", "shape": [2, "batch", 128]}],
                 "outputs": [{"name": "output", "dtype": "float32", "shape": ["batch", 1]}]}  # fmt: skip
    text = triton.config_pbtxt(fake_manifest("onnxruntime", batch=1, model=recurrent), "m", art("onnxruntime"))
    assert field(text, "max_batch_size") == ["0"] and "dynamic_batching" not in text
    assert field(text, "dims") == ["[ 1, 16 ]", "[ 2, 1, 128 ]", "[ -1, 1 ]"]
    plain = triton.config_pbtxt(fake_manifest("onnxruntime", batch=4), "m", art("onnxruntime"))
    assert field(plain, "max_batch_size") == ["4"]
