"""Issue 52 item 8: ``--data`` given an image, an audio file or a bare ``.npy`` for a model of several inputs says
what the file is and every form ``--data`` takes (a folder of images among them), not only ".npz or NAME.npy".
Real models and real files: MTCNN O-Net with one of the photos, basic-pitch with its music as a .wav, silero-vad
(three inputs) with its audio windows as one .npy."""

from __future__ import annotations

import wave

import numpy as np
import pytest
from PIL import Image

from tests.cli_runner import run_cli
from tests.realmodels.corpus import MODELS, PITCH_SR, tune

pytestmark = pytest.mark.slow


def _model(name: str, folder):
    path = next(m for m in MODELS if m.name == name).extract(folder)
    if isinstance(path, str):
        pytest.skip(path)
    return path


def _refused(capsys, model, data, tmp_path) -> str:
    code, out, err = run_cli(capsys, "bench", str(model), "--data", str(data), "--db", f"sqlite:///{tmp_path / 'r.db'}")
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "Traceback" not in out + err, err
    assert "a folder of images" in lines[0] and "a .npy (a model with one input)" in lines[0]  # every form, named
    return lines[0]


def test_one_photo_is_told_to_come_in_a_folder(capsys, tmp_path, photos, corpus_dir):
    path = tmp_path / "face.jpg"
    Image.fromarray(photos[0]).save(path)
    line = _refused(capsys, _model("mtcnn-onet", corpus_dir), path, tmp_path)
    assert "one image file; images are read from a folder of them" in line


def test_a_wav_is_told_to_be_made_into_the_models_inputs(capsys, tmp_path, corpus_dir):
    path = tmp_path / "tune.wav"
    with wave.open(str(path), "wb") as w:  # the corpus's music, 16-bit mono at basic-pitch's rate
        w.setnchannels(1), w.setsampwidth(2), w.setframerate(PITCH_SR)
        w.writeframes((np.clip(tune(2.0), -1, 1) * 32767).astype("<i2").tobytes())
    line = _refused(capsys, _model("basic-pitch", corpus_dir), path, tmp_path)
    assert "an audio file, which autodeploy does not decode" in line and "numpy.savez" in line


def test_a_bare_npy_for_a_model_of_three_inputs_says_it_feeds_one(capsys, tmp_path, corpus_dir):
    path = tmp_path / "windows.npy"
    np.save(path, np.zeros((4, 576), np.float32))
    line = _refused(capsys, _model("silero-vad", corpus_dir), path, tmp_path)
    assert "a bare .npy feeds a model with one input, and this one has 3" in line
