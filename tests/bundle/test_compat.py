"""Engine version and device checks: refusals for what cannot run, warnings for what only changes speed."""

import pytest

from autodeploy.adapters.base import Artifact, TrialConfig
from autodeploy.bundle import BundleError, check_compatible, export, loader
from autodeploy.model import load_model
from tests.models import mlp

ORT_VERSION = loader.installed_version(["onnxruntime"])
AMX_CPU = ("Intel Xeon Sapphire Rapids", frozenset({"avx512f", "amx_bf16", "amx_tile"}))
OLD_CPU = ("AMD EPYC", frozenset({"avx2", "avx512f", "avx512_vnni"}))


def manifest(engine="onnxruntime", version=ORT_VERSION, precision="fp32", requires=None, cpu="AMD EPYC"):
    return {"engine": {"name": engine, "version": version}, "settings": {"precision": precision},
            "requires": requires or {}, "device": {"cpu": cpu}}  # fmt: skip


def test_a_plain_bundle_runs_here():
    assert check_compatible(manifest(), cpu=OLD_CPU, gpus=None) == []


def test_bf16_winner_is_refused_on_a_cpu_without_bf16(monkeypatch):
    monkeypatch.setattr(loader, "installed_version", lambda packages: "2025.1.0")
    requires = {
        "isa_any_of": ["avx512_bf16", "amx_bf16"],
        "why": "OpenVINO runs bf16 natively only with AVX512-BF16 or AMX",
    }
    m = manifest("openvino", "2025.1.0", "bf16", requires, cpu=AMX_CPU[0])
    with pytest.raises(
        BundleError, match=r"needs a CPU with avx512_bf16 or amx_bf16 .*this CPU \(AMD EPYC\) has none"
    ):
        check_compatible(m, cpu=OLD_CPU)
    assert check_compatible(m, cpu=AMX_CPU) == []
    assert "cannot read this CPU's features" in check_compatible(m, cpu=None)[0]


def test_int8_vnni_is_speed_not_a_refusal():
    art = Artifact(path=None, engine="onnxruntime", engine_version="1", precision="int8", key="k", files=())
    assert export.device_requirements(TrialConfig("onnxruntime", "int8"), art, {"arch": "x86_64"}) == {}


def test_another_cpu_model_is_a_warning():
    warnings = check_compatible(manifest(cpu="Intel Core i9"), cpu=OLD_CPU, gpus=None)
    assert len(warnings) == 1 and "benchmarked on Intel Core i9, this CPU is AMD EPYC" in warnings[0]


def test_engine_version_mismatch_refuses_unless_allowed():
    m = manifest(version="0.0.1")
    with pytest.raises(
        BundleError,
        match=f"benchmarked with onnxruntime 0.0.1, this machine has {ORT_VERSION}.*requirements.txt",
    ):
        check_compatible(m, cpu=OLD_CPU)
    assert "outputs and speed may differ" in check_compatible(m, cpu=OLD_CPU, allow_other_version=True)[0]


def test_missing_engine_package_says_how_to_install():
    with pytest.raises(
        BundleError, match="runs on tflite 1.0, which is not installed|benchmarked with tflite"
    ):
        check_compatible(manifest("tflite", "1.0"), cpu=OLD_CPU)


def test_tensorrt_checks_version_and_compute_capability(monkeypatch):
    monkeypatch.setattr(loader, "installed_version", lambda packages: "10.7.0")
    m = manifest("tensorrt", "10.7.0", "fp16", {"gpu_compute_capability": "9.0"})
    assert check_compatible(m, cpu=OLD_CPU, gpus=["9.0"]) == []
    with pytest.raises(BundleError, match="built for compute capability 9.0, this machine's GPUs are 8.6"):
        check_compatible(m, cpu=OLD_CPU, gpus=["8.6"])
    with pytest.raises(BundleError, match="needs an NVIDIA GPU of compute capability 9.0; none found"):
        check_compatible(m, cpu=OLD_CPU, gpus=None)
    locked = manifest("tensorrt", "10.6.0", "fp16", {"gpu_compute_capability": "9.0"})
    with pytest.raises(
        BundleError, match="benchmarked with tensorrt 10.6.0"
    ):  # version-locked: no escape hatch
        check_compatible(locked, cpu=OLD_CPU, gpus=["9.0"], allow_other_version=True)


def test_export_records_what_each_engine_needs():
    def art(engine, meta=None):
        return Artifact(
            path=None, engine=engine, engine_version="1", precision="x", key="k", files=(), meta=meta or {}
        )

    bf16 = export.device_requirements(TrialConfig("openvino", "bf16"), art("openvino"), {"arch": "x86_64"})
    assert set(bf16["isa_any_of"]) == {"avx512_bf16", "amx_bf16"}
    trt = export.device_requirements(
        TrialConfig("tensorrt", "fp16"), art("tensorrt", {"compute_capability": "8.9"}), {}
    )
    assert trt["gpu_compute_capability"] == "8.9"
    with pytest.raises(BundleError, match="does not record the compute capability"):
        export.device_requirements(TrialConfig("tensorrt", "fp16"), art("tensorrt"), {})
    assert (
        export.device_requirements(TrialConfig("openvino", "fp32"), art("openvino"), {"arch": "x86_64"}) == {}
    )


def test_runtime_settings_use_each_engines_own_words(tmp_path):
    model = load_model(mlp(tmp_path / "m.onnx", in_features=16))

    def art(engine):
        return Artifact(path=None, engine=engine, engine_version="1", precision="x", key="k", files=())

    config = TrialConfig("openvino", "bf16", batch=2, threads=4, knobs={"NUM_STREAMS": 2})
    ov = export.runtime_settings(config, art("openvino"), model)
    assert ov["properties"] == {"INFERENCE_PRECISION_HINT": "bf16", "PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": "2",
                                "INFERENCE_NUM_THREADS": 4}  # fmt: skip
    assert ov["shapes"] == {"x": [2, 16]}  # compiled at the measured batch, as the harness did
    tfl = export.runtime_settings(TrialConfig("tflite", "int8", threads=2, knobs={"xnnpack": False}), art("tflite"), model)
    assert tfl == {
        "model_file": "model.tflite",
        "layout_file": "layout.json",
        "num_threads": 2,
        "xnnpack": False,
    }
    with pytest.raises(BundleError, match="no runner for it"):
        export.runtime_settings(TrialConfig("warp"), art("warp"), model)
