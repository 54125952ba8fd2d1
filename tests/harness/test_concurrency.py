"""Requests in flight through each engine's own parallel API, the closed and open loops, the batcher."""

from __future__ import annotations

import time

import numpy as np
import pytest

from autodeploy.adapters import registry
from autodeploy.adapters.base import Artifact, TrialConfig
from autodeploy.device import probe_device
from autodeploy.errors import EngineError
from autodeploy.harness.concurrency import BatchPolicy, closed_loop, open_loop
from autodeploy.harness.run import HarnessSettings, prepare_data, run_trial
from autodeploy.harness.timing import TimingPolicy
from autodeploy.model import load_model
from autodeploy.runtime.base import ThreadPool
from tests.adapters.faulty import TARGET
from tests.models import mlp

FAST = TimingPolicy(warmup_min_calls=2, warmup_max_s=0.2, min_samples=64, min_duration_s=0.2, max_duration_s=5)
FEEDS = {"x": np.ones((2, 8), np.float32)}


def _runner(engine: str, tmp_path, config: TrialConfig):
    model = load_model(mlp(tmp_path / "m.onnx"))
    adapter = registry.get(engine)
    if not adapter.probe(probe_device()).available:
        pytest.skip(f"{engine} unavailable")
    artifact = adapter.build(model, config, None, tmp_path / "work", target=probe_device())
    return adapter.load(Artifact.read(artifact.path), config, model)


@pytest.mark.parametrize("sessions", ["shared", "per_request"])
def test_ort_offline_keeps_n_requests_in_flight(tmp_path, sessions):
    runner = _runner("onnxruntime", tmp_path, TrialConfig("onnxruntime", batch=2, threads=1,
                                                           knobs={"sessions": sessions}))  # fmt: skip
    pool = runner.pool(3)
    assert len(pool._threads) == 3 and pool.info["sessions"] == (1 if sessions == "shared" else 3)  # noqa: SLF001
    run = closed_loop(pool, FEEDS, FAST)
    pool.close()
    runner.close()
    assert run.requests == 3 and len(run.samples_ns) >= 64 and run.stopped_by == "min_reached"
    assert run.duration_s >= 0.2 and (run.samples_ns > 0).all()


def test_openvino_offline_reads_back_what_it_compiled(tmp_path):
    pytest.importorskip("openvino")
    config = TrialConfig("openvino", batch=2, threads=1, knobs={"PERFORMANCE_HINT": "THROUGHPUT"})
    runner = _runner("openvino", tmp_path, config)
    pool = runner.pool(None)  # AUTO: OPTIMAL_NUMBER_OF_INFER_REQUESTS
    info = pool.info
    assert info["requests"] == info["OPTIMAL_NUMBER_OF_INFER_REQUESTS"] == pool.requests >= 1
    assert info["INFERENCE_PRECISION_HINT"] == "f32" and info["INFERENCE_NUM_THREADS"] == 1
    assert info["NUM_STREAMS"] == 1  # one thread holds one stream, whatever the hint asks
    run = closed_loop(pool, FEEDS, FAST)
    pool.close()
    runner.close()
    assert len(run.samples_ns) >= 64 and run.duration_s >= 0.2


def test_more_requests_than_a_runtime_allows_is_refused(tmp_path):
    runner = _runner("onnxruntime", tmp_path, TrialConfig("onnxruntime", threads=1))
    with pytest.raises(EngineError, match="allows 1 to 64"):
        runner.pool(65)
    runner.close()


def test_a_failing_request_in_flight_fails_the_loop_and_drains_all(tmp_path):
    ended = []

    def call(feeds):
        time.sleep(0.002)
        ended.append(1)
        if len(ended) == 10:
            raise ValueError("request 10 broke")

    pool = ThreadPool([call] * 3)
    start = time.monotonic()
    with pytest.raises(EngineError, match="ValueError: request 10 broke"):
        closed_loop(pool, FEEDS, TimingPolicy(warmup_min_calls=0, warmup_max_s=0, min_samples=10_000,
                                               max_samples=10_000, min_duration_s=30, max_duration_s=30))  # fmt: skip
    assert time.monotonic() - start < 5  # no hang: the loop stops at the failure
    assert pool._busy == 0  # noqa: SLF001 - every request in flight ended before the error was raised
    pool.close()


def test_an_ort_error_inside_the_queue_is_the_engines_message(tmp_path):
    runner = _runner("onnxruntime", tmp_path, TrialConfig("onnxruntime", threads=1))
    pool = runner.pool(2)
    with pytest.raises(EngineError, match="request in flight failed"):
        closed_loop(pool, {"x": np.ones((2, 3), np.float32)}, FAST)  # wrong shape: ORT refuses it in a thread
    pool.close()
    runner.close()


def test_the_batcher_forms_batches_under_its_max_delay_and_splits_queue_from_compute():
    sizes = []

    def call(feeds):
        sizes.append(feeds["n"])
        time.sleep(0.003)  # a 3 ms engine, one request: at 1000 q/s queries pile up

    pool = ThreadPool([call])
    run = open_loop(pool, lambda k: {"n": k}, 1000.0, 200, BatchPolicy(max_batch=8, max_delay_us=2000), seed=3)
    pool.close()
    assert run.batch_sizes.sum() == 200 and run.batch_sizes.max() <= 8 and run.batch_sizes.mean() > 2
    assert sorted(sizes) == sorted(run.batch_sizes.tolist())  # each call got the feeds of its batch size
    assert (run.queue_ns >= 0).all() and (run.compute_ns >= 2_500_000).all()
    assert np.array_equal(run.queue_ns + run.compute_ns, run.latency_ns)
    # a query waits in the queue at most for its batch's delay, or for the one request to be free
    assert np.percentile(run.queue_ns, 50) > 0


def test_without_batching_every_query_is_its_own_call():
    pool = ThreadPool([lambda feeds: time.sleep(0.0005)] * 2)
    run = open_loop(pool, lambda k: {"n": k}, 200.0, 50, BatchPolicy(), seed=1)
    pool.close()
    assert (run.batch_sizes == 1).all() and len(run.latency_ns) == 50


def test_a_batch_waits_no_longer_than_the_max_delay_at_light_load():
    pool = ThreadPool([lambda feeds: None] * 2)
    run = open_loop(pool, lambda k: {"n": k}, 50.0, 40, BatchPolicy(max_batch=8, max_delay_us=1000), seed=2)
    pool.close()
    # at 50 q/s a second query rarely comes within 1 ms: mostly batches of one, each of which waited
    # the whole delay for company (a loaded machine can only make that wait longer)
    assert run.batch_sizes.mean() < 2
    assert np.median(run.queue_ns) >= 1_000_000


def test_bad_batcher_settings_are_refused():
    with pytest.raises(ValueError, match="max queue delay must be >= 0"):
        BatchPolicy(4, -1)


@pytest.fixture
def setup(tmp_path):
    model = load_model(mlp(tmp_path / "m.onnx"))
    settings = HarnessSettings(workdir=tmp_path / "work", policy=FAST, timeout_s=60.0, memory_cap_mb=700)
    return model, settings, prepare_data(model, settings)


def test_an_offline_trial_records_its_concurrency(setup):
    model, settings, data = setup
    config = TrialConfig("onnxruntime", batch=2, threads=1, knobs={"num_requests": 2})
    result = run_trial(model, config, data, settings, scenario="offline")
    assert result.ok, result.failure_message
    m = result.measurement
    assert m.scenario == "offline" and m.serving["concurrency"]["requests"] == 2
    assert m.throughput == pytest.approx(2 * m.latency.n / m.duration_s)
    assert result.accuracy.passed


def test_a_server_trial_splits_queueing_from_compute(setup):
    model, settings, data = setup
    config = TrialConfig("onnxruntime", batch=4, threads=1, knobs={"num_requests": 1, "max_queue_delay_us": 500})
    result = run_trial(model, config, data, settings, scenario="server", sla_ms=50.0)
    assert result.ok, result.failure_message
    server = result.measurement.serving["server"]
    assert server["max_rate_qps"] > 0 and server["p99_ms_at_rate"] <= 50.0
    split = server["split"]
    assert split["max_batch"] == 4 and split["max_queue_delay_us"] == 500 and split["requests"] == 1
    assert 1 <= split["mean_batch"] <= 4 and split["queue_ms"]["p50"] >= 0 and split["compute_ms"]["p50"] > 0


def test_a_request_failing_in_flight_fails_the_trial_as_run_failed(setup):
    model, settings, data = setup
    registry.register("faulty", TARGET)
    try:
        config = TrialConfig("faulty", threads=1, knobs={"fault": "fail_in_flight", "num_requests": 2})
        result = run_trial(model, config, data, settings, scenario="offline")
    finally:
        registry.unregister("faulty")
    assert result.failure_kind == "run_failed"
    assert "deliberate failure of a request in flight" in result.failure_message
