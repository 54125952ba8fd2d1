"""Numbers people can read (units scaled, every best with its unit) and a tune people can follow."""

import dataclasses
import re
import sys

import pytest

from autodeploy.adapters.base import TrialConfig
from autodeploy.cli import _common, bench, tune
from autodeploy.cli._common import fmt_ms, fmt_ms_ci
from autodeploy.search.study import Finalist, Ratio, StudySummary
from tests.cli.test_cli import FAST, env, run  # noqa: F401 - env is a fixture
from tests.models import mlp
from tests.results_db.factories import ok_result


def test_times_are_scaled_to_their_unit():
    assert fmt_ms(0.004) == "4.000 µs" and fmt_ms(0.09185) == "91.85 µs"
    assert fmt_ms(12.5) == "12.50 ms" and fmt_ms(1500.0) == "1.500 s" and fmt_ms(None) == "-"
    assert fmt_ms_ci(0.004, (0.0039, 0.0042)) == "4.000 [3.900, 4.200] µs"


def test_a_fast_model_reads_in_microseconds_not_zeros(env, capsys):  # noqa: F811
    tmp_path, _ = env
    code, out, err = run(capsys, "bench", str(mlp(tmp_path / "m.onnx")), *FAST)
    assert code == 0, err
    median = re.search(r"median\s+│\s+(.+?)\s+│", out).group(1)
    assert median.endswith(("µs", "ms")) and not median.startswith("0.0"), median


def test_every_best_has_its_unit_and_objective():
    assert tune.best_text("ort/fp32/b1/t1 = 0.09185", "latency") == "best p90: ort/fp32/b1/t1 at 91.85 µs"
    assert tune.best_text("ort/fp32/b8/t2 = 1234.5", "throughput") == "best throughput: ort/fp32/b8/t2 at 1234.5 items/s"
    assert tune.best_text("x = 3.5, 0.01, 40", "pareto") == "best p90, accuracy drop, memory: x at 3.500 ms, drop 1.00%, 40 MB"
    assert tune.best_text(None, "latency") == "best: none meets the constraints yet"


def test_an_unstable_result_comes_with_advice(capsys, monkeypatch):
    monkeypatch.setattr(_common.out, "width", 200)
    result = ok_result()
    noisy = dataclasses.replace(result.measurement.latency, cv=0.23, unstable=True)
    bench._print_result(dataclasses.replace(result, measurement=dataclasses.replace(result.measurement, latency=noisy)), 1, "m")
    err = capsys.readouterr().err
    assert "CV > 10%" in err and "--min-duration" in err and "--threads 1" in err and "quieter machine" in err
    bench._print_result(result, 1, "m")
    assert "unstable" not in capsys.readouterr().err


def _finalist(label, stat, ci, **kw):
    engine, precision, _, _ = label.split("/")
    return Finalist(TrialConfig(engine=engine, precision=precision, batch=1, threads=1), label, stat, ci, 600,
                    [f"uid-{label}"], **kw)  # fmt: skip


def _fake_tune(summary=None, interrupt_after=0):
    def fake(*_args, reporter, **_kw):
        reporter.study("s", "latency")
        reporter.start(4, None)
        for done in range(1, interrupt_after + 1):
            reporter.trial_done(done, "tflite/int8/b1/t1 = 0.5")
        if summary is None:
            raise KeyboardInterrupt
        reporter.finalists(6)
        for r in range(6):
            reporter.phase(f"finalists round {r // 3 + 1}/2: tflite/fp32/b1/t1")
        return summary

    return fake


def test_tune_names_the_winner_explains_the_screening_best_and_prints_the_next_commands(env, capsys, monkeypatch):  # noqa: F811
    best = _finalist("tflite/int8/b1/t1", 0.61, (0.60, 0.62))
    winner = _finalist("tflite/fp32/b1/t1", 0.42, (0.41, 0.43))
    baseline = _finalist("onnxruntime/fp32/b1/t1", 0.84, (0.83, 0.85), baseline=True)
    speedups = {"p90": Ratio(2.0, (1.9, 2.1), 0.75, 3), "median": Ratio(1.8, (1.7, 1.9), 0.75, 3)}
    limit = {"label": winner.label, "engine": "tflite", "batch": 1, "precision": "fp32", "gop": 0.1, "gops": 238.1,
             "peak_gops": 300.0, "share": 238.1 / 300.0, "peak_kernel": "onnxruntime MatMul 1024x1024", "uncounted": [],
             "what_if": {"precision": "int8", "peak_gops": 900.0, "share": 238.1 / 300.0, "ms": 0.14, "items_per_s": 7143}}  # fmt: skip
    summary = StudySummary("s", "latency", {"complete": 4}, [best, winner, baseline], winner, speedup_vs_baseline=2.0,
                           statistic="p90", speedups=speedups, rounds=3, roofline=limit)  # fmt: skip
    monkeypatch.setattr(tune.api, "tune", _fake_tune(summary))
    code, out, err = run(capsys, "tune", "m.onnx", "--name", "s")
    assert code == 0, err
    # issue 41: how far the winner is from this device's limit, and what int8 at that share would take
    assert ("limit: tflite/fp32 runs at 79% of this device's fp32 peak (238 of 300 GOP/s); a passing int8 at the "
            "same share would take about 140.0 µs a call") in out
    # issue 26: the headline names its statistic, gives the paired interval and the median's ratio
    assert ("winner: tflite/fp32/b1/t1, p90 420.0 µs vs 840.0 µs for the ORT fp32 default: 2.00x [1.90, 2.10] "
            "(median 1.80x [1.70, 1.90]; intervals over 3 rounds, 75% coverage)") in out
    assert "tflite/int8/b1/t1 led the screening, but re-measured interleaved" in out and "610.0 [600.0, 620.0] µs" in out
    for command in ("autodeploy export s -o s-bundle", "autodeploy bundle run s-bundle", "autodeploy dashboard"):
        assert command in out
    assert "finalists" in err and "6/6" in err  # the finalist phase has its own bar, completed


def test_ctrl_c_says_what_was_kept_and_how_to_resume(env, capsys, monkeypatch):  # noqa: F811
    monkeypatch.setattr(tune.api, "tune", _fake_tune(None, interrupt_after=2))
    monkeypatch.setattr(sys, "argv", ["autodeploy", "tune", "m.onnx", "--trials", "8"])
    tmp_path, db = env
    from autodeploy.results_db.store import Store

    Store.open(db).close()
    code, out, err = run(capsys, "tune", "m.onnx", "--trials", "8")
    assert code == 130
    assert "study s keeps its 0 stored trial(s)" in err
    assert "resume with: autodeploy tune m.onnx --trials 8 --name s --resume" in err


@pytest.mark.parametrize("argv, expected", [
    (["autodeploy", "tune", "m.onnx", "--name", "x", "--resume"], "autodeploy tune m.onnx --name x --resume"),
    (["autodeploy", "tune", "m model.onnx"], "autodeploy tune 'm model.onnx' --name s --resume"),
])  # fmt: skip
def test_the_resume_command_is_the_typed_one_plus_resume_and_name(monkeypatch, argv, expected):
    monkeypatch.setattr(sys, "argv", argv)
    assert tune.resume_command("s") == expected


@pytest.mark.parametrize("objective", ["latency", "throughput"])
def test_the_finalists_table_lists_the_winner_then_the_others_best_first(env, capsys, monkeypatch, objective):  # noqa: F811
    """Finalists come in screening order; the table shows them as re-measured, so the runner-up is the second row."""
    better, worse = (0.50, 0.90) if objective == "latency" else (900.0, 500.0)
    screened_first = _finalist("openvino/fp32/b1/t1", worse, (worse, worse))
    winner = _finalist("openvino/bf16/b1/t1", better / 2 if objective == "latency" else better * 2, (0.1, 0.2))
    runner_up = _finalist("onnxruntime/fp32/b1/t1", better, (better, better))
    summary = StudySummary(
        "s", objective, {"complete": 3}, [screened_first, runner_up, winner], winner, speedup_vs_baseline=None
    )
    monkeypatch.setattr(tune.api, "tune", _fake_tune(summary))
    code, out, err = run(capsys, "tune", "m.onnx", "--name", "s")
    assert code == 0, err
    rows = [line for line in out.splitlines() if "/b1/t1" in line and "│" in line]
    assert [r.split("│")[1].strip() for r in rows] == [winner.label, runner_up.label, screened_first.label]


def test_the_screening_bar_ends_done_when_the_search_space_runs_out_first():
    # The bar said "13/28 ... eta 5 min" while the summary said "stopped by search space".
    from autodeploy.cli.tune import _ProgressReporter

    with _ProgressReporter() as reporter:
        reporter.start(28, space=None)
        for done in range(1, 14):
            reporter.trial_done(done, None)
        task = reporter.progress.tasks[reporter.task]
        assert (task.completed, task.total) == (13, 28)
    task = reporter.progress.tasks[reporter.task]
    assert (task.completed, task.total, task.fields["eta"]) == (13, 13, "0s") and task.finished


def test_rejected_configs_are_listed_closest_first_in_ten_lines_at_most(capsys, monkeypatch):
    from autodeploy.search.study import Rejected

    monkeypatch.setattr(_common.out, "width", 200)
    rejected = [Rejected(f"onnxruntime/fp32/b{b}/t2", "max_memory_mb", 500.0 + b, 500.0, "MB",
                         f"peak memory {500 + b:.1f} MB > 500 MB") for b in range(1, 13)]  # fmt: skip
    summary = StudySummary("s", "latency", {"complete": 12}, [], None, rejected=rejected, closest=rejected[0],
                           note=f"no trial meets the constraints; closest: {rejected[0].text()}")  # fmt: skip
    tune._print_summary(summary, "s")
    captured = capsys.readouterr()
    assert "no winner: no trial meets the constraints; closest: onnxruntime/fp32/b1/t2: peak memory 501.0 MB > 500 MB" in captured.err
    lines = captured.out.splitlines()
    start = lines.index("rejected by a constraint: 12 configs, closest first")
    listed = lines[start + 1 : start + 1 + tune.REJECTED_SHOWN]
    assert listed == [f"  onnxruntime/fp32/b{b}/t2: peak memory {500 + b:.1f} MB > 500 MB" for b in range(1, 9)]
    assert lines[start + 1 + tune.REJECTED_SHOWN] == "  ... 4 more (see --format json)"
    assert tune.REJECTED_SHOWN + 2 <= 10


def test_tune_says_why_the_baseline_stayed_in_the_tie_margins_words(env, capsys, monkeypatch):  # noqa: F811
    """Issue 52 item 3: a baseline that stays over a config it ties with once read "was faster: 9.107 ms against
    9.093 ms"; the line now states the one rule, with both numbers."""
    best = _finalist("openvino/bf16/b1/t1", 9.093, (9.0, 9.2))
    baseline = _finalist("onnxruntime/fp32/b1/t1", 9.107, (9.0, 9.2), baseline=True)
    summary = StudySummary("s", "latency", {"complete": 4}, [best, baseline], baseline, speedup_vs_baseline=1.0,
                           statistic="p90", speedups={"p90": Ratio(1.0, (0.99, 1.01), 0.75, 3)}, rounds=3)  # fmt: skip
    monkeypatch.setattr(tune.api, "tune", _fake_tune(summary))
    code, out, err = run(capsys, "tune", "m.onnx", "--name", "s")
    assert code == 0, err
    text = " ".join(out.split())
    assert "openvino/bf16/b1/t1 led the screening; re-measured interleaved with" in text
    assert "a config replaces the baseline only by beating it by more than the 3% tie margin" in text
    assert "was faster" not in text
