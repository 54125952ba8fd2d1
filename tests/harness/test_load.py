"""The machine's load over a timed phase: what "under load" means, and that a CPU hog beside a run is seen.

No timing assertions: a hogged run must read at least a low bar of other processes' cores (the hog
alone keeps about one core busy), whatever else the machine is doing.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from autodeploy.adapters.base import TrialConfig
from autodeploy.harness.load import UNDER_LOAD_CORES, Load, LoadMeter, sample
from autodeploy.harness.run import HarnessSettings, prepare_data, run_trial
from autodeploy.harness.timing import TimingPolicy, time_calls
from autodeploy.model import load_model
from tests.models import mlp

#: Long enough that a hog started before it is running for the whole timed phase.
POLICY = TimingPolicy(
    warmup_min_calls=2, warmup_max_s=0.2, min_samples=64, min_duration_s=1.0, max_duration_s=5
)


@pytest.fixture
def hog() -> Iterator[subprocess.Popen]:
    """Another process spinning one core for as long as the test runs."""
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    time.sleep(0.3)  # let it start spinning
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_under_load_is_one_named_threshold() -> None:
    quiet = Load(other_cores=UNDER_LOAD_CORES, cpus=2, wall_s=1.0)
    busy = Load(other_cores=0.93, cpus=2, wall_s=1.0, loadavg_1m=1.8, cpu_mhz=2596.1)
    assert not quiet.under_load and busy.under_load
    assert busy.text() == "other processes used 0.93 of 2 cores (46%), load average 1.80, 2596 MHz"
    assert quiet.text() == f"other processes used {UNDER_LOAD_CORES:.2f} of 2 cores (12%)"
    assert Load.from_dict(busy.to_dict()) == busy and busy.to_dict()["under_load"] is True


def test_a_meter_reads_the_machine() -> None:
    load = sample(0.2)
    assert load.cpus >= 1 and load.other_cores >= 0 and load.wall_s >= 0.2
    assert load.loadavg_1m is None or load.loadavg_1m >= 0


def test_other_processes_are_the_machine_less_our_own_process() -> None:
    """Counters and clock are injected: 3 busy core-seconds over 2 s, 1 of them ours, is 1 core of others."""
    readings = iter([(100.0, 10.0), (103.0, 11.0)])
    ticks = iter([50.0, 52.0])
    assert LoadMeter(lambda: next(readings), lambda: next(ticks)).stop().other_cores == pytest.approx(1.0)
    # the two counters tick apart: a process slightly ahead of the machine's count reads 0, never below
    readings, ticks = iter([(100.0, 10.0), (100.5, 10.6)]), iter([0.0, 1.0])
    assert LoadMeter(lambda: next(readings), lambda: next(ticks)).stop().other_cores == 0.0


def test_the_timing_loop_records_the_load() -> None:
    run = time_calls(
        lambda: None, TimingPolicy(warmup_min_calls=0, warmup_max_s=0, min_samples=2, min_duration_s=0.05)
    )
    # the meter brackets the timed loop (which may stop early at its sample cap, before min_duration_s)
    assert run.load is not None and run.load.wall_s >= run.duration_s > 0


@pytest.mark.slow
def test_a_cpu_hog_beside_a_bench_is_seen(tmp_path, hog) -> None:
    model = load_model(mlp(tmp_path / "m.onnx"))
    settings = HarnessSettings(workdir=tmp_path / "work", policy=POLICY, timeout_s=60.0, memory_cap_mb=700)
    result = run_trial(model, TrialConfig("onnxruntime", threads=1), prepare_data(model, settings), settings)
    assert result.ok, result.failure_message
    load = result.measurement.load
    assert load is not None and hog.poll() is None
    assert load.other_cores >= 0.3, load.text()  # the hog alone spins about one core
    assert load.under_load and result.measurement.under_load
