"""Export a real trial: the manifest, the loader's outputs, atomic writes, refusals."""

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import autodeploy.bundle
from autodeploy.bundle import BundleError, export, loader
from autodeploy.errors import UsageError, WriteError
from autodeploy.results_db.store import Store
from tests.bundle.conftest import feeds


def test_bundle_holds_the_artifact_unchanged_and_a_complete_manifest(stored, bundle):
    names = sorted(p.relative_to(bundle).as_posix() for p in bundle.rglob("*") if p.is_file())
    assert names == ["README.md", "loader.py", "manifest.json", "manifest.sha256", "model/artifact.json",
                     "model/model.onnx", "requirements.txt", "runtime/__init__.py", "runtime/base.py",
                     "runtime/cache.py", "runtime/machine.py", "runtime/onnxruntime.py"]  # fmt: skip
    for name in ("artifact.json", "model.onnx"):
        assert (bundle / "model" / name).read_bytes() == (stored.artifact.path / name).read_bytes()
    m = json.loads((bundle / "manifest.json").read_text())
    assert m["schema"] == loader.SCHEMA and m["model"]["sha256"] == stored.model.sha256
    assert m["engine"] == {
        "name": "onnxruntime",
        "version": stored.artifact.engine_version,
        "package": "onnxruntime",
        "packages": ["onnxruntime"],
        "runtime": "onnxruntime",
        "runtime_version": stored.artifact.engine_version,
    }
    assert m["settings"] == stored.config.to_dict()
    assert m["runtime"]["intra_op_num_threads"] == 1 and m["runtime"]["execution_mode"] == "ORT_PARALLEL"
    assert (
        m["device"]["fingerprint"]
        and m["measurements"]["n_samples"] >= 64
        and m["measurements"]["p90_ms"] > 0
    )
    assert m["accuracy"]["passed"] and m["constraints"]["accuracy"]["passed"]
    # the shape its numbers are at: the bench fixed none, so every input as fed (batch 2 of x[N, 8])
    assert (m["shapes"]["shipped"], m["source"]["trial_id"]) == ("x=2x8", stored.trial_id)
    assert m["shapes"]["fed"] == {"x": [2, 8]} and m["by_shape"] == []  # one shape: nothing per shape
    assert m["source"]["reproduce"] == "autodeploy bench m.onnx --batch 2"
    assert set(m["files"]) == set(names) - {"manifest.json", "manifest.sha256"}
    assert m["files"]["model/model.onnx"]["size"] == (bundle / "model/model.onnx").stat().st_size
    assert (
        f"onnxruntime=={stored.artifact.engine_version}"
        in (bundle / "requirements.txt").read_text().splitlines()
    )
    assert (bundle / "loader.py").read_bytes() == open(loader.__file__, "rb").read()
    import autodeploy.runtime.onnxruntime as shipped  # the runtime the harness measured with, verbatim

    assert (bundle / "runtime" / "onnxruntime.py").read_bytes() == open(shipped.__file__, "rb").read()


def test_loaded_bundle_gives_the_benchmarked_artifacts_outputs(stored, bundle):
    x = feeds()
    with autodeploy.bundle.load(bundle) as predictor:
        got = predictor.run(x)
        assert predictor.settings == stored.config.to_dict() and predictor.warnings == []
        with pytest.raises(BundleError, match="dtype float64"):
            predictor.run({"x": x["x"].astype(np.float64)})
        with pytest.raises(BundleError, match="missing \\['x'\\]"):
            predictor.run({"y": x["x"]})
    want = stored.reference_outputs(x)
    assert list(got) == ["logits"] and np.array_equal(got["logits"], want["logits"])


def test_loader_applies_the_same_session_options_as_the_adapter(stored, bundle, monkeypatch):
    import onnxruntime as ort

    from autodeploy.adapters import registry

    seen, real = [], ort.InferenceSession

    def recording(path, sess_options=None, **kwargs):
        seen.append(sess_options)
        return real(path, sess_options=sess_options, **kwargs)

    monkeypatch.setattr(ort, "InferenceSession", recording)
    registry.get("onnxruntime").load(stored.artifact, stored.config, stored.model).close()
    autodeploy.bundle.load(bundle).close()
    theirs, mine = seen
    for attr in (
        "intra_op_num_threads",
        "inter_op_num_threads",
        "execution_mode",
        "graph_optimization_level",
    ):
        assert getattr(mine, attr) == getattr(theirs, attr), attr
    assert mine.intra_op_num_threads == 1 and mine.execution_mode == ort.ExecutionMode.ORT_PARALLEL


def test_tar_bundle_loads_and_cleans_up_its_extraction(stored, tmp_path):
    path = export.write_bundle(stored.source(), tmp_path / "b.tar.gz", tar=True)
    assert path.is_file() and not any(p.name.startswith(".") for p in tmp_path.iterdir())
    predictor = autodeploy.bundle.load(path)
    extracted = predictor.root
    assert np.array_equal(predictor.run(feeds())["logits"], stored.reference_outputs(feeds())["logits"])
    predictor.close()
    del predictor
    import gc

    gc.collect()
    assert not extracted.exists()


def test_export_refuses_an_existing_destination(stored, tmp_path):
    (tmp_path / "taken").mkdir()
    with pytest.raises(UsageError, match="already exists"):
        export.write_bundle(stored.source(), tmp_path / "taken")


def test_an_export_that_fails_midway_leaves_nothing(stored, tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(export, "seal", broken)  # after the model and loader were copied
    with pytest.raises(WriteError, match="No space left on device .*fix: free space on the disk of"):
        export.write_bundle(stored.source(), tmp_path / "b")
    with pytest.raises(WriteError, match="No space left on device .*or choose another --output"):
        export.write_bundle(stored.source(), tmp_path / "b.tar.gz", tar=True)
    assert list(tmp_path.iterdir()) == []


def test_a_killed_export_leaves_nothing_and_the_next_export_cleans_up(stored, tmp_path):
    script = textwrap.dedent(f"""
        import os, signal
        from autodeploy.bundle import export
        from autodeploy.results_db.store import Store
        def die(*a, **k):
            os.kill(os.getpid(), signal.SIGKILL)
        export.seal = die
        with Store.open({stored.db!r}, readonly=True) as store:
            source = export.stored_trial(store, {stored.trial_id})
        export.write_bundle(source, {str(tmp_path / "b")!r})
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == -9, proc.stderr
    assert not (tmp_path / "b").exists()
    leftovers = [p for p in tmp_path.iterdir() if p.name.startswith(".b.partial-")]
    assert len(leftovers) == 1  # the dead process's staging folder, never the bundle
    export.write_bundle(stored.source(), tmp_path / "b")
    assert [p.name for p in tmp_path.iterdir()] == ["b"]
    loader.verify(tmp_path / "b")


def test_a_failed_trial_is_refused(stored, tmp_path):
    from autodeploy.harness.result import TrialResult
    from autodeploy.results_db.store import DeviceRecord, ModelRecord

    failed = TrialResult.failed("f" * 32, stored.config, "run_failed", "boom")
    with Store.open(stored.db) as store:
        trial_id = store.add_trial(failed, model=ModelRecord.of(stored.model),
                                   device=DeviceRecord.of(__import__("autodeploy.device").device.probe_device()))  # fmt: skip
        with pytest.raises(
            BundleError, match=f"trial {trial_id} .*cannot be shipped: it failed \\(run_failed: boom\\)"
        ):
            export.stored_trial(store, trial_id)
        with pytest.raises(UsageError, match="no trial 9999"):
            export.stored_trial(store, 9999)


def test_a_study_without_a_winner_says_why(stored):
    from autodeploy.device import probe_device
    from autodeploy.results_db.store import DeviceRecord, ModelRecord

    note = "no trial meets the constraints; the best-so-far is shown and is not a winner"
    with Store.open(stored.db) as store:
        store.save_study("nowin", model=ModelRecord.of(stored.model), device=DeviceRecord.of(probe_device()),
                         objective="latency", settings={}, command="autodeploy tune m.onnx")  # fmt: skip
        store.finish_study("nowin", winner_uid=None, summary={"note": note})
        with pytest.raises(BundleError, match=f"study 'nowin' has no winner: {note}; fix: .*--trial ID"):
            export.study_winner(store, "nowin")
        with pytest.raises(UsageError, match="no study named 'nope'.*nowin"):
            export.study_winner(store, "nope")


def test_a_gone_artifact_is_a_clear_error(stored, tmp_path):
    import dataclasses

    source = stored.source()
    gone = dataclasses.replace(
        source, trial=dataclasses.replace(source.trial, artifact_path=str(tmp_path / "gone"))
    )
    with pytest.raises(BundleError, match="artifact of trial .* is gone"):
        export.write_bundle(gone, tmp_path / "b")
    assert not (tmp_path / "b").exists()


def test_numbers_say_their_statistic_shape_calls_and_machine():
    load = {"other_cores": 0.02, "cpus": 2, "wall_s": 1.0, "loadavg_1m": None, "cpu_mhz": None}
    numbers = {"p90_ms": 44.67, "median_ms": 40.0, "shape": "x=1x3x320x320", "scenario": "single-stream", "load": load}
    assert export.numbers_text(numbers) == "p90 44.67 ms at x=1x3x320x320, one call at a time, solo"
    busy = {**numbers, "p90_ms": None, "scenario": "offline", "load": {**load, "other_cores": 1.1}}
    assert export.numbers_text(busy) == ("median 40.00 ms at x=1x3x320x320, requests in flight, under load "
                                         "(1.10 of 2 cores busy with other processes)")  # fmt: skip
    old = {"p90_ms": 1.5, "median_ms": 1.0, "scenario": "single-stream"}  # exported before shapes and load were kept
    assert export.numbers_text(old) == "p90 1.500 ms, one call at a time"
    two = {"statistic": "p90", "rounds": 3, "shapes": [{"shape": "x=1x3x160x160"}, {"shape": "x=1x3x320x320"}]}
    assert export.basis_text(two) == "the median over 3 rounds of each round's p90, their mean over 2 shapes"
    assert export.basis_text({"statistic": "items/s", "rounds": 0}) == "one screening run's items/s"
    assert export.basis_text({}) == ""
