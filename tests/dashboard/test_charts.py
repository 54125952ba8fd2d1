"""The chart helpers on their own: log ticks people can read, and the winner and baseline marked."""

from __future__ import annotations

import html
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


def test_a_tflite_study_marks_litert_fp32_as_its_baseline_not_the_ort_default():
    """Issue 39: a .tflite study's baseline is LiteRT fp32 on the file as given; ORT (through tf2onnx) is a config."""
    litert, ort = "tflite/fp32/b1/tdefault", queries.BASELINE_LABEL
    metric = queries.METRICS["latency"]
    trials = _best([("openvino/bf16/b1/t1", "openvino", "bf16", 0.9, 0.8, 1.0, ""),
                    (litert, "tflite", "fp32", 1.1, 1.0, 1.2, ""), (ort, "onnxruntime", "fp32", 1.3, 1.2, 1.4, "")])  # fmt: skip
    trials = trials.drop(columns="role").assign(n_samples=64)
    finalists = pd.DataFrame({"label": ["openvino/bf16/b1/t1", litert], "role": ["winner", "baseline"],
                              "baseline": [False, True], "baseline_name": ["LiteRT fp32, the file as given"] * 2,
                              "value": [0.9, 1.1], "n_samples": [64, 64], "statistic": ["p90_ms"] * 2,
                              "ci_low": [0.8, 1.0], "ci_high": [1.0, 1.2]})  # fmt: skip
    best = queries.rank_by_finalists(trials, finalists, metric)
    assert list(best.loc[best["baseline"], "config_label"]) == [litert]
    assert dict(zip(best["config_label"], best["role"], strict=True))[ort] == ""  # a config like any other
    fig = charts.ci_bars(best, metric)
    labels = list(fig.data[0].y)
    assert labels[1] == f"{litert}  baseline (LiteRT fp32, the file as given)" and labels[2] == ort
    assert list(fig.data[0].marker.color)[1] == charts.BASELINE_COLOR != list(fig.data[0].marker.color)[2]
    (note,) = fig.layout.annotations
    assert note.text == "LiteRT fp32, the file as given"
    heat = charts.heatmap(best, metric)
    marks = {(a.y, a.x): a.text for a in heat.layout.annotations}
    assert marks[("tflite", "fp32")] == "baseline" and ("onnxruntime", "fp32") not in marks


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


def _judged(rows):
    columns = ["config_label", "engine", "precision", "latency_ms", "latency_ci_low", "latency_ci_high", "role",
               "verdict", "reason"]  # fmt: skip
    return pd.DataFrame(rows, columns=columns)


REASON = "accuracy drop 8.30% > 1.00%"
#: OpenVINO int8's fastest config is rejected, a slower one passes; every ORT int8 config is rejected.
JUDGED = [
    ("openvino/int8/b1/t1", "openvino", "int8", 14.92, 14.5, 15.3, "", "rejected", REASON),
    ("openvino/int8/b1/t2", "openvino", "int8", 16.0, 15.5, 16.5, "winner", "feasible", ""),
    ("openvino/fp32/b1/t1", "openvino", "fp32", 20.0, 19.5, 20.5, "", "feasible", ""),
    ("onnxruntime/int8/b1/t1", "onnxruntime", "int8", 15.0, 14.5, 15.5, "", "rejected", "peak memory 300.0 MB > 100 MB"),
    (queries.BASELINE_LABEL, "onnxruntime", "fp32", 30.0, 29.0, 31.0, "baseline", "feasible", ""),
]  # fmt: skip


def test_a_rejected_config_bar_is_grey_hatched_and_says_why():
    best = _judged(JUDGED)
    best.loc[0, "role"] = "runner-up"  # even a role never makes a rejected config green
    bar = charts.ci_bars(best, queries.METRICS["latency"]).data[0]
    colors, shapes = list(bar.marker.color), list(bar.marker.pattern.shape)
    assert colors[0] == charts.REJECTED_COLOR != charts.WINNER_COLOR and shapes[0] == "/"
    assert bar.y[0] == "openvino/int8/b1/t1  runner-up  ✗ rejected"
    assert html.escape(REASON) in bar.hovertext[0]
    assert colors[3] == charts.REJECTED_COLOR and "peak memory 300.0 MB" in bar.hovertext[3]
    assert colors[1] == charts.WINNER_COLOR and shapes[1] == "" and "rejected" not in bar.hovertext[1]
    assert [s for s in shapes if s] == ["/", "/"]  # only the two rejected bars are hatched


def test_heatmap_colours_a_cell_by_its_best_passing_config_and_greys_a_cell_with_none():
    fig = charts.heatmap(_judged(JUDGED), queries.METRICS["latency"])
    colour, grey = fig.data
    assert list(colour.y) == ["onnxruntime", "openvino"] and list(colour.x) == ["fp32", "int8"]
    cells = {(e, p): colour.z[i][j] for i, e in enumerate(colour.y) for j, p in enumerate(colour.x)}
    # The faster rejected OpenVINO int8 (14.92) never colours its cell: the passing one (16.0) does.
    assert cells == {("openvino", "int8"): 16.0, ("openvino", "fp32"): 20.0, ("onnxruntime", "fp32"): 30.0,
                     ("onnxruntime", "int8"): None}  # fmt: skip
    assert min(v for row in colour.z for v in row if v is not None) == 16.0  # the scale's good end: a passing one  # fmt: skip
    assert html.escape(REASON) in colour.customdata[1][1] and "openvino/int8/b1/t2" in colour.customdata[1][1]
    # Every ORT int8 config was rejected: that cell is on the grey layer only, saying so and why.
    assert grey.z[0][1] is not None and [v for row in grey.z for v in row if v is not None] == [grey.z[0][1]]
    assert grey.text[0][1] == "✗ rejected" and "peak memory 300.0 MB &gt; 100 MB" in grey.customdata[0][1]
    assert {c for _, c in grey.colorscale} == {charts.REJECTED_COLOR} and not grey.showscale
    assert {a.text for a in fig.layout.annotations} == {"★ winner", "baseline"}  # marks kept


def test_a_device_bar_of_a_rejected_config_is_hatched_and_says_why():
    best = _judged([JUDGED[3], JUDGED[4]]).assign(cpu="Test CPU", device="0123456789abcdef")
    (trace,) = charts.across_devices(best, queries.METRICS["latency"]).data
    assert list(trace.text) == ["✗ rejected", "baseline"] and list(trace.marker.pattern.shape) == ["/", ""]
    assert trace.customdata[0][1] == "peak memory 300.0 MB &gt; 100 MB"  # Plotly would read "<...>" as a tag


def test_a_fleet_jobs_devices_stand_side_by_side_with_their_intervals_in_the_unit_that_reads_best():
    def run(device: str, value: float, ci: list[float] | None, caveats: list[str]) -> dict:
        winner = {"config": "onnxruntime/fp32/b1/t1/k=v", "statistic": "p90", "value": value, "value_text": "-",
                  "speedup": 1.5, "caveats": caveats, **({"ci": ci} if ci else {})}  # fmt: skip
        return {"device": device, "state": "done", "winner": winner, "study": f"fleet.1.{device}"}

    record = {"job": 1, "model": "m", "status": "done", "devices": [run("a", 0.1, [0.09, 0.12], []),
                                                                    run("b", 0.2, None, ["screening only"])]}  # fmt: skip
    rows = pd.DataFrame(queries.fleet_rows([record]), columns=queries.FLEET_COLUMNS)
    (bars,) = charts.fleet_job(rows, "job 1: <b>m</b>").data
    assert list(bars.x) == ["a", "b"] and list(bars.y) == pytest.approx([100.0, 200.0])  # in µs
    assert bars.error_y.array[0] == pytest.approx(20.0) and math.isnan(bars.error_y.array[1])  # b has no interval  # fmt: skip
    assert list(bars.text) == ["1.50x", "1.50x, screening only"] and list(bars.marker.pattern.shape) == ["", "."]  # fmt: skip
    fig = charts.fleet_job(rows, "job 1: <b>m</b>")
    assert fig.layout.yaxis.title.text == "p90 (µs)" and "&lt;b&gt;" in fig.layout.title.text
