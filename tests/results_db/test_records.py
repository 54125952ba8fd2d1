"""One record from the worker to the bundle: the numbers a worker reports are the numbers a manifest ships.

Runs on SQLite and PostgreSQL (the ``store`` fixture): worker JSON -> :class:`TrialResult` (the
parent's :func:`measure`) -> the store -> :class:`TrialRow` -> the manifest's ``measurements``.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from autodeploy.accuracy.records import Accuracy, OutputAccuracy
from autodeploy.adapters.base import Artifact, TrialConfig
from autodeploy.bundle.export import Source, build_manifest
from autodeploy.harness import run
from autodeploy.harness.energy import Cost, Reading
from autodeploy.harness.load import Load
from autodeploy.harness.result import Measurement, TrialResult
from autodeploy.harness.stats import summarize
from autodeploy.harness.supervisor import WorkerOutcome
from autodeploy.results_db import Store, TrialFilter
from autodeploy.roofline import Roofline
from tests.results_db.factories import DEVICE, MODEL

#: The keys of a bundle manifest's ``measurements`` since bundle schema 1, in order.
MANIFEST_KEYS = ("scenario", "batch", "n_samples", "median_ms", "mean_ms", "stdev_ms", "cv", "min_ms", "max_ms",
                 "median_ci", "p90_ms", "p90_ci", "p99_ms", "p99_ci", "unstable", "throughput", "peak_rss_mb",
                 "artifact_mb", "build_s", "warmup_calls", "duration_s")  # fmt: skip
CONFIG = TrialConfig("onnxruntime", "fp32", batch=2, threads=3, knobs={"graph_optimization_level": "ORT_ENABLE_ALL"})


def _measurement(n: int) -> Measurement:
    samples_ns = np.random.default_rng(n).integers(900_000, 1_300_000, n)
    accuracy = Accuracy((OutputAccuracy("logits", 1e-6, 2e-7, 0.9999, top1_agreement=1.0),), 64,
                        "top1_agreement >= 0.99", True)  # fmt: skip
    return Measurement(
        scenario="single-stream", batch=CONFIG.batch, latency=summarize(samples_ns), throughput=1789.5,
        peak_rss_mb=41.25, artifact_mb=1.5, build_s=None, warmup_calls=7, duration_s=1.25, accuracy=accuracy,
        samples_ms=tuple(float(x) for x in samples_ns / 1e6),
    )  # fmt: skip


@pytest.mark.parametrize("n", [10, 100, 700], ids=["no-p90", "no-p99", "all-claims"])
def test_a_measurement_round_trips_through_its_dict(n: int) -> None:
    m = _measurement(n)
    assert Measurement.from_dict(json.loads(json.dumps(m.to_dict()))) == m  # insufficient follows from n
    assert tuple(m.to_dict()) == Measurement.keys()
    assert Measurement.from_dict(m.to_dict(samples=False)).samples_ms is None


LOAD = Load(other_cores=0.93, cpus=2, wall_s=2.5, loadavg_1m=1.8, cpu_mhz=2596.1)


def test_the_load_a_measurement_ran_under_round_trips_through_its_dict_and_the_store(store: Store) -> None:
    m = dataclasses.replace(_measurement(100), load=LOAD)
    d = json.loads(json.dumps(m.to_dict()))
    assert d["load"] == {"other_cores": 0.93, "cpus": 2, "wall_s": 2.5, "loadavg_1m": 1.8, "cpu_mhz": 2596.1,
                         "under_load": True}  # fmt: skip
    assert Measurement.from_dict(d) == m and m.under_load
    result = TrialResult("l" * 32, CONFIG, "ok", "1.20.0", measurement=m)
    store.add_trial(result, model=MODEL, device=DEVICE)
    row = store.trial(TrialFilter(uid=result.uid))
    assert row is not None and row.measurement == m and row.measurement.load == LOAD


def test_a_measurements_share_of_peak_round_trips_through_its_dict_and_the_store(store: Store) -> None:
    line = Roofline("bf16", gop=8.2, gops=345.0, peak_gops=392.0, peak_kernel="openvino MatMul 1024x1024")
    m = dataclasses.replace(_measurement(100), roofline=line)
    d = json.loads(json.dumps(m.to_dict()))
    assert d["roofline"]["share"] == pytest.approx(345 / 392) and Measurement.from_dict(d) == m
    result = TrialResult("r" * 32, CONFIG, "ok", "1.20.0", measurement=m)
    store.add_trial(result, model=MODEL, device=DEVICE)
    row = store.trial(TrialFilter(uid=result.uid), samples=False)
    assert row is not None and row.measurement is not None and row.measurement.roofline == line
    old = {k: v for k, v in d.items() if k != "roofline"}  # stored before revision 0008: none
    assert Measurement.from_dict(old).roofline is None and "roofline" not in Measurement.from_dict(old).to_dict()


def test_what_a_measurement_cost_round_trips_through_its_dict_and_the_store(store: Store) -> None:
    """Energy from a named meter beside the CPU time, and CPU time alone with why no energy (revision 0013)."""
    metered = Cost(calls=400, items=800, wall_s=2.0, cpu_s=1.5, readings=(
        Reading("powercap intel-rapl:0 package-0", 30.0, idle_w=5.0), Reading("powercap intel-rapl:0:0 core", 12.0,
                                                                               idle_w=1.0, counted=False)))  # fmt: skip
    bare = Cost(calls=400, items=400, wall_s=2.0, cpu_s=1.5, no_meter="no energy meter here: no powercap")
    for uid, cost in (("e" * 32, metered), ("c" * 32, bare)):
        m = dataclasses.replace(_measurement(100), cost=cost)
        d = json.loads(json.dumps(m.to_dict()))
        assert Measurement.from_dict(d) == m
        store.add_trial(TrialResult(uid, CONFIG, "ok", "1.20.0", measurement=m), model=MODEL, device=DEVICE)
        row = store.trial(TrialFilter(uid=uid), samples=False)
        assert row is not None and row.measurement is not None and row.measurement.cost == cost
    assert metered.energy_mj == pytest.approx((30.0 - 5.0 * 2.0) * 1e3 / 800)  # the package less its idle draw
    assert metered.cpu_ms == pytest.approx(1.875)
    assert bare.energy_mj is None and bare.to_dict()["cpu_ms_per_inference"] == pytest.approx(3.75)
    old = {k: v for k, v in _measurement(100).to_dict().items() if k != "cost"}  # stored before revision 0013
    assert Measurement.from_dict(old).cost is None and "cost" not in Measurement.from_dict(old).to_dict()


def test_a_record_made_before_the_load_was_read_reads_back_without_one() -> None:
    """An older worker's JSON, store row or bundle manifest has no ``load``: it reads as not recorded."""
    old = {k: v for k, v in _measurement(100).to_dict().items() if k != "load"}
    m = Measurement.from_dict(old)
    assert m.load is None and not m.under_load and "load" not in m.to_dict()


def test_a_result_round_trips_through_its_dict() -> None:
    result = TrialResult("u" * 32, CONFIG, "ok", "1.20.0", measurement=_measurement(100), extra={"stopped_by": "n"})
    assert TrialResult.from_dict(json.loads(json.dumps(result.to_dict()))) == result


def _through_the_parent(measured: Measurement, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> TrialResult:
    """What :func:`run.measure` makes of the worker's JSON (the worker itself is not started)."""
    payload = {"engine_version": "1.20.0", "measurement": measured.to_dict(), "artifact_path": str(tmp_path),
               "artifact_files": {"artifact.json": "a" * 64, "model.onnx": "b" * 64},
               "extra": {"stopped_by": "min_samples"}}  # fmt: skip
    wire = json.loads(json.dumps({"status": "ok", **payload}))
    outcome = WorkerOutcome("ok", {k: v for k, v in wire.items() if k != "status"})
    monkeypatch.setattr(run, "run_worker", lambda *args, **kwargs: outcome)
    prepared = run.Prepared("a" * 32, CONFIG, "single-stream", spec=object(), build_s=0.75, engine_version="1.20.0")  # type: ignore[arg-type]
    return run.measure(prepared, run.HarnessSettings(workdir=tmp_path))


def test_the_numbers_a_worker_reports_are_the_numbers_a_bundle_ships(
    store: Store, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    measured = _measurement(700)
    result = _through_the_parent(measured, monkeypatch, tmp_path)
    assert result.ok and result.config == CONFIG
    assert result.measurement == dataclasses.replace(measured, build_s=0.75)  # the parent adds build_s

    store.add_trial(result, model=MODEL, device=DEVICE)
    row = store.trial(TrialFilter(uid=result.uid))
    assert row is not None and row.config == CONFIG and row.measurement == result.measurement
    assert row.artifact_files == result.artifact_files == {"artifact.json": "a" * 64, "model.onnx": "b" * 64}

    artifact = Artifact(tmp_path, "onnxruntime", "1.20.0", "fp32", CONFIG.key(), ("model.onnx",))
    source = Source(row, None, store.model_interface(MODEL.sha256) or {}, store.device_info(DEVICE.fingerprint) or {})
    manifest = json.loads(json.dumps(build_manifest(source, artifact)))
    shipped = manifest["measurements"]
    lat = measured.latency
    assert (shipped["n_samples"], shipped["median_ms"], shipped["mean_ms"], shipped["stdev_ms"], shipped["cv"]) == (
        lat.n, lat.median, lat.mean, lat.stdev, lat.cv,
    )  # fmt: skip
    assert (shipped["min_ms"], shipped["max_ms"], shipped["unstable"]) == (lat.min, lat.max, lat.unstable)
    assert [shipped[k] for k in ("median_ci", "p90_ms", "p90_ci", "p99_ms", "p99_ci")] == [
        list(lat.median_ci), lat.p90, list(lat.p90_ci), lat.p99, list(lat.p99_ci),
    ]  # fmt: skip
    assert (shipped["scenario"], shipped["batch"], shipped["throughput"], shipped["peak_rss_mb"]) == (
        "single-stream", 2, 1789.5, 41.25,
    )  # fmt: skip
    assert (shipped["artifact_mb"], shipped["build_s"], shipped["warmup_calls"], shipped["duration_s"]) == (
        1.5, 0.75, 7, 1.25,
    )  # fmt: skip
    assert list(shipped) == list(MANIFEST_KEYS)  # the bundle format is unchanged
    again = Measurement.from_dict({**shipped, "accuracy": manifest["accuracy"]})
    assert again == dataclasses.replace(row.measurement, samples_ms=None)
    assert manifest["settings"] == CONFIG.to_dict()
