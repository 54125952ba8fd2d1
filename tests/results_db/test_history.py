"""A config's history on one device, read from a real store (issue 42): one value per earlier study or run."""

from __future__ import annotations

import dataclasses

from autodeploy.results_db import TrialFilter
from autodeploy.results_db.history import gate_history, trial_history
from autodeploy.results_db.records import GateRunRecord
from tests.results_db.factories import DEVICE, MODEL, config, ok_result

BASE = config(threads=None)
OTHER_DEVICE = dataclasses.replace(DEVICE, fingerprint="fp-" + "1" * 16)


def _add(store, uid, p90, *, study, phase="finalist", device=DEVICE, cfg=BASE):
    result = ok_result(uid, config=cfg)
    latency = dataclasses.replace(result.measurement.latency, p90=p90, median=p90 * 0.9)
    result = dataclasses.replace(result, measurement=dataclasses.replace(result.measurement, latency=latency))
    store.add_trial(result, model=MODEL, device=device, study=study, phase=phase, shape_key="")


def test_one_value_per_earlier_study_its_finalist_rounds_first_this_study_left_out(store):
    _add(store, "a1", 4.0, study="a")
    _add(store, "a2", 6.0, study="a")
    _add(store, "a0", 30.0, study="a", phase="screening")  # a short screening run: the rounds speak for study a
    _add(store, "b0", 9.0, study="b", phase="screening")  # no finalists: its screening trial is its value
    _add(store, "now", 100.0, study="today")  # the study asking
    _add(store, "dev", 50.0, study="c", device=OTHER_DEVICE)  # another device
    _add(store, "cfg", 50.0, study="c", cfg=config(threads=1))  # another config
    where = TrialFilter(model_sha256=MODEL.sha256, device=DEVICE.fingerprint, config_key=ok_result(config=BASE).config.key())
    values, kind = trial_history(store, where, "p90", exclude_study="today")
    assert sorted(values) == [5.0, 9.0] and kind == "studies"
    medians, _ = trial_history(store, where, "median", exclude_study="today")
    assert sorted(medians) == [4.5, 8.1]
    _add(store, "bench", 7.0, study=None, phase=None)  # a bench run outside any study: a run of its own
    values, kind = trial_history(store, where, "p90", exclude_study="today")
    assert sorted(values) == [5.0, 7.0, 9.0] and kind == "runs"


def test_earlier_interleaved_gate_runs_of_the_same_baseline_count_once_each(store):
    def run(sha, cfg, mode, medians):
        rounds = {"baseline": [{"median_ms": m, "failure": None} for m in medians], "candidate": []}
        return GateRunRecord(mode=mode, verdict="pass", baseline_ref="b.onnx", baseline_sha256=sha, baseline_config=cfg,
                             candidate_ref="c.onnx", candidate_sha256=sha, candidate_config=cfg,
                             settings={"rounds_measured": rounds}, metrics=[], notes=[], wall_s=1.0)  # fmt: skip

    one = config(threads=1)
    store.add_gate_run(run(MODEL.sha256, one, "interleaved", [2.0, 3.0, 4.0]), device=DEVICE)
    store.add_gate_run(run(MODEL.sha256, one, "against-db", [9.0]), device=DEVICE)  # measured no baseline
    store.add_gate_run(run("cd" * 32, one, "interleaved", [9.0]), device=DEVICE)  # another model
    store.add_gate_run(run(MODEL.sha256, config(threads=2), "interleaved", [9.0]), device=DEVICE)  # another config
    store.add_gate_run(run(MODEL.sha256, one, "interleaved", [5.0]), device=OTHER_DEVICE)
    key = ok_result(config=one).config.key()
    assert gate_history(store, device=DEVICE.fingerprint, baseline_sha256=MODEL.sha256, config_key=key) == [3.0]
