"""A real recogniser at several widths: ddddocr's CRNN ``common.onnx`` (fixed batch 1, dynamic
width) benched at two widths on ONNX Runtime and OpenVINO: one stored measurement per width, each
artifact compiled for its width, each output as wide as its input says."""

from __future__ import annotations

import pytest

import autodeploy
from autodeploy.adapters import registry
from autodeploy.device import probe_device
from autodeploy.harness.timing import TimingPolicy
from autodeploy.results_db import Store, TrialFilter
from autodeploy.shapes import parse_flags
from tests.realmodels.corpus import MODELS

pytestmark = pytest.mark.slow  # a real model, two engines, two widths: about a minute on 2 loaded cores

QUICK = TimingPolicy(warmup_min_calls=2, warmup_max_s=0.5, min_samples=10, min_duration_s=0.2, max_duration_s=2.0)
WIDTHS = (128, 256)


@pytest.mark.parametrize("engine", ["onnxruntime", "openvino"])
def test_ddddocr_at_two_widths_gives_one_measurement_per_width(engine, tmp_path, monkeypatch):
    available = registry.get(engine).probe(probe_device())
    if not available.available:
        pytest.skip(f"{engine}: {available}")
    real = next(m for m in MODELS if m.name == "ddddocr-common")
    path = real.extract(tmp_path)
    if isinstance(path, str):
        pytest.skip(path)
    monkeypatch.setenv("AUTODEPLOY_CACHE", str(tmp_path / "cache"))
    db = f"sqlite:///{tmp_path / 'r.db'}"
    shapes = parse_flags([f"input1=1x1x64x{w}" for w in WIDTHS])
    stored = autodeploy.bench_shapes(path, engine=engine, threads=1, shapes=shapes, timing=QUICK, db=db,
                                     timeout_s=120, build_timeout_s=300)  # fmt: skip
    assert [s.shape_key for s in stored] == [f"input1=1x1x64x{w}" for w in WIDTHS]
    assert all(s.ok for s in stored), [s.result.failure_message for s in stored]
    with Store.open(db, readonly=True) as store:
        rows = [store.trial(TrialFilter(id=s.id)) for s in stored]
    assert [r.shapes["input1"] for r in rows] == [[1, 1, 64, w] for w in WIDTHS]
    assert all(r.measurement is not None and r.accuracy.passed for r in rows)
