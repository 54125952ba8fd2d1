"""Issue 52 item 2: a ``.tflite`` with a MediaPipe custom op (``Convolution2DTransposeBias``) that neither tf2onnx
(ONNX Runtime's way in) nor OpenVINO's frontend converts: each refusal's fix named the other ("run it on another
engine (onnxruntime)", "run it on tflite or openvino"). Both now name the engine that reads the file as given."""

from __future__ import annotations

import hashlib

import pytest

from autodeploy import tflite_onnx
from autodeploy.adapters import registry
from autodeploy.adapters.base import TrialConfig
from autodeploy.device import probe_device
from autodeploy.errors import ConversionError
from autodeploy.harness.result import headline
from autodeploy.model import load_model
from tests.realmodels.corpus import HELD_OUT

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def selfie(tmp_path_factory):
    path = next(m for m in HELD_OUT if m.name == "mediapipe-selfie-segmentation").extract(tmp_path_factory.mktemp("m"))
    if isinstance(path, str):
        pytest.skip(path)
    return path


def test_tf2onnx_refusing_a_custom_op_points_at_litert_alone(selfie, tmp_path):
    if tflite_onnx.missing():
        pytest.skip(tflite_onnx.missing())
    with pytest.raises(ConversionError) as caught:
        tflite_onnx.to_onnx(selfie, hashlib.sha256(selfie.read_bytes()).hexdigest(), tmp_path / "tf2onnx")
    line = str(caught.value).splitlines()[0]
    assert "Convolution2DTransposeBias" in line and line.endswith(f"fix: {tflite_onnx.GIVEN_FIX}"), line
    assert "openvino" not in line


def test_openvino_refusing_a_custom_op_points_at_litert_not_back_at_onnx_runtime(selfie, tmp_path):
    engine = registry.get("openvino")
    if not engine.probe(probe_device()).available:
        pytest.skip(str(engine.probe(probe_device())))
    info = load_model(selfie)
    with pytest.raises(ConversionError) as caught:
        engine.build(info, TrialConfig("openvino"), None, tmp_path / "work", target=probe_device())
    line = headline(str(caught.value))
    assert "fix: run it on tflite, which reads the file as given" in line and "onnxruntime" not in line, line


def test_bench_learns_a_failed_conversion_and_fails_the_next_precision_at_once(selfie, tmp_path):
    """Issue 52 item 11: ``bench`` paid for a conversion that had already failed, once per precision; a study prunes
    the engine's other precisions at once. Now the stored failure (with the engine version that failed) is learned."""
    import autodeploy
    from autodeploy.results_db.store import Store

    engine = registry.get("openvino")
    if not engine.probe(probe_device()).available:
        pytest.skip(str(engine.probe(probe_device())))
    db, cache = f"sqlite:///{tmp_path / 'r.db'}", tmp_path / "cache"
    first = autodeploy.bench(selfie, engine="openvino", precision="fp32", db=db, cache=cache)
    assert first.result.failure_kind == "build_failed" and first.result.engine_version, first.result
    with pytest.raises(ConversionError) as caught:
        autodeploy.bench(selfie, engine="openvino", precision="fp16", db=db, cache=cache)
    line = str(caught.value)
    assert f"in trial {first.id} (openvino/fp32" in line and "Convolution2DTransposeBias" in line, line
    assert "run it on tflite" in caught.value.fix and "--retry-conversion" in caught.value.fix
    with Store.open(db) as store:
        assert store.count_trials() == 1  # nothing run, nothing stored
    again = autodeploy.bench(selfie, engine="openvino", precision="fp16", db=db, cache=cache, retry_conversion=True)
    assert again.id != first.id and again.result.failure_kind == "build_failed"
