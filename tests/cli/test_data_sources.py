"""``--data`` as bench takes it, in every other command that takes inputs: bundle run, inhouse
quantize and gate read a folder of images and ``sample:images`` with the same preprocessing flags,
through one helper (``cli._common.data_of``); a bundle runs images as it was measured on them."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

import autodeploy
from autodeploy.cli import _common
from autodeploy.harness.timing import TimingPolicy
from autodeploy.images import Preprocess
from autodeploy.intake import load_data
from autodeploy.model import load_model
from autodeploy.zoo.cnn import tiny_cnn
from tests.cli_runner import run_cli

PIL = pytest.importorskip("PIL.Image")
FAST = TimingPolicy(warmup_min_calls=2, warmup_max_s=0.2, min_samples=16, min_duration_s=0.05, max_duration_s=5)
MEAN, SCALE = "[123.675,116.28,103.53]", "[58.395,57.12,57.375]"
IMAGENET = Preprocess("NCHW", False, (123.675, 116.28, 103.53), (58.395, 57.12, 57.375))
N_IMAGES = 10


@pytest.fixture
def env(tmp_path, monkeypatch):
    """A tiny CNN ([N,3,32,32]), a folder of PNG crops of scikit-learn's photos, a fresh cache and store."""
    pytest.importorskip("sklearn")
    import onnx

    from autodeploy.images import sample_crops

    monkeypatch.setenv("AUTODEPLOY_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(_common.out, "width", 250)
    model = tmp_path / "cnn.onnx"
    onnx.save(tiny_cnn(), str(model))
    folder = tmp_path / "imgs"
    folder.mkdir()
    for i, crop in enumerate(sample_crops(N_IMAGES, 48, 40, seed=5)):
        PIL.fromarray(crop).save(folder / f"{i}.png")
    return tmp_path, model, folder, f"sqlite:///{tmp_path / 'r.db'}"


def test_a_bundle_records_what_it_was_measured_on_and_runs_images_the_same_way(env, capsys):
    from autodeploy.api._bundle_run import _bundle_feeds as feeds

    tmp_path, model, folder, db = env
    (trial,) = autodeploy.bench_shapes(model, threads=1, data=folder, preprocess=IMAGENET, timing=FAST, db=db)
    assert trial.ok, trial.result.failure_message
    bundle = autodeploy.export(trial=trial.id, output=tmp_path / "b", db=db)
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["inputs"] == {"data": str(folder), "preprocess": IMAGENET.to_dict()}
    assert f"Measured on inputs: {folder} (NCHW, RGB, mean [123.675, 116.28, 103.53]" in (bundle / "README.md").read_text()
    # no flag: images are fed as measured; a flag replaces the recorded preprocessing; arrays never get it
    want = load_data(folder, load_model(model), IMAGENET).inputs["input"][:1]
    np.testing.assert_array_equal(feeds(manifest, bundle, str(folder), None)["input"], want)
    raw = feeds(manifest, bundle, str(folder), Preprocess("NCHW"))["input"]
    assert raw.max() > 100 and not np.array_equal(raw, want)  # pixels 0..255, no mean/scale
    np.savez(tmp_path / "a.npz", input=want)
    np.testing.assert_array_equal(feeds(manifest, bundle, str(tmp_path / "a.npz"), None)["input"], want)
    code, out, err = run_cli(capsys, "bundle", "run", str(bundle), "--data", str(folder), "--min-samples", "8",
                             "--min-duration", "0.05")  # fmt: skip
    assert code == 0, err
    assert "this machine" in out
    code, out, err = run_cli(capsys, "bundle", "run", str(bundle), "--data", "sample:images", "--min-samples", "8",
                             "--min-duration", "0.05", "--reverse-input-channels")  # fmt: skip
    assert code == 0, err
    code, out, _ = run_cli(capsys, "bundle", "info", str(bundle))
    assert "measured on inputs" in out and f"{folder} (NCHW, RGB, mean [123.675, 116.28, 103.53]" in out


def test_a_bundle_of_a_zoo_photo_model_records_the_zoos_imagenet_preprocessing():
    from autodeploy import zoo
    from autodeploy.zoo.photos import IMAGENET as PHOTOS

    assert zoo.own_inputs("zoo:resnet50") == {"data": "zoo:resnet50 (its own data)", "preprocess": PHOTOS.to_dict()}
    assert PHOTOS == IMAGENET and zoo.own_inputs("zoo:tiny-cnn") is None


def test_inhouse_quantize_calibrates_on_an_image_folder(env, capsys):
    tmp_path, model, folder, _ = env
    out_path = tmp_path / "q.onnx"
    code, out, err = run_cli(capsys, "inhouse", "quantize", str(model), "-o", str(out_path), "--data", str(folder),
                             "--mean-values", MEAN, "--scale-values", SCALE, "--no-fallback")  # fmt: skip
    assert code == 0, err
    assert re.search(rf"calibration items\s*│\s*{N_IMAGES}\s", out), out  # the folder, not 64 synthetic items
    assert out_path.exists()
    code, _, err = run_cli(capsys, "inhouse", "quantize", str(model), "-o", str(out_path), "--mean-values", MEAN)
    assert code == 2 and "without image data" in err and "Traceback" not in err


def test_gate_evaluates_on_an_image_folder(env, capsys):
    _, model, folder, db = env
    code, out, err = run_cli(capsys, "gate", "--baseline", str(model), "--candidate", str(model), "--rounds", "2",
                             "--min-samples", "2", "--calls", "8", "--duration", "0.01", "--data", str(folder),
                             "--mean-values", MEAN, "--scale-values", SCALE, "--no-store", "--db", db)  # fmt: skip
    assert code in (0, 2), out + err  # never fail against itself; too few runs may be inconclusive
    assert f"on {N_IMAGES} evaluation items" in out  # the whole folder: FP32 against FP32 calibrates nothing
    code, out, err = run_cli(capsys, "gate", "--baseline", str(model), "--candidate", str(model),
                             "--data", str(folder), "--layout", "NHWC", "--no-store", "--db", db)  # fmt: skip
    assert code == 64 and "3 (RGB) or 1 (gray)" in out + err  # bad input, not an inconclusive 2


def test_a_bundles_inputs_come_from_the_trial_else_its_study_else_are_unknown():
    from dataclasses import replace
    from datetime import datetime, timezone

    from autodeploy.bundle.export import Source, inputs_of
    from autodeploy.results_db.store import StudyRow

    def source(inputs, settings=None, model="m"):
        now = datetime.now(timezone.utc)
        trial = replace(_trial_row(), inputs=inputs)
        study = None if settings is None else StudyRow(1, "s", "latency", settings, None, None, None, model, "0", "0", now, now)
        return Source(trial, study, {"name": model}, {})

    recorded = {"data": "photos/", "preprocess": IMAGENET.to_dict()}
    assert inputs_of(source(recorded)) == recorded
    assert inputs_of(source(None)) is None  # a bench trial stored before schema 0005: not recorded
    tuned = source(None, {"data": "sample:images", "preprocess": {"layout": "NHWC", "reverse_input_channels": True}})
    assert inputs_of(tuned) == {"data": "sample:images", "preprocess": {"layout": "NHWC", "reverse_input_channels": True,
                                                                       "mean_values": None, "scale_values": None}}  # fmt: skip
    assert inputs_of(source(None, {}, model="zoo:mobilenetv2"))["preprocess"] == IMAGENET.to_dict()  # the zoo's own
    assert inputs_of(source(None, {})) == {"data": "synthetic", "preprocess": None}


def _trial_row():
    from datetime import datetime, timezone

    from autodeploy.adapters.base import TrialConfig
    from autodeploy.results_db.store import TrialRow

    return TrialRow(id=1, uid="u", created_at=datetime.now(timezone.utc), status="ok", failure_kind=None,
                    failure_message=None, study=None, phase=None, command=None, artifact_path=None,
                    engine_version=None, config=TrialConfig("onnxruntime"), config_key="k", model_name="m",
                    model_sha256="0", device_cpu="cpu", device_fingerprint="0")  # fmt: skip
