"""The chart helpers on their own: log ticks people can read, and the winner and baseline marked."""

from __future__ import annotations

import math

import pandas as pd
import pytest

pytest.importorskip("plotly", reason="the dashboard needs plotly: pip install 'autodeploy[dashboard]'")

from autodeploy.dashboard import charts, queries  # noqa: E402
from autodeploy.verdict import Limits  # noqa: E402


def test_log_ticks_are_1_2_5_and_span_the_data():
    assert charts.log_ticks(0.09, 3.0) == [0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0]
    assert charts.log_ticks(0.01, 1000.0) == [0.01, 0.1, 1.0, 10.0, 100.0, 1000.0]
    assert charts.log_ticks(2e-5, 30.0) == [1e-05, 1e-4, 1e-3, 0.01, 0.1, 1.0, 10.0, 100.0]  # decades past 3


def test_tick_labels_name_their_unit():
    assert [charts.short_ms(v) for v in (0.05, 0.2, 1.0, 20.0, 1500.0)] == ["50 µs", "200 µs", "1 ms", "20 ms", "1.5 s"]


def _best(rows):
    columns = ["config_label", "engine", "precision", "latency_ms", "latency_ci_low", "latency_ci_high", "role"]
    return pd.DataFrame(rows, columns=columns)


def test_bars_on_a_wide_spread_have_readable_log_ticks_and_mark_winner_and_baseline():
    best = _best([("ov/int8/b1/t1", "ov", "int8", 0.08, 0.07, 0.09, "winner"),
                  (queries.BASELINE_LABEL, "onnxruntime", "fp32", 0.4, 0.35, 0.45, "baseline"),
                  ("tflite/fp32/b1/t1", "tflite", "fp32", 3.0, 2.5, 3.5, "")])  # fmt: skip
    fig = charts.ci_bars(best, queries.METRICS["latency"])
    axis = fig.layout.xaxis
    assert axis.type == "log" and list(axis.ticktext) == ["50 µs", "100 µs", "200 µs", "500 µs", "1 ms", "2 ms",
                                                           "5 ms"]  # fmt: skip
    assert axis.range[0] <= math.log10(0.05) and axis.range[1] >= math.log10(5.0)  # every tick label in view
    labels = list(fig.data[0].y)
    assert labels[0] == "ov/int8/b1/t1  ★ winner" and labels[1].endswith("baseline (ORT fp32 default)")
    (line,) = fig.layout.shapes  # the baseline's value as a dashed line, its label where the line is
    (note,) = fig.layout.annotations
    assert line.x0 == 0.4 and line.line.dash == "dash"
    assert note.text == "ORT fp32 default" and note.x == pytest.approx(math.log10(0.4))  # log axis: log10 position


def test_a_baseline_that_won_is_named_as_both():
    assert charts.role_label(queries.BASELINE_LABEL, "winner").endswith("★ winner (ORT fp32 default)")


def test_pareto_draws_every_constraint_the_study_had():
    df = pd.DataFrame({"config_label": ["a", "b"], "latency_ms": [1.0, 2.0], "accuracy_drop": [0.0, 0.004],
                       "peak_rss_mb": [10.0, 20.0], "verdict": ["winner", "pareto"], "reason": ["", ""]})  # fmt: skip
    fig = charts.pareto(df, Limits(max_accuracy_drop=0.005, max_memory_mb=64.0, sla_ms=1.5), "latency")
    texts = sorted(a.text for a in fig.layout.annotations if "budget" in a.text or "cap" in a.text or "SLA" in a.text)
    assert texts == ["accuracy budget 0.50%", "latency SLA 1.5 ms", "latency SLA 1.5 ms", "memory cap 64 MB"]
    assert fig.layout.yaxis.tickformat == ".1%" and fig.layout.yaxis.range[1] > 0.005  # the budget line is in view
    assert [len(t.x) for t in fig.data if t.name == "winner"] == [1, 1]
    server = charts.pareto(df, Limits(max_accuracy_drop=0.005, sla_ms=1.5), "server")  # the SLA bounds p99 under load
    assert not [a for a in server.layout.annotations if "SLA" in a.text]
