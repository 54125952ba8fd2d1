"""Real studies on a tiny model: every trial stored, pruned and failed trials kept, resume adds trials."""

import subprocess
import sys

import optuna
import pytest

from autodeploy.adapters import registry
from autodeploy.adapters.base import TrialConfig
from autodeploy.device import probe_device
from autodeploy.errors import UsageError
from autodeploy.harness.run import HarnessSettings, prepare_data
from autodeploy.harness.timing import TimingPolicy
from autodeploy.model import load_model
from autodeploy.results_db import Store
from autodeploy.search.config import StudyConfig
from autodeploy.search.study import StudyContext, run_study
from autodeploy.verdict import feasible
from tests.adapters.faulty import TARGET
from tests.models import mlp

FAST = TimingPolicy(
    warmup_min_calls=2, warmup_max_s=0.2, min_samples=64, min_duration_s=0.1, max_duration_s=5
)
FAST_FINALISTS = {"count": 2, "rounds": 2, "min_samples": 64, "min_duration_s": 0.1}


def make_ctx(tmp_path, db, *, name="s", resume=False, **config):
    model = load_model(mlp(tmp_path / "m.onnx"))
    settings = HarnessSettings(workdir=tmp_path / "work", policy=FAST, timeout_s=20)
    cfg = StudyConfig(model=str(model.path), **{"engines": ["onnxruntime"], "threads": [1], **config})
    store = Store.open(db)
    return StudyContext(cfg, name, model, probe_device(), prepare_data(model, settings), settings, store,
                        db, "autodeploy tune test", resume)  # fmt: skip


@pytest.mark.slow
def test_study_finalists_winner_and_resume(tmp_path):
    db = f"sqlite:///{tmp_path / 'r.db'}"
    ctx = make_ctx(tmp_path, db, trials=4, precisions=["fp32", "fp16"], finalists=FAST_FINALISTS,
                   constraints={"max_accuracy_drop": 0.5})  # fmt: skip
    summary = run_study(ctx)
    study = optuna.load_study(study_name="s", storage=db)
    # --trials 4 counts measurements; this space runs only 2 configs (fp16 is pruned, 2 execution
    # modes), so the study stops after budget + space size = 8 asks, measuring nothing twice.
    new = [t for t in study.trials if t.state.name != "PRUNED" and "repeat_of" not in t.user_attrs]
    assert len(new) == 2 and len({t.user_attrs["config"]["knobs"]["execution_mode"] for t in new}) == 2
    assert len(study.trials) == 8 and sum(summary.trials.values()) == 8
    pruned = [t for t in study.trials if t.state.name == "PRUNED"]
    assert all("fp16" in t.user_attrs["pruned_reason"] for t in pruned)
    assert summary.winner is not None and summary.winner.ci is not None and summary.winner.n_samples >= 64
    assert any(f.baseline for f in summary.finalists) or summary.winner.config.precision == "fp32"
    assert summary.speedup_vs_baseline is None or summary.speedup_vs_baseline > 0
    stored = ctx.store.study_trials("s")
    measured = [t for t in study.trials if t.state.name == "COMPLETE" and not t.user_attrs["reused"]]
    assert len(ctx.store.study_trials("s", phase="screening")) == len(measured)
    assert len(ctx.store.study_trials("s", phase="finalist")) == sum(len(f.uids) for f in summary.finalists)
    assert {t.user_attrs["uid"] for t in study.trials if "uid" in t.user_attrs} <= {r.uid for r in stored} | {
        r.uid for r in ctx.store.list_trials(limit=1000)
    }
    assert ctx.store.get_study("s").winner_uid in {r.uid for r in stored}

    with pytest.raises(UsageError, match="already exists"):
        run_study(make_ctx(tmp_path, db, trials=1))
    changed = make_ctx(
        tmp_path, db, resume=True, trials=1, precisions=["fp32", "int8"], finalists={"count": 0}
    )
    with pytest.raises(UsageError, match="another search space"):
        run_study(changed)
    again = make_ctx(tmp_path, db, resume=True, trials=2, precisions=["fp32", "fp16"], finalists={"count": 0})
    run_study(again)
    resumed = optuna.load_study(study_name="s", storage=db).trials
    assert len(resumed) == 8 + 1 + 6  # a resume remembers both configs: 2 + 4 asks, all pruned or repeats
    assert [t for t in resumed[9:] if t.state.name != "PRUNED" and "repeat_of" not in t.user_attrs] == []


@pytest.mark.slow
def test_failures_are_recorded_and_the_study_goes_on(tmp_path):
    registry.register("faulty", TARGET)
    try:
        db = f"sqlite:///{tmp_path / 'r.db'}"
        ctx = make_ctx(tmp_path, db, engines=["faulty"], sampler="grid", precisions=["fp32"],
                       knobs={"faulty": {"fault": ["raise_in_run", "none"]}}, finalists={"count": 0})  # fmt: skip
        summary = run_study(ctx)
    finally:
        registry.unregister("faulty")
    study = optuna.load_study(study_name="s", storage=db)
    states = sorted(t.state.name for t in study.trials)
    assert states == ["COMPLETE", "FAIL"]
    failed = next(t for t in study.trials if t.state.name == "FAIL")
    assert failed.user_attrs["failure"].startswith("run_failed: RuntimeError: deliberate run failure")
    assert summary.winner is not None and summary.winner.config.knobs == {"fault": "none"}
    kinds = sorted(str(r.failure_kind) for r in ctx.store.study_trials("s"))
    assert kinds == ["None", "run_failed"]


@pytest.mark.slow
def test_a_failed_build_or_accuracy_prunes_every_config_of_that_artifact(tmp_path):
    """Threads do not change an artifact: its build failure and its accuracy are learned once."""
    registry.register("faulty", TARGET)
    try:
        db = f"sqlite:///{tmp_path / 'r.db'}"
        ctx = make_ctx(tmp_path, db, engines=["faulty"], sampler="grid", precisions=["fp32"], threads=[1, 2],
                       knobs={"faulty": {"fault": ["fail_build", "wrong_outputs", "none"]}},
                       finalists={"count": 0})  # fmt: skip
        summary = run_study(ctx)
    finally:
        registry.unregister("faulty")
    trials = optuna.load_study(study_name="s", storage=db).trials
    by = {(t.user_attrs["config"]["threads"], t.user_attrs["config"]["knobs"]["fault"]): t for t in trials}
    assert len(trials) == 6 and by[1, "fail_build"].state.name == "FAIL"
    assert by[2, "fail_build"].state.name == "PRUNED"
    assert "built the same artifact and failed: build_failed" in by[2, "fail_build"].user_attrs["pruned_reason"]
    assert by[1, "wrong_outputs"].state.name == "COMPLETE" and not feasible(by[1, "wrong_outputs"].constraints)
    assert by[2, "wrong_outputs"].state.name == "PRUNED"
    assert "breaks the accuracy budget" in by[2, "wrong_outputs"].user_attrs["pruned_reason"]
    assert by[1, "none"].state.name == by[2, "none"].state.name == "COMPLETE"
    assert len(ctx.store.study_trials("s")) == 4  # two configs never cost a worker
    assert summary.trials == {"fail": 1, "pruned": 2, "complete": 3}


@pytest.mark.slow
def test_no_feasible_trial_leaves_a_labelled_best_so_far(tmp_path):
    db = f"sqlite:///{tmp_path / 'r.db'}"
    ctx = make_ctx(tmp_path, db, trials=1, precisions=["fp32"], constraints={"max_memory_mb": 0.001})
    summary = run_study(ctx)
    assert summary.winner is None and "best-so-far" in summary.note and len(summary.finalists) == 1


@pytest.mark.slow
@pytest.mark.postgres
def test_three_workers_share_one_study_on_postgres(tmp_path, postgres_url):
    model = mlp(tmp_path / "m.onnx")
    cmd = [sys.executable, "-m", "autodeploy", "tune", str(model), "--name", "shared", "--resume", "--fresh",
           "--engine", "onnxruntime", "--threads", "1", "--trials", "3", "--finalists", "0",
           "--min-duration", "0.1", "--db", postgres_url, "--storage", postgres_url]  # fmt: skip
    env = {**__import__("os").environ, "AUTODEPLOY_CACHE": str(tmp_path / "cache")}
    workers = [
        subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for _ in range(3)
    ]
    outputs = [w.communicate(timeout=600)[0] for w in workers]
    assert all(w.returncode == 0 for w in workers), outputs
    study = optuna.load_study(study_name="shared", storage=postgres_url)
    # 3 workers x --trials 3 measurements over a space of 4 configs: every config is measured; a
    # repeat is answered from the first measurement (two workers racing may both measure one).
    assert len(study.trials) <= 3 * (3 + 4) and all(t.state.is_finished() for t in study.trials)
    with Store.open(postgres_url) as store:
        rows = store.study_trials("shared")
    measured = [t for t in study.trials if "uid" in t.user_attrs and "repeat_of" not in t.user_attrs]
    uids = [t.user_attrs["uid"] for t in measured]
    assert len(rows) == len(uids) == len(set(uids)) <= 9
    assert {r.uid for r in rows} == set(uids)
    pruned = {TrialConfig.from_dict(t.user_attrs["config"]).key() for t in study.trials if t.state.name == "PRUNED"}
    assert len({r.config_key for r in rows} | pruned) == 4  # each measured, or pruned with its artifact's fate


def test_the_portfolio_looks_at_every_engine_and_precision_first_cheap_builds_before_slow():
    from autodeploy.search.space import EngineChoices, SearchSpace
    from autodeploy.search.study import _enqueue_portfolio

    space = SearchSpace({"tflite": EngineChoices(("fp32", "int8"), {"xnnpack": (True, False)}),
                         "onnxruntime": EngineChoices(("fp32", "int8"), {"execution_mode": ("ORT_SEQUENTIAL",
                                                                                            "ORT_PARALLEL")})},
                        batches=(1, 8), threads=(1, 2))  # fmt: skip
    study = optuna.create_study()
    _enqueue_portfolio(study, space)
    waiting = [t.system_attrs["fixed_params"] for t in study.get_trials(states=(optuna.trial.TrialState.WAITING,))]
    assert [(p["engine"], p[f"{p['engine']}.precision"]) for p in waiting] == [
        ("onnxruntime", "fp32"), ("onnxruntime", "int8"), ("tflite", "fp32"), ("tflite", "int8")]  # fmt: skip
    assert all(p["batch"] == 1 and p["threads"] == 2 for p in waiting)
    assert waiting[0]["onnxruntime.execution_mode"] == "ORT_SEQUENTIAL" and waiting[2]["tflite.xnnpack"] is True
    _enqueue_portfolio(study, space)  # a resume or a second worker adds nothing twice
    assert len(study.get_trials(states=(optuna.trial.TrialState.WAITING,))) == 4


@pytest.mark.slow
def test_every_engine_and_precision_gets_a_look_before_any_is_refined(tmp_path):
    engines = ["onnxruntime", "openvino"] if registry.get("openvino").probe(probe_device()).available else ["onnxruntime"]
    db = f"sqlite:///{tmp_path / 'r.db'}"
    ctx = make_ctx(tmp_path, db, engines=engines, precisions=["fp32", "int8"], trials=2 * len(engines),
                   finalists={"count": 0}, constraints={"max_accuracy_drop": 1.0})  # fmt: skip
    run_study(ctx)
    trials = optuna.load_study(study_name="s", storage=db).trials
    first = {(t.user_attrs["config"]["engine"], t.user_attrs["config"]["precision"]) for t in trials[: 2 * len(engines)]}
    assert first == {(e, p) for e in engines for p in ("fp32", "int8")}


@pytest.mark.slow
def test_a_throughput_study_measures_offline_and_compares_runs(tmp_path):
    """--objective throughput: every trial in the offline scenario with its requests in flight; the
    finalists compared on items/s per worker run; a single-stream trial of the same config is not reused."""
    db = f"sqlite:///{tmp_path / 'r.db'}"
    ctx = make_ctx(tmp_path, db, objective="throughput", trials=2, batches=[2],
                   knobs={"onnxruntime": {"num_requests": [1, 2], "sessions": ["shared"]}},
                   finalists={"count": 1, "rounds": 2, "min_samples": 64, "min_duration_s": 0.1})  # fmt: skip
    summary = run_study(ctx)
    rows = ctx.store.study_trials("s")
    assert rows and {r.measurement.scenario for r in rows} == {"offline"}
    assert all(r.measurement.serving["concurrency"]["requests"] == r.config.knobs["num_requests"]
               for r in rows if r.config.knobs)  # fmt: skip
    winner = summary.winner
    assert winner is not None and winner.statistic > 0 and winner.ci[0] <= winner.statistic <= winner.ci[1]
    assert len(winner.uids) == 2  # one items/s per round
