"""A real tiny study exported through the CLI, and real OpenVINO / TFLite winners loaded by the bundle loader."""

import importlib.util
import json

import numpy as np
import pytest

import autodeploy.bundle
from autodeploy.adapters import registry
from autodeploy.adapters.base import Artifact, TrialConfig
from autodeploy.bundle import export
from autodeploy.device import probe_device
from autodeploy.harness.run import HarnessSettings, prepare_data, run_trial
from autodeploy.results_db.store import DeviceRecord, ModelRecord, Store
from autodeploy.search.study import run_study
from tests.bundle.conftest import FAST, feeds, fresh_venv
from tests.cli.test_cli import run as run_cli
from tests.search.test_study import FAST_FINALISTS, make_ctx


@pytest.mark.slow
def test_study_winner_exports_verifies_and_loads(tmp_path, capsys, monkeypatch):
    db = f"sqlite:///{tmp_path / 'r.db'}"
    ctx = make_ctx(tmp_path, db, name="mlp-latency", trials=2, finalists=FAST_FINALISTS,
                   constraints={"max_accuracy_drop": 0.5})  # fmt: skip
    summary = run_study(ctx)
    assert summary.winner is not None
    monkeypatch.setenv("AUTODEPLOY_DB", db)
    code, out, err = run_cli(capsys, "export", "mlp-latency", "-o", str(tmp_path / "ship"))
    assert code == 0 and "study 'mlp-latency' winner" in out, err
    m = json.loads((tmp_path / "ship" / "manifest.json").read_text())
    assert m["source"]["study"] == "mlp-latency" and m["source"]["reproduce"] == "autodeploy tune test"
    assert m["source"]["trial_uid"] == ctx.store.get_study("mlp-latency").winner_uid
    assert (
        m["selection"]["objective"] == "latency" and m["selection"]["winner"]["label"] == summary.winner.label
    )
    drop = m["constraints"]["accuracy_drop"]
    assert drop["limit"] == 0.5 and 0 <= drop["measured"] <= 0.5 and drop["passed"]
    assert m["settings"] == summary.winner.config.to_dict()
    code, out, err = run_cli(capsys, "bundle", "verify", str(tmp_path / "ship"))
    assert code == 0, err
    code, out, err = run_cli(capsys, "bundle", "info", str(tmp_path / "ship"))
    assert code == 0 and "mlp-latency" in out, err
    config = TrialConfig.from_dict(m["settings"])
    artifact = Artifact.read(tmp_path / "ship" / "model")
    x = feeds(batch=config.batch)
    with registry.get(config.engine).load(artifact, config, ctx.model) as runner, \
            autodeploy.bundle.load(tmp_path / "ship") as predictor:  # fmt: skip
        assert np.array_equal(predictor.run(x)["logits"], runner.run(x)["logits"])
    code, out, err = run_cli(
        capsys, "export", "mlp-latency", "-o", str(tmp_path / "repo"), "--format", "triton"
    )
    assert code == 0 and (tmp_path / "repo" / "m" / "config.pbtxt").is_file(), err


def _engine_trial(tmp_path, stored, config, max_accuracy_drop=0.01):
    engine = registry.get(config.engine)
    if not engine.probe(probe_device()).available:
        pytest.skip(f"{config.engine}: {engine.probe(probe_device())}")
    settings = HarnessSettings(workdir=tmp_path / "work", policy=FAST, timeout_s=300, max_accuracy_drop=max_accuracy_drop)
    result = run_trial(stored.model, config, prepare_data(stored.model, settings), settings)
    assert result.ok, result.failure_message
    with Store.open(stored.db) as store:
        trial_id = store.add_trial(
            result, model=ModelRecord.of(stored.model), device=DeviceRecord.of(probe_device())
        )
        source = export.stored_trial(store, trial_id)
    return source, Artifact.read(export.Path(result.artifact_path))


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("openvino") is None, reason="openvino is not installed")
def test_openvino_winner_loads_with_its_compile_properties(stored, tmp_path):
    config = TrialConfig("openvino", "fp32", batch=2, threads=1, knobs={"NUM_STREAMS": 1})
    source, artifact = _engine_trial(tmp_path, stored, config)
    bundle = export.write_bundle(source, tmp_path / "ov")
    m = json.loads((bundle / "manifest.json").read_text())
    assert m["runtime"]["properties"]["INFERENCE_PRECISION_HINT"] == "f32" and m["requires"] == {}
    x = feeds()
    with (
        registry.get("openvino").load(artifact, config, stored.model) as runner,
        autodeploy.bundle.load(bundle) as p,
    ):
        assert np.array_equal(p.run(x)["logits"], runner.run(x)["logits"])
    repo = export.Path(tmp_path / "repo")
    from autodeploy.bundle import triton

    triton.write_repository(source, repo, model_name="m")
    assert sorted(p.name for p in (repo / "m" / "1").iterdir()) == ["model.bin", "model.xml"]


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("onnx2tf") is None, reason="the TFLite converter is not installed"
)
def test_tflite_winner_loads_with_its_threads_and_layout(stored, tmp_path):
    config = TrialConfig("tflite", "fp32", batch=2, threads=1)
    source, artifact = _engine_trial(tmp_path, stored, config)
    bundle = export.write_bundle(source, tmp_path / "tfl")
    x = feeds()
    with (
        registry.get("tflite").load(artifact, config, stored.model) as runner,
        autodeploy.bundle.load(bundle) as p,
    ):
        assert np.array_equal(p.run(x)["logits"], runner.run(x)["logits"])


@pytest.mark.slow
@pytest.mark.parametrize("precision,runtime", [("fp32", "onnxruntime"), ("int8", "onnxruntime"), ("int8", "openvino")])
def test_inhouse_winner_ships_on_the_runtime_it_was_measured_on(stored, tmp_path, precision, runtime):
    """The in-house engine's artifact is plain ONNX: its bundle pins and runs the runtime it ran on."""
    if runtime == "openvino" and importlib.util.find_spec("openvino") is None:
        pytest.skip("openvino is not installed")
    config = TrialConfig("inhouse", precision, batch=2, threads=1, knobs={"runtime": runtime})
    # The random-weight MLP's logits are near ties: int8 flips argmaxes. The test is about shipping.
    source, artifact = _engine_trial(tmp_path, stored, config, max_accuracy_drop=1.0)
    bundle = export.write_bundle(source, tmp_path / "inhouse")
    m = json.loads((bundle / "manifest.json").read_text())
    from autodeploy.runtime import machine

    installed = machine.installed_version([runtime])
    assert m["engine"]["name"] == "inhouse" and m["engine"]["runtime"] == runtime
    assert m["engine"]["runtime_version"] == installed and m["engine"]["version"].startswith("autodeploy-")
    assert f"{runtime}=={installed}" in (bundle / "requirements.txt").read_text().splitlines()
    assert (bundle / "runtime" / f"{runtime}.py").is_file()
    x = feeds()
    with registry.get("inhouse").load(artifact, config, stored.model) as runner, autodeploy.bundle.load(bundle) as p:
        assert np.array_equal(p.run(x)["logits"], runner.run(x)["logits"])
    from autodeploy.bundle import triton

    repo = triton.write_repository(source, tmp_path / "repo", model_name="m")
    backend = {"onnxruntime": 'platform: "onnxruntime_onnx"', "openvino": 'backend: "openvino"'}[runtime]
    assert backend in (repo / "m" / "config.pbtxt").read_text()


@pytest.mark.slow
@pytest.mark.parametrize("config", [
    TrialConfig("openvino", "fp32", batch=2, threads=1),
    TrialConfig("tflite", "fp32", batch=2, threads=1),
    TrialConfig("inhouse", "fp32", batch=2, threads=1),
], ids=lambda c: c.engine)  # fmt: skip
def test_each_engines_bundle_runs_in_a_fresh_venv_with_only_its_requirements(stored, tmp_path, config):
    """What a user does on the target: a new venv, `pip install -r requirements.txt`, the shipped loader.
    (ONNX Runtime's own bundle has the same test in test_verify.py.)"""
    import subprocess
    import textwrap

    source, artifact = _engine_trial(tmp_path, stored, config)
    bundle = export.write_bundle(source, tmp_path / "ship")
    python, env = fresh_venv(bundle / "requirements.txt", tmp_path / "venv")
    x = feeds()
    np.save(tmp_path / "x.npy", x["x"])
    script = textwrap.dedent(f"""
        import runpy, sys, numpy as np
        loader = runpy.run_path({str(bundle / "loader.py")!r})
        p = loader["load"]({str(bundle)!r})
        np.save({str(tmp_path / "y.npy")!r}, p.run({{"x": np.load({str(tmp_path / "x.npy")!r})}})["logits"])
        assert "autodeploy" not in sys.modules
    """)
    proc = subprocess.run([str(python), "-I", "-c", script], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    with registry.get(config.engine).load(artifact, config, stored.model) as runner:
        assert np.array_equal(np.load(tmp_path / "y.npy"), runner.run(x)["logits"])
