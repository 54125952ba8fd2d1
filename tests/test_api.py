"""The library entry points end to end: ``autodeploy.bench``, ``tune`` and ``export`` on zoo:tiny-cnn
with ONNX Runtime, into a temporary SQLite store, and the exported bundle loaded and run."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import numpy as np
import optuna
import pytest

import autodeploy
from autodeploy.adapters.base import TrialConfig
from autodeploy.api import BenchRequest
from autodeploy.errors import UnknownEngineError, UsageError
from autodeploy.harness.timing import TimingPolicy
from autodeploy.intake import resolve_model
from autodeploy.results_db import Store, TrialFilter
from autodeploy.search.study import Reporter
from tests.models import seq_model

FAST = TimingPolicy(
    warmup_min_calls=2, warmup_max_s=0.2, min_samples=64, min_duration_s=0.1, max_duration_s=5
)
SMALL_FINALISTS = {"finalists": {"count": 1, "rounds": 1, "min_samples": 64, "min_duration_s": 0.1}}


@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTODEPLOY_CACHE", str(tmp_path / "cache"))
    return tmp_path, f"sqlite:///{tmp_path / 'r.db'}"


class Recorder(Reporter):
    def __init__(self) -> None:
        self.phases: list[str] = []
        self.done: list[int] = []

    def phase(self, text: str) -> None:
        self.phases.append(text)

    def trial_done(self, done: int, best: str | None) -> None:
        self.done.append(done)


def test_import_autodeploy_stays_light_and_loads_the_api_on_first_use():
    code = (
        "import sys, autodeploy; before = 'autodeploy.api' in sys.modules; autodeploy.bench; autodeploy.bundle; "
        "heavy = [m for m in ('onnxruntime', 'openvino', 'tensorrt', 'tensorflow', 'torch', 'streamlit', 'optuna')"
        " if m in sys.modules]; print(before, 'autodeploy.api' in sys.modules, heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False True []"
    assert autodeploy.tune is autodeploy.api.tune and autodeploy.tune.__module__ == "autodeploy.api._tune"


def test_bench_returns_the_trial_as_stored(env):
    tmp_path, db = env
    progress: list[str] = []
    record = autodeploy.bench("zoo:tiny-cnn", engine="onnxruntime", threads=1, timing=FAST, db=db,
                              progress=progress.append)  # fmt: skip
    assert (
        record.ok
        and record.model.name == "zoo:tiny-cnn"
        and record.config.label() == "onnxruntime/fp32/b1/t1"
    )
    assert progress[0] == "building zoo:tiny-cnn (first use only)"
    assert any(p.startswith("onnxruntime/fp32/b1/t1: ") for p in progress)
    result = record.result
    with Store.open(db, readonly=True) as store:
        row = store.trial(TrialFilter(id=record.id))
        assert store.count_trials() == 1
    assert row.uid == result.uid and row.status == "ok" and row.config == result.config
    assert row.model_name == "zoo:tiny-cnn" and row.model_sha256 == record.model.sha256
    assert row.device_fingerprint == record.device.fingerprint
    assert row.n_samples == result.latency.n >= 64
    assert row.median_ms == pytest.approx(result.latency.median)
    assert row.p90_ms == pytest.approx(result.latency.p90)
    assert row.samples_ms == pytest.approx(result.samples_ms)
    assert row.accuracy == result.accuracy and row.accuracy.passed
    assert row.command.startswith("autodeploy.bench('zoo:tiny-cnn', engine='onnxruntime', threads=1")


def test_bench_takes_a_trial_config_and_an_open_store(env):
    tmp_path, db = env
    with Store.open(db) as store:
        config = TrialConfig("onnxruntime", batch=2, threads=1)
        request = BenchRequest(timing=FAST, db=store, command="by hand")  # the keywords as one record
        record = autodeploy.bench("zoo:tiny-cnn", config, request=request)
        row = store.trial(TrialFilter(id=record.id))  # the store is left open
    assert row.batch == 2 and row.command == "by hand" and record.config == config


def test_a_bench_request_is_the_keywords_once():
    request = BenchRequest(engine="onnxruntime", threads=1, timeout_s=120)
    assert BenchRequest.of(None, None, {"engine": "onnxruntime", "threads": 1, "timeout_s": 120}) == request
    assert BenchRequest.of(request, None, {"threads": 2}).threads == 2 and request.threads == 1  # keywords win
    assert request.trial_config() == TrialConfig("onnxruntime", "fp32", 1, 1, {})
    # what the recorded command repeats: the settings given, not where it ran or reported
    assert dataclasses.replace(request, db="sqlite:///r.db", progress=print).given() == {
        "engine": "onnxruntime", "threads": 1, "timeout_s": 120,
    }  # fmt: skip
    with pytest.raises(TypeError, match="unknown keyword.s. engin; it takes: config, engine, "):
        autodeploy.bench("zoo:tiny-cnn", engin="openvino")
    with pytest.raises(UsageError, match="not both"):
        autodeploy.bench("zoo:tiny-cnn", TrialConfig("onnxruntime"), request=BenchRequest(batch=2))
    with pytest.raises(UsageError, match="server scenario needs a p99 bound"):
        BenchRequest(scenario="server")


def test_bad_arguments_raise_autodeploy_errors_before_any_work(env):
    tmp_path, db = env
    with pytest.raises(UnknownEngineError, match="unknown engine 'warp'"):
        autodeploy.bench("zoo:tiny-cnn", engine="warp", db=db)
    with pytest.raises(UsageError, match="not both"):
        autodeploy.bench("zoo:tiny-cnn", TrialConfig("onnxruntime"), batch=2, db=db)
    with pytest.raises(UsageError, match="no model given"):
        autodeploy.tune(db=db)
    with pytest.raises(UsageError, match="invalid study config: objective"):
        autodeploy.tune("zoo:tiny-cnn", objective="fastest", db=db)
    with pytest.raises(UsageError, match="one of them"):
        autodeploy.export(output=tmp_path / "ship", db=db)
    Store.open(db).close()  # an empty store
    with pytest.raises(UsageError, match="no study named 'nope'"):
        autodeploy.export("nope", tmp_path / "ship", db=db)
    assert not (tmp_path / "ship").exists()


@pytest.mark.slow
def test_tune_then_export_then_load_and_run_the_bundle(env):
    tmp_path, db = env
    reporter = Recorder()
    summary = autodeploy.tune("zoo:tiny-cnn", config=SMALL_FINALISTS, name="api", engines=["onnxruntime"],
                              precisions=["fp32"], threads=[1], trials=2, min_samples=64, min_duration_s=0.1,
                              db=db, reporter=reporter)  # fmt: skip
    assert summary.name == "api" and summary.winner is not None and summary.trials["complete"] == 2
    assert reporter.done == [1, 2] and "building zoo:tiny-cnn (first use only)" in reporter.phases

    path = autodeploy.export(summary, tmp_path / "ship", db=db)
    assert path == tmp_path / "ship"
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["source"]["study"] == "api" and manifest["settings"] == summary.winner.config.to_dict()
    reproduce = manifest["source"]["reproduce"]
    assert (
        reproduce.startswith("autodeploy.tune('zoo:tiny-cnn', config={'finalists': ")
        and "name='api'" in reproduce
    )
    x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)
    with autodeploy.bundle.load(path) as predictor:
        logits = predictor.run({"input": x})["logits"]
    import onnxruntime as ort

    expected = ort.InferenceSession(str(resolve_model("zoo:tiny-cnn").info.path)).run(None, {"input": x})[0]
    np.testing.assert_allclose(logits, expected, rtol=1e-4, atol=1e-5)

    # Resume with the model and name only: the stored search space and screening settings apply.
    again = autodeploy.tune("zoo:tiny-cnn", name="api", resume=True, trials=1, finalists=0, db=db)
    # Both configs of the space were measured: the resume measures nothing new. The resumed sampler is
    # seeded apart (storage.py), so what it suggests is a measured config (repeated, for free) or a point
    # the space prunes by its rule (pruned, for free); which, and how many, varies with the seed.
    assert again.trials["complete"] == 2 and again.trials.get("repeated", 0) + again.trials.get("pruned", 0) >= 1
    trials = optuna.load_study(study_name="api", storage=db).trials
    assert {(t.user_attrs["config"]["engine"], t.user_attrs["config"]["threads"]) for t in trials} == {
        ("onnxruntime", 1)
    }


@pytest.mark.slow
def test_a_resumed_study_keeps_its_input_shapes(env):
    tmp_path, db = env
    model = seq_model(tmp_path / "seq.onnx")  # [N, S] inputs: S must be fixed
    fixed = {"input_ids": (1, 8), "attention_mask": (1, 8)}
    common = {"name": "seq", "trials": 1, "finalists": 0, "min_samples": 64, "min_duration_s": 0.1, "db": db}
    autodeploy.tune(model, engines=["onnxruntime"], precisions=["fp32"], threads=[1], shapes=fixed, **common)
    again = autodeploy.tune(model, resume=True, **common)  # no shapes: the study's own apply
    assert sum(again.trials.values()) >= 2  # the resume ran (no ShapeError) and added to the study


@pytest.mark.slow
def test_bench_takes_the_same_accuracy_budget_as_tune(env):
    # `bench` had no budget flag: a budget that admits everything turns the same outputs from
    # inaccurate into a pass, and the default budget rejects them.
    from autodeploy.adapters import registry
    from tests.adapters.faulty import TARGET

    tmp_path, db = env
    registry.register("faulty", TARGET)
    try:
        config = TrialConfig("faulty", threads=1, knobs={"fault": "wrong_outputs"})  # every argmax shifted
        strict = autodeploy.bench("zoo:tiny-cnn", config, timing=FAST, db=db).result
        loose = autodeploy.bench("zoo:tiny-cnn", config, timing=FAST, db=db, max_accuracy_drop=1.0).result
    finally:
        registry.unregister("faulty")
    assert strict.failure_kind == "conversion" and not strict.accuracy.passed  # its fp32 breaks the model
    assert loose.ok and loose.accuracy.passed
    assert strict.accuracy.outputs[0].cosine == pytest.approx(loose.accuracy.outputs[0].cosine)  # the same outputs


class _Terminal:
    """A stderr that says it is a terminal, and keeps what is written to it."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def isatty(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self.lines += [line for line in text.splitlines() if line]
        return len(text)

    def flush(self) -> None:
        pass


def test_the_api_shows_progress_on_a_terminal_and_stays_quiet_elsewhere(env, monkeypatch, capsys):
    """Issue 52 item 5: without reporter=/progress= the API was silent for minutes."""
    tmp_path, db = env
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    summary = autodeploy.tune("zoo:tiny-cnn", engines=["onnxruntime"], precisions=["fp32"], threads=[1], trials=1,
                              config=SMALL_FINALISTS, min_samples=64, min_duration_s=0.1, db=db, name="shown")  # fmt: skip
    assert summary.winner is not None
    assert all(line.startswith("autodeploy: ") for line in terminal.lines) and len(terminal.lines) >= 3
    assert "autodeploy: screening: 1 trials" in terminal.lines and any("trial 1/1 done" in x for x in terminal.lines)
    stored = autodeploy.bench("zoo:tiny-cnn", threads=1, timing=FAST, db=db)
    assert stored.ok and any("starting worker" in line for line in terminal.lines)
    monkeypatch.undo()  # stderr back to pytest's capture, which is no terminal: nothing is printed
    monkeypatch.setenv("AUTODEPLOY_CACHE", str(tmp_path / "cache"))
    autodeploy.bench("zoo:tiny-cnn", threads=1, timing=FAST, db=db)
    assert "autodeploy:" not in capsys.readouterr().err
