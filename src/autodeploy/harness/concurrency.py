"""Many requests in flight: the closed loop of *offline* and *multi-stream*, the open loop of *server*.

Both drive a :class:`~autodeploy.runtime.base.Pool` (the engine's own parallel API) from one
thread. The closed loop keeps every request busy: a new query starts as soon as one is free.
The open loop issues queries at Poisson arrival times, however many are in flight; a
:class:`Batcher` in front of the pool groups queued items into batches (max batch size, max
queue delay), as Triton's dynamic batcher does, and each query's time is split into time queued
and time computing. A failed request stops the loop, every request in flight is drained, and
the failure is raised; nothing is left running.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from autodeploy.errors import EngineError
from autodeploy.harness.energy import Cost, CostMeter, Meters, idle_watts
from autodeploy.harness.load import Load, LoadMeter
from autodeploy.harness.timing import Clock, StopReason, TimingPolicy, warm_up
from autodeploy.runtime.base import Pool

Feeds = Mapping[str, np.ndarray]
# Sleep until this close to an arrival, then spin. Less than the one-runner loop's 200 µs: here the
# engine runs beside the arrival thread, and a spinning thread takes a core from it on a small
# machine. A query issued late (sleep() overshoots by ~50-100 µs) counts from its scheduled arrival,
# so lateness can only make the p99 worse, never better.
SPIN_NS = 50_000


class _Tracker:
    """Start and end clock reads per tag, and the first failure; ``done`` is called from engine threads."""

    def __init__(self, size: int, clock: Clock) -> None:
        self.starts = np.zeros(size, dtype=np.int64)
        self.ends = np.zeros(size, dtype=np.int64)
        self.clock = clock
        self.error: BaseException | None = None

    def done(self, tag: int, error: BaseException | None) -> None:
        # No lock: one item store per call is atomic under the GIL, and the loop reads the ends
        # only after draining (a lock here is paid on every query of a fast model).
        now = self.clock()
        if error is not None:
            self.error = self.error or error
            return
        self.ends[tag] = now

    def raise_failure(self) -> None:
        if self.error is not None:
            text = str(self.error).strip().splitlines()
            raise EngineError(f"a request in flight failed: {type(self.error).__name__}: {text[0] if text else ''}")


@dataclass(frozen=True)
class LoopRun:
    """The timed phase of a closed loop: per-query latencies and items per second over the wall time."""

    samples_ns: np.ndarray
    duration_s: float  # first start to last end (or the stop decision, if later)
    requests: int
    warmup_calls: int
    stopped_by: StopReason
    load: Load | None = None  # how busy the machine was over the timed phase
    cost: Cost | None = None  # CPU time and energy over it, per query (harness/energy.py)


def closed_loop(pool: Pool, feeds: Feeds, policy: TimingPolicy, clock: Clock = time.perf_counter_ns,
                meters: Meters | None = None) -> LoopRun:  # fmt: skip
    """Keep ``pool.requests`` queries in flight: warm up, then time under ``policy``'s stopping rules.

    Warm-up rounds (each: one query per request, then drain) follow :func:`~autodeploy.harness.timing.warm_up`.
    The timed phase starts queries until both ``min_samples`` have started and ``min_duration_s`` has
    passed (or a cap is hit), then drains; the wall time runs from its start to the last query's end. CPU time
    and ``meters``' energy are read as :func:`~autodeploy.harness.timing.time_calls` reads them.
    """
    meters = meters or Meters(absent=("not looked for",))
    idle = idle_watts(meters.counters)
    try:
        warmup = warm_up(lambda: _round(pool, feeds, clock), policy, clock)
        tracker = _Tracker(policy.max_samples, clock)
        pool.on_done = tracker.done  # the pool reports to the tracker of this phase
        meter = LoadMeter.start()
        spent = CostMeter(meters, idle)
        start = clock()
        min_end, max_end = start + int(policy.min_duration_s * 1e9), start + int(policy.max_duration_s * 1e9)
        i, stopped_by, now = 0, "max_samples", start
        while tracker.error is None:
            pool.wait_free()
            now = clock()
            if i >= policy.min_samples and now >= min_end:
                stopped_by = "min_reached"
                break
            if i >= policy.max_samples or now >= max_end:
                stopped_by = "max_samples" if i >= policy.max_samples else "max_duration"
                break
            tracker.starts[i] = now
            pool.start(feeds, i)
            i += 1
    finally:
        pool.drain()  # every request in flight ends before anything else happens
    load, cost = meter.stop(), spent.stop(i)
    tracker.raise_failure()
    latencies = tracker.ends[:i] - tracker.starts[:i]
    # The phase lasts until the last query ends, or until the loop decided to stop if every query
    # had already ended then (its wall time still counts: nothing was in flight only by our doing).
    end = max(int(tracker.ends[:i].max()), now)
    return LoopRun(latencies, (end - start) / 1e9, pool.requests, warmup, stopped_by, load, cost)  # type: ignore[arg-type]


def _round(pool: Pool, feeds: Feeds, clock: Clock) -> None:
    tracker = _Tracker(pool.requests, clock)
    pool.on_done = tracker.done
    try:
        for i in range(pool.requests):
            pool.wait_free()
            pool.start(feeds, i)
    finally:
        pool.drain()
    tracker.raise_failure()


@dataclass(frozen=True)
class BatchPolicy:
    """Triton's dynamic batcher: up to ``max_batch`` queued items per call, waiting at most
    ``max_delay_us`` after the first for more. ``max_batch=1``: no batching, one query per call."""

    max_batch: int = 1
    max_delay_us: int = 0

    def __post_init__(self) -> None:
        if self.max_batch < 1:
            raise ValueError(f"max batch size must be >= 1, got {self.max_batch}")
        if self.max_delay_us < 0:
            raise ValueError(f"max queue delay must be >= 0 µs, got {self.max_delay_us}")


@dataclass(frozen=True)
class OpenRun:
    """Per query of an open loop: latency from arrival, and its split into queued and computing."""

    latency_ns: np.ndarray
    queue_ns: np.ndarray
    compute_ns: np.ndarray
    batch_sizes: np.ndarray  # items per call made


class Batcher:
    """Groups queued items into calls on a pool, in a thread of its own (Triton's dynamic batcher).

    A batch is sent once it holds ``max_batch`` items or ``max_delay_us`` has passed since its
    first item arrived; while every request is busy it keeps filling up to ``max_batch``.
    ``feeds_for(k)`` gives the feeds of a call of ``k`` items.
    """

    def __init__(self, pool: Pool, feeds_for: Callable[[int], Feeds], policy: BatchPolicy, arrivals: np.ndarray,
                 clock: Clock) -> None:  # fmt: skip
        self.pool, self.feeds_for, self.policy, self.clock = pool, feeds_for, policy, clock
        self.arrivals = arrivals
        n = len(arrivals)
        self.batch_start = np.zeros(n, dtype=np.int64)
        self.ends = np.zeros(n, dtype=np.int64)
        self.sizes: list[int] = []
        self._batches: list[list[int]] = []
        self._queue: queue.SimpleQueue[int | None] = queue.SimpleQueue()
        self.error: BaseException | None = None
        self._lock = threading.Lock()
        pool.on_done = self._done
        self._thread = threading.Thread(target=self._serve, name="batcher", daemon=True)
        self._thread.start()

    def put(self, item: int) -> None:
        self._queue.put(item)

    def close(self) -> None:
        """No more items: send what is queued, wait for every call to end."""
        self._queue.put(None)
        self._thread.join()
        self.pool.drain()

    def _done(self, tag: int, error: BaseException | None) -> None:
        now = self.clock()
        with self._lock:
            if error is not None:
                self.error = self.error or error
                return
            self.ends[self._batches[tag]] = now

    def _serve(self) -> None:
        ended = False
        try:
            while not ended and self.error is None:
                first = self._queue.get()
                if first is None:
                    return
                batch, ended = self._fill([first])
                self._send(batch)
        except BaseException as exc:  # noqa: BLE001 - reported as the run's failure
            self.error = self.error or exc

    def _fill(self, batch: list[int]) -> tuple[list[int], bool]:
        limit, deadline = self.policy.max_batch, self.arrivals[batch[0]] + self.policy.max_delay_us * 1000
        while len(batch) < limit:
            wait = (deadline - self.clock()) / 1e9
            try:
                item = self._queue.get(timeout=wait) if wait > 0 else self._queue.get_nowait()
            except queue.Empty:
                break
            if item is None:
                return batch, True
            batch.append(item)
        self.pool.wait_free()
        while len(batch) < limit:  # Triton fills the batch from the queue while no instance is free
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is None:
                return batch, True
            batch.append(item)
        return batch, False

    def _send(self, batch: list[int]) -> None:
        with self._lock:
            tag = len(self._batches)
            self._batches.append(batch)
        self.sizes.append(len(batch))
        feeds = self.feeds_for(len(batch))
        now = self.clock()
        self.batch_start[batch] = now
        self.pool.start(feeds, tag)


def open_loop(pool: Pool, feeds_for: Callable[[int], Feeds], rate_qps: float, n: int, policy: BatchPolicy,
              *, seed: int = 0, clock: Clock = time.perf_counter_ns) -> OpenRun:  # fmt: skip
    """Issue ``n`` queries at Poisson arrivals of ``rate_qps`` through a :class:`Batcher`; time each from arrival."""
    gaps = np.random.default_rng(seed).exponential(1e9 / rate_qps, n)
    arrivals = clock() + np.cumsum(gaps).astype(np.int64)
    batcher = Batcher(pool, feeds_for, policy, arrivals, clock)
    try:
        for i, arrival in enumerate(arrivals):
            if batcher.error is not None:
                break
            wait = arrival - clock()
            if wait > SPIN_NS:
                time.sleep((wait - SPIN_NS) / 1e9)
            while clock() < arrival:
                pass
            batcher.put(i)
    finally:
        batcher.close()
    if batcher.error is not None:
        text = str(batcher.error).strip().splitlines()
        raise EngineError(f"a request in flight failed: {type(batcher.error).__name__}: {text[0] if text else ''}")
    return OpenRun(batcher.ends - arrivals, batcher.batch_start - arrivals, batcher.ends - batcher.batch_start,
                   np.array(batcher.sizes))  # fmt: skip
