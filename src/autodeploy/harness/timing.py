"""The one timing loop for every engine: warm up until stable, then time call by call.

Adapters never time themselves (STYLE.md rule 3); the worker hands ``Runner.run`` bound to
its feeds to :func:`time_calls`. The clock is injectable so the stopping rules can be tested
with a fake clock instead of real sleeps.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np

from autodeploy.harness.energy import Cost, CostMeter, Meters, idle_watts
from autodeploy.harness.load import Load, LoadMeter

Clock = Callable[[], int]
StopReason = Literal["min_reached", "max_samples", "max_duration"]
#: The most seconds a flag or a study config may ask a timed phase (or the finalists' spread) to last: a day.
#: More is a typo, and past the clocks' range (int nanoseconds here, time_t in a sleep) it overflows.
MAX_TIMED_S = 86_400.0


@dataclass(frozen=True)
class TimingPolicy:
    """How long to warm up and how many calls to time (docs/architecture.md, "Measurement rules").

    Warm-up makes at least ``warmup_min_calls`` calls, then goes on until the median of the
    last ``warmup_window`` calls is within ``warmup_tolerance`` (relative) of the median of the
    window before it, or until ``warmup_max_s`` has passed. The timed phase runs until *both*
    ``min_samples`` and ``min_duration_s`` are met (MLPerf LoadGen's rule), capped by
    ``max_samples`` and ``max_duration_s``.
    """

    warmup_min_calls: int = 5
    warmup_max_s: float = 10.0
    warmup_window: int = 5
    warmup_tolerance: float = 0.10
    min_samples: int = 64
    min_duration_s: float = 2.0
    max_samples: int = 100_000
    max_duration_s: float = 60.0

    def __post_init__(self) -> None:
        checks = [
            (self.warmup_min_calls >= 0, f"warmup_min_calls must be >= 0, got {self.warmup_min_calls}"),
            (self.warmup_max_s >= 0, f"warmup_max_s must be >= 0, got {self.warmup_max_s}"),
            (self.warmup_window >= 1, f"warmup_window must be >= 1, got {self.warmup_window}"),
            (self.warmup_tolerance >= 0, f"warmup_tolerance must be >= 0, got {self.warmup_tolerance}"),
            (self.min_samples >= 2, f"min_samples must be >= 2 (statistics need 2), got {self.min_samples}"),
            (self.min_duration_s >= 0, f"min_duration_s must be >= 0, got {self.min_duration_s}"),
            (
                self.min_samples <= self.max_samples,
                f"min_samples ({self.min_samples}) must be <= max_samples ({self.max_samples})",
            ),
            (
                self.min_duration_s <= self.max_duration_s,
                f"min_duration_s ({self.min_duration_s}) must be <= max_duration_s ({self.max_duration_s})",
            ),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(f"invalid TimingPolicy: {message}")


@dataclass(frozen=True)
class TimedRun:
    """The timed phase of one measurement.

    Attributes:
        samples_ns: Per-call latencies in nanoseconds (int64), in call order.
        duration_s: Wall time of the timed phase (from its start to the end of the last call).
        warmup_calls: Calls made during warm-up (not in ``samples_ns``).
        stopped_by: ``"min_reached"`` when both minimums were met, else the cap that ended it.
        load: How busy the machine was over the timed phase (:mod:`autodeploy.harness.load`).
        cost: The worker's CPU time and, where a meter is, the energy over the timed phase
            (:mod:`autodeploy.harness.energy`), per call until the worker gives it its batch.
    """

    samples_ns: np.ndarray
    duration_s: float
    warmup_calls: int
    stopped_by: StopReason
    load: Load | None = None
    cost: Cost | None = None


def warm_up(fn: Callable[[], object], policy: TimingPolicy, clock: Clock = time.perf_counter_ns) -> int:
    """Call ``fn`` until its latency is stable; return the number of calls made.

    Always makes ``policy.warmup_min_calls`` calls (even past ``warmup_max_s``); after that
    it stops as soon as the last two windows of ``policy.warmup_window`` calls have medians
    within ``policy.warmup_tolerance`` of each other (relative to the earlier window), or once
    ``policy.warmup_max_s`` has passed. ``warmup_min_calls=0, warmup_max_s=0`` disables warm-up.
    """
    window, tolerance = policy.warmup_window, policy.warmup_tolerance
    max_ns = int(policy.warmup_max_s * 1e9)
    durations: list[int] = []
    start = now = clock()
    while len(durations) < policy.warmup_min_calls or not (
        _stable(durations, window, tolerance) or now - start >= max_ns
    ):
        t0 = clock()
        fn()
        now = clock()
        durations.append(now - t0)
    return len(durations)


def _stable(durations: list[int], window: int, tolerance: float) -> bool:
    if len(durations) < 2 * window:
        return False
    last = statistics.median(durations[-window:])
    before = statistics.median(durations[-2 * window : -window])
    return abs(last - before) <= tolerance * before


def time_calls(
    fn: Callable[[], object], policy: TimingPolicy, clock: Clock = time.perf_counter_ns,
    meters: Meters | None = None,
) -> TimedRun:  # fmt: skip
    """Warm ``fn`` up, then time it call by call under ``policy``'s stopping rules.

    Only ``fn()`` sits between the two clock reads; storing the sample and checking the
    stopping rules happen outside them, into a preallocated array. The end-of-call clock
    read doubles as "now" for the duration checks, so each call costs two clock reads. The
    machine's load, the process's CPU time and ``meters``' energy counters are read just before and after
    the timed phase, never inside it; the idle draw of ``meters`` before warm-up.

    Args:
        fn: The call to time, with its inputs already bound (e.g. ``lambda: runner.run(feeds)``).
        policy: Warm-up and stopping rules.
        clock: Monotonic clock in integer nanoseconds; injectable for tests.
        meters: The energy counters to read (:func:`autodeploy.harness.energy.find`); none: CPU time only.
    """
    meters = meters or Meters(absent=("not looked for",))
    idle = idle_watts(meters.counters)
    warmup_calls = warm_up(fn, policy, clock)
    buf = np.empty(policy.max_samples, dtype=np.int64)
    max_samples, min_samples = policy.max_samples, policy.min_samples
    meter = LoadMeter.start()
    spent = CostMeter(meters, idle)
    start = clock()
    min_end = start + int(policy.min_duration_s * 1e9)
    max_end = start + int(policy.max_duration_s * 1e9)
    i = 0
    while True:
        t0 = clock()
        fn()
        t1 = clock()
        buf[i] = t1 - t0
        i += 1
        # The minimums are checked first so a run that meets them is "min_reached" even when
        # the same call also hits a cap.
        if i >= min_samples and t1 >= min_end:
            stopped_by: StopReason = "min_reached"
            break
        if i >= max_samples:
            stopped_by = "max_samples"
            break
        if t1 >= max_end:
            stopped_by = "max_duration"
            break
    load, cost = meter.stop(), spent.stop(i)
    return TimedRun(
        samples_ns=buf[:i].copy(),
        duration_s=(t1 - start) / 1e9,
        warmup_calls=warmup_calls,
        stopped_by=stopped_by,
        load=load,
        cost=cost,
    )
