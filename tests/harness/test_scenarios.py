import time

import numpy as np

from autodeploy.harness.scenarios import max_rate_under_sla, poisson_run


def test_poisson_run_measures_from_arrival_and_queues():
    # A 2 ms "engine" at 1000 q/s is overloaded: later queries wait, so latency grows far past 2 ms.
    latencies = poisson_run(lambda: time.sleep(0.002), 1000.0, 60, seed=1) / 1e6
    assert latencies.min() >= 1.9
    assert np.percentile(latencies, 99) > 10


def test_light_load_latency_is_the_service_time():
    latencies = poisson_run(lambda: time.sleep(0.001), 50.0, 30, seed=2) / 1e6
    assert np.median(latencies) < 5


def test_max_rate_bisects_under_the_sla():
    result = max_rate_under_sla(
        lambda: time.sleep(0.001), sla_ms=20.0, service_ms=1.1, queries=80, iterations=4
    )
    assert 0 < result.max_rate_qps < 1000 / 1.1
    assert len(result.tried) == 4 and result.p99_ms_at_rate <= 20.0
    assert all(p99 > 20.0 for rate, p99 in result.tried if rate > result.max_rate_qps)


def test_an_impossible_sla_gives_zero_rate():
    result = max_rate_under_sla(
        lambda: time.sleep(0.002), sla_ms=0.5, service_ms=2.0, queries=20, iterations=2
    )
    assert result.max_rate_qps == 0.0 and result.p99_ms_at_rate is None
