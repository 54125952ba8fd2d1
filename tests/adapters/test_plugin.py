"""Adding an engine is one adapter file, one runtime file and one registry entry (an entry point).

The plug-in (``tests/adapters/plugin``) is registered only through the ``autodeploy.engines``
entry-point group of a distribution installed into a temporary site folder; then the
registry, the conformance checks and a real trial in a worker process all find and run it.
"""

import numpy as np
import pytest

from autodeploy.adapters import registry
from autodeploy.adapters.base import TrialConfig
from autodeploy.data import synthetic
from autodeploy.device import probe_device
from autodeploy.harness.run import HarnessSettings, prepare_data, run_trial
from autodeploy.harness.timing import TimingPolicy
from autodeploy.model import load_model
from tests.adapters.plugin.adapter import TARGET
from tests.models import mlp


@pytest.fixture
def installed(tmp_path, monkeypatch):
    """A distribution whose only content is the entry point, on sys.path (inherited by workers)."""
    site = tmp_path / "site"
    info = site / "autodeploy_reference_engine-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: autodeploy-reference-engine\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{registry.ENTRY_POINT_GROUP}]\nreference = {TARGET}\n")
    monkeypatch.syspath_prepend(str(site))
    return site


def test_the_entry_point_alone_registers_the_engine(installed):
    assert "reference" not in registry.ENGINES
    assert registry.targets()["reference"] == TARGET
    engine = registry.get("reference")
    assert engine.probe(probe_device()).available and engine.probe_version() == engine.probe(probe_device()).version


def test_without_the_entry_point_the_engine_is_unknown():
    assert "reference" not in registry.targets()


def test_the_plugin_builds_loads_and_matches_onnxruntime(installed, tmp_path):
    model = load_model(mlp(tmp_path / "m.onnx", in_features=16, classes=8))
    engine, ort = registry.get("reference"), registry.get("onnxruntime")
    feeds = {"x": synthetic(model, 4).inputs["x"]}
    outputs = []
    for e in (engine, ort):
        config = TrialConfig(e.name, "fp32", batch=4)
        artifact = e.build(model, config, None, tmp_path / "artifacts", target=probe_device())
        with e.load(artifact, config, model) as runner:
            outputs.append(runner.run(feeds)["logits"])
    np.testing.assert_allclose(outputs[0], outputs[1], rtol=1e-4, atol=1e-5)


def test_a_trial_of_the_plugin_runs_in_a_worker_process(installed, tmp_path):
    model = load_model(mlp(tmp_path / "m.onnx", in_features=16, classes=8))
    policy = TimingPolicy(warmup_min_calls=2, warmup_max_s=0.2, min_samples=10, min_duration_s=0.05, max_duration_s=2)
    settings = HarnessSettings(workdir=tmp_path / "work", policy=policy, timeout_s=60)
    result = run_trial(model, TrialConfig("reference", "fp32"), prepare_data(model, settings), settings)
    assert result.ok, result.failure_message
    assert result.accuracy.passed and result.accuracy.outputs[0].cosine > 0.9999
    assert result.latency.n >= 10 and result.engine_version == registry.get("reference").probe_version()
