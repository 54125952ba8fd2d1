"""Security round 4 (issue 37), part B: a trial whose run was killed (kill -9) or stopped (Ctrl-C).

A killed ``tune`` left its Optuna trial RUNNING through every later resume (summaries said "1 running",
a grid never measured that point): a resume ends the RUNNING trials whose process on this host is gone,
at once, without waiting for their heartbeat to go stale. Neither a killed nor an interrupted trial is
its config's failure: both are counted as ``interrupted`` and a grid asks their point again.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import optuna
import psutil
import pytest

from tests.models import mlp


def _tune(model, db, *extra: str) -> list[str]:
    return [sys.executable, "-m", "autodeploy", "tune", str(model), "--name", "s", "--engine", "onnxruntime",
            "--threads", "1", "--batch", "1", "--precision", "fp32", "--sampler", "grid", "--finalists", "0",
            "--min-samples", "16", "--db", db, *extra]  # fmt: skip


def _env(tmp_path) -> dict[str, str]:
    return {**os.environ, "AUTODEPLOY_CACHE": str(tmp_path / "cache"),
            "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}  # fmt: skip


def _start_and_wait_for_a_measuring_trial(tmp_path, model, db) -> subprocess.Popen:
    proc = subprocess.Popen(_tune(model, db, "--min-duration", "30", "--fresh"), env=_env(tmp_path),
                            start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[0]
        try:
            trials = optuna.load_study(study_name="s", storage=db).trials
        except Exception:  # not created yet
            trials = []
        workers = psutil.Process(proc.pid).children(recursive=True)
        if any(t.state.name == "RUNNING" for t in trials) and any("measure" in " ".join(w.cmdline()) or
                                                                  "worker" in " ".join(w.cmdline()) for w in workers):
            time.sleep(1.0)  # into the timed phase
            return proc
        time.sleep(0.2)
    proc.kill()
    raise AssertionError("no trial started running in time")


def _resume(tmp_path, model, db) -> dict:
    done = subprocess.run(_tune(model, db, "--resume", "--min-duration", "0.1", "--format", "json"), env=_env(tmp_path),
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)


@pytest.mark.slow
def test_a_killed_runs_trial_is_ended_at_the_next_resume_and_its_grid_point_measured(tmp_path):
    model = mlp(tmp_path / "m.onnx")
    db = f"sqlite:///{tmp_path / 'r.db'}"
    first = _start_and_wait_for_a_measuring_trial(tmp_path, model, db)
    doomed = psutil.Process(first.pid).children(recursive=True)
    os.killpg(first.pid, signal.SIGKILL)
    for p in doomed:
        p.kill()
    first.wait(timeout=30)
    (killed,) = [t for t in optuna.load_study(study_name="s", storage=db).trials if t.state.name == "RUNNING"]

    record = _resume(tmp_path, model, db)  # at once: its heartbeat is not stale yet (GRACE_S)
    trials = optuna.load_study(study_name="s", storage=db).trials
    assert all(t.state.is_finished() for t in trials)
    ended = next(t for t in trials if t.number == killed.number)
    assert ended.state.name == "FAIL" and "interrupted" in ended.user_attrs and "failure" not in ended.user_attrs
    assert record["trials"].get("interrupted") == 1 and "running" not in record["trials"] and "fail" not in record["trials"]
    # The grid point it held was measured by the resume.
    assert ended.params in [t.params for t in trials if t.state.name == "COMPLETE"]
    assert record["winner"] is not None


@pytest.mark.slow
def test_an_interrupted_trial_is_not_counted_as_a_failure(tmp_path):
    model = mlp(tmp_path / "m.onnx")
    db = f"sqlite:///{tmp_path / 'r.db'}"
    first = _start_and_wait_for_a_measuring_trial(tmp_path, model, db)
    os.killpg(first.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the foreground process group
    output, _ = first.communicate(timeout=60)
    assert first.returncode == 130, output
    (stopped,) = [t for t in optuna.load_study(study_name="s", storage=db).trials if t.state.name != "WAITING"]
    assert stopped.state.name == "FAIL" and stopped.user_attrs.get("interrupted") == "stopped by Ctrl-C"

    record = _resume(tmp_path, model, db)
    assert record["trials"].get("interrupted") == 1 and "fail" not in record["trials"]
    trials = optuna.load_study(study_name="s", storage=db).trials
    assert stopped.params in [t.params for t in trials if t.state.name == "COMPLETE"]  # its grid point, asked again
