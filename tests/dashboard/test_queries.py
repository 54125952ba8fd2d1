"""The query module on its own: bound parameters, read-only, and the Pareto verdicts."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

pytest.importorskip("pandas", reason="the dashboard needs pandas (it comes with streamlit)")

from autodeploy.dashboard import queries  # noqa: E402
from autodeploy.dashboard.queries import Filters  # noqa: E402
from autodeploy.results_db import Store  # noqa: E402
from tests.dashboard.conftest import STUDY  # noqa: E402


def test_import_autodeploy_and_the_cli_load_no_streamlit_plotly_or_pandas():
    code = ("import sys, autodeploy, autodeploy.dashboard, autodeploy.cli.app; "
            "print(sorted(m for m in ('streamlit', 'plotly', 'pandas') if m in sys.modules))")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_query_module_holds_no_sql_and_no_copied_column_list():
    source = Path(queries.__file__).read_text()
    assert "sqlalchemy" not in source and "schema import" not in source  # every read goes through the Store
    columns = queries.trial_columns()  # derived from the records: every stored number has a column
    assert {"n_samples", "median_ms", "median_ci_low", "p99_ci_high", "build_s", "duration_s"} <= set(columns)
    assert not hasattr(queries, "TRIAL_COLUMNS")


def _row(
    label: str, latency: float, drop: float, mb: float, status: str = "ok", kind: str | None = None
) -> dict:
    return {"config_label": label, "uid": label, "status": status, "failure_kind": kind, "failure_message": "boom",
            "latency_ms": latency, "accuracy_drop": drop, "peak_rss_mb": mb}  # fmt: skip


def test_verdicts_mark_winner_front_and_reasons():
    df = pd.DataFrame([
        _row("a", 1.0, 0.0, 10.0),  # winner
        _row("b", 0.5, 0.005, 12.0),  # faster, slightly less accurate: on the front
        _row("c", 2.0, 0.0, 11.0),  # dominated by a
        _row("d", 0.4, 0.05, 9.0, "failed", "inaccurate"),  # breaks the 1% budget
        _row("e", 0.3, 0.0, 300.0),  # breaks the memory budget
        {**_row("f", float("nan"), float("nan"), float("nan"), "failed", "timeout")},
    ])  # fmt: skip
    out = queries.verdicts(df, {"max_accuracy_drop": 0.01, "max_memory_mb": 100}, winner="a").set_index("uid")
    assert out["verdict"].to_dict() == {"a": "winner", "b": "pareto", "c": "feasible", "d": "rejected",
                                        "e": "rejected", "f": "rejected"}  # fmt: skip
    assert out.loc["d", "reason"] == "accuracy drop 5.00% > 1.00%"
    assert out.loc["e", "reason"] == "peak memory 300.0 MB > 100 MB"
    assert out.loc["f", "reason"] == "timeout: boom"


def test_an_inaccurate_trial_within_the_study_budget_is_feasible():
    df = pd.DataFrame([_row("d", 0.4, 0.03, 9.0, "failed", "inaccurate")])
    assert queries.verdicts(df, {"max_accuracy_drop": 0.05}, winner=None)["verdict"].tolist() == ["pareto"]


def _digest(folder: Path) -> dict[str, str]:
    """The database and its write-ahead log. Not ``-shm``: a WAL reader, read-only included, records its read
    mark in that shared-memory index (it holds no rows), so it changes whenever a writer left it behind."""
    files = [p for p in sorted(folder.glob("results.db*")) if not p.name.endswith("-shm")]
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


@pytest.mark.slow
def test_queries_on_the_study_store_bind_their_parameters_and_write_nothing(study_db):
    folder = Path(study_db.url.removeprefix("sqlite:///")).parent
    before = _digest(folder)
    with Store.open(study_db.url, readonly=True) as store:
        opts = queries.options(store)
        assert opts.engines == ("onnxruntime",) and opts.studies == (STUDY,) and len(opts.devices) == 2
        everything = queries.trials(store)
        assert len(everything) == len(queries.trials(store, Filters(engines=("onnxruntime",))))
        hostile = "x' OR '1'='1"  # a bound parameter matches nothing; spliced SQL would match everything
        for f in (Filters(model=hostile), Filters(device=hostile), Filters(engines=(hostile,)),
                  Filters(scenario=hostile), Filters(study=hostile)):  # fmt: skip
            assert queries.trials(store, f).empty
        assert queries.study(store, hostile) is None
        in_study = queries.trials(store, Filters(study=STUDY), measured_only=True)
        samples = queries.samples(store, tuple(int(i) for i in in_study["trial_id"]))
        assert samples.groupby("trial_id").size().to_dict() == dict(
            zip(in_study["trial_id"], in_study["n_samples"], strict=True)
        )
        runs = queries.gate_runs(store, Filters(device=hostile))
        assert runs is None or runs.empty
        storage = queries.optuna_storage(store)
        history = queries.optuna_trials(storage, STUDY)
        assert len(history) == sum(study_db.summary.trials.values()) and queries.optuna_trials(storage, hostile) is None
        importance, reason = queries.param_importance(storage, STUDY)
        assert importance is not None and reason == ""
    assert _digest(folder) == before


def test_trials_carry_their_shape_and_the_best_per_config_is_kept_per_shape(tmp_path):
    from tests.results_db.factories import DEVICE, MODEL, ok_result

    with Store.open(f"sqlite:///{tmp_path / 'r.db'}") as store:
        for uid, key, median in (("narrow", "x=1x3x16x24", 1.0), ("wide", "x=1x3x16x48", 3.0), ("old", None, 2.0)):
            store.add_trial(ok_result(uid, median=median), model=MODEL, device=DEVICE,
                            shape_key=key)  # fmt: skip
        df = queries.trials(store)
    assert "shapes" not in df.columns  # the per-input dict stays in the store; `shape` names it
    assert sorted(df["shape"]) == ["-", "x=1x3x16x24", "x=1x3x16x48"]
    best = queries.best_per_config(df, queries.METRICS["latency"])
    assert sorted(best["shape"]) == ["-", "x=1x3x16x24", "x=1x3x16x48"]  # one config, kept once per shape


def test_trials_say_how_busy_the_machine_was_while_each_ran(tmp_path):
    """``under_load`` and ``other_cores`` columns: set where the load was read, empty for older rows."""
    from autodeploy.harness.load import Load
    from tests.results_db.factories import DEVICE, MODEL, ok_result

    with Store.open(f"sqlite:///{tmp_path / 'r.db'}") as store:
        store.add_trial(ok_result("busy", load=Load(1.2, 2, 2.0)), model=MODEL, device=DEVICE)
        store.add_trial(ok_result("quiet", load=Load(0.05, 2, 2.0)), model=MODEL, device=DEVICE)
        store.add_trial(ok_result("old"), model=MODEL, device=DEVICE)  # stored before the load was read
        df = queries.trials(store).set_index("uid")
    assert {"under_load", "other_cores"} <= set(queries.trial_columns())
    assert df.loc["busy", "under_load"] is True and df.loc["busy", "other_cores"] == 1.2
    assert df.loc["quiet", "under_load"] is False and pd.isna(df.loc["old", "under_load"])


def test_trials_carry_their_share_of_peak_and_the_roofline_chart_plots_it(tmp_path):
    """``gops`` and ``share_of_peak`` columns from each measurement's roofline (empty before it was counted);
    :func:`queries.roofline` keeps each config's highest share, and the chart draws a bar per config with a 100% line."""
    pytest.importorskip("plotly", reason="the dashboard's charts need plotly: pip install 'autodeploy[dashboard]'")
    from autodeploy.dashboard import charts
    from autodeploy.roofline import Roofline
    from tests.results_db.factories import DEVICE, MODEL, ok_result

    with Store.open(f"sqlite:///{tmp_path / 'r.db'}") as store:
        store.add_trial(ok_result("slow", roofline=Roofline("fp32", 0.4, 80.0, 200.0, "onnxruntime MatMul")),
                        model=MODEL, device=DEVICE)  # fmt: skip
        store.add_trial(ok_result("fast", roofline=Roofline("fp32", 0.4, 150.0, 200.0, "onnxruntime MatMul")),
                        model=MODEL, device=DEVICE)  # fmt: skip
        store.add_trial(ok_result("old"), model=MODEL, device=DEVICE)
        df = queries.trials(store)
    assert {"gops", "share_of_peak"} <= set(queries.trial_columns())
    by_uid = df.set_index("uid")
    assert by_uid.loc["fast", "share_of_peak"] == pytest.approx(0.75) and pd.isna(by_uid.loc["old", "share_of_peak"])
    best = queries.roofline(df)
    assert len(best) == 1 and best["gops"].iloc[0] == 150.0  # one config: its highest share
    fig = charts.roofline(best)
    assert [list(t.x) for t in fig.data] == [[75.0]] and any(s.x0 == 100.0 for s in fig.layout.shapes)


def _studies(*rows: tuple[str, str, dict]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["name", "objective", "constraints"])


def test_judged_holds_each_trial_to_its_own_study_and_a_bench_to_the_default_budget():
    df = pd.DataFrame([
        {**_row("loose", 0.4, 0.03, 9.0, "failed", "inaccurate"), "study": "loose"},  # within its 5% budget
        {**_row("tight", 0.4, 0.03, 9.0, "failed", "inaccurate"), "study": "tight"},  # over its 1%
        {**_row("capped", 0.3, 0.0, 300.0), "study": "tight"},  # over its memory cap
        {**_row("bench", 0.5, 0.03, 9.0, "failed", "inaccurate"), "study": None},  # no study: the default 1%
        {**_row("fine", 0.5, 0.0, 9.0), "study": None},
    ])  # fmt: skip
    studies = _studies(("loose", "latency", {"max_accuracy_drop": 0.05}),
                       ("tight", "latency", {"max_accuracy_drop": 0.01, "max_memory_mb": 100}))  # fmt: skip
    out = queries.judged(df, studies).set_index("uid")
    assert out["verdict"].to_dict() == {"loose": "feasible", "tight": "rejected", "capped": "rejected",
                                        "bench": "rejected", "fine": "feasible"}  # fmt: skip
    assert out.loc["tight", "reason"] == "accuracy drop 3.00% > 1.00%"
    assert out.loc["capped", "reason"] == "peak memory 300.0 MB > 100 MB"
    assert out.loc["bench", "reason"] == "accuracy drop 3.00% > 1.00%" and out.loc["fine", "reason"] == ""
    # The one rule: the Pareto page's verdicts reject the same rows for the same reasons.
    tight = {"max_accuracy_drop": 0.01, "max_memory_mb": 100}
    pareto = queries.verdicts(df[df["study"] == "tight"], tight, None)
    assert pareto.set_index("uid")["reason"].to_dict() == out.loc[["tight", "capped"], "reason"].to_dict()


def test_limits_text_names_each_constraint_as_the_study_applies_it():
    assert queries.limits_text(None, None) == "accuracy drop ≤ 1.00%"
    both = {"max_accuracy_drop": 0.005, "max_memory_mb": 64, "sla_ms": 5}
    assert queries.limits_text(both, "latency") == "accuracy drop ≤ 0.50%, memory ≤ 64 MB, latency ≤ 5 ms"
    assert queries.limits_text(both, "server").endswith("p99 ≤ 5 ms")  # a server study's SLA bounds the p99


def test_a_study_whose_finalists_all_broke_its_constraints_shows_them_rejected(tmp_path):
    """No config met the memory cap: the finalists are best-so-far, each rejected with the study's own reason."""
    from tests.results_db.factories import DEVICE, MODEL

    def finalist(label: str, precision: str, baseline: bool = False) -> dict:
        return {"label": label, "config": {"engine": "onnxruntime", "precision": precision}, "statistic": 1.0,
                "ci": None, "n_samples": 64, "baseline": baseline, "failure": None}  # fmt: skip

    why = {"ort/int8": "peak memory 80.0 MB > 64 MB", "ort/fp32": "peak memory 90.0 MB > 64 MB"}
    summary = {"name": "capped", "objective": "latency", "trials": {"complete": 2}, "winner": None,
               "finalists": [finalist("ort/int8", "int8"), finalist("ort/fp32", "fp32", baseline=True)],
               "rejected": [{"config": label, "constraint": "max_memory_mb", "value": 1.0, "limit": 64.0, "unit": "MB",
                             "reason": reason} for label, reason in why.items()],
               "note": "no trial meets the constraints"}  # fmt: skip
    with Store.open(f"sqlite:///{tmp_path / 'r.db'}") as store:
        store.save_study("capped", model=MODEL, device=DEVICE, objective="latency", command="autodeploy tune m.onnx",
                         settings={"constraints": {"max_accuracy_drop": 0.01, "max_memory_mb": 64}})  # fmt: skip
        store.finish_study("capped", winner_uid=None, summary=summary)
        finalists, studies = queries.finalists(store), queries.studies(store)
    assert finalists.set_index("label")[["verdict", "reason"]].to_dict("index") == {
        label: {"verdict": "rejected", "reason": reason} for label, reason in why.items()}  # fmt: skip
    assert studies["rejected"].tolist() == [2]
    assert studies["limits"].tolist() == ["accuracy drop ≤ 1.00%, memory ≤ 64 MB"]
    assert studies["constraints"].tolist() == [{"max_accuracy_drop": 0.01, "max_memory_mb": 64}]
