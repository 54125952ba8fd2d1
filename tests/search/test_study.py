"""Real studies on a tiny model: every trial stored, pruned and failed trials kept, resume adds trials."""

import subprocess
import sys
import time

import optuna
import pytest

from autodeploy.accuracy.records import sqnr_for_drop
from autodeploy.adapters import registry
from autodeploy.adapters.base import TrialConfig
from autodeploy.device import probe_device
from autodeploy.errors import UsageError
from autodeploy.harness.run import HarnessSettings, prepare_data
from autodeploy.harness.timing import TimingPolicy
from autodeploy.inhouse.memory import floor_mb
from autodeploy.model import load_model
from autodeploy.objectives import of as objective_of
from autodeploy.results_db import Store, TrialFilter
from autodeploy.search.config import StudyConfig
from autodeploy.search.study import Reporter, StudyContext, run_study
from autodeploy.verdict import feasible, mb_text
from tests.adapters.faulty import TARGET
from tests.models import detector, mlp

FAST = TimingPolicy(
    warmup_min_calls=2, warmup_max_s=0.2, min_samples=64, min_duration_s=0.1, max_duration_s=5
)
#: Rounds back to back (``spread_s: 0``): spreading them over the study's time is tested in test_rounds_in_time.py.
FAST_FINALISTS = {"count": 2, "rounds": 2, "min_samples": 64, "min_duration_s": 0.1, "spread_s": 0}
#: ORT's execution modes alone (without thread pinning, which one thread cannot use: those configs are pruned).
EXECUTION_MODES = {"onnxruntime": {"execution_mode": ["ORT_SEQUENTIAL", "ORT_PARALLEL"]}}


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
                   constraints={"max_accuracy_drop": 0.5}, knobs=EXECUTION_MODES)  # fmt: skip
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
    stored = ctx.store.trials(TrialFilter(study="s"))
    measured = [t for t in study.trials if t.state.name == "COMPLETE" and not t.user_attrs["reused"]]
    assert len(ctx.store.trials(TrialFilter(study="s", phase="screening"))) == len(measured)
    dropped = [uid for again in summary.load["reran"] for uid in again["dropped_uids"]]  # a round run under load
    assert len(ctx.store.trials(TrialFilter(study="s", phase="finalist"))) == sum(len(f.uids) for f in summary.finalists) + len(dropped)
    assert {t.user_attrs["uid"] for t in study.trials if "uid" in t.user_attrs} <= {r.uid for r in stored} | {
        r.uid for r in ctx.store.trials()
    }
    assert ctx.store.get_study("s").winner_uid in {r.uid for r in stored}

    with pytest.raises(UsageError, match="already exists"):
        run_study(make_ctx(tmp_path, db, trials=1))
    changed = make_ctx(
        tmp_path, db, resume=True, trials=1, precisions=["fp32", "int8"], finalists={"count": 0}, knobs=EXECUTION_MODES
    )
    with pytest.raises(UsageError, match="another search space"):
        run_study(changed)
    again = make_ctx(tmp_path, db, resume=True, trials=2, precisions=["fp32", "fp16"], finalists={"count": 0},
                     knobs=EXECUTION_MODES)
    run_study(again)
    resumed = optuna.load_study(study_name="s", storage=db).trials
    # a resume remembers every config of the space as looked at: one ask (a repeat or pruned), then it stops
    assert len(resumed) == 8 + 1 + 1
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
    kinds = sorted(str(r.failure_kind) for r in ctx.store.trials(TrialFilter(study="s")))
    assert kinds == ["None", "run_failed"]
    assert summary.failures == {"run_failed": {"count": 1, "config": failed_label(study),
                                               "reason": failed.user_attrs["failure"]}}  # fmt: skip


def failed_label(study) -> str:
    from autodeploy.adapters.base import TrialConfig

    failed = next(t for t in study.trials if t.state.name == "FAIL")
    return TrialConfig.from_dict(failed.user_attrs["config"]).label()


@pytest.mark.slow
def test_a_load_failure_prunes_every_config_of_that_artifact_whatever_its_runtime_knobs(tmp_path):
    """A study ran 15 identical load_failed trials that differed only in a runtime knob: learned once now."""
    registry.register("faulty", TARGET)
    try:
        db = f"sqlite:///{tmp_path / 'r.db'}"
        ctx = make_ctx(tmp_path, db, engines=["faulty"], sampler="grid", precisions=["fp32"], threads=[1, 2],
                       knobs={"faulty": {"fault": ["raise_in_load"]}}, finalists={"count": 0})  # fmt: skip
        summary = run_study(ctx)
    finally:
        registry.unregister("faulty")
    trials = optuna.load_study(study_name="s", storage=db).trials
    assert sorted(t.state.name for t in trials) == ["FAIL", "PRUNED"]
    pruned = next(t for t in trials if t.state.name == "PRUNED")
    assert "loaded the same artifact and failed: load_failed" in pruned.user_attrs["pruned_reason"]
    assert len(ctx.store.trials(TrialFilter(study="s"))) == 1  # one worker run, not one per thread count
    assert summary.failures["load_failed"]["count"] == 1
    assert "deliberate load failure" in summary.failures["load_failed"]["reason"]


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
    assert len(ctx.store.trials(TrialFilter(study="s"))) == 4  # two configs never cost a worker
    assert summary.trials == {"fail": 1, "pruned": 2, "complete": 3}


@pytest.mark.slow
def test_an_fp32_conversion_that_breaks_the_model_prunes_every_precision_built_from_it(tmp_path):
    """fp32 that loses 10x the budget is the conversion's fault: its int8 (same engine, same build knobs) is
    pruned with that reason, never measured; another conversion (fault=none) of the same engine is not."""
    registry.register("faulty", TARGET)
    try:
        db = f"sqlite:///{tmp_path / 'r.db'}"
        ctx = make_ctx(tmp_path, db, engines=["faulty"], sampler="grid", precisions=["fp32", "int8"], threads=[1],
                       knobs={"faulty": {"fault": ["wrong_outputs", "none"]}}, finalists={"count": 0})  # fmt: skip
        run_study(ctx)
    finally:
        registry.unregister("faulty")
    trials = sorted(optuna.load_study(study_name="s", storage=db).trials, key=lambda t: t.number)
    by = {(t.user_attrs["config"]["precision"], t.user_attrs["config"]["knobs"]["fault"]): t for t in trials}
    broken = by["fp32", "wrong_outputs"]
    assert "fp32 conversion breaks the model" in broken.user_attrs["broken_conversion"]
    sibling = by["int8", "wrong_outputs"]
    if sibling.number > broken.number:  # the grid's order is the sampler's: after it, the sibling is never built
        assert sibling.state.name == "PRUNED"
        assert sibling.user_attrs["pruned_reason"] == broken.user_attrs["broken_conversion"]
    assert by["fp32", "none"].state.name == "COMPLETE"  # another conversion of the same engine
    rows = ctx.store.trials(TrialFilter(study="s"))
    assert [r.failure_kind for r in rows if r.config.precision == "fp32" and r.config.knobs["fault"] == "wrong_outputs"] == ["conversion"]


@pytest.mark.slow
def test_a_failed_conversion_prunes_every_precision_built_from_it_at_once(tmp_path):
    """An engine converts once for all its precisions (OpenVINO's frontend, onnx2tf): the first precision's
    ConversionError prunes its siblings with that reason, the op in it; they never cost a build worker."""
    registry.register("faulty", TARGET)
    try:
        db = f"sqlite:///{tmp_path / 'r.db'}"
        ctx = make_ctx(tmp_path, db, engines=["faulty"], sampler="grid", precisions=["fp32", "int8"], threads=[1],
                       knobs={"faulty": {"fault": ["fail_conversion"]}}, finalists={"count": 0})  # fmt: skip
        summary = run_study(ctx)
    finally:
        registry.unregister("faulty")
    trials = sorted(optuna.load_study(study_name="s", storage=db).trials, key=lambda t: t.number)
    assert summary.winner is None and [t.state.name for t in trials] == ["FAIL", "PRUNED"]
    assert "ConversionError" in trials[0].user_attrs["broken_conversion"]
    assert trials[1].user_attrs["pruned_reason"] == trials[0].user_attrs["broken_conversion"]
    assert "ai.onnx.ml.Deliberate" in trials[1].user_attrs["pruned_reason"]
    assert len(ctx.store.trials(TrialFilter(study="s"))) == 1  # the sibling never cost a worker


@pytest.mark.slow
def test_no_feasible_trial_names_the_closest_config_and_leaves_a_labelled_best_so_far(tmp_path):
    db = f"sqlite:///{tmp_path / 'r.db'}"
    ctx = make_ctx(tmp_path, db, trials=2, precisions=["fp32"], constraints={"max_memory_mb": 0.001})
    summary = run_study(ctx)
    assert summary.winner is None and "best-so-far" in summary.note and len(summary.finalists) == 1
    # every measured config is listed once, each with the peak memory its trial stored and the cap
    trials = optuna.load_study(study_name="s", storage=db).trials
    measured = {TrialConfig.from_dict(t.user_attrs["config"]).label(): t.user_attrs["uid"] for t in trials
                if t.state.name == "COMPLETE" and "repeat_of" not in t.user_attrs}  # fmt: skip
    rows = {r.uid: r for r in ctx.store.trials(TrialFilter(study="s"))}
    assert len(measured) == 2 and sorted(r.config for r in summary.rejected) == sorted(measured)
    for r in summary.rejected:
        peak = rows[measured[r.config]].measurement.peak_rss_mb
        assert (r.constraint, r.value, r.limit, r.unit) == ("max_memory_mb", peak, 0.001, "MB") and peak > 0.001
        assert r.reason == f"peak memory {mb_text(peak)} MB > 0.001 MB"
    # the closest is the one that missed the cap by least, named in the note with both numbers
    closest = summary.closest
    assert closest == summary.rejected[0] and closest.value == min(r.value for r in summary.rejected)
    assert summary.note.startswith(f"no trial meets the constraints; closest: {closest.config}: peak memory "
                                   f"{mb_text(closest.value)} MB > 0.001 MB")  # fmt: skip
    assert ctx.store.get_study("s").summary["closest"]["config"] == closest.config  # stored with the summary


@pytest.mark.slow
@pytest.mark.postgres
def test_three_workers_share_one_study_on_postgres(tmp_path, postgres_url):
    model = mlp(tmp_path / "m.onnx")
    knobs = tmp_path / "knobs.yaml"  # the two knobs the search tries on every precision: a space of 8 configs
    knobs.write_text("knobs:\n  onnxruntime:\n    execution_mode: [ORT_SEQUENTIAL, ORT_PARALLEL]\n"
                     "    intra_op_thread_affinities: [none, one_cpu_each]\n")  # fmt: skip
    cmd = [sys.executable, "-m", "autodeploy", "tune", str(model), "--name", "shared", "--resume", "--fresh",
           "--engine", "onnxruntime", "--threads", "1", "--trials", "3", "--finalists", "0", "--config", str(knobs),
           "--min-duration", "0.1", "--db", postgres_url, "--storage", postgres_url]  # fmt: skip
    env = {**__import__("os").environ, "AUTODEPLOY_CACHE": str(tmp_path / "cache")}
    workers = [
        subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for _ in range(3)
    ]
    outputs = [w.communicate(timeout=600)[0] for w in workers]
    assert all(w.returncode == 0 for w in workers), outputs
    study = optuna.load_study(study_name="shared", storage=postgres_url)
    # 3 workers x --trials 3 measurements over a space of 8 configs (fp32/int8 x 2 execution modes x 2 thread
    # affinities; pinning one thread is pruned with its reason): every config is measured or pruned; a
    # repeat is answered from the first measurement (two workers racing may both measure one).
    assert len(study.trials) <= 3 * (3 + 8) and all(t.state.is_finished() for t in study.trials)
    with Store.open(postgres_url) as store:
        rows = store.trials(TrialFilter(study="shared"))
    measured = [t for t in study.trials if "uid" in t.user_attrs and "repeat_of" not in t.user_attrs]
    uids = [t.user_attrs["uid"] for t in measured]
    assert len(rows) == len(uids) == len(set(uids)) <= 9
    assert {r.uid for r in rows} == set(uids)
    pruned = {TrialConfig.from_dict(t.user_attrs["config"]).key() for t in study.trials if t.state.name == "PRUNED"}
    assert len({r.config_key for r in rows} | pruned) == 8  # each measured, or pruned with its artifact's fate


def _portfolio(space, isa=(), values=None):
    """Every stage of the portfolio as the study asks it: (engine, precision, params) in order; each
    asked config is told ``values[(engine, precision)]`` (pruned when missing)."""
    from autodeploy.search.portfolio import enqueue_portfolio
    from autodeploy.search.space import suggest

    study = optuna.create_study()
    asked = []
    while enqueue_portfolio(study, space, isa):
        trial = study.ask()
        config = suggest(trial, space)
        asked.append((config.engine, config.precision, trial.params))
        value = (values or {}).get((config.engine, config.precision))
        trial.set_user_attr("config", config.to_dict())
        if value is None:
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        else:
            trial.set_constraint("accuracy_drop", 0.0)
            study.tell(trial, value)
    assert not enqueue_portfolio(study, space, isa)  # a resume or a second worker adds nothing twice
    return asked


def test_the_portfolio_looks_at_every_engine_and_precision_first_cheap_builds_before_slow():
    from autodeploy.search.space import EngineChoices, SearchSpace

    space = SearchSpace({"tflite": EngineChoices(("fp32", "int8"), {"xnnpack": (True, False)}),
                         "onnxruntime": EngineChoices(("fp32", "int8"), {"execution_mode": ("ORT_SEQUENTIAL",
                                                                                            "ORT_PARALLEL")})},
                        batches=(1, 8), threads=(1, 2))  # fmt: skip
    asked = _portfolio(space)
    assert [(e, p) for e, p, _ in asked] == [
        ("onnxruntime", "fp32"), ("onnxruntime", "int8"), ("tflite", "fp32"), ("tflite", "int8")]  # fmt: skip
    params = [p for _, _, p in asked]
    assert all(p["batch"] == 1 and p["threads"] == 2 for p in params)
    assert params[0]["onnxruntime.execution_mode"] == "ORT_SEQUENTIAL" and params[2]["tflite.xnnpack"] is True
    # int8 builds calibrate: every cheap engine's other precisions come first
    space = SearchSpace({"onnxruntime": EngineChoices(("fp32", "int8"), {}), "openvino": EngineChoices(("fp32", "int8"), {})},
                        batches=(1,), threads=(1,))  # fmt: skip
    assert [(e, p) for e, p, _ in _portfolio(space)] == [
        ("onnxruntime", "fp32"), ("openvino", "fp32"), ("onnxruntime", "int8"), ("openvino", "int8")]  # fmt: skip


def test_the_portfolio_looks_at_int8_of_the_fastest_engine_first():
    from autodeploy.search.space import EngineChoices, SearchSpace

    space = SearchSpace({"onnxruntime": EngineChoices(("fp32", "int8"), {}), "openvino": EngineChoices(("fp32", "int8"), {}),
                         "inhouse": EngineChoices(("fp32", "int8"), {})}, batches=(1,), threads=(1,))  # fmt: skip
    values = {("onnxruntime", "fp32"): 2.0, ("openvino", "fp32"): 1.0}  # inhouse/fp32 failed: no value
    asked = [(e, p) for e, p, _ in _portfolio(space, values=values)]
    assert asked[3:] == [("openvino", "int8"), ("onnxruntime", "int8"), ("inhouse", "int8")]


def test_a_branch_whose_only_look_was_interrupted_is_asked_again_first():
    """A killed run's trial (failed as ``interrupted`` on resume) was no look: the resume's first ask is
    that branch's portfolio config again, not whatever the sampler draws (it may draw only configs that prune)."""
    from autodeploy.search.portfolio import enqueue_portfolio, unseen_branches
    from autodeploy.search.space import EngineChoices, SearchSpace, suggest

    space = SearchSpace({"onnxruntime": EngineChoices(("fp32",), {"execution_mode": ("ORT_SEQUENTIAL", "ORT_PARALLEL")})},
                        batches=(1,), threads=(1,))  # fmt: skip
    study = optuna.create_study()
    assert enqueue_portfolio(study, space)
    killed = study.ask()
    suggest(killed, space)
    killed.set_user_attr("interrupted", "its run (pid 1) ended without finishing it")
    study.tell(killed, state=optuna.trial.TrialState.FAIL)
    assert unseen_branches(study, space) == [("onnxruntime", "fp32")]
    assert enqueue_portfolio(study, space)
    again = study.ask()
    suggest(again, space)
    assert again.params == killed.params  # the portfolio's point, enqueued again
    study.tell(again, 1.0)
    assert unseen_branches(study, space) == [] and not enqueue_portfolio(study, space)


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
def test_a_config_the_memory_plan_cannot_fit_is_pruned_before_building(tmp_path):
    db = f"sqlite:///{tmp_path / 'r.db'}"
    # zoo mlp: weights + live activations are ~0.0009 MB, so 0.0005 MB cannot fit
    ctx = make_ctx(tmp_path, db, trials=1, precisions=["fp32"], constraints={"max_memory_mb": 0.0005},
                   finalists={"count": 0}, knobs=EXECUTION_MODES)  # fmt: skip
    summary = run_study(ctx)
    trials = optuna.load_study(study_name="s", storage=db).trials
    assert trials and all(t.state.name == "PRUNED" for t in trials)
    assert all("memory plan needs at least" in t.user_attrs["pruned_reason"] for t in trials)
    assert ctx.store.trials(TrialFilter(study="s")) == [], "nothing was built or measured"
    # rejected by the memory cap all the same: the plan's floor against the cap, the closest named
    floor = floor_mb(ctx.model, 1, "fp32")
    closest = summary.closest
    assert summary.winner is None and closest is not None and closest.config.startswith("onnxruntime/fp32/b1/t1")
    assert (closest.constraint, closest.value, closest.limit) == ("max_memory_mb", floor, 0.0005) and floor > 0.0005
    assert f"closest: {closest.config}: memory plan needs at least {mb_text(floor)} MB > 0.0005 MB" in summary.note

@pytest.mark.slow
def test_a_config_breaking_the_accuracy_budget_is_listed_with_its_worst_channel_group(tmp_path):
    """The detector of tests/models.py: static int8 with a quantized head loses its class-score channels."""
    db = f"sqlite:///{tmp_path / 'r.db'}"
    model = load_model(detector(tmp_path / "det.onnx"))
    settings = HarnessSettings(workdir=tmp_path / "work", policy=FAST, timeout_s=60)
    knobs = {"quant_method": ["static"], "quant_head": ["int8"], "execution_mode": ["ORT_SEQUENTIAL"]}
    cfg = StudyConfig(model=str(model.path), engines=["onnxruntime"], threads=[1], precisions=["fp32", "int8"],
                      sampler="grid", knobs={"onnxruntime": knobs}, finalists={"count": 0})  # fmt: skip
    ctx = StudyContext(cfg, "s", model, probe_device(), prepare_data(model, settings), settings, Store.open(db), db,
                       "autodeploy tune test")  # fmt: skip
    summary = run_study(ctx)
    assert summary.winner is not None and summary.winner.config.precision == "fp32" and summary.closest is None
    (rejected,) = summary.rejected
    assert rejected.config.startswith("onnxruntime/int8/b1/t1") and rejected.constraint == "max_accuracy_drop"
    # the numbers are the stored verdict's: the worst channel group's SQNR against the budget's limit
    (row,) = [r for r in ctx.store.trials(TrialFilter(study="s")) if r.config.precision == "int8"]
    (o,) = row.accuracy.outputs
    assert row.failure_kind == "inaccurate" and o.channels == "axis 1, channels 4-11"
    assert (rejected.value, rejected.unit) == (o.sqnr_db, "dB") and rejected.limit == pytest.approx(sqnr_for_drop(0.01))
    assert rejected.value < rejected.limit
    # the box channels (pixels) moved more in the output's units than the class scores: the line names them too
    moved = f"; moved most: {o.moved_channels}, max abs error {o.moved_max_abs:.4g} in the output's units" if o.moved_channels else ""
    assert rejected.reason == (f"output 'output0', axis 1, channels 4-11: SQNR {o.sqnr_db:.1f} dB < 17 dB "
                               f"(max accuracy drop 1%); max abs error {o.error_max_abs:.4g}, p99 {o.error_p99_abs:.4g}, "
                               f"in the output's units{moved}; kind sqnr taken from its shape [N, 12, 64], no other kind "
                               "proven: declare another with --accuracy output0=KIND (docs/accuracy.md)")  # fmt: skip
    assert "output 'output0', axis 1, channels 4-11: SQNR" in row.failure_message  # the harness named the same group


# -- build once, measure many; priorities; the time budget -------------------------------------


def _by_threads(trials):
    return {t.user_attrs["config"]["threads"]: t for t in trials if t.state.name == "COMPLETE"}


@pytest.mark.slow
def test_runtime_settings_reuse_one_build_and_its_accuracy(tmp_path):
    """Threads do not change the artifact: the second config skips the build worker and the worker
    takes the accuracy the first measured instead of comparing again (the trial says whose)."""
    db = f"sqlite:///{tmp_path / 'r.db'}"
    ctx = make_ctx(tmp_path, db, sampler="grid", precisions=["fp32"], threads=[1, 2], finalists={"count": 0},
                   knobs={"onnxruntime": {"execution_mode": ["ORT_SEQUENTIAL"]}})  # fmt: skip
    summary = run_study(ctx)
    first, second = (t for _, t in sorted(_by_threads(optuna.load_study(study_name="s", storage=db).trials).items()))
    assert "accuracy_reused_from" not in first.user_attrs and first.user_attrs["artifact_reused"] is False
    assert second.user_attrs["accuracy_reused_from"] == first.user_attrs["uid"]
    assert second.user_attrs["artifact_reused"] is True and second.user_attrs["wall_s"]["build"] < 0.5  # no worker
    assert second.user_attrs["artifact_path"] == first.user_attrs["artifact_path"]
    rows = {r.uid: r for r in ctx.store.trials(TrialFilter(study="s"))}
    assert rows[second.user_attrs["uid"]].accuracy == rows[first.user_attrs["uid"]].accuracy
    engine_time = summary.time_by_engine["onnxruntime"]
    assert engine_time["runs"] == 2 and engine_time["timing_s"] > 0 and engine_time["accuracy_s"] > 0


@pytest.mark.slow
def test_an_int8_slower_than_fp32_on_the_same_runtime_gets_no_more_trials(tmp_path):
    registry.register("faulty", TARGET)
    try:
        db = f"sqlite:///{tmp_path / 'r.db'}"
        ctx = make_ctx(tmp_path, db, engines=["faulty"], precisions=["fp32", "int8"], threads=[1, 2], trials=4,
                       knobs={"faulty": {"fault": ["slow_int8"]}}, finalists={"count": 0},
                       constraints={"max_accuracy_drop": 1.0})  # fmt: skip
        summary = run_study(ctx)
    finally:
        registry.unregister("faulty")
    trials = optuna.load_study(study_name="s", storage=db).trials
    int8 = [t for t in trials if t.user_attrs["config"]["precision"] == "int8"]
    assert int8[0].state.name == "COMPLETE"  # the portfolio's look, at the same threads as fp32's
    later = [t for t in int8[1:] if "repeat_of" not in t.user_attrs]
    assert all(t.state.name == "PRUNED" and "measured slower than fp32" in t.user_attrs["pruned_reason"] for t in later)
    assert "int8 measured slower than fp32 on faulty" in summary.deprioritized["faulty/int8"]
    assert len([t for t in trials if t.state.name == "COMPLETE" and "repeat_of" not in t.user_attrs]) <= 3


def _trial(engine, precision, threads, value):
    config = TrialConfig(engine, precision, threads=threads).to_dict()
    return optuna.trial.create_trial(params={}, distributions={}, values=[value], user_attrs={"config": config},
                                     system_attrs={"constraints": [0.0]})  # fmt: skip


def test_an_int8_branch_stays_open_where_it_wins_at_some_setting():
    from autodeploy.search.memory import Memory

    study = optuna.create_study(direction="minimize")
    for trial in (_trial("openvino", "fp32", 4, 1.0), _trial("openvino", "int8", 4, 1.2),
                  _trial("onnxruntime", "fp32", 4, 1.0), _trial("onnxruntime", "int8", 4, 1.3),
                  _trial("onnxruntime", "int8", 1, 0.9), _trial("onnxruntime", "fp32", 1, 1.5)):  # fmt: skip
        study.add_trial(trial)
    slower = Memory.of(study).slower
    assert list(slower) == ["openvino/int8"] and "b1/t4: 1.2 against 1" in slower["openvino/int8"]
    assert Memory.of(optuna.create_study(direction="maximize")).slower == {}


@pytest.mark.parametrize(("text", "seconds"), [("600", 600), ("90s", 90), ("10m", 600), ("1h30m", 5400),
                                               ("1.5h", 5400), (45, 45)])  # fmt: skip
def test_time_budgets_read_as_people_write_them(text, seconds):
    from autodeploy.search.budget import parse_duration

    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["10x", "m", "-5m", "0", "ten minutes"])
def test_a_time_budget_that_is_no_duration_is_refused(text):
    from autodeploy.search.budget import parse_duration

    with pytest.raises(UsageError, match="time-budget"):
        parse_duration(text)


@pytest.mark.slow
def test_a_time_budget_too_small_for_the_baseline_says_how_long_the_baseline_takes(tmp_path):
    ctx = make_ctx(tmp_path, f"sqlite:///{tmp_path / 'r.db'}", precisions=["fp32"], time_budget_s=0.1)
    with pytest.raises(UsageError, match=r"too small: measuring even the baseline \(the ORT fp32 default\) takes about "
                                         r"[\d.]+ s here") as raised:  # fmt: skip
        run_study(ctx)
    assert "\n" not in str(raised.value)


@pytest.mark.slow
def test_a_budget_ending_mid_build_stops_that_build_only_and_a_resume_goes_on(tmp_path):
    """The hung build is stopped when the budget ends and recorded as timeout; the config measured before
    is the answer; a resume keeps every trial and tries the stopped config again."""
    registry.register("faulty", TARGET)
    try:
        db = f"sqlite:///{tmp_path / 'r.db'}"
        space = dict(engines=["onnxruntime", "faulty"], precisions=["fp32"], sampler="random",
                     knobs={"onnxruntime": {"execution_mode": ["ORT_SEQUENTIAL"]}, "faulty": {"fault": ["hang_in_build"]}},
                     finalists={"count": 0})  # fmt: skip
        summary = run_study(make_ctx(tmp_path, db, time_budget_s=20, **space))
        first = optuna.load_study(study_name="s", storage=db).trials
        resumed = run_study(make_ctx(tmp_path, db, resume=True, time_budget_s=12, **space))
    finally:
        registry.unregister("faulty")
    hung = [t for t in first if t.user_attrs["config"]["engine"] == "faulty"]
    assert [t.state.name for t in hung] == ["FAIL"] and hung[0].user_attrs["failure"].startswith("timeout")
    assert hung[0].user_attrs["budget_timeout"] is True
    assert summary.winner is not None and summary.winner.config.engine == "onnxruntime"
    assert summary.stopped_by == "time budget" and summary.wall_s < 20 + 10  # the stop is prompt
    assert "screening only" in summary.confidence
    after = optuna.load_study(study_name="s", storage=db).trials
    assert [(t.number, t.state, t.values) for t in after[: len(first)]] == [(t.number, t.state, t.values) for t in first]
    retried = after[len(first)]  # the portfolio asks the stopped config again, first
    assert retried.user_attrs["config"]["engine"] == "faulty" and retried.user_attrs["budget_timeout"]
    assert resumed.winner is not None and resumed.winner.config.engine == "onnxruntime"
    assert len(ctx_rows := Store.open(db).trials(TrialFilter(study="s"))) >= 3 and any(r.failure_kind == "timeout" for r in ctx_rows)


@pytest.mark.slow
def test_a_slow_conversion_the_budget_cannot_pay_for_is_skipped_and_said(tmp_path):
    from tests.adapters.faulty import SLOW_TARGET

    registry.register("slowfaulty", SLOW_TARGET)
    notes = []

    class Notes(Reporter):
        def note(self, text):
            notes.append(text)

    try:
        db = f"sqlite:///{tmp_path / 'r.db'}"
        ctx = make_ctx(tmp_path, db, engines=["onnxruntime", "slowfaulty"], precisions=["fp32"], time_budget_s=60,
                       knobs={"slowfaulty": {"fault": ["none"]}}, finalists={"count": 0})  # fmt: skip
        summary = run_study(ctx, Notes())
    finally:
        registry.unregister("slowfaulty")
    trials = optuna.load_study(study_name="s", storage=db).trials
    slow = [t for t in trials if t.user_attrs["config"]["engine"] == "slowfaulty"]
    assert slow and all(t.state.name == "PRUNED" and t.user_attrs.get("budget_skip") for t in slow)
    notes = [n for n in notes if not n.startswith("the machine is busy")]  # said when other work runs here
    assert len(notes) == 1 and notes[0].startswith("skipped slowfaulty/fp32: its conversion takes about 2.0 min")
    assert summary.skipped == notes and summary.winner is not None


@pytest.mark.slow
def test_a_finalist_round_under_load_runs_once_more_and_the_study_says_so(tmp_path):
    """A CPU hog beside the whole study: it is said before the study, every finalist round runs under load,
    and only the first of them runs again (bounded), its less loaded run kept, whole. No paired round of the
    winner and the baseline runs quiet, so the two run alone (bounded by the rounds), and the speed-up,
    resting on loaded rounds after all, says so."""
    notes, reruns = [], []

    class Heard(Reporter):
        def note(self, text):
            notes.append(text)

        def rerun(self, runs):
            reruns.append(runs)

    db = f"sqlite:///{tmp_path / 'r.db'}"
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)  # let it start spinning
        ctx = make_ctx(tmp_path, db, trials=1, knobs={"onnxruntime": {"execution_mode": ["ORT_SEQUENTIAL"]}},
                       finalists={"count": 1, "rounds": 2, "min_samples": 64, "min_duration_s": 0.2, "spread_s": 0})  # fmt: skip
        summary = run_study(ctx, Heard())
    finally:
        hog.kill()
        hog.wait()
    load = summary.load
    assert load["before"]["under_load"] and any(n.startswith("the machine is busy before the study") for n in notes)
    (again,) = load["reran"]  # at most one round runs again, however busy the machine stays
    assert again["round"] == 1 and again["kept"] in ("first", "again") and len(again["dropped_uids"]) == 2
    assert reruns[0] == 2 and any(n.startswith("finalist round 1 ran under load") for n in notes)
    pairs = load.get("pair_rounds", 0)
    if summary.winner is not None and not summary.winner.baseline:
        # up to 2x the rounds announced; it stops after as many loaded pair rounds in a row as the rounds
        assert pairs == 2 and reruns[1:] == [8] and any("the two run alone" in n for n in notes)
        assert any(n.startswith("the last 2 pair rounds ran under load") for n in notes)
        assert all(r.under_load and r.left_out == 0 for r in summary.speedups.values())
        assert "every paired round ran under load" in summary.headline()
    else:  # the baseline won: there is no speed-up to pair
        assert pairs == 0 and reruns == [2]
    assert load["under_load"]
    assert all(len(f.loads) == len(load["rounds"]) + (pairs if f.baseline or f is summary.winner else 0)
               for f in summary.finalists)  # fmt: skip
    kept = {uid for f in summary.finalists for uid in f.uids}
    stored = {r.uid for r in ctx.store.trials(TrialFilter(study="s", phase="finalist"))}
    assert stored == kept | set(again["dropped_uids"]) and not kept & set(again["dropped_uids"])
    assert all(r.measurement.under_load for r in ctx.store.trials(TrialFilter(study="s", phase="finalist")))


def test_a_throughput_study_measures_offline_and_compares_runs(tmp_path):
    """--objective throughput: every trial in the offline scenario with its requests in flight; the
    finalists compared on items/s per worker run; a single-stream trial of the same config is not reused."""
    db = f"sqlite:///{tmp_path / 'r.db'}"
    ctx = make_ctx(tmp_path, db, objective="throughput", trials=2, batches=[2],
                   knobs={"onnxruntime": {"num_requests": [1, 2], "sessions": ["shared"]}},
                   finalists={"count": 1, "rounds": 2, "min_samples": 64, "min_duration_s": 0.1, "spread_s": 0})  # fmt: skip
    summary = run_study(ctx)
    rows = ctx.store.trials(TrialFilter(study="s"))
    assert rows and {r.measurement.scenario for r in rows} == {"offline"}
    assert all(r.measurement.serving["concurrency"]["requests"] == r.config.knobs["num_requests"]
               for r in rows if r.config.knobs)  # fmt: skip
    winner = summary.winner
    assert winner is not None and winner.statistic > 0 and winner.ci[0] <= winner.statistic <= winner.ci[1]
    # one items/s per round (and per pair round, when a busy machine left too few quiet ones to pair)
    assert len(winner.uids) == 2 + summary.load.get("pair_rounds", 0)


# -- cover, then refine only contenders; finalists halved; ties only when close ----------------


def test_the_portfolio_looks_at_precisions_this_cpu_runs_natively_first():
    from autodeploy.search.space import EngineChoices, SearchSpace

    space = SearchSpace({"openvino": EngineChoices(("fp32", "bf16", "int8"), {})}, batches=(1,), threads=(1,))
    assert [p for _, p, _ in _portfolio(space, ("avx512_bf16", "avx512_vnni"))] == ["bf16", "fp32", "int8"]
    assert [p for _, p, _ in _portfolio(space, ("avx2",))] == ["fp32", "bf16", "int8"]  # int8 calibrates: last


def test_a_branch_far_behind_the_best_at_the_same_threads_is_named_an_outsider():
    from autodeploy.search.memory import outsiders

    study = optuna.create_study(direction="minimize")
    for trial in (_trial("openvino", "fp32", 2, 1.0), _trial("onnxruntime", "fp32", 2, 1.4),
                  _trial("inhouse", "int8", 2, 2.0), _trial("inhouse", "fp32", 2, 1.6),
                  _trial("openvino", "fp32", 1, 0.5)):  # fmt: skip
        study.add_trial(trial)
    out = outsiders(study.trials, minimize=True)
    # judged at t2, where all were measured: openvino/fp32's t1 value is no yardstick for the others' t2
    assert sorted(out) == ["inhouse/fp32", "inhouse/int8"]
    assert "2.00x worse than openvino/fp32 at b1/t2" in out["inhouse/int8"]
    study.add_trial(_trial("inhouse", "fp32", 1, 0.6))  # close to the best at t1: a contender after all
    assert sorted(outsiders(study.trials, minimize=True)) == ["inhouse/int8"]
    items_per_s = optuna.create_study(direction="maximize")
    for trial in (_trial("a", "fp32", 1, 100.0), _trial("b", "fp32", 1, 60.0)):
        items_per_s.add_trial(trial)
    assert list(outsiders(items_per_s.trials, minimize=False)) == ["b/fp32"]


def _ranked(*rows):
    return [optuna.trial.create_trial(params={}, distributions={}, values=[v],
                                      user_attrs={"config": TrialConfig(e, p, threads=t).to_dict()})
            for e, p, t, v in rows]  # fmt: skip


def test_finalists_are_the_best_of_each_branch_first():
    from autodeploy.search.finalists import _contenders

    ranked = _ranked(("openvino", "fp32", 2, 1.00), ("openvino", "fp32", 1, 1.02), ("inhouse", "fp32", 2, 1.10),
                     ("onnxruntime", "fp32", 2, 1.30), ("onnxruntime", "int8", 2, 1.80))  # fmt: skip
    picked = [(c["engine"], c["threads"]) for c in (t.user_attrs["config"] for t in _contenders(ranked, 3))]
    assert picked == [("openvino", 2), ("inhouse", 2), ("onnxruntime", 2)]  # one per branch before a second of one
    assert [t.values[0] for t in _contenders(ranked, 5)] == [1.00, 1.02, 1.10, 1.30, 1.80]  # then by screening


def test_a_finalist_wholly_behind_the_leader_runs_no_more_rounds():
    """Paired by round (issue 26): slower than the leader in every round, with a paired interval above 1."""
    from autodeploy.search.winner import one_pair_margin, still_in
    from autodeploy.verdict import FIRST_ROUND_MARGIN

    lead, close, behind = [1.0, 2.0, 1.0], [1.04, 1.9, 1.05], [1.5, 3.0, 1.6]  # round 2: the machine was slow
    assert still_in([(0, lead), (1, close), (2, behind), (3, [None, None, None])], objective_of("latency")) == [0, 1]
    assert still_in([(0, [1.0]), (1, [1.08])], objective_of("latency")) == [0, 1]  # one round: not clear yet
    assert still_in([(0, [1.0]), (1, [1.5])], objective_of("latency")) == [0]
    assert still_in([(0, [1.0, 1.0]), (1, [1.08, 1.05])], objective_of("latency")) == [0]  # two rounds, slower in both
    # one round's gap must beat the machine's own swing: a shared VM read the ORT default 4.9 ms in screening
    # and 10.4 ms in round 1 (the host took a vCPU, no steal reported); there 1.5x is no gap, 2.2x is
    assert one_pair_margin([[5.0, 5.2], [3.0, None], [None], []]) == FIRST_ROUND_MARGIN  # steady: the floor
    wide = one_pair_margin([[4.9, 10.4], [3.0, 3.1]])
    assert wide == pytest.approx(10.4 / 4.9 - 1)
    assert still_in([(0, [1.0]), (1, [1.5])], objective_of("latency"), margin=wide) == [0, 1]
    assert still_in([(0, [1.0]), (1, [2.2])], objective_of("latency"), margin=wide) == [0]
    assert still_in([(0, [100.0, 90.0]), (1, [50.0, 45.0])], objective_of("throughput")) == [0]
    assert still_in([(0, [1.0, 1.0]), (1, [1.5, 1.5])], objective_of("latency"), keep=1) == [0, 1]  # the baseline stays
    # before a winner claim's rounds: the closest rival stays beside the leader (2.6x, not 4x) ...
    three = [(0, [1.0]), (1, [4.0]), (2, [2.6])]
    assert still_in(three, objective_of("latency")) == [0]
    assert still_in(three, objective_of("latency"), rival=True) == [0, 2]
    # ... and the baseline, which runs every round for the speed-up, is no rival: the leader keeps a contender
    # that one swing of the machine could have put behind (within the margin), not one far behind
    near = [(0, [1.0, 1.0]), (1, [4.0, 4.0]), (2, [1.3, 1.2]), (3, [3.0, 3.0])]
    assert still_in(near, objective_of("latency"), keep=3, margin=wide) == [0, 3]
    assert still_in(near, objective_of("latency"), keep=3, rival=True, margin=wide) == [0, 2, 3]
    assert still_in(near, objective_of("latency"), keep=3, rival=True) == [0, 3]  # 1.25x behind twice, on a steady machine
    far = [(0, [1.0, 1.0]), (1, [4.0, 4.0]), (2, [2.7, 2.8]), (3, [3.0, 3.0])]
    assert still_in(far, objective_of("latency"), keep=3, rival=True, margin=wide) == [0, 3]


def test_a_tie_needs_close_statistics_not_only_overlapping_intervals():
    """A noisy all-cores config 1.29x faster is not tied with a one-thread config (the cheaper one would win)."""
    from autodeploy.search.study import Finalist
    from autodeploy.search.winner import choose as _choose

    def finalist(threads, p90, ci):
        config = TrialConfig("openvino", "fp32", threads=threads)
        return Finalist(config, config.label(), p90, ci, 600, ["u"])

    fast_noisy, slow = finalist(2, 1.00, (0.90, 1.40)), finalist(1, 1.29, (1.25, 1.33))
    assert _choose("s", objective_of("latency"), {}, [slow, fast_noisy]).winner is fast_noisy
    close = finalist(1, 1.02, (0.98, 1.06))
    summary = _choose("s", objective_of("latency"), {}, [close, fast_noisy])
    assert summary.winner is close and summary.tie_with == [fast_noisy.label]  # a real tie: the cheaper one


@pytest.mark.slow
def test_after_every_branch_had_its_look_only_contenders_are_refined(tmp_path):
    """faulty/int8 runs 2 ms slower per call than onnxruntime/int8 (the mlp takes microseconds): it gets
    its one look in the portfolio, then no more trials, and is said to be behind; the study stops by itself."""
    registry.register("faulty", TARGET)
    try:
        db = f"sqlite:///{tmp_path / 'r.db'}"
        ctx = make_ctx(tmp_path, db, engines=["onnxruntime", "faulty"], precisions=["int8"], threads=[1, 2],
                       knobs={"faulty": {"fault": ["slow_int8"]}}, finalists={"count": 0},
                       constraints={"max_accuracy_drop": 1.0})  # fmt: skip
        summary = run_study(ctx)
    finally:
        registry.unregister("faulty")
    trials = optuna.load_study(study_name="s", storage=db).trials
    faulty = [t for t in trials if t.user_attrs["config"]["engine"] == "faulty" and "repeat_of" not in t.user_attrs]
    assert faulty[0].state.name == "COMPLETE" and faulty[0].number < 2  # the portfolio's look
    assert faulty[1:] and all(t.state.name == "PRUNED" and "worse than onnxruntime/int8" in t.user_attrs["pruned_reason"]
                              for t in faulty[1:])  # fmt: skip
    ort = {TrialConfig.from_dict(t.user_attrs["config"]).key() for t in trials
           if t.user_attrs["config"]["engine"] == "onnxruntime" and t.state.name == "COMPLETE"}  # fmt: skip
    assert len(ort) >= 2  # the contender is refined (threads, execution mode)
    assert "worse than onnxruntime/int8" in summary.deprioritized["faulty/int8"]
    assert summary.stopped_by in ("search space", "no improvement")


@pytest.mark.slow
def test_finalists_halve_a_config_that_falls_wholly_behind(tmp_path):
    registry.register("faulty", TARGET)
    try:
        db = f"sqlite:///{tmp_path / 'r.db'}"
        ctx = make_ctx(tmp_path, db, engines=["onnxruntime", "faulty"], precisions=["int8"], trials=2,
                       knobs={"faulty": {"fault": ["slow_int8"]}, "onnxruntime": {"execution_mode": ["ORT_SEQUENTIAL"]}},
                       finalists={"count": 2, "rounds": 3, "min_samples": 64, "min_duration_s": 0.1, "spread_s": 0},
                       constraints={"max_accuracy_drop": 1.0})  # fmt: skip
        summary = run_study(ctx)
    finally:
        registry.unregister("faulty")
    by = {f.config.engine if not f.baseline else "baseline": f for f in summary.finalists}
    assert len(by["faulty"].uids) == 1 and by["faulty"].statistic > 2.0  # one round: 2 ms behind, wholly
    assert summary.winner is not None and summary.winner.config.engine == "onnxruntime"
    assert len(summary.winner.uids) >= 1
    if len(summary.winner.uids) < 3:
        assert "fell wholly behind" in summary.confidence


def test_after_the_portfolio_each_contender_is_measured_at_every_thread_count():
    from autodeploy.search.memory import Memory
    from autodeploy.search.portfolio import enqueue_neighbours
    from autodeploy.search.space import EngineChoices, SearchSpace
    from autodeploy.search.study import ranked

    space = SearchSpace({"openvino": EngineChoices(("fp32", "int8"), {}), "onnxruntime": EngineChoices(("fp32",), {})},
                        batches=(1,), threads=(1, 2, 4))  # fmt: skip
    study = optuna.create_study(direction="minimize")
    for trial in (_trial("openvino", "fp32", 4, 1.0), _trial("openvino", "int8", 4, 1.2), _trial("onnxruntime", "fp32", 4, 3.0)):
        study.add_trial(trial)

    def waiting():
        return sorted((p["engine"], p[f"{p['engine']}.precision"], p["threads"])
                      for p in (t.system_attrs["fixed_params"] for t in study.get_trials(states=(optuna.trial.TrialState.WAITING,))))  # fmt: skip

    enqueue_neighbours(study, space, Memory.of(study), ranked(study, objective_of("latency")))
    # int8 is slower than fp32 on openvino, onnxruntime 3x behind: neither is refined
    assert waiting() == [("openvino", "fp32", 1), ("openvino", "fp32", 2)]
    enqueue_neighbours(study, space, Memory.of(study), ranked(study, objective_of("latency")))
    assert len(waiting()) == 2  # nothing twice while they wait
    for _ in range(2):  # asked and pruned (no config: nothing looked at)
        study.tell(study.ask().number, state=optuna.trial.TrialState.PRUNED)
    study.add_trial(_trial("openvino", "fp32", 1, 0.9))  # a new best: its own neighbours are looked at already
    study.add_trial(_trial("openvino", "fp32", 2, 0.95))
    enqueue_neighbours(study, space, Memory.of(study), ranked(study, objective_of("latency")))
    assert waiting() == []
