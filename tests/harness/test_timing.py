
import numpy as np
import pytest

from autodeploy.harness.timing import TimingPolicy, time_calls, warm_up

MS = 1_000_000


class FakeClock:
    """Integer-nanosecond clock that moves only when a fake call "runs"."""

    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now


def fake_fn(clock: FakeClock, latencies_ns):
    """A call whose i-th invocation takes latencies_ns(i) on the fake clock; counts calls."""
    calls = []

    def fn() -> None:
        clock.now += latencies_ns(len(calls))
        calls.append(1)

    fn.calls = calls
    return fn


NO_WARMUP = {"warmup_min_calls": 0, "warmup_max_s": 0.0}


def test_continues_until_min_duration_after_min_samples():
    clock = FakeClock()
    fn = fake_fn(clock, lambda i: MS)  # 1 ms per call
    run = time_calls(fn, TimingPolicy(min_samples=10, min_duration_s=0.5, **NO_WARMUP), clock=clock)
    assert run.stopped_by == "min_reached"
    assert len(run.samples_ns) == 500  # 10 samples came early; the 0.5 s minimum decided
    assert run.samples_ns.dtype == np.int64 and np.all(run.samples_ns == MS)
    assert run.duration_s == pytest.approx(0.5)
    assert run.warmup_calls == 0


def test_continues_until_min_samples_after_min_duration():
    clock = FakeClock()
    fn = fake_fn(clock, lambda i: 100 * MS)
    run = time_calls(fn, TimingPolicy(min_samples=64, min_duration_s=1.0, **NO_WARMUP), clock=clock)
    assert run.stopped_by == "min_reached" and len(run.samples_ns) == 64
    assert run.duration_s == pytest.approx(6.4)


def test_max_samples_cap():
    clock = FakeClock()
    fn = fake_fn(clock, lambda i: 1_000)  # 1 us per call: the duration minimum is far away
    policy = TimingPolicy(min_samples=10, min_duration_s=5.0, max_samples=1000, **NO_WARMUP)
    run = time_calls(fn, policy, clock=clock)
    assert run.stopped_by == "max_samples" and len(run.samples_ns) == 1000


def test_max_duration_cap():
    clock = FakeClock()
    fn = fake_fn(clock, lambda i: 1_000 * MS)  # 1 s per call
    policy = TimingPolicy(min_samples=64, min_duration_s=2.0, max_duration_s=10.0, **NO_WARMUP)
    run = time_calls(fn, policy, clock=clock)
    assert run.stopped_by == "max_duration" and len(run.samples_ns) == 10
    assert run.duration_s == pytest.approx(10.0)


def cooling(i: int) -> int:
    """First 10 calls slow and getting faster (50, 46, ..., 14 ms), then 1 ms."""
    return (50 - 4 * i) * MS if i < 10 else MS


def test_warm_up_waits_for_stable_latency():
    clock = FakeClock()
    fn = fake_fn(clock, cooling)
    calls = warm_up(fn, TimingPolicy(warmup_window=5), clock=clock)
    # Windows of calls [8, 13) = {18, 14, 1, 1, 1} ms and [13, 18) share the median 1 ms;
    # every earlier pair of windows differs by far more than 10%.
    assert calls == 18 and len(fn.calls) == 18


def test_warm_up_takes_at_least_min_calls():
    clock = FakeClock()
    fn = fake_fn(clock, lambda i: MS)  # stable from the start
    assert warm_up(fn, TimingPolicy(warmup_min_calls=25, warmup_window=5), clock=clock) == 25
    assert warm_up(fn, TimingPolicy(warmup_min_calls=3, warmup_window=5), clock=clock) == 10  # 2 windows


def test_warm_up_gives_up_after_max_time():
    clock = FakeClock()
    fn = fake_fn(clock, lambda i: (i + 1) * 10 * MS)  # keeps getting slower, never stable
    calls = warm_up(fn, TimingPolicy(warmup_max_s=1.0), clock=clock)
    assert clock.now >= 1e9 and calls == len(fn.calls) < 20


def test_time_calls_reports_warmup_and_excludes_it():
    clock = FakeClock()
    fn = fake_fn(clock, cooling)
    run = time_calls(fn, TimingPolicy(min_samples=64, min_duration_s=0.0), clock=clock)
    assert run.warmup_calls == 18
    assert len(run.samples_ns) == 64 and np.all(run.samples_ns == MS)
    assert len(fn.calls) == 18 + 64


def test_real_clock_smoke():
    policy = TimingPolicy(warmup_min_calls=2, warmup_window=2, min_samples=20, min_duration_s=0.01)
    run = time_calls(lambda: sum(range(100)), policy)
    # No wall-clock bound: a loaded machine may pause this process for seconds. That the loop ended
    # by its own rule (both minimums met), not by a cap, is what must hold anywhere.
    assert run.stopped_by == "min_reached" and len(run.samples_ns) >= 20
    assert np.all(run.samples_ns > 0) and run.duration_s >= 0.01


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"min_samples": 100, "max_samples": 10}, "min_samples"),
        ({"min_duration_s": 5.0, "max_duration_s": 1.0}, "min_duration_s"),
        ({"min_samples": 1}, "min_samples must be >= 2"),
        ({"warmup_window": 0}, "warmup_window"),
        ({"warmup_tolerance": -0.1}, "warmup_tolerance"),
        ({"warmup_min_calls": -1}, "warmup_min_calls"),
    ],
)
def test_policy_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        TimingPolicy(**kwargs)
