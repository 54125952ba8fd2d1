"""The study record's runner-up: the finalist after the winner, as the CLI and the dashboard both show it."""

from __future__ import annotations

import dataclasses

import jsonschema

from autodeploy.adapters.base import TrialConfig
from autodeploy.harness.load import Load
from autodeploy.report import SCHEMA, study_record
from autodeploy.search.study import Finalist, StudySummary
from autodeploy.search.summary import finalist_load_text, load_text, runner_up


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


def test_the_study_says_which_finalist_rounds_ran_under_load_and_which_ran_again():
    fast = dataclasses.replace(_finalist("openvino", 4, 1.0), loads=(0.05, 0.9, 0.04))
    base = dataclasses.replace(_finalist("onnxruntime", None, 1.5, baseline=True), loads=(0.06, 1.1, None))
    load = {"before": Load(1.2, 2, 0.5).to_dict(), "threshold_cores": 0.25, "rounds": [0.06, 1.1, 0.04],
            "under_load": [2], "reran": [{"round": 1, "other_cores": [0.8, 0.06], "kept": "again",
                                          "dropped_uids": ["a", "b"]}]}  # fmt: skip
    summary = StudySummary("s", "latency", {"complete": 4}, [fast, base], fast, [], 1.5, load=load)
    text = load_text(summary.to_dict())
    assert text.startswith("load: finalist round 1 ran under load (0.80 cores of other processes) and once more "
                           "(0.06 cores; the less loaded is kept): the second run counts; finalist round 2 ran under "
                           "load (other processes kept up to 1.10 cores busy, more than 0.25)")  # fmt: skip
    assert finalist_load_text({"loads": fast.loads}) == "under load in round 2 (up to 0.90 cores)"
    assert finalist_load_text({"loads": (0.05, None)}) == "quiet" and finalist_load_text({"loads": ()}) == "-"
    record = study_record(summary)
    jsonschema.validate(record, SCHEMA, cls=jsonschema.Draft202012Validator)
    assert record["load"]["under_load"] == [2] and record["load"]["before"]["under_load"] is True
    assert record["finalists"][0]["load_by_round"] == [0.05, 0.9, 0.04]
    quiet = dataclasses.replace(summary, load={**load, "rounds": [0.06, 0.1, 0.04], "under_load": [], "reran": []})
    assert load_text(quiet.to_dict()) == "load: the finalist rounds ran quiet (other processes kept at most 0.10 cores busy)"
    assert load_text(dataclasses.replace(summary, load={}).to_dict()) == ""  # a study stored before the load was read


def test_a_tflite_study_names_litert_as_its_baseline_never_ort():
    """Issue 39: the speed-up of a study on a .tflite is over LiteRT fp32 on the file as given; every line says so,
    and a summary stored before ``baseline_name`` existed is named from its baseline finalist's engine."""
    from autodeploy.search.study import Ratio
    from autodeploy.search.summary import baseline_name, headline

    fast, base = _finalist("openvino", 1, 60.0), _finalist("tflite", None, 90.0, baseline=True)
    unsteady = [{"config": base.label, "baseline": True, "low": 80.0, "high": 150.0}]
    summary = StudySummary("s", "latency", {"complete": 2}, [fast, base], fast, [], 1.5, statistic="p90",
                           speedups={"p90": Ratio(1.5, None, None, 1)}, baseline_name="LiteRT fp32, the file as given",
                           load={"rounds": [0.0], "pair_rounds": 2, "unsteady": unsteady})  # fmt: skip
    record = study_record(summary)
    jsonschema.validate(record, SCHEMA, cls=jsonschema.Draft202012Validator)
    assert record["baseline"] == "LiteRT fp32, the file as given"
    assert record["headline"] == ("winner: openvino/fp32/b1/t1, p90 60.00 ms vs 90.00 ms for LiteRT fp32, the file "
                                  "as given: 1.50x")  # fmt: skip
    text = load_text(summary.to_dict())
    assert "the winner and LiteRT fp32, the file as given ran 2 more rounds" in text
    assert "LiteRT fp32, the file as given read 80.00-150.00 ms" in text and "ORT" not in text
    legacy = {**summary.to_dict(), "baseline_name": None}  # stored before issue 39
    assert baseline_name(legacy) == "LiteRT fp32, the file as given"
    onnx = dataclasses.replace(summary, finalists=[fast, _finalist("onnxruntime", None, 90.0, baseline=True)],
                               baseline_name="")  # fmt: skip
    assert "for the ORT fp32 default: 1.50x" in headline(onnx.to_dict())
    alone = dataclasses.replace(summary, winner=base)
    assert headline(alone.to_dict()).endswith(": the baseline itself (LiteRT fp32, the file as given), no config "
                                              "the search found beat it")  # fmt: skip


def test_the_winner_line_names_the_shapes_its_numbers_are_at():
    from autodeploy.search.summary import headline, shapes_text

    mix = [{"shape": "x=1x3x160x160", "weight": 3.0}, {"shape": "x=1x3x320x320", "weight": 1.0}]
    assert shapes_text({"shapes": mix}) == " over shapes x=1x3x160x160 and x=1x3x320x320 (their mean, weighted 3:1)"
    even = [{**c, "weight": 1.0} for c in mix]
    assert shapes_text({"shapes": even}) == " over shapes x=1x3x160x160 and x=1x3x320x320 (their mean)"
    assert shapes_text({"shapes": mix[1:]}) == " at x=1x3x320x320" and shapes_text({}) == ""
    fast, base = _finalist("openvino", 1, 30.49), _finalist("onnxruntime", None, 45.0, baseline=True)
    summary = StudySummary("s", "latency", {"complete": 2}, [fast, base], fast, statistic="p90", shapes=mix[1:])
    record = study_record(summary)
    jsonschema.validate(record, SCHEMA, cls=jsonschema.Draft202012Validator)
    assert record["shapes"] == mix[1:]
    assert headline(summary.to_dict()).startswith("winner: openvino/fp32/b1/t1, p90 30.49 ms at x=1x3x320x320")
