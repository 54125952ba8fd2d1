"""MLPerf's *server* scenario: queries arrive as a Poisson process; find the highest rate whose p99 meets the SLA.

One query is in flight at a time (one runner); a query that arrives while the runner is
busy waits, and its latency counts from its arrival, so queueing shows up in the p99 as
it would in a real server.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from autodeploy.harness.stats import MIN_SAMPLES_P99

Clock = Callable[[], int]
SPIN_NS = 200_000  # sleep until this close to an arrival, then spin: sleep() overshoots by ~50-100 µs


@dataclass(frozen=True)
class ServerResult:
    max_rate_qps: float  # 0.0 when even the lowest rate tried misses the SLA
    p99_ms_at_rate: float | None
    tried: tuple[tuple[float, float], ...]  # (rate, p99 ms) for every rate run

    def to_dict(self) -> dict:
        return {"max_rate_qps": self.max_rate_qps, "p99_ms_at_rate": self.p99_ms_at_rate,
                "tried": [list(t) for t in self.tried]}  # fmt: skip


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

    Each rate runs ``queries`` queries (662 by default: the fewest that support a p99 claim).
    """
    low, high = 0.0, 1000.0 / service_ms
    best: tuple[float, float] | None = None
    tried = []
    for i in range(iterations):
        rate = (low + high) / 2
        p99 = float(np.percentile(poisson_run(fn, rate, queries, seed=seed + i), 99)) / 1e6
        tried.append((rate, p99))
        if p99 <= sla_ms:
            low, best = rate, (rate, p99)
        else:
            high = rate
    if best is None:
        return ServerResult(0.0, None, tuple(tried))
    return ServerResult(best[0], best[1], tuple(tried))
