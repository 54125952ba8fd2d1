"""MLPerf's scenarios, by LoadGen's names, and the *server* search: the highest Poisson rate whose p99 meets the SLA.

* ``single-stream``: one query at a time, batch-1 latency (:func:`~autodeploy.harness.timing.time_calls`).
* ``offline``: the most items/s with N requests in flight through the engine's parallel API.
* ``multi-stream``: a fixed number of queries in flight; per-query latency percentiles.
* ``server``: Poisson arrivals with as many queries in flight as arrive, through the dynamic
  batcher (:mod:`autodeploy.harness.concurrency`); :func:`search_rate` bisects the rate.

What each scenario means to the rest (requests in flight, a rate under the SLA, its knobs) is the table
:data:`autodeploy.objectives.SCENARIOS`.

:func:`poisson_run` is the one-runner form: a query that arrives while the runner is busy waits,
and its latency counts from its arrival, so queueing shows up in the p99 as it would in a real server.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from autodeploy.harness.stats import MIN_SAMPLES_P99
from autodeploy.verdict import meets_sla

Clock = Callable[[], int]
SPIN_NS = 200_000  # sleep until this close to an arrival, then spin: sleep() overshoots by ~50-100 µs


@dataclass(frozen=True)
class ServerResult:
    max_rate_qps: float  # 0.0 when even the lowest rate tried misses the SLA
    p99_ms_at_rate: float | None
    tried: tuple[tuple[float, float], ...]  # (rate, p99 ms) for every rate run
    #: At the best rate (through the batcher): ``queue_ms``/``compute_ms`` p50 and p99 of each query's
    #: time queued and computing, ``mean_batch`` items per call, and the batcher and pool settings.
    split: dict | None = None

    def to_dict(self) -> dict:
        return {"max_rate_qps": self.max_rate_qps, "p99_ms_at_rate": self.p99_ms_at_rate,
                "tried": [list(t) for t in self.tried], **({"split": self.split} if self.split else {})}  # fmt: skip


def poisson_run(fn: Callable[[], object], rate_qps: float, n: int, *, seed: int = 0,
                clock: Clock = time.perf_counter_ns) -> np.ndarray:  # fmt: skip
    """Issue ``n`` queries with exponential gaps at ``rate_qps``; return latencies (ns) from arrival."""
    gaps = np.random.default_rng(seed).exponential(1e9 / rate_qps, n)
    start = clock()
    arrivals = start + np.cumsum(gaps).astype(np.int64)
    latencies = np.empty(n, dtype=np.int64)
    for i, arrival in enumerate(arrivals):
        wait = arrival - clock()
        if wait > SPIN_NS:
            time.sleep((wait - SPIN_NS) / 1e9)
        while clock() < arrival:
            pass
        fn()
        latencies[i] = clock() - arrival
    return latencies


def max_rate_under_sla(fn: Callable[[], object], sla_ms: float, service_ms: float, *, queries: int = MIN_SAMPLES_P99,
                       iterations: int = 6, seed: int = 0) -> ServerResult:  # fmt: skip
    """Bisect the Poisson rate between 0 and one runner's capacity (1 / ``service_ms``).

    Each rate runs ``queries`` queries (:data:`~autodeploy.harness.stats.MIN_SAMPLES_P99` by default: the
    fewest that support a p99 claim).
    """
    return search_rate(lambda rate, i: poisson_run(fn, rate, queries, seed=seed + i), sla_ms,
                       1000.0 / service_ms, iterations=iterations)  # fmt: skip


def search_rate(run_at: Callable[[float, int], Any], sla_ms: float, capacity_qps: float, *,
                iterations: int = 6) -> ServerResult:  # fmt: skip
    """Bisect the Poisson rate between 0 and ``capacity_qps``; ``run_at(rate, i)`` runs iteration ``i``.

    ``run_at`` returns latencies in ns, or an :class:`~autodeploy.harness.concurrency.OpenRun`
    whose queueing/compute split is kept for the best rate.
    """
    low, high = 0.0, capacity_qps
    best: tuple[float, float, Any] | None = None
    tried = []
    for i in range(iterations):
        rate = (low + high) / 2
        run = run_at(rate, i)
        latencies = run if isinstance(run, np.ndarray) else run.latency_ns
        p99 = float(np.percentile(latencies, 99)) / 1e6
        tried.append((rate, p99))
        if meets_sla(p99, sla_ms):
            low, best = rate, (rate, p99, run)
        else:
            high = rate
    if best is None:
        return ServerResult(0.0, None, tuple(tried))
    rate, p99, run = best
    return ServerResult(rate, p99, tuple(tried), None if isinstance(run, np.ndarray) else split_of(run))


def split_of(run: Any) -> dict:
    """p50/p99 of time queued and time computing (ms), and the mean items per call, of an open-loop run."""

    def pct(values: np.ndarray) -> dict[str, float]:
        return {"p50": float(np.percentile(values, 50)) / 1e6, "p99": float(np.percentile(values, 99)) / 1e6}

    return {"queue_ms": pct(run.queue_ns), "compute_ms": pct(run.compute_ns),
            "mean_batch": float(run.batch_sizes.mean()) if len(run.batch_sizes) else 0.0}  # fmt: skip
