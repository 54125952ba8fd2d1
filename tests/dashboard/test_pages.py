"""Each page in Streamlit's AppTest, on the store a real small study filled (``study_db``).

AppTest runs the entry point (sidebar filters, navigation) and then the page, in-process.
Checks are on what rendered: titles, tables, chart specs, messages, and that nothing raised.
"""

from __future__ import annotations

import base64
import html
import json

import numpy as np
import pytest

pytest.importorskip("streamlit", reason="the dashboard needs streamlit: pip install 'autodeploy[dashboard]'")
pytest.importorskip("plotly", reason="the dashboard needs plotly: pip install 'autodeploy[dashboard]'")

from streamlit.testing.v1 import AppTest  # noqa: E402

from autodeploy.dashboard import APP, DB_ENV  # noqa: E402
from autodeploy.report import study_record  # noqa: E402
from autodeploy.results_db import Store  # noqa: E402
from autodeploy.search.summary import speedup_text  # noqa: E402
from autodeploy.units import fmt_ms_ci  # noqa: E402
from tests.dashboard.conftest import SECOND_DEVICE, STUDY  # noqa: E402

TIMEOUT_S = 60


def open_page(monkeypatch: pytest.MonkeyPatch, url: str, page: str | None = None) -> AppTest:
    monkeypatch.setenv(DB_ENV, url)
    at = AppTest.from_file(str(APP), default_timeout=TIMEOUT_S)
    at.run()
    if page is not None:
        at.switch_page(f"app_pages/{page}.py")
        at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    return at


def chart_specs(at: AppTest) -> list[dict]:
    return [json.loads(el.proto.spec) for el in at.get("plotly_chart")]


def numbers(values) -> list:
    """A Plotly array as a list: Plotly writes numpy arrays as ``{"dtype", "bdata"}`` (base64)."""
    if isinstance(values, dict):
        return np.frombuffer(base64.b64decode(values["bdata"]), dtype=values["dtype"]).tolist()
    return list(values)


def titles(at: AppTest) -> list[str]:
    return [t.value for t in at.title]


@pytest.mark.slow
def test_overview_lists_the_study_its_winner_and_both_devices(monkeypatch, study_db):
    at = open_page(monkeypatch, study_db.url)
    assert titles(at) == ["Overview"]
    studies = at.dataframe[0].value
    assert list(studies["name"]) == [STUDY]
    assert studies["winner"][0] == study_db.summary.winner.label
    devices = at.dataframe[1].value
    assert SECOND_DEVICE.fingerprint in set(devices["fingerprint"]) and len(devices) == 2
    assert any(study_db.summary.winner.label in s.value for s in at.success)
    assert studies["rejected"][0] >= 1 and studies["limits"][0] == "accuracy drop ≤ 1.00%"  # int8, over 1%  # fmt: skip
    labels = [d.proto.label for d in at.get("download_button")]
    assert "Download the study's trials (CSV)" in labels


@pytest.mark.slow
def test_overview_exports_the_winner_bundle_or_shows_the_command(monkeypatch, study_db):
    at = open_page(monkeypatch, study_db.url)
    buttons = [b for b in at.button if b.key == "overview_bundle"]
    if not buttons:  # the bundle exporter is not installed: the command to run instead
        assert any(c.value.startswith(f"autodeploy export {STUDY}") for c in at.code)
        return
    buttons[0].click().run()
    assert not at.exception and not at.error, [e.value for e in [*at.exception, *at.error]]
    assert "Download the bundle (.tar.gz)" in [d.proto.label for d in at.get("download_button")]


@pytest.mark.slow
def test_compare_shows_engine_by_precision_heatmap_ci_bars_and_distributions(monkeypatch, study_db):
    at = open_page(monkeypatch, study_db.url, "compare")
    assert titles(at) == ["Compare"]
    heatmap, bars, boxes = chart_specs(at)
    assert heatmap["data"][0]["type"] == "heatmap"
    assert tuple(heatmap["data"][0]["y"]) == study_db.engines
    assert set(heatmap["data"][0]["x"]) == set(study_db.precisions)
    assert bars["data"][0]["type"] == "bar" and bars["data"][0]["error_x"]["visible"]
    assert all(t["type"] == "box" for t in boxes["data"])
    best = at.dataframe[0].value
    assert set(best["precision"]) == set(study_db.precisions)
    # Ranked as the study ranked them: the winner on top, the re-measured finalists at tune's numbers...
    summary = study_db.summary
    assert best["config_label"].iloc[0] == summary.winner.label and best["role"].iloc[0] == "winner"
    assert best["latency_ms"].iloc[0] == summary.winner.statistic
    assert bars["data"][0]["y"][0].startswith(summary.winner.label) and "★ winner" in bars["data"][0]["y"][0]
    remeasured = best[best["source"] == "finalists, re-measured"]
    by_label = {f.label: f.statistic for f in summary.finalists if f.statistic is not None}
    assert set(remeasured["config_label"]) == set(by_label)
    assert all(by_label[c] == v for c, v in zip(remeasured["config_label"], remeasured["latency_ms"], strict=True))
    # ...then every other config by its best trial, best first.
    rest = best[best["source"] == "best trial"]["latency_ms"].tolist()
    assert rest == sorted(rest) and best.index[best["source"] == "best trial"].min() == len(remeasured)


@pytest.mark.slow
def test_compare_marks_the_rejected_int8_with_its_reason_and_never_colours_it(monkeypatch, study_db):
    at = open_page(monkeypatch, study_db.url, "compare")
    heatmap, bars, _ = chart_specs(at)
    best = at.dataframe[0].value
    int8 = best[best["precision"] == "int8"]
    assert not int8.empty and set(int8["verdict"]) == {"rejected"}  # int8 breaks the study's 1% budget
    assert all(r.startswith("output 'probs': top-1 agreement ") and r.endswith("< 0.99 (max accuracy drop 1%)")
               for r in int8["reason"])  # the worst output, named in its own measure  # fmt: skip
    assert set(best.loc[best["precision"] == "fp32", "verdict"]) == {"feasible"}
    assert any("rejected by their study's constraints" in c.value for c in at.caption)
    # Heatmap: no int8 config passed, so the int8 cell has no colour and the grey layer says why.
    colour, grey = heatmap["data"]
    col = list(colour["x"]).index("int8")
    assert all(row[col] is None for row in colour["z"])
    why = html.escape(int8["reason"].iloc[0], quote=False)  # "<" and ">" as entities: Plotly's hover reads a few HTML tags
    assert grey["text"][0][col] == "✗ rejected" and why in grey["customdata"][0][col]
    # Bars: each int8 bar is grey and hatched, labelled, its reason on hover; never the winner's green.
    bar = bars["data"][0]
    rows = [i for i, label in enumerate(bar["y"]) if "/int8/" in label]
    shapes, colors = bar["marker"]["pattern"]["shape"], bar["marker"]["color"]
    assert rows and all("✗ rejected" in bar["y"][i] and shapes[i] == "/" for i in rows)
    assert all(colors[i] != "#2ca02c" and "accuracy drop" in bar["hovertext"][i] for i in rows)


@pytest.mark.slow
def test_compare_never_merges_models_or_devices_into_one_bar(monkeypatch, study_db):
    at = open_page(monkeypatch, study_db.url, "compare")
    pairs = at.selectbox(key="compare_group").options
    assert len(pairs) == 3  # mlp on this CPU, mlp on the second device, wide on this CPU
    seen = {}
    for pair in pairs:
        at.selectbox(key="compare_group").set_value(pair).run()
        best = at.dataframe[0].value
        assert best["model"].nunique() == 1 and best["cpu"].nunique() == 1
        assert not best["config_label"].duplicated().any()
        seen[pair] = set(best["config_label"])
    baseline = "onnxruntime/fp32/b1/tdefault"
    assert sum(baseline in labels for labels in seen.values()) == 2  # the study's baseline and wide's bench, apart


@pytest.mark.slow
def test_compare_filters_by_engine_and_metric(monkeypatch, study_db):
    at = open_page(monkeypatch, study_db.url, "compare")
    at.selectbox(key="compare_metric").set_value("throughput").run()
    heatmap = chart_specs(at)[0]
    assert "throughput" in heatmap["layout"]["title"]["text"]
    at.multiselect(key="f_engines").set_value(["onnxruntime"]).run()
    assert not at.exception and set(at.dataframe[0].value["engine"]) == {"onnxruntime"}


@pytest.mark.slow
def test_pareto_marks_the_winner_and_rejects_int8_for_its_accuracy_drop(monkeypatch, study_db):
    at = open_page(monkeypatch, study_db.url, "pareto")
    assert titles(at) == ["Pareto"]
    (scatter,) = chart_specs(at)
    assert {t["name"] for t in scatter["data"]} >= {"winner", "rejected"}
    winner_points = [t for t in scatter["data"] if t["name"] == "winner"]
    xs = [numbers(t["x"]) for t in winner_points]
    assert [len(x) for x in xs] == [1, 1]  # once per panel (accuracy, memory), at tune's number
    assert xs[0][0] == study_db.summary.winner.statistic
    assert scatter["layout"]["yaxis"]["tickformat"].endswith("%")  # accuracy in %, as the reasons say it
    budget = [sh for sh in scatter["layout"]["shapes"] if sh.get("y0") == 0.01 and sh["line"]["dash"] == "dash"]
    assert budget, "the accuracy budget (1%) is drawn"
    assert any("accuracy budget 1.00%" in a["text"] for a in scatter["layout"]["annotations"])
    front, rejected = at.dataframe[0].value, at.dataframe[1].value
    assert study_db.summary.winner.label in set(front.loc[front["verdict"] == "winner", "config_label"])
    int8 = rejected[rejected["config_label"].str.contains("/int8/")]
    measured = [r for r in int8["reason"] if r.startswith("output 'probs': top-1 agreement ")]
    assert measured and all(r.endswith("< 0.99 (max accuracy drop 1%)") for r in measured)
    # The other int8 configs build the same artifact: pruned for that artifact's accuracy, never measured.
    assert all(r in measured or "the same artifact and it breaks the accuracy budget" in r for r in int8["reason"])
    pruned = int8[int8["reason"].str.startswith("pruned")]
    assert not pruned.duplicated(["config_label", "reason"]).any()  # a config pruned again is listed once


@pytest.mark.slow
def test_trials_shows_the_optuna_history_and_parameter_importance(monkeypatch, study_db):
    at = open_page(monkeypatch, study_db.url, "trials")
    assert titles(at) == ["Trials"]
    history, importance = chart_specs(at)
    assert history["layout"]["title"]["text"].startswith("Optimization history")  # "(log scale)" on wide spreads
    assert importance["data"][0]["type"] == "bar"
    optuna_table = at.dataframe[0].value
    assert list(optuna_table["number"]) == list(range(sum(study_db.summary.trials.values())))
    assert set(optuna_table["state"]) <= {"complete", "pruned", "fail"}
    params = at.dataframe[1].value
    assert "onnxruntime.precision" in set(params["param"])
    # A study of a few trials: the importances come with their caveat.
    complete = int((optuna_table["state"] == "complete").sum())
    assert importance["layout"]["title"]["text"].endswith(f"from {complete} complete trials)")
    assert any(f"only {complete} complete trials" in w.value for w in at.warning)
    stored = at.dataframe[2].value
    assert {"screening", "finalist"} <= set(stored["phase"])
    measured_int8 = stored[stored["config_label"].str.contains("/int8/") & stored["latency_ms"].notna()]
    assert not measured_int8.empty and set(measured_int8["verdict"]) == {"rejected"}  # by the study's budget  # fmt: skip
    assert set(stored.loc[stored["status"] == "ok", "verdict"]) == {"feasible"}
    assert stored["other_cores"].notna().any()  # how busy the machine was while each ran


@pytest.mark.slow
def test_devices_compares_one_model_across_fingerprints(monkeypatch, study_db):
    at = open_page(monkeypatch, study_db.url, "devices")
    assert titles(at) == ["Devices"]
    assert any("measured on 2 device fingerprints" in c.value for c in at.caption)
    (bars,) = chart_specs(at)
    assert len(bars["data"]) == 2  # one bar group per device
    marks = [m for trace in bars["data"] for m in trace["text"]]
    assert marks.count("★ winner") == 1  # the study's device has a winner; the second device ran no study
    per_device = at.dataframe[1].value
    assert SECOND_DEVICE.fingerprint in set(per_device["device"])
    # Only int8 was rejected, and no int8 config passed: its bar is there, hatched and saying so.
    assert set(per_device.loc[per_device["verdict"] == "rejected", "precision"]) == {"int8"}
    assert "✗ rejected" in marks
    hatched = [m for t in bars["data"] for m, s in zip(t["text"], t["marker"]["pattern"]["shape"], strict=True) if s]  # fmt: skip
    assert hatched and set(hatched) == {"✗ rejected"}


@pytest.mark.slow
def test_regressions_on_the_study_store_says_the_gate_has_not_run(monkeypatch, study_db):
    at = open_page(monkeypatch, study_db.url, "regressions")
    assert titles(at) == ["Regressions"]
    assert any("gate has not run on this store" in i.value for i in at.info)
    assert not at.dataframe


def test_regressions_on_a_store_from_before_the_gate_says_so(monkeypatch, tmp_path):
    url = f"sqlite:///{tmp_path / 'old.db'}"
    with Store.open(url) as store, store.engine.begin() as conn:
        conn.exec_driver_sql("DROP TABLE IF EXISTS ad_gate_runs")  # as a store made before the gate
    at = open_page(monkeypatch, url, "regressions")
    assert any("no `ad_gate_runs` table" in i.value and "issue 8" in i.value for i in at.info)


def test_regressions_shows_stored_gate_verdicts(monkeypatch, tmp_path):
    store_module = pytest.importorskip("autodeploy.results_db.store")
    if not hasattr(store_module, "GateRunRecord"):
        pytest.skip("this store has no gate runs yet (issue 8)")
    url = f"sqlite:///{tmp_path / 'gate.db'}"
    metric = {"name": "p90", "unit": "ms", "verdict": "fail", "reason": "p90 is 12% slower (CI 8%..16%) > 5%",
              "change": 0.12, "change_ci": [0.08, 0.16], "baseline": 1.0, "candidate": 1.12}  # fmt: skip
    run = store_module.GateRunRecord(
        mode="interleaved", verdict="fail", baseline_ref="a.onnx", baseline_sha256="a" * 64, baseline_config={},
        candidate_ref="b.onnx", candidate_sha256="b" * 64, candidate_config={}, settings={}, metrics=[metric],
        notes=["a note"], wall_s=3.0,
    )  # fmt: skip
    with Store.open(url) as store:
        store.add_gate_run(run, device=SECOND_DEVICE, command="autodeploy gate a.onnx b.onnx")
    at = open_page(monkeypatch, url, "regressions")
    assert [m.value for m in at.metric] == ["0", "1", "0"]
    runs, per_metric = at.dataframe[0].value, at.dataframe[1].value
    assert runs["verdict"].tolist() == ["fail"] and "p90: p90 is 12% slower" in runs["failing"][0]
    assert per_metric[["metric", "verdict", "change_ci_high"]].values.tolist() == [["p90", "fail", 0.16]]
    assert len(at.get("plotly_chart")) == 1


@pytest.mark.slow
def test_winners_agrees_with_the_study_record_the_cli_prints(monkeypatch, study_db):
    at = open_page(monkeypatch, study_db.url, "winners")
    assert titles(at) == ["Winners"]
    record = study_record(study_db.summary)  # what `tune --format json` printed
    (row,) = at.dataframe[0].value.to_dict("records")  # one study; the benched "wide" model has none
    assert row["winner"] == record["winner"]["label"] and row["study"] == STUDY
    assert row["speedup"] == speedup_text(record) and f"({record['optimised']}" in row["speedup"]  # names its statistic
    ci = record["winner"]["statistic_ci"]  # one finalist round (this fixture): no interval over rounds
    assert row["winner_value"] == fmt_ms_ci(record["winner"]["statistic"], None if ci is None else tuple(ci))
    second = record["runner_up"]
    assert row["runner_up"] == (second["label"] if second else None)
    (bars,) = chart_specs(at)  # the study's finalists, winner on top, baseline named
    labels = bars["data"][0]["y"]
    assert labels[0].startswith(record["winner"]["label"]) and "★ winner" in labels[0]
    assert any("ORT fp32 default" in label for label in labels)
    assert numbers(bars["data"][0]["x"])[0] == record["winner"]["statistic"]


KNOBS = "/graph_optimization_level=ORT_ENABLE_ALL,execution_mode=ORT_SEQUENTIAL,intra_op_spinning=0"


def _winner(config: str, value: float, speedup: float, caveats: tuple[str, ...] = ()) -> dict:
    return {"config": config + KNOBS, "statistic": "p90", "value": value, "value_text": f"{value:.3f} ms",
            "speedup": speedup, "caveats": list(caveats)}  # fmt: skip


def _run(job: int, device: str, state: str, winner: dict | None = None, **new_keys) -> dict:
    """A device record of a fleet job as jobs.status writes it (``new_keys``: issue 51's, absent from older ones)."""
    return {"device": device, "state": state, "winner": winner, "reason": None, "heartbeat_age_s": 3.0, "trials": 9,
            "attempts": 1, "skipped": [], "study": f"fleet.{job}.{device}", **new_keys}  # fmt: skip


def _job(job: int, status: str, devices: list[dict], **new_keys) -> dict:
    return {"job": job, "model": "tiny-cnn", "model_sha256": "ab" * 32, "state": "open", "status": status,
            "reason": None, "devices": devices, **new_keys}  # fmt: skip


FLEET = [  # a tune job from before issue 51's keys, a running one, a profile job
    _job(1, "done", [_run(1, "edge-a", "done", _winner("onnxruntime/int8/b1/t4", 3.2, 2.3456)),
                     _run(1, "edge-b", "done", _winner("openvino/fp32/b1/t8", 5.5, 1.4321, ("screening only",)))]),
    _job(2, "running", [_run(2, "edge-a", "running", phase="finalist round 2/3", trials_budget=12, fingerprint="fa"),
                        _run(2, "edge-b", "queued", queue_position=1, fingerprint="fb")], kind="tune"),
    _job(3, "done", [_run(3, "edge-a", "done", {**_winner("onnxruntime/fp32/b1/t4", 7.0, None), "statistic": "median",
                                                 "ci": [6.9, 7.2], "values": {"median": 7.0, "p90": 7.4}},
                          own_winner=_winner("onnxruntime/int8/b1/t4", 3.7, 2.3456), vs_own={"statistic": "p90", "ratio": 2.0}),
                     _run(3, "edge-b", "done", {**_winner("onnxruntime/fp32/b1/t4", 8.0, None), "statistic": "median"},
                          own_winner=None, vs_own=None)],
         kind="profile", profile="onnxruntime/fp32/b1/t4" + KNOBS),
]  # fmt: skip
FLEET_DEVICES = [{"name": n, "tags": ["edge"], "fingerprint": f, "same_machine_as": [], "cpu": "Test CPU", "isa": ["avx2"],
                  "engines": {"onnxruntime": "available (1.20.1)", "tensorrt": "unavailable: no GPU"}, "version": "0.9",
                  "heartbeat_age_s": 3.0, "online": True, "running": None, "retired_at": None}
                 for n, f in (("edge-a", "fa"), ("edge-b", "fb"))]  # fmt: skip


def test_the_fleet_page_shows_progress_and_a_profile_job_beside_each_devices_own_winner(monkeypatch, tmp_path):  # fmt: skip
    from autodeploy.fleet import jobs

    monkeypatch.setattr(jobs, "status", lambda store, job_id=None: FLEET)
    monkeypatch.setattr(jobs, "devices", lambda store, retired=False: FLEET_DEVICES)
    url = f"sqlite:///{tmp_path / 'fleet.db'}"
    Store.open(url).close()
    at = open_page(monkeypatch, url, "fleet")
    grid = at.markdown[0].value
    assert grid.startswith("| Job | edge\\-a | edge\\-b |") and "None" not in grid
    assert "finalist round 2/3, 9 of 12 trials" in grid and "\\#1 in the queue" in grid  # issue 51's keys
    assert "profile of onnxruntime/fp32/b1/t4 |" in grid  # short; the knobs only in the link's title
    assert "median 7\\.000 \\[6\\.900, 7\\.200\\] ms · 2\\.00x slower \\(p90\\) than its own winner onnxruntime/int8/b1/t4 \\(p90 3\\.700 ms\\)" in grid  # fmt: skip
    assert "2\\.35x \\(p90\\)" in grid and ":orange[screening only]" in grid
    runs = at.dataframe[0].value
    assert list(runs.loc[runs["Job"] == 3, "Profiled vs own winner"]) == ["2.00x slower (p90)", ""]
    assert not runs.isna().any().any()
    assert set(runs["Knobs"]) == {KNOBS[1:], ""} and max(map(len, runs["Config"])) < 25
    tune, profile = chart_specs(at)
    assert len(tune["data"]) == 1 and list(tune["data"][0]["text"]) == ["2.35x", "1.43x, screening only"]
    assert [t["name"] for t in profile["data"]] == ["profiled config", "its own winner"]
    assert numbers(profile["data"][0]["y"]) == [7.4, 8.0] and profile["layout"]["yaxis"]["title"]["text"] == "p90 / median (ms)"  # fmt: skip
    assert list(at.dataframe[1].value["Engines missing"]) == ["tensorrt", "tensorrt"]
    at.multiselect(key="fleet_states").set_value(["queued"]).run()
    assert at.markdown[0].value.splitlines()[0] == "| Job | edge\\-b |" and list(at.dataframe[0].value["Job"]) == [2]  # fmt: skip


@pytest.mark.parametrize("page", ["overview", "winners", "compare", "pareto", "trials", "devices", "regressions", "fleet"])  # fmt: skip
def test_every_page_renders_an_empty_store(monkeypatch, tmp_path, page):
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    Store.open(url).close()  # create the schema; the dashboard itself never writes
    at = open_page(monkeypatch, url, page)
    assert titles(at) == [page.capitalize()]


def test_a_missing_store_is_one_error_line(monkeypatch, tmp_path):
    monkeypatch.setenv(DB_ENV, f"sqlite:///{tmp_path / 'none.db'}")
    at = AppTest.from_file(str(APP), default_timeout=TIMEOUT_S).run()
    assert not at.exception
    assert "the file does not exist" in at.error[0].value
    assert not (tmp_path / "none.db").exists()
