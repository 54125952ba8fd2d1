"""Fixtures: a real ONNX Runtime trial in a real store, and bundles exported from it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from autodeploy.adapters import registry
from autodeploy.adapters.base import Artifact, TrialConfig
from autodeploy.bundle import export
from autodeploy.device import probe_device
from autodeploy.harness.run import HarnessSettings, prepare_data, run_trial
from autodeploy.harness.timing import TimingPolicy
from autodeploy.model import ModelInfo, load_model
from autodeploy.results_db.store import DeviceRecord, ModelRecord, Store
from tests.models import mlp

FAST = TimingPolicy(
    warmup_min_calls=2, warmup_max_s=0.2, min_samples=64, min_duration_s=0.1, max_duration_s=5
)
CONFIG = TrialConfig("onnxruntime", batch=2, threads=1, knobs={"execution_mode": "ORT_PARALLEL"})


@dataclass(frozen=True)
class Stored:
    db: str
    trial_id: int
    model: ModelInfo
    config: TrialConfig
    artifact: Artifact
    root: Path

    def source(self) -> export.Source:
        with Store.open(self.db, readonly=True) as store:
            return export.stored_trial(store, self.trial_id)

    def reference_outputs(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The benchmarked artifact's outputs, through the adapter the harness used."""
        with registry.get(self.config.engine).load(self.artifact, self.config, self.model) as runner:
            return runner.run(feeds)


@pytest.fixture(scope="session")
def stored(tmp_path_factory) -> Stored:
    """One real, measured ORT trial (batch 2, 1 thread, ORT_PARALLEL) stored in a SQLite file."""
    root = tmp_path_factory.mktemp("stored")
    model = load_model(mlp(root / "m.onnx"))
    settings = HarnessSettings(workdir=root / "work", policy=FAST, timeout_s=30)
    result = run_trial(model, CONFIG, prepare_data(model, settings), settings)
    assert result.ok, result.failure_message
    db = f"sqlite:///{root / 'r.db'}"
    with Store.open(db) as store:
        trial_id = store.add_trial(result, model=ModelRecord.of(model), device=DeviceRecord.of(probe_device()),
                                   command="autodeploy bench m.onnx --batch 2", shape_key="",
                                   shapes=model.measured_shapes(CONFIG.batch))  # as bench stores it  # fmt: skip
    return Stored(db, trial_id, model, CONFIG, Artifact.read(Path(result.artifact_path)), root)


@pytest.fixture
def bundle(stored, tmp_path) -> Path:
    """A fresh bundle folder of the stored trial (safe to damage)."""
    return export.write_bundle(stored.source(), tmp_path / "bundle")


def feeds(batch: int = 2, seed: int = 0) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(seed).standard_normal((batch, 8)).astype(np.float32)}


def fresh_venv(requirements: Path, folder: Path) -> tuple[Path, dict[str, str]]:
    """A new virtualenv holding only ``requirements`` (a bundle's requirements.txt): its python and
    the environment to run it in (no PYTHONPATH: nothing of this checkout leaks in). Skips the test
    when the requirements cannot be installed here."""
    import os
    import subprocess
    import venv

    venv.create(folder, with_pip=True, clear=True)
    python = folder / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    pip = subprocess.run([str(python), "-m", "pip", "install", "-q", "-r", str(requirements)],
                         capture_output=True, text=True, env=env, timeout=900)  # fmt: skip
    if pip.returncode != 0:
        pytest.skip(f"cannot install the bundle's requirements here: {pip.stderr.strip()[-300:]}")
    return python, env
