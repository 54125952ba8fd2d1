"""Screening: one Optuna trial is one config measured once (or pruned with its reason, or taken from the store)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autodeploy.accuracy.records import Accuracy
from autodeploy.accuracy.rules import CONVERSION_FACTOR, conversion_fault
from autodeploy.adapters import registry
from autodeploy.adapters.base import TrialConfig
from autodeploy.errors import TrialFailed
from autodeploy.harness import load as machine_load
from autodeploy.harness.result import conversion_failed, headline
from autodeploy.harness.run import run_trial
from autodeploy.harness.stats import latency_claim
from autodeploy.results_db.records import TrialFilter
from autodeploy.results_db.store import DeviceRecord, ModelRecord
from autodeploy.search.budget import SLOW_BUILD_GUESS_S, Budget, duration_text
from autodeploy.search.config import StudyConfig
from autodeploy.search.context import StudyCase, StudyContext
from autodeploy.search.memory import Memory, accuracy_key
from autodeploy.search.objective import Metrics, has_measures, rejections, values, violations
from autodeploy.search.portfolio import unseen_branches
from autodeploy.search.reporter import Reporter
from autodeploy.search.space import SearchSpace, suggest, unsupported_reason
from autodeploy.search.storage import trial_state
from autodeploy.verdict import Rejection, feasible, mb_text

if TYPE_CHECKING:
    import optuna


def finalist_reserve(cfg: StudyConfig, memory: Memory, budget: Budget) -> float:
    """Seconds screening leaves for the finalists: their runs at the screening's cost per run, each
    longer by the extra timed seconds; at least one round, else at most 30% of the budget (fewer
    rounds fit then)."""
    if budget.seconds is None or cfg.finalists.count == 0 or not cfg.objective.remeasured:
        return 0.0
    if not memory.timing_s:
        return 0.0
    f = cfg.finalists
    per_run = sum(memory.timing_s) / len(memory.timing_s) + max(0.0, f.min_duration_s - cfg.screening.min_duration_s)
    one_round = per_run * (f.count + 1)  # the finalists and the baseline
    return min(one_round * f.rounds, max(one_round, 0.3 * budget.seconds))


def refining(study: optuna.Study, cfg: StudyConfig, space: SearchSpace) -> bool:
    """Every engine × precision has had its look (none waits, none is left): the sampler refines now."""
    if cfg.sampler == "grid":
        return False
    return not study.get_trials(deepcopy=False, states=(trial_state().WAITING,)) and not unseen_branches(study, space)


def screen(ctx: StudyContext, study: optuna.Study, trial: optuna.Trial, space: SearchSpace,
            reporter: Reporter, memory: Memory, budget: Budget) -> bool:  # fmt: skip
    """Tell the study about one suggested config; True when it cost a measurement (pruned and repeated configs don't)."""
    state = trial_state()
    config = suggest(trial, space)
    trial.set_user_attr("config", config.to_dict())
    artifact = _artifact_key(ctx, config)
    trial.set_user_attr("artifact_key", artifact)
    reason = next((r for c in ctx.shape_cases() if (r := unsupported_reason(config, ctx.device, c.model))), None)
    branch = f"{config.engine}/{config.precision}"
    reason = reason or memory.dead.get(artifact) or memory.broken_by(config) or memory.slower.get(branch)
    earlier = memory.seen.get(config.key())
    if not reason and earlier is None and refining(study, ctx.config, space):  # every branch had its look: refine only contenders
        reason = memory.behind.get(branch)
    if not reason and (unfit := _cannot_fit(ctx, config)):  # the memory plan: pruned before anything is built
        reason = unfit[0]
        trial.set_user_attr("rejected", [asdict(unfit[1])])
    if not reason:
        reason = _unaffordable(ctx, config, artifact, memory, budget)
        if reason:
            trial.set_user_attr("budget_skip", reason)
            if f"{config.engine}/{config.precision}" not in budget.told:
                budget.told.add(f"{config.engine}/{config.precision}")
                reporter.note(reason)
    if reason:
        trial.set_user_attr("pruned_reason", reason)
        study.tell(trial, state=state.PRUNED)
        return False
    if earlier is not None:  # TPE likes to repeat itself: answer from the first measurement
        trial.set_user_attr("repeat_of", earlier.number)
        trial.set_user_attr("uid", earlier.user_attrs.get("uid", ""))
        trial.set_user_attr("reused", True)
        for key, value in (earlier.constraints or {}).items():
            trial.set_constraint(key, value)
        study.tell(trial, earlier.values)
        return False
    measured = measure(replace(ctx, settings=budget.capped(ctx.settings)), config, reporter, memory=memory)
    for key, value in measured.attrs(artifact).items():
        trial.set_user_attr(key, value)
    if measured.per_shape:
        trial.set_user_attr("shape_uids", {k: m.uid for k, m in measured.per_shape.items()})
        trial.set_user_attr("shape_values", {k: values(m.metrics, ctx.config.objective)[0] if m.metrics else None
                                             for k, m in measured.per_shape.items()})  # fmt: skip
    memory.learn({**measured.attrs(artifact), "config": config.to_dict()})
    if measured.metrics is None:
        trial.set_user_attr("failure", measured.failure)
        if measured.failure and measured.failure.startswith("timeout") and budget.left() <= 1.0:
            trial.set_user_attr("budget_timeout", True)  # not the config's fault: a resume tries it again
        kind = failure_kind(measured.failure)
        if kind == "unsupported":  # the build refused (an int8 that quantized nothing): pruned, as the space prunes
            _bury(trial, memory, artifact, f"trial {trial.number}: {measured.failure}")
            trial.set_user_attr("pruned_reason", measured.failure)
            study.tell(trial, state=state.PRUNED)
            return True
        if kind in ("build_failed", "load_failed"):  # the artifact's fault, whatever the runtime knobs
            verb = "built" if kind == "build_failed" else "loaded"
            _bury(trial, memory, artifact, f"trial {trial.number} {verb} the same artifact and failed: "
                  f"{measured.failure}")  # fmt: skip
            if conversion_failed(measured.failure):  # shared by every precision
                reason = f"trial {trial.number}: {measured.failure}; every precision of {config.engine} needs that conversion"
                trial.set_user_attr("broken_conversion", reason)
                memory.break_conversion(config, reason)
        study.tell(trial, state=state.FAIL)
        return True
    found = violations(measured.metrics, ctx.config.constraints, ctx.config.objective)
    if not feasible(found):  # what the summary lists: each broken constraint with its value and limit
        trial.set_user_attr("rejected", [asdict(r) for r in _rejections(ctx, measured)])
    if found.get("accuracy_drop", 0.0) > 0:
        _bury(trial, memory, artifact, f"trial {trial.number} measured the same artifact and it breaks the "
              f"accuracy budget (drop {measured.metrics.accuracy_drop:.2%})")  # fmt: skip
        drop, budget = measured.metrics.accuracy_drop, ctx.config.constraints.max_accuracy_drop
        if conversion_fault(config.precision, drop, budget):  # fp32 itself broken: no precision of it can pass
            reason = (f"trial {trial.number}: {config.engine}'s fp32 conversion breaks the model (accuracy drop "
                      f"{drop:.2%}, {CONVERSION_FACTOR:g}x the budget or more: a conversion fault, not a precision's "
                      f"effect); every precision of {config.engine} is built from it")  # fmt: skip
            trial.set_user_attr("broken_conversion", reason)
            memory.break_conversion(config, reason)
    for key, value in found.items():
        trial.set_constraint(key, value)  # the samplers read these (Optuna >= 5)
    study.tell(trial, values(measured.metrics, ctx.config.objective))
    memory.seen.setdefault(config.key(), study.get_trials(deepcopy=False)[trial.number])  # as told, constraints too
    return True


def _cannot_fit(ctx: StudyContext, config: TrialConfig) -> tuple[str, Rejection] | None:
    """Why the memory plan says ``config`` cannot fit --max-memory-mb at some shape, and that as a rejection."""
    from autodeploy.inhouse.memory import cannot_fit, floor_mb

    limit = ctx.config.constraints.max_memory_mb
    for c in ctx.shape_cases():
        if limit is not None and (reason := cannot_fit(c.model, config.batch, config.precision, limit)):
            floor = floor_mb(c.model, config.batch, config.precision) or 0.0
            text = f"memory plan needs at least {mb_text(floor)} MB > {limit:g} MB (not built)"
            return reason, Rejection("max_memory_mb", floor, limit, "MB", text, (floor - limit) / limit if limit else floor)
    return None


def _rejections(ctx: StudyContext, measured: Measured) -> list[Rejection]:
    """The constraints a measured config breaks (:func:`autodeploy.search.objective.rejections`); with
    several shapes, accuracy is named at the shape that lost most."""
    assert measured.metrics is not None
    accuracy, at = measured.accuracy, ""
    if measured.per_shape:
        key, worst = max(measured.per_shape.items(), key=lambda kv: kv[1].metrics.accuracy_drop if kv[1].metrics else 0.0)
        accuracy, at = worst.accuracy, f"at {key}: "
    found = rejections(measured.metrics, ctx.config.constraints, ctx.config.objective, accuracy)
    return [replace(r, reason=at + r.reason) if r.constraint == "max_accuracy_drop" else r for r in found]


def _unaffordable(ctx: StudyContext, config: TrialConfig, artifact: str, memory: Memory, budget: Budget) -> str:
    """Why a slow conversion (onnx2tf) is skipped: its build would not end before the time budget does."""
    slow = registry.get(config.engine).slow_build and ctx.model.format == "onnx"  # a .tflite as given converts nothing
    if budget.seconds is None or not slow or artifact in memory.artifacts:
        return ""
    build_s = memory.build_s.get(config.engine, SLOW_BUILD_GUESS_S)
    need = build_s + ctx.settings.policy.min_duration_s + finalist_reserve(ctx.config, memory, budget)
    if budget.left() >= need:
        return ""
    timed = "as timed here" if config.engine in memory.build_s else "a first guess, none timed here yet"
    return (f"skipped {config.engine}/{config.precision}: its conversion takes about {duration_text(build_s)} "
            f"({timed}) and {duration_text(max(budget.left(), 0))} of the time budget is left; "
            "a larger --time-budget or a --resume looks at it")  # fmt: skip


def _bury(trial: optuna.Trial, memory: Memory, artifact: str, reason: str) -> None:
    """Every later config of this artifact is pruned with ``reason`` (also after a resume)."""
    trial.set_user_attr("dead_artifact", reason)
    memory.dead[artifact] = reason


def _artifact_key(ctx: StudyContext, config: TrialConfig) -> str:
    """The adapter's build key: configs that share it share one build, so one artifact's fate."""
    engine = registry.get(config.engine)
    version = engine.probe_version()
    keys = [engine.build_key(c.model, config, version, c.data.calibration_sha256) for c in ctx.shape_cases()]
    return keys[0] if len(keys) == 1 else "+".join(keys)


@dataclass(frozen=True)
class Measured:
    metrics: Metrics | None
    uid: str
    failure: str | None = None
    reused: bool = False  # taken from the store: nothing ran
    samples_ms: tuple[float, ...] = ()
    #: Per shape key, that shape's measurement (several shapes only).
    per_shape: dict[str, Measured] = field(default_factory=dict)
    accuracy: Accuracy | None = None
    accuracy_uid: str = ""  # the trial that measured ``accuracy`` (this one, unless it was reused)
    artifact_path: str | None = None
    artifact_reused: bool = False  # measured on an artifact built for an earlier config: no build worker
    wall_s: dict[str, float] = field(default_factory=dict)  # build, timing, accuracy seconds
    ci: tuple[float, float] | None = None  # the screening value's 95% CI (latency)
    load: machine_load.Load | None = None  # how busy the machine was while it was timed (the busiest shape)
    started: float | None = None  # when a finalist round's run of it started (seconds since the epoch)

    def attrs(self, artifact: str) -> dict[str, Any]:
        """What the Optuna trial stores about this measurement (JSON), read back by :meth:`Memory.learn`."""
        out: dict[str, Any] = {"uid": self.uid, "reused": self.reused, "artifact_key": artifact}
        if self.accuracy is not None:
            out.update(accuracy=asdict(self.accuracy), accuracy_uid=self.accuracy_uid)
            if self.accuracy_uid and self.accuracy_uid != self.uid:
                out["accuracy_reused_from"] = self.accuracy_uid
        if self.artifact_path:
            out.update(artifact_path=self.artifact_path, artifact_reused=self.artifact_reused)
        if self.wall_s:
            out["wall_s"] = self.wall_s
        if self.ci is not None:
            out["ci"] = list(self.ci)
        return out




def measure(ctx: StudyContext, config: TrialConfig, reporter: Reporter, phase: str = "screening",
             memory: Memory | None = None) -> Measured:  # fmt: skip
    """Metrics of ``config`` at every shape of the study, combined by the mix (:func:`combine`).

    With one shape and ``memory``, a config whose artifact was built before is measured on it (no
    build worker) and the accuracy measured on that artifact at this batch is reused (no comparison
    in the worker). With several shapes every shape is its own artifact and accuracy: no reuse.
    """
    cases = ctx.shape_cases()
    if len(cases) == 1:
        return _measure_case(ctx, cases[0], config, reporter, phase, memory)
    per_shape = {}
    for case in cases:
        measured = _measure_case(ctx, case, config, reporter, phase, None)
        per_shape[case.key] = measured
        if measured.metrics is None:  # one shape failing fails the config for the mix
            failure = f"at {case.key}: {measured.failure}"
            return Measured(None, measured.uid, failure, per_shape=per_shape, wall_s=_walls(per_shape))
    metrics = combine([(c.weight, per_shape[c.key].metrics) for c in cases])  # type: ignore[misc]
    last = per_shape[cases[-1].key]
    loads = [m.load for m in per_shape.values() if m.load is not None]
    return Measured(metrics, last.uid, reused=all(m.reused for m in per_shape.values()), per_shape=per_shape,
                     wall_s=_walls(per_shape), load=max(loads, key=lambda x: x.other_cores, default=None))  # fmt: skip


def _walls(per_shape: dict[str, Measured]) -> dict[str, float]:
    """Build, timing and accuracy seconds over every shape."""
    out: dict[str, float] = {}
    for measured in per_shape.values():
        for part, seconds in measured.wall_s.items():
            out[part] = out.get(part, 0.0) + seconds
    return out


def combine(weighted: list[tuple[float, Metrics]]) -> Metrics:
    """One set of metrics for a weighted mix of shapes: latencies are the mix's expected latency
    (weighted mean), throughput the mix's items/s (weighted harmonic mean), CPU time and energy per inference
    their weighted mean, accuracy drop and memory the worst shape's, so a config that fails at one shape fails
    for the mix."""
    total = sum(w for w, _ in weighted)

    def mean(values: list[float | None]) -> float | None:
        if any(v is None for v in values):
            return None
        return sum(w * v for (w, _), v in zip(weighted, values, strict=True)) / total  # type: ignore[operator]

    def rate(values: list[float | None]) -> float | None:
        if any(not v for v in values):
            return None
        return total / sum(w / v for (w, _), v in zip(weighted, values, strict=True))  # type: ignore[operator]

    ms = [m for _, m in weighted]
    rss = [m.peak_rss_mb for m in ms if m.peak_rss_mb is not None]
    return Metrics(ms[-1].uid, mean([m.median_ms for m in ms]) or 0.0, mean([m.p90_ms for m in ms]),
                   rate([m.throughput for m in ms]), max(rss) if rss else None,
                   max(m.accuracy_drop for m in ms), rate([m.server_rate for m in ms]),
                   mean([m.cpu_ms for m in ms]), mean([m.energy_mj for m in ms]),
                   mean([m.cold_start_ms for m in ms]))  # fmt: skip


def _measure_case(
    ctx: StudyContext, case: StudyCase, config: TrialConfig, reporter: Reporter, phase: str,
    memory: Memory | None,
) -> Measured:
    """Metrics of ``config`` at one shape: from the store when measured before here, else a fresh trial (stored)."""
    cfg = ctx.config
    at = f" at {case.key}" if len(ctx.shape_cases()) > 1 else ""
    # A stored measurement was judged without this study's --metric: reused, the metric would never run. A rate
    # under the SLA (server) was searched under its own study's SLA: measured again, under this one.
    if not cfg.fresh and cfg.objective.sla_bounds_latency and phase == "screening" and cfg.metric is None:
        version = registry.get(config.engine).probe_version()
        repeat = TrialFilter(model_sha256=case.model.sha256, device=ctx.device.fingerprint, config_key=config.key(),
                             engine_version=version, shape_key=case.key, scenario=cfg.objective.scenario,
                             measured_only=True, newest_first=True)  # fmt: skip
        row = ctx.store.trial(repeat, samples=False)
        if row is not None and row.accuracy is not None and has_measures(Metrics.of_row(row), cfg.objective):
            return Measured(Metrics.of_row(row), row.uid, reused=True, accuracy=row.accuracy, accuracy_uid=row.uid)
    artifact_key = _artifact_key(ctx, config) if memory is not None else ""
    built = memory.artifacts.get(artifact_key) if memory is not None else None
    if built is not None and not (Path(built) / "artifact.json").is_file():
        built = None  # removed since (a cleared cache): build it again
    known = memory.accuracy.get(accuracy_key(artifact_key, config.batch)) if memory is not None else None
    reporter.phase(f"{config.label()}{at}: starting")
    result = run_trial(case.model, config, case.data, ctx.settings,
                       progress=lambda p: reporter.phase(f"{config.label()}{at}: {p}"),
                       scenario=cfg.objective.scenario,
                       sla_ms=None if cfg.objective.sla_bounds_latency else cfg.constraints.sla_ms,
                       artifact=None if built is None else Path(built), known=known,
                       measured=ctx.store.artifact_files_measured)  # fmt: skip
    ctx.store.add_trial(result, model=ModelRecord.of(case.model), device=DeviceRecord.of(ctx.device),
                        command=ctx.command, study=ctx.name, phase=phase, shape_key=case.key,
                        shapes=case.model.measured_shapes(config.batch))  # fmt: skip
    if result.extra.get("reference_failed"):  # stored above; every other trial would fail the same way
        raise TrialFailed(result.failure_kind or "crashed", headline(result.failure_message))
    wall = dict(result.extra.get("wall_s") or {})
    common = dict(wall_s=wall, artifact_path=result.artifact_path, artifact_reused=built is not None)
    if result.latency is None or result.accuracy is None:
        return Measured(None, result.uid, f"{result.failure_kind}: {headline(result.failure_message)}", **common)
    used = result.extra.get("accuracy_reused_from") or result.uid
    if memory is not None:
        memory.learn({"config": config.to_dict(), "artifact_key": artifact_key, "uid": result.uid,
                      "artifact_path": result.artifact_path, "accuracy": asdict(result.accuracy), "accuracy_uid": used})  # fmt: skip
    latency = result.latency
    ci = latency_claim(latency)[1]
    return Measured(Metrics.of_result(result), result.uid, samples_ms=result.samples_ms, accuracy=result.accuracy,
                     accuracy_uid=used, ci=ci if cfg.objective.from_calls else None,
                     load=result.measurement.load if result.measurement is not None else None, **common)  # fmt: skip


def failure_kind(failure: str | None) -> str | None:
    """``build_failed`` from a trial's stored failure, ``"build_failed: ..."`` or ``"at x=1x3: build_failed: ..."``."""
    if not failure:
        return None
    text = failure.split(": ", 1)[1] if failure.startswith("at ") and ": " in failure else failure
    return text.split(":", 1)[0].strip() or None
