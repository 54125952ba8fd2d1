"""Triton model repositories: layout and the config.pbtxt fields taken from the winner (no server here)."""

import json
import re

import pytest

from autodeploy.bundle import BundleError, export, triton
from tests.bundle.triton_proto.parse import parse

MODEL = {"name": "zoo:mlp", "sha256": "0" * 64, "shapes": {},
         "inputs": [{"name": "x", "dtype": "float32", "shape": ["N", 8]}],
         "outputs": [{"name": "logits", "dtype": "float32", "shape": ["N", 4]}]}  # fmt: skip


def fake_manifest(engine, precision="fp32", batch=4, threads=2, knobs=None, model=MODEL, scenario="single-stream",
                  serving=None, isa=("avx2",)):  # fmt: skip
    return {"engine": {"name": engine, "version": "1"}, "model": model,
            "settings": {"engine": engine, "precision": precision, "batch": batch, "threads": threads, "knobs": knobs or {}},
            "measurements": {"median_ms": 1.5, "scenario": scenario, **({"serving": serving} if serving else {})},
            "device": {"cpu": "CPU", "fingerprint": "f" * 16, "isa": list(isa)}}  # fmt: skip


def pbtxt(manifest):
    """config.pbtxt for ``manifest``, parsed with Triton's model_config.proto (a field Triton does not know raises)."""
    text, notes = triton.config_pbtxt(manifest, "m")
    return text, parse(text), notes


def field(text, name):
    return re.findall(rf"^\s*{name}: (.+)$", text, re.M)


def test_real_ort_trial_becomes_a_repository(stored, tmp_path):
    repo = triton.write_repository(stored.source(), tmp_path / "repo", model_name="mlp")
    assert sorted(p.relative_to(repo).as_posix() for p in repo.rglob("*") if p.is_file()) == [
        "mlp/1/model.onnx", "mlp/README.md", "mlp/config.pbtxt", "mlp/manifest.json"]  # fmt: skip
    assert (repo / "mlp/1/model.onnx").read_bytes() == (stored.artifact.path / "model.onnx").read_bytes()
    text = (repo / "mlp/config.pbtxt").read_text()
    assert field(text, "name")[0] == '"mlp"' and field(text, "platform") == ['"onnxruntime_onnx"']
    assert field(text, "backend") == ['"onnxruntime"'] and field(text, "max_batch_size") == ["2"]
    assert "dynamic_batching" not in text and field(text, "kind") == ["KIND_CPU"]  # measured on whole batches
    assert field(text, "count") == ["1"] and field(text, "dims") == ["[ 8 ]", "[ 4 ]"]
    assert field(text, "data_type") == ["TYPE_FP32", "TYPE_FP32"]
    assert 'key: "intra_op_thread_count"\n  value: {\n    string_value: "1"' in text
    assert 'key: "execution_mode"\n  value: {\n    string_value: "1"' in text  # ORT_PARALLEL
    assert "optimization" not in text  # ORT_ENABLE_ALL is the backend's default
    parse(text)
    assert "dynamic batching was not measured" in (repo / "mlp/README.md").read_text()
    assert triton.notes_of(repo) == json.loads((repo / "mlp/manifest.json").read_text())["triton"]["not_carried"]
    assert text.count("{") == text.count("}") and text.count("[") == text.count("]")
    manifest = json.loads((repo / "mlp/manifest.json").read_text())
    assert manifest["format"] == "triton" and "1/model.onnx" in manifest["files"]


def test_ort_graph_level_and_inter_op_threads():
    m = fake_manifest(
        "onnxruntime", knobs={"graph_optimization_level": "ORT_ENABLE_BASIC", "inter_op_num_threads": 2}
    )
    text, _ = triton.config_pbtxt(m, "m")
    assert "optimization {\n  graph {\n    level: -1\n  }\n}" in text
    assert 'key: "inter_op_thread_count"\n  value: {\n    string_value: "2"' in text


def test_openvino_config_carries_streams_threads_hint_and_bf16():
    compiled = {"PERFORMANCE_HINT": "THROUGHPUT", "NUM_STREAMS": 2, "INFERENCE_NUM_THREADS": 4,
                "INFERENCE_PRECISION_HINT": "bf16", "OPTIMAL_NUMBER_OF_INFER_REQUESTS": 2}  # fmt: skip
    m = fake_manifest("openvino", "bf16", batch=8, threads=4, scenario="offline",
                      knobs={"NUM_STREAMS": 2, "PERFORMANCE_HINT": "THROUGHPUT", "num_requests": 4},
                      serving={"concurrency": {**compiled, "requests": 4}, "compiled": compiled})  # fmt: skip
    text, config, notes = pbtxt(m)
    assert config.backend == "openvino" and not config.platform
    assert config.max_batch_size == 8 and [g.count for g in config.instance_group] == [4]
    params = {k: v.string_value for k, v in config.parameters.items()}
    assert params == {"INFERENCE_NUM_THREADS": "4", "NUM_STREAMS": "2", "PERFORMANCE_HINT": "THROUGHPUT",
                      "HINT_BF16": "YES", "SKIP_OV_DYNAMIC_BATCHSIZE": "YES", "ENABLE_BATCH_PADDING": "YES"}  # fmt: skip
    assert not config.HasField("dynamic_batching")  # measured offline, on whole batches
    assert any("dynamic batching was not measured" in n for n in notes)


def test_openvino_streams_and_threads_are_the_compiled_ones_not_the_requested():
    """NUM_STREAMS=2 with one thread compiles one stream: the repository says what ran."""
    compiled = {"PERFORMANCE_HINT": "THROUGHPUT", "NUM_STREAMS": 1, "INFERENCE_NUM_THREADS": 1,
                "INFERENCE_PRECISION_HINT": "f32", "OPTIMAL_NUMBER_OF_INFER_REQUESTS": 1}  # fmt: skip
    m = fake_manifest("openvino", batch=1, threads=1, scenario="offline", knobs={"NUM_STREAMS": 2},
                      serving={"concurrency": {**compiled, "requests": 1}, "compiled": compiled})  # fmt: skip
    _, config, notes = pbtxt(m)
    params = {k: v.string_value for k, v in config.parameters.items()}
    assert params == {"INFERENCE_NUM_THREADS": "1", "NUM_STREAMS": "1", "PERFORMANCE_HINT": "THROUGHPUT"}
    assert notes == []  # f32 is the CPU plugin's default on a CPU without bf16 (isa avx2 here)


def test_an_fp32_openvino_winner_on_a_bf16_cpu_says_triton_cannot_pin_f32():
    compiled = {"PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": 1, "INFERENCE_NUM_THREADS": 2,
                "INFERENCE_PRECISION_HINT": "f32", "OPTIMAL_NUMBER_OF_INFER_REQUESTS": 1}  # fmt: skip
    m = fake_manifest("openvino", batch=1, serving={"compiled": compiled}, isa=("avx512f", "avx512_bf16"))
    _, config, notes = pbtxt(m)
    assert "HINT_BF16" not in config.parameters
    assert len(notes) == 1 and "INFERENCE_PRECISION_HINT=f32" in notes[0] and "only HINT_BF16" in notes[0]


def test_a_server_winner_carries_its_measured_batcher_and_instances():
    split = {"max_batch": 4, "max_queue_delay_us": 500, "requests": 2, "mean_batch": 2.5,
             "queue_ms": {"p50": 0.3, "p99": 0.6}, "compute_ms": {"p50": 1.0, "p99": 1.2}}  # fmt: skip
    serving = {"concurrency": {"requests": 2, "sessions": 2, "intra_op_num_threads": 1},
               "server": {"max_rate_qps": 900.0, "p99_ms_at_rate": 4.0, "tried": [], "split": split}}  # fmt: skip
    m = fake_manifest("onnxruntime", batch=4, threads=1, scenario="server",
                      knobs={"num_requests": 2, "max_queue_delay_us": 500, "sessions": "per_request"}, serving=serving)
    _, config, notes = pbtxt(m)
    assert config.max_batch_size == 4 and [g.count for g in config.instance_group] == [2]
    assert config.dynamic_batching.max_queue_delay_microseconds == 500
    assert list(config.dynamic_batching.preferred_batch_size) == []  # the batcher filled up to max batch
    assert notes == []


def test_threads_sharing_one_ort_session_cannot_be_carried():
    serving = {"concurrency": {"requests": 3, "sessions": 1, "intra_op_num_threads": 1}}
    m = fake_manifest("onnxruntime", batch=1, threads=1, scenario="offline", knobs={"num_requests": 3},
                      serving=serving)  # fmt: skip
    _, config, notes = pbtxt(m)
    assert [g.count for g in config.instance_group] == [3]
    assert len(notes) == 1 and "3 threads sharing one ONNX Runtime session" in notes[0]


def test_tensorrt_config_uses_the_plan_profile_and_a_gpu_instance():
    text, _ = triton.config_pbtxt(fake_manifest("tensorrt", "fp16", batch=2, threads=None), "m")
    assert field(text, "platform") == ['"tensorrt_plan"'] and field(text, "kind") == ["KIND_GPU"]
    assert field(text, "max_batch_size") == ["8"] and "parameters" not in text


def test_the_parameters_are_the_declared_backends_own_words(monkeypatch):
    """``parameters``, the graph level and the notes come from the backend the engine declares
    (``TritonBackend.parameters``), not from its name: the ORT engine declaring another backend gets its words."""
    from dataclasses import dataclass

    from autodeploy.adapters.base import TritonBackend, TritonParameters
    from autodeploy.adapters.ort import OnnxRuntimeEngine

    @dataclass(frozen=True)
    class Echo(TritonBackend):
        def parameters(self, settings, serving, max_batch, device):
            return TritonParameters({"THREADS": str(settings["threads"]), "BATCH": str(max_batch)}, 1,
                                    (f"seen on {device['cpu']}",))  # fmt: skip

    monkeypatch.setattr(OnnxRuntimeEngine, "triton", Echo("echo"))
    _, config, notes = pbtxt(fake_manifest("onnxruntime", batch=4, threads=2))
    assert config.backend == "echo" and not config.platform
    assert {k: v.string_value for k, v in config.parameters.items()} == {"THREADS": "2", "BATCH": "4"}
    assert config.optimization.graph.level == 1 and notes[-1] == "seen on CPU"
    monkeypatch.setattr(OnnxRuntimeEngine, "triton", TritonBackend("echo"))  # the base writes none
    text, config, _ = pbtxt(fake_manifest("onnxruntime", batch=4, threads=2))
    assert not config.parameters and "optimization" not in text


def test_static_batch_model_gets_full_shapes_and_no_dynamic_batching():
    static = {**MODEL, "inputs": [{"name": "x", "dtype": "int64", "shape": [1, 3, "S"]}],
              "outputs": [{"name": "y", "dtype": "bool", "shape": [1, 3]}]}  # fmt: skip
    text, _ = triton.config_pbtxt(fake_manifest("onnxruntime", batch=1, model=static), "m")
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
    text, _ = triton.config_pbtxt(fake_manifest("onnxruntime", batch=1, model=recurrent), "m")
    assert field(text, "max_batch_size") == ["0"] and "dynamic_batching" not in text
    assert field(text, "dims") == ["[ 1, 16 ]", "[ 2, 1, 128 ]", "[ -1, 1 ]"]
    plain, _ = triton.config_pbtxt(fake_manifest("onnxruntime", batch=4), "m")
    assert field(plain, "max_batch_size") == ["4"]


def test_a_real_openvino_offline_trial_exports_exactly_what_was_measured(tmp_path):
    """Measured offline (AsyncInferQueue, THROUGHPUT hint, NUM_STREAMS=2 asked with one thread), stored,
    exported: every config.pbtxt field is the stored measurement's, read back from the compiled model."""
    pytest.importorskip("openvino")
    from autodeploy.adapters.base import TrialConfig
    from autodeploy.device import probe_device
    from autodeploy.harness.run import HarnessSettings, prepare_data, run_trial
    from autodeploy.model import load_model
    from autodeploy.results_db.store import DeviceRecord, ModelRecord, Store
    from tests.bundle.conftest import FAST
    from tests.models import mlp

    model = load_model(mlp(tmp_path / "m.onnx"))
    settings = HarnessSettings(workdir=tmp_path / "work", policy=FAST, timeout_s=60)
    config = TrialConfig("openvino", batch=4, threads=1,
                         knobs={"PERFORMANCE_HINT": "THROUGHPUT", "NUM_STREAMS": 2, "num_requests": 3})  # fmt: skip
    result = run_trial(model, config, prepare_data(model, settings), settings, scenario="offline")
    assert result.ok, result.failure_message
    db = f"sqlite:///{tmp_path / 'r.db'}"
    with Store.open(db) as store:
        trial_id = store.add_trial(result, model=ModelRecord.of(model), device=DeviceRecord.of(probe_device()))
        source = export.stored_trial(store, trial_id)
    repo = triton.write_repository(source, tmp_path / "repo", model_name="m")
    config_msg = parse((repo / "m/config.pbtxt").read_text())
    serving = source.trial.measurement.serving
    compiled = serving["compiled"]
    assert compiled["NUM_STREAMS"] == 1 and compiled["INFERENCE_NUM_THREADS"] == 1  # what one thread holds
    params = {k: v.string_value for k, v in config_msg.parameters.items()}
    assert params["NUM_STREAMS"] == str(compiled["NUM_STREAMS"]) and params["INFERENCE_NUM_THREADS"] == "1"
    assert params["PERFORMANCE_HINT"] == compiled["PERFORMANCE_HINT"] == "THROUGHPUT"
    assert params["SKIP_OV_DYNAMIC_BATCHSIZE"] == params["ENABLE_BATCH_PADDING"] == "YES"
    assert "HINT_BF16" not in params and compiled["INFERENCE_PRECISION_HINT"] == "f32"
    assert [g.count for g in config_msg.instance_group] == [serving["concurrency"]["requests"]] == [3]
    assert config_msg.max_batch_size == 4 and not config_msg.HasField("dynamic_batching")
    assert [list(i.dims) for i in config_msg.input] == [[8]]
