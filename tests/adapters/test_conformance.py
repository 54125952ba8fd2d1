"""The engine conformance suite: every engine in the registry runs it (see conftest.py)."""

import numpy as np
import pytest
from onnx.reference import ReferenceEvaluator

from autodeploy.adapters.base import ARTIFACT_FILE, Artifact, TrialConfig
from autodeploy.data import synthetic
from autodeploy.device import probe_device
from autodeploy.errors import ShapeError, UnsupportedConfigError
from autodeploy.model import load_model
from tests.models import mlp


@pytest.fixture
def model(tmp_path):
    return load_model(mlp(tmp_path / "m.onnx", in_features=16, classes=8))


def _reference(model, feeds):
    """Outputs from onnx's own reference evaluator: independent of every engine."""
    return ReferenceEvaluator(str(model.path)).run(None, feeds)


def test_probe_reports_version(engine):
    availability = engine.probe(probe_device())
    assert availability.available and availability.version


def test_fp32_build_load_run_matches_reference(engine, model, tmp_path):
    config = TrialConfig(engine.name, "fp32", batch=4, threads=1)
    artifact = engine.build(model, config, None, tmp_path / "artifacts", target=probe_device())
    assert (artifact.path / ARTIFACT_FILE).is_file() and artifact.files
    assert artifact.engine == engine.name and artifact.size_bytes() > 0
    feeds = {"x": synthetic(model, 4).inputs["x"]}
    with engine.load(artifact, config, model) as runner:
        outputs = runner.run(feeds)
    np.testing.assert_allclose(outputs["logits"], _reference(model, feeds)[0], rtol=1e-4, atol=1e-4)


def test_build_is_cached_and_reloads(engine, model, tmp_path):
    config = TrialConfig(engine.name, "fp32")
    first = engine.build(model, config, None, tmp_path / "a", target=probe_device())
    mtime = (first.path / ARTIFACT_FILE).stat().st_mtime_ns
    second = engine.build(model, config, None, tmp_path / "a", target=probe_device())
    assert second.path == first.path and (second.path / ARTIFACT_FILE).stat().st_mtime_ns == mtime
    reread = Artifact.read(first.path)
    assert reread == first
    assert not list((tmp_path / "a").glob(".*")), "no temporary build folder is left behind"


def test_int8_stays_close_to_reference(engine, model, tmp_path):
    space = engine.space(probe_device(), model)
    if "int8" not in space.precisions:
        pytest.skip(f"{engine.name} offers no int8 here: {space.unsupported.get('int8')}")
    calibration = synthetic(model, 64, seed=1).inputs
    config = TrialConfig(engine.name, "int8")
    artifact = engine.build(
        model, config, calibration, tmp_path / "a", target=probe_device(), calibration_hash="c1"
    )
    feeds = {"x": synthetic(model, 16, seed=2).inputs["x"]}
    with engine.load(artifact, config, model) as runner:
        got = runner.run(feeds)["logits"].ravel()
    want = _reference(model, feeds)[0].ravel()
    cosine = float(got @ want / (np.linalg.norm(got) * np.linalg.norm(want)))
    # A 16-wide random MLP loses a few percent to int8 (measured: 0.97 dynamic, 0.989 static);
    # the model is that small so the suite stays fast.
    assert cosine > 0.95
    assert np.abs(got - want).max() > 0, "int8 outputs equal fp32 exactly: nothing was quantized"


def test_unsupported_precision_is_pruned_with_reason(engine, model):
    with pytest.raises(UnsupportedConfigError, match="cannot run precision 'int3'"):
        engine.check(probe_device(), model, TrialConfig(engine.name, "int3"))
    with pytest.raises(UnsupportedConfigError, match="no knob 'warp_drive'"):
        engine.check(probe_device(), model, TrialConfig(engine.name, knobs={"warp_drive": 9}))


def test_runner_checks_feeds(engine, model, tmp_path):
    config = TrialConfig(engine.name)
    artifact = engine.build(model, config, None, tmp_path / "a", target=probe_device())
    with engine.load(artifact, config, model) as runner:
        with pytest.raises(ShapeError, match="missing \\['x'\\]"):
            runner.run({"y": np.zeros((1, 16), np.float32)})
        with pytest.raises(ShapeError, match="dtype float64"):
            runner.run({"x": np.zeros((1, 16), np.float64)})


def test_the_shipped_runtime_runs_the_artifact_as_the_harness_does(engine, model, tmp_path):
    """The runtime files a bundle ships, imported the way the shipped loader imports them."""
    import importlib.util
    import shutil
    from pathlib import Path

    import autodeploy.bundle.loader
    import autodeploy.runtime

    config = TrialConfig(engine.name, "fp32", batch=4, threads=1)
    artifact = engine.build(model, config, None, tmp_path / "artifacts", target=probe_device())
    name = engine.runtime_module(config).rpartition(".")[2]
    shipped = tmp_path / "shipped"
    (shipped / "runtime").mkdir(parents=True)
    shutil.copyfile(autodeploy.bundle.loader.__file__, shipped / "loader.py")
    for module in ("__init__", "base", "machine", "cache", name):
        shutil.copyfile(Path(autodeploy.runtime.__file__).with_name(f"{module}.py"), shipped / "runtime" / f"{module}.py")
    spec = importlib.util.spec_from_file_location(f"shipped_loader_{engine.name}", shipped / "loader.py")
    loader = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loader)
    runtime = loader._runtime(name)
    assert Path(runtime.__file__).parent == shipped / "runtime"  # not autodeploy's own copy
    feeds = {"x": synthetic(model, 4).inputs["x"]}
    settings = engine.runtime_settings(artifact, config, model)
    with runtime.open(artifact.path, settings, loader._runtime("base").IO.from_dict(model.to_dict())) as runner:
        got = runner.run(feeds)
    with engine.load(artifact, config, model) as runner:
        want = runner.run(feeds)
    assert list(got) == list(want) == ["logits"]
    np.testing.assert_array_equal(got["logits"], want["logits"])


def test_requests_in_flight_through_the_engines_parallel_api(engine, model, tmp_path):
    """Runner.pool: N requests at once (AsyncInferQueue, ORT threads, LiteRT interpreters, TensorRT contexts)."""
    config = TrialConfig(engine.name, "fp32", batch=4, threads=1)
    artifact = engine.build(model, config, None, tmp_path / "a", target=probe_device())
    feeds = {"x": synthetic(model, 4).inputs["x"]}
    ended: list[tuple[int, object]] = []
    with engine.load(artifact, config, model) as runner:
        pool = runner.pool(3)
        pool.on_done = lambda tag, error: ended.append((tag, error))
        for tag in range(12):
            pool.wait_free()
            pool.start(feeds, tag)
        pool.close()
    assert pool.requests == 3 and pool.info["requests"] == 3
    assert sorted(tag for tag, _ in ended) == list(range(12)) and all(error is None for _, error in ended)
