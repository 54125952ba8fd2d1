"""The study record's runner-up: the finalist after the winner, as the CLI and the dashboard both show it."""

from __future__ import annotations

from autodeploy.adapters.base import TrialConfig
from autodeploy.report import runner_up, study_record
from autodeploy.search.study import Finalist, StudySummary


def _finalist(engine: str, threads: int | None, value: float | None, ci=None, *, baseline=False, failure=None):
    config = TrialConfig(engine, "fp32", batch=1, threads=threads)
    ci = ci or (None if value is None else (value * 0.98, value * 1.02))
    return Finalist(config, config.label(), value, ci, 100, ["u"], baseline, failure)


def test_the_runner_up_is_the_next_best_finalist_and_never_a_failed_one():
    fast, failed = _finalist("openvino", 4, 1.0), _finalist("tflite", 1, None, failure="run_failed: boom")
    slow, base = _finalist("onnxruntime", 4, 2.0), _finalist("onnxruntime", None, 1.5, baseline=True)
    summary = StudySummary("s", "latency", {"complete": 4}, [fast, failed, slow, base], fast, [], 1.5)
    record = study_record(summary)
    assert record["runner_up"]["label"] == base.label and record["runner_up"]["baseline"]  # the baseline ranks too


def test_in_a_tie_the_runner_up_may_have_the_better_number():
    quick = _finalist("openvino", 4, 1.00, (0.95, 1.06))
    cheap = _finalist("openvino", 1, 1.02, (0.97, 1.08))  # tied, fewer threads: the winner
    summary = StudySummary("s", "latency", {}, [quick, cheap], cheap, [quick.label], None)
    assert runner_up(summary.to_dict())["label"] == quick.label


def test_throughput_ranks_higher_first_and_no_winner_means_no_runner_up():
    a, b, c = _finalist("openvino", 1, 900.0), _finalist("onnxruntime", 1, 800.0), _finalist("tflite", 1, 850.0)
    summary = StudySummary("s", "throughput", {}, [a, b, c], a, [], None)
    assert runner_up(summary.to_dict())["label"] == c.label
    assert study_record(StudySummary("s", "latency", {}, [a], None, note="every finalist failed"))["runner_up"] is None
