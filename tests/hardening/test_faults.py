"""Faults during a study: a tune process killed with SIGKILL mid-trial, and trials that crash.

A killed run leaves its Optuna trial RUNNING; the next run fails it once its heartbeat is
stale (``search.storage.GRACE_S``) and completes its own trials, and the store holds each
measured trial exactly once. Trials that segfault, hang with the GIL released, or allocate
past the memory cap are recorded with their kind within their timeout, nothing is left
running, and the search goes on.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import optuna
import psutil
import pytest

from autodeploy.adapters import registry
from autodeploy.device import probe_device
from autodeploy.harness.run import HarnessSettings, prepare_data
from autodeploy.harness.supervisor import TERM_GRACE_S
from autodeploy.harness.timing import TimingPolicy
from autodeploy.model import load_model
from autodeploy.results_db import Store, TrialFilter
from autodeploy.search import storage as study_storage
from autodeploy.search import study as study_module
from autodeploy.search.config import StudyConfig
from autodeploy.search.study import StudyContext, run_study
from tests.adapters.faulty import TARGET
from tests.models import mlp

FAST = TimingPolicy(
    warmup_min_calls=2, warmup_max_s=0.2, min_samples=64, min_duration_s=0.1, max_duration_s=5
)


def _tune(tmp_path, model, db, *extra: str) -> list[str]:
    return [sys.executable, "-m", "autodeploy", "tune", str(model), "--name", "killed", "--engine", "onnxruntime",
            "--threads", "1", "--precision", "fp32", "--min-duration", "0.5", "--finalists", "0", "--fresh", "--db", db, *extra]  # fmt: skip


def _env(tmp_path) -> dict[str, str]:
    return {**os.environ, "AUTODEPLOY_CACHE": str(tmp_path / "cache"),
            "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}  # fmt: skip


def _wait_for_running_trial(db: str, proc: subprocess.Popen, timeout: float = 120) -> None:
    """Until the study has a RUNNING trial whose harness worker is measuring (a child process is up)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[0]
        try:
            trials = optuna.load_study(study_name="killed", storage=db).trials
        except Exception:  # the study is not created yet (or the database is being set up)
            trials = []
        workers = psutil.Process(proc.pid).children(recursive=True)
        if any(t.state.name == "RUNNING" for t in trials) and workers:
            return
        time.sleep(0.2)
    raise AssertionError("no trial started running in time")


@pytest.mark.slow
def test_kill_9_mid_trial_then_resume(tmp_path):
    model = mlp(tmp_path / "m.onnx")
    db = f"sqlite:///{tmp_path / 'r.db'}"
    first = subprocess.Popen(_tune(tmp_path, model, db, "--trials", "3"), env=_env(tmp_path), start_new_session=True,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    _wait_for_running_trial(db, first)
    # Workers run in their own process group; kill them too, as a supervisor killing the job would.
    doomed = psutil.Process(first.pid).children(recursive=True)
    os.killpg(first.pid, signal.SIGKILL)
    for p in doomed:
        p.kill()
    first.wait(timeout=30)
    killed_at = time.monotonic()
    assert first.returncode == -signal.SIGKILL
    stale = [
        t.number
        for t in optuna.load_study(study_name="killed", storage=db).trials
        if t.state.name == "RUNNING"
    ]
    assert len(stale) == 1

    time.sleep(max(0.0, killed_at + study_storage.GRACE_S + 1 - time.monotonic()))
    resumed = subprocess.run(_tune(tmp_path, model, db, "--trials", "2", "--resume"), env=_env(tmp_path),
                             capture_output=True, text=True, timeout=300)  # fmt: skip
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "Traceback" not in resumed.stderr and "Warning" not in resumed.stderr, resumed.stderr

    trials = optuna.load_study(study_name="killed", storage=db).trials
    states = {t.number: t.state.name for t in trials}
    assert states[stale[0]] == "FAIL"
    assert all(t.state.is_finished() for t in trials)
    resumed_trials = [t for t in trials if t.number not in stale and t.datetime_start and t.number > stale[0]]
    assert all(t.state.name in ("COMPLETE", "PRUNED") for t in resumed_trials)
    # --trials 2 counts measurements; repeats and pruned configs are free (so there may be more trials)
    measured = [t for t in resumed_trials if t.state.name == "COMPLETE" and "repeat_of" not in t.user_attrs]
    assert 1 <= len(measured) <= 2
    with Store.open(db) as store:
        rows = store.trials(TrialFilter(study="killed"))
    uids = [r.uid for r in rows]
    assert len(uids) == len(set(uids))  # nothing stored twice
    attrs = {t.user_attrs["uid"] for t in trials if "uid" in t.user_attrs}
    assert attrs == set(uids)  # every measured Optuna trial has its row, and no row is unaccounted for
    assert "uid" not in next(t for t in trials if t.number == stale[0]).user_attrs


@pytest.mark.slow
def test_crash_hang_and_oom_trials_are_recorded_and_the_search_goes_on(tmp_path):
    timeout_s, cap_mb = 10.0, 700  # room for a cold worker start (a fresh venv compiles its imports) before the allocation
    path = load_model(mlp(tmp_path / "m.onnx"))
    settings = HarnessSettings(
        workdir=tmp_path / "work", policy=FAST, timeout_s=timeout_s, memory_cap_mb=cap_mb
    )
    faults = ["segfault", "hang", "oom", "none"]
    cfg = StudyConfig(model=str(path.path), engines=["faulty"], precisions=["fp32"], threads=[1], sampler="grid",
                      knobs={"faulty": {"fault": faults}}, finalists={"count": 0})  # fmt: skip
    db = f"sqlite:///{tmp_path / 'r.db'}"
    registry.register("faulty", TARGET)
    timings: dict[str, float] = {}

    class Timer(study_module.Reporter):
        started = 0.0
        label = ""

        def phase(self, text: str) -> None:
            if text.endswith(": starting"):
                self.started, self.label = time.monotonic(), text

        def trial_done(self, done: int, best: str | None) -> None:
            timings[self.label] = time.monotonic() - self.started

    try:
        with Store.open(db) as store:
            ctx = StudyContext(cfg, "faults", path, probe_device(), prepare_data(path, settings), settings, store,
                               db, "autodeploy tune test")  # fmt: skip
            summary = run_study(ctx, Timer())
            rows = store.trials(TrialFilter(study="faults"))
    finally:
        registry.unregister("faulty")

    study = optuna.load_study(study_name="faults", storage=db)
    assert len(study.trials) == 4 and all(t.state.is_finished() for t in study.trials)
    kinds = {r.config.knobs["fault"]: (r.failure_kind, r.failure_message) for r in rows}
    assert kinds["segfault"][0] == "crashed" and "SIGSEGV" in kinds["segfault"][1]
    assert kinds["hang"][0] == "timeout" and f"after {timeout_s:g} s" in kinds["hang"][1]
    assert kinds["oom"][0] == "oom" and f"memory cap of {cap_mb} MB" in kinds["oom"][1]
    assert kinds["none"] == (None, None)
    assert summary.winner is not None and summary.winner.config.knobs == {"fault": "none"}
    # Each within its timeout, plus a build worker and the SIGTERM grace (the reference is shared).
    assert len(timings) == 4 and all(t < timeout_s + TERM_GRACE_S + 20 for t in timings.values()), timings
    leftovers = [c for c in psutil.Process().children(recursive=True) if c.is_running()]
    assert not [c for c in leftovers if "autodeploy.harness.worker" in " ".join(c.cmdline())]
