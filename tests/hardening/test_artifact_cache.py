"""A cached artifact replaced *and* its ``artifact.json`` resealed (issue 28): a re-``bench`` measured
the other file, and export shipped it under the source model's SHA-256. ``artifact.json`` is in
the cache, so whoever writes the cache can rewrite it consistently; what it cannot rewrite is the
results store's record of the files each measurement ran on. A cached artifact that no longer
holds the files its store measured is built again from the model, and ``artifact.json`` records
the build (key and source model) so an artifact moved in from another build is never reused."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import autodeploy.api
from autodeploy.adapters import registry
from autodeploy.adapters.base import ARTIFACT_FILE, Artifact, TrialConfig
from autodeploy.bundle import export
from autodeploy.device import probe_device
from autodeploy.model import load_model
from autodeploy.results_db import Store
from tests.bundle.conftest import FAST
from tests.models import mlp


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _swap_and_reseal(artifact: Path, other: Path) -> None:
    """What an attacker with write access to the cache does: another model's bytes, checksums to match."""
    shutil.copyfile(other, artifact / "model.onnx")
    record = json.loads((artifact / ARTIFACT_FILE).read_text())
    record["sha256"]["model.onnx"] = _sha256(other)
    (artifact / ARTIFACT_FILE).write_text(json.dumps(record, indent=2))


def test_a_replaced_and_resealed_cached_artifact_is_rebuilt_not_measured_or_exported(tmp_path):
    source, other = mlp(tmp_path / "m.onnx", seed=0), mlp(tmp_path / "other.onnx", seed=1)
    db, cache = f"sqlite:///{tmp_path / 'r.db'}", tmp_path / "cache"
    first = autodeploy.api.bench(source, engine="onnxruntime", threads=1, timing=FAST, db=db, cache=cache)
    assert first.result.ok, first.result.failure_message
    artifact = Path(first.result.artifact_path)
    genuine = (artifact / "model.onnx").read_bytes()
    _swap_and_reseal(artifact, other)
    assert Artifact.read(artifact).changed() == []  # consistent: artifact.json alone cannot tell

    second = autodeploy.api.bench(source, engine="onnxruntime", threads=1, timing=FAST, db=db, cache=cache)
    assert second.result.ok, second.result.failure_message
    assert Path(second.result.artifact_path) == artifact
    assert (artifact / "model.onnx").read_bytes() == genuine  # built again from the source model
    assert second.result.artifact_files["model.onnx"] == hashlib.sha256(genuine).hexdigest()
    with Store.open(db, readonly=True) as store:
        bundle = export.write_bundle(export.stored_trial(store, second.id), tmp_path / "bundle")
    assert (bundle / "model" / "model.onnx").read_bytes() == genuine


def test_an_artifact_built_for_another_model_is_never_reused(tmp_path):
    """Another build's folder (with its own consistent artifact.json) put in this key's place."""
    engine, config = registry.get("onnxruntime"), TrialConfig("onnxruntime")
    model = load_model(mlp(tmp_path / "m.onnx", seed=0))
    other = load_model(mlp(tmp_path / "other.onnx", seed=1))
    mine = engine.build(model, config, None, tmp_path / "work", target=probe_device())
    theirs = engine.build(other, config, None, tmp_path / "work", target=probe_device())
    record = json.loads((mine.path / ARTIFACT_FILE).read_text())
    assert (record["key"], record["model_sha256"]) == (mine.key, model.sha256)
    shutil.rmtree(mine.path)
    shutil.copytree(theirs.path, mine.path)
    again = engine.build(model, config, None, tmp_path / "work", target=probe_device())
    assert not again.reused and again.path == mine.path
    assert _sha256(again.path / "model.onnx") == _sha256(model.path)
    rebuilt = engine.build(model, config, None, tmp_path / "work", target=probe_device())
    assert rebuilt.reused  # and the rebuilt one is reused
