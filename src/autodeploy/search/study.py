"""The study driver: screen configs with Optuna, re-measure the finalists interleaved, pick the winner.

Plain Optuna through ask-and-tell, so each trial can be pruned with its reason, failed with
its kind, or taken from the store, and the loop can stop cleanly at any point.
"""

from __future__ import annotations

import os
import threading
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from autodeploy.adapters import registry
from autodeploy.adapters.base import TrialConfig
from autodeploy.errors import StoreError, TrialFailed, UsageError
from autodeploy.harness.run import HarnessSettings, PreparedData, run_trial
from autodeploy.harness.stats import bootstrap_mean_ci, summarize
from autodeploy.harness.timing import TimingPolicy
from autodeploy.results_db.store import DeviceRecord, ModelRecord, Store
from autodeploy.search.config import StudyConfig
from autodeploy.search.objective import DIRECTIONS, Metrics, values, violations
from autodeploy.search.space import SearchSpace, build_space, suggest, unsupported_reason
from autodeploy.verdict import feasible, pareto_front

if TYPE_CHECKING:
    import optuna

    from autodeploy.device import DeviceInfo
    from autodeploy.model import ModelInfo

BASELINE = TrialConfig("onnxruntime", "fp32", batch=1, threads=None)
DEFAULT_TRIALS = 30
# A running trial beats every HEARTBEAT_S; one silent for GRACE_S (its process was killed) is
# failed by the next run or worker of the study (Optuna's fail_stale_trials).
HEARTBEAT_S = 5
GRACE_S = 20


@dataclass(frozen=True)
class StudyContext:
    """Everything a study run needs, resolved and validated by the caller (the CLI)."""

    config: StudyConfig
    name: str
    model: ModelInfo
    device: DeviceInfo
    data: PreparedData
    settings: HarnessSettings
    store: Store
    storage: str  # Optuna's RDB storage URL (by default the results database itself)
    command: str
    resume: bool = False


class Reporter:
    """Progress hooks; the CLI draws a progress bar, tests pass this silent one."""

    def study(self, name: str, objective: str) -> None: ...  # the study being run, before start
    def start(self, total: int, space: SearchSpace) -> None: ...
    def finalists(self, runs: int) -> None: ...  # the interleaved re-measurement begins: runs to come
    def phase(self, text: str) -> None: ...
    def trial_done(self, done: int, best: str | None) -> None: ...


@dataclass(frozen=True)
class Finalist:
    config: TrialConfig
    label: str
    statistic: (
        float | None
    )  # p90 ms (latency) or items/s (throughput) over all rounds; screening value otherwise
    ci: tuple[float, float] | None
    n_samples: int
    uids: list[str]
    baseline: bool = False
    failure: str | None = None


@dataclass(frozen=True)
class StudySummary:
    name: str
    objective: str
    trials: dict[str, int]  # state -> count, over the whole study
    finalists: list[Finalist]
    winner: Finalist | None
    tie_with: list[str] = field(default_factory=list)  # labels statistically tied with the winner
    speedup_vs_baseline: float | None = None
    note: str = ""  # e.g. "no trial meets the constraints: best-so-far shown"
    inputs: str = ""  # what accuracy was judged on, when it was not the user's data

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def run_study(ctx: StudyContext, reporter: Reporter | None = None) -> StudySummary:
    """Run (or resume) the study ``ctx.name``: screening trials, then finalists and the winner."""
    reporter = reporter or Reporter()
    cfg = ctx.config
    _check_same_model_and_device(ctx)
    study, storage = _open_study(ctx)
    space = build_space(cfg, ctx.device, ctx.model)
    # Store the resolved space, so a resume searches the same one even if engines were installed since.
    settings = {**cfg.model_dump(mode="json"), "engines": list(space.engines), "threads": list(space.threads),
                "batches": list(space.batches),
                "knobs": {e: {k: list(v) for k, v in c.knobs.items()} for e, c in space.engines.items()}}  # fmt: skip
    ctx.store.save_study(ctx.name, model=ModelRecord.of(ctx.model), device=DeviceRecord.of(ctx.device),
                         objective=cfg.objective, settings=settings, command=ctx.command)  # fmt: skip
    budget = cfg.trials if cfg.trials is not None else DEFAULT_TRIALS
    if cfg.sampler == "grid":
        budget = min(cfg.trials if cfg.trials is not None else 10**9, _enqueue_grid(study, space))
    else:
        _enqueue_portfolio(study, space)
    # --trials counts measurements: pruned configs and repeats cost nothing, so more may be asked
    # (the grid asks each of its points once).
    max_asks = budget if cfg.sampler == "grid" else budget + space.size()
    reporter.study(ctx.name, cfg.objective)
    reporter.start(budget, space)
    started, measured, asked = time.monotonic(), 0, 0
    while measured < budget and asked < max_asks:
        if cfg.timeout_s is not None and time.monotonic() - started > cfg.timeout_s:
            break
        _fail_stale_trials(study)
        memory = _Memory.of(study)  # read afresh: workers sharing the study learn from each other
        with warnings.catch_warnings():
            # "Heartbeat ... is supposed to be used with Study.optimize": _heartbeat beats for us.
            warnings.filterwarnings("ignore", "Heartbeat of storage")
            trial = study.ask()
        asked += 1
        try:
            with _heartbeat(storage, study, trial):
                counted = _screen(ctx, study, trial, space, reporter, memory)
        except ValueError as exc:
            study.tell(trial, state=_state().FAIL)
            if "dynamic value space" not in str(exc):
                raise
            raise UsageError(f"study {ctx.name!r} was created with another search space",
                             fix="resume it with the same engines, precisions, batches, threads and knobs, "
                             "or choose another --name") from None  # fmt: skip
        except BaseException:  # Ctrl-C or a bug: close the Optuna trial so a resume starts clean
            study.tell(trial, state=_state().FAIL)
            raise
        if counted:
            measured += 1
            reporter.trial_done(measured, best_label(study, cfg.objective))
    summary = _finalize(ctx, study, reporter)
    ctx.store.finish_study(ctx.name, winner_uid=summary.winner.uids[-1] if summary.winner and summary.winner.uids else None,
                           summary=summary.to_dict())  # fmt: skip
    return summary


def _check_same_model_and_device(ctx: StudyContext) -> None:
    """A study is bound to one model (by hash) and one device (by fingerprint): joining it from
    another would mix their measurements in one search and one winner."""
    stored = ctx.store.get_study(ctx.name)
    if stored is None:
        return
    if stored.model_sha256 != ctx.model.sha256:
        raise UsageError(f"study {ctx.name!r} belongs to model {stored.model_name} (sha256 {stored.model_sha256[:12]}…), "
                         f"not {ctx.model.name} (sha256 {ctx.model.sha256[:12]}…)",
                         fix="choose another --name for this model")  # fmt: skip
    if stored.device_fingerprint != ctx.device.fingerprint:
        raise UsageError(f"study {ctx.name!r} was measured on device {stored.device_fingerprint} "
                         f"({stored.device_cpu}), this device is {ctx.device.fingerprint} ({ctx.device.cpu_model})",
                         fix="give each device its own study name; the dashboard's Devices page compares them")  # fmt: skip


# -- screening ----------------------------------------------------------------------------


def _open_study(ctx: StudyContext) -> tuple[optuna.Study, optuna.storages.RDBStorage]:
    """The study ``ctx.name`` (created, or loaded with ``--resume``) and the storage it lives in."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        storage = _rdb_storage(ctx.storage)
        existing = optuna.study.get_all_study_names(storage=storage)
    except Exception as exc:  # Optuna wraps SQLAlchemy errors in several types
        raise StoreError(f"cannot open the study storage {ctx.storage}: {str(exc).splitlines()[0]}",
                         fix="pass --storage or --db with a reachable database") from None  # fmt: skip
    if ctx.name in existing and not ctx.resume:
        raise UsageError(f"study {ctx.name!r} already exists",
                         fix="add --resume to add trials to it, or choose another --name")  # fmt: skip
    # A resumed or joined study must not replay the same seeded suggestions as the first run.
    seed = ctx.config.seed if ctx.name not in existing else ctx.config.seed + os.getpid()
    study = optuna.create_study(study_name=ctx.name, storage=storage, load_if_exists=True,
                                directions=DIRECTIONS[ctx.config.objective], sampler=_sampler(ctx.config, seed))  # fmt: skip
    want = [d.upper() for d in DIRECTIONS[ctx.config.objective]]
    if [d.name for d in study.directions] != want:
        raise UsageError(f"study {ctx.name!r} was created for another objective",
                         fix="resume it with its own --objective, or choose another --name")  # fmt: skip
    return study, storage


def _rdb_storage(url: str, attempts: int = 5) -> optuna.storages.RDBStorage:
    """Optuna's storage with heartbeats. Workers starting together race to create Optuna's tables
    (PostgreSQL then raises a unique violation on pg_type): the loser retries and finds them made."""
    import optuna

    for attempt in range(attempts):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # heartbeat_interval
                return optuna.storages.RDBStorage(url, heartbeat_interval=HEARTBEAT_S, grace_period=GRACE_S)
        except Exception as exc:
            text = str(exc)
            if attempt == attempts - 1 or not ("already exists" in text or "unique constraint" in text):
                raise
            time.sleep(0.5 * (attempt + 1))
    raise AssertionError("unreachable")


def _fail_stale_trials(study: optuna.Study) -> None:
    """Fail the trials left RUNNING by a killed run or worker, so the study can go on without them."""
    import optuna

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)


@contextmanager
def _heartbeat(storage: optuna.storages.RDBStorage, study: optuna.Study, trial: optuna.Trial) -> Iterator[None]:
    """Record the trial's heartbeat from a thread while it runs (what ``Study.optimize`` does for its trials).

    ``storage`` is the one the study was opened on; the trial's storage id comes from its public
    study name and number.
    """
    study_id = storage.get_study_id_from_name(study.study_name)
    trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, trial.number)
    stop = threading.Event()

    def beat() -> None:
        while True:
            storage.record_heartbeat(trial_id)
            if stop.wait(HEARTBEAT_S):
                return

    thread = threading.Thread(target=beat, name="optuna-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def _sampler(cfg: StudyConfig, seed: int) -> optuna.samplers.BaseSampler:
    """Samplers take the constraints from each trial (``Trial.set_constraint``), so none needs a constraints_func."""
    import optuna

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        if cfg.sampler == "tpe":
            # multivariate + group model the conditional (per-engine) parameters jointly.
            return optuna.samplers.TPESampler(seed=seed, multivariate=True, group=True)
        if cfg.sampler == "nsga2":
            return optuna.samplers.NSGAIISampler(seed=seed)
        return optuna.samplers.RandomSampler(seed=seed)  # "random", and "grid" (grid points are enqueued)


def _enqueue_grid(study: optuna.Study, space: SearchSpace) -> int:
    """Enqueue every grid point the study has not run yet; return how many."""
    seen = [t.params for t in study.get_trials(deepcopy=False)]
    missing = [p for p in space.grid() if p not in seen]
    for params in missing:
        study.enqueue_trial(params, skip_if_exists=True)
    return len(missing)


@dataclass
class _Memory:
    """What the study has learned that no other config can change, rebuilt from its trials on resume.

    * ``dead``: artifact key -> why every config that builds that artifact is pruned: it failed
      to build, or it broke the accuracy budget (accuracy depends on the artifact, not on
      threads, streams or hints).
    * ``seen``: config key -> the trial that measured it; a repeat is answered from it for free.
    """

    dead: dict[str, str] = field(default_factory=dict)
    seen: dict[str, optuna.trial.FrozenTrial] = field(default_factory=dict)

    @classmethod
    def of(cls, study: optuna.Study) -> _Memory:
        memory = cls()
        for t in study.get_trials(deepcopy=False):
            if t.user_attrs.get("dead_artifact"):
                memory.dead[t.user_attrs["artifact_key"]] = t.user_attrs["dead_artifact"]
            if t.state == _state().COMPLETE and "repeat_of" not in t.user_attrs:
                memory.seen.setdefault(TrialConfig.from_dict(t.user_attrs["config"]).key(), t)
        return memory


def _enqueue_portfolio(study: optuna.Study, space: SearchSpace) -> None:
    """Cover before exploiting: one default config per engine × precision is tried first, cheap
    builds before slow ones (onnx2tf takes minutes), then the sampler refines batch, threads and knobs."""
    seen = {(t.params.get("engine"), t.params.get(f"{t.params.get('engine')}.precision"))
            for t in study.get_trials(deepcopy=False)}  # fmt: skip
    order = list(space.engines)
    for engine in sorted(order, key=lambda e: (registry.get(e).slow_build, order.index(e))):
        choices = space.engines[engine]
        for precision in choices.precisions:
            if (engine, precision) in seen:
                continue
            params: dict[str, Any] = {"engine": engine, f"{engine}.precision": precision, "batch": space.batches[0]}
            if choices.threads:
                params["threads"] = max(space.threads)  # all cores: what an engine's default would use
            params.update({f"{engine}.{knob}": values[0] for knob, values in choices.knobs.items()})
            study.enqueue_trial(params, skip_if_exists=True)


def _screen(ctx: StudyContext, study: optuna.Study, trial: optuna.Trial, space: SearchSpace,
            reporter: Reporter, memory: _Memory) -> bool:  # fmt: skip
    """Tell the study about one suggested config; True when it cost a measurement (pruned and repeated configs don't)."""
    state = _state()
    config = suggest(trial, space)
    trial.set_user_attr("config", config.to_dict())
    artifact = _artifact_key(ctx, config)
    trial.set_user_attr("artifact_key", artifact)
    reason = unsupported_reason(config, ctx.device, ctx.model) or memory.dead.get(artifact)
    if reason:
        trial.set_user_attr("pruned_reason", reason)
        study.tell(trial, state=state.PRUNED)
        return False
    earlier = memory.seen.get(config.key())
    if earlier is not None:  # TPE likes to repeat itself: answer from the first measurement
        trial.set_user_attr("repeat_of", earlier.number)
        trial.set_user_attr("uid", earlier.user_attrs.get("uid", ""))
        trial.set_user_attr("reused", True)
        for key, value in (earlier.constraints or {}).items():
            trial.set_constraint(key, value)
        study.tell(trial, earlier.values)
        return False
    measured = _measure(ctx, config, reporter)
    trial.set_user_attr("uid", measured.uid)
    trial.set_user_attr("reused", measured.reused)
    if measured.metrics is None:
        trial.set_user_attr("failure", measured.failure)
        if measured.failure and measured.failure.startswith("build_failed"):
            _bury(trial, memory, artifact, f"trial {trial.number} built the same artifact and failed: "
                  f"{measured.failure}")  # fmt: skip
        study.tell(trial, state=state.FAIL)
        return True
    found = violations(measured.metrics, ctx.config.constraints, ctx.config.objective)
    if found.get("accuracy_drop", 0.0) > 0:
        _bury(trial, memory, artifact, f"trial {trial.number} measured the same artifact and it breaks the "
              f"accuracy budget (drop {measured.metrics.accuracy_drop:.2%})")  # fmt: skip
    for key, value in found.items():
        trial.set_constraint(key, value)  # the samplers read these (Optuna >= 5)
    study.tell(trial, values(measured.metrics, ctx.config.objective))
    memory.seen.setdefault(config.key(), study.get_trials(deepcopy=False)[trial.number])  # as told, constraints too
    return True


def _bury(trial: optuna.Trial, memory: _Memory, artifact: str, reason: str) -> None:
    """Every later config of this artifact is pruned with ``reason`` (also after a resume)."""
    trial.set_user_attr("dead_artifact", reason)
    memory.dead[artifact] = reason


def _artifact_key(ctx: StudyContext, config: TrialConfig) -> str:
    """The adapter's build key: configs that share it share one build, so one artifact's fate."""
    engine = registry.get(config.engine)
    return engine.build_key(ctx.model, config, engine.probe_version(), ctx.data.calibration_sha256)


@dataclass(frozen=True)
class _Measured:
    metrics: Metrics | None
    uid: str
    failure: str | None = None
    reused: bool = False
    samples_ms: tuple[float, ...] = ()


#: The MLPerf scenario each objective is measured in: throughput with requests in flight (offline).
SCENARIO_OF = {"latency": "single-stream", "pareto": "single-stream", "throughput": "offline", "server": "server"}


def _measure(
    ctx: StudyContext, config: TrialConfig, reporter: Reporter, phase: str = "screening"
) -> _Measured:
    """Metrics of ``config``: from the store when measured before here, else a fresh trial (stored)."""
    cfg = ctx.config
    if not cfg.fresh and cfg.objective != "server" and phase == "screening":
        version = registry.get(config.engine).probe_version()
        row = ctx.store.find_measured(ctx.model.sha256, ctx.device.fingerprint, config.key(), version,
                                      scenario=SCENARIO_OF[cfg.objective])  # fmt: skip
        if row is not None and row.accuracy is not None:
            return _Measured(Metrics.of_row(row), row.uid, reused=True)
    reporter.phase(f"{config.label()}: starting")
    result = run_trial(ctx.model, config, ctx.data, ctx.settings, progress=lambda p: reporter.phase(f"{config.label()}: {p}"),
                       scenario=SCENARIO_OF[cfg.objective],
                       sla_ms=cfg.constraints.sla_ms if cfg.objective == "server" else None)  # fmt: skip
    ctx.store.add_trial(result, model=ModelRecord.of(ctx.model), device=DeviceRecord.of(ctx.device),
                        command=ctx.command, study=ctx.name, phase=phase)  # fmt: skip
    if result.extra.get("reference_failed"):  # stored above; every other trial would fail the same way
        raise TrialFailed(result.failure_kind or "crashed", result.failure_message or "")
    if result.latency is None or result.accuracy is None:
        return _Measured(None, result.uid, f"{result.failure_kind}: {result.failure_message}")
    return _Measured(Metrics.of_result(result), result.uid, samples_ms=result.samples_ms)


def _state() -> Any:
    from optuna.trial import TrialState

    return TrialState


def feasible_trials(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    done = study.get_trials(deepcopy=False, states=(_state().COMPLETE,))
    return [t for t in done if t.constraints and feasible(t.constraints)]


def ranked(study: optuna.Study, objective: str) -> list[optuna.trial.FrozenTrial]:
    """Feasible trials best first, one per config (Pareto front by latency for ``pareto``)."""
    trials = feasible_trials(study)
    if objective == "pareto":
        trials = [trials[i] for i in pareto_front([t.values for t in trials])]
        trials.sort(key=lambda t: t.values[0])
    else:
        trials.sort(key=lambda t: t.values[0], reverse=objective in ("throughput", "server"))
    unique, seen = [], set()
    for t in trials:
        key = TrialConfig.from_dict(t.user_attrs["config"]).key()
        if key not in seen:
            seen.add(key)
            unique.append(t)
    return unique


def best_label(study: optuna.Study, objective: str) -> str | None:
    top = ranked(study, objective)
    if not top:
        return None
    t = top[0]
    return (
        f"{TrialConfig.from_dict(t.user_attrs['config']).label()} = {', '.join(f'{v:.4g}' for v in t.values)}"
    )


# -- finalists and the winner ------------------------------------------------------------


def _finalize(ctx: StudyContext, study: optuna.Study, reporter: Reporter) -> StudySummary:
    cfg = ctx.config
    counts: dict[str, int] = {}
    for t in study.get_trials(deepcopy=False):
        kind = "repeated" if "repeat_of" in t.user_attrs else t.state.name.lower()  # repeats cost nothing
        counts[kind] = counts.get(kind, 0) + 1
    top = ranked(study, cfg.objective)[: max(cfg.finalists.count, 1)]
    if not top:
        return _best_so_far(study, cfg.objective, counts, ctx.name)
    remeasure = cfg.finalists.count > 0 and cfg.objective in ("latency", "throughput")
    if not remeasure:
        finalists = [_from_screening(t) for t in top]
        return StudySummary(ctx.name, cfg.objective, counts, finalists, finalists[0],
                            note="winner from screening values (not re-measured)")  # fmt: skip
    configs = [TrialConfig.from_dict(t.user_attrs["config"]) for t in top]
    baseline_ok = registry.get(BASELINE.engine).probe(ctx.device).available
    with_baseline = baseline_ok and BASELINE.key() not in {c.key() for c in configs}
    finalists = _interleaved(ctx, [*configs, *([BASELINE] if with_baseline else [])], reporter, with_baseline)
    return _choose(ctx.name, cfg.objective, counts, finalists)


def _interleaved(ctx: StudyContext, configs: list[TrialConfig], reporter: Reporter,
                 with_baseline: bool) -> list[Finalist]:  # fmt: skip
    """A B C A B C …: every round runs each config once, in a rotated order, so drift hits all alike."""
    f = ctx.config.finalists
    policy = TimingPolicy(min_samples=f.min_samples, min_duration_s=f.min_duration_s,
                          max_duration_s=max(60.0, 4 * f.min_duration_s))  # fmt: skip
    long_ctx = replace(ctx, settings=replace(ctx.settings, policy=policy))
    samples: list[list[float]] = [[] for _ in configs]
    rates: list[list[float]] = [[] for _ in configs]  # items/s of each run (offline: not from latencies)
    uids: list[list[str]] = [[] for _ in configs]
    failures: list[str | None] = [None for _ in configs]
    reporter.finalists(f.rounds * len(configs))
    for r in range(f.rounds):
        for i in [(j + r) % len(configs) for j in range(len(configs))]:
            reporter.phase(f"finalists round {r + 1}/{f.rounds}: {configs[i].label()}")
            measured = _measure(long_ctx, configs[i], reporter, phase="finalist")
            uids[i].append(measured.uid)
            if measured.metrics is None:
                failures[i] = measured.failure
                continue
            samples[i].extend(measured.samples_ms)
            rates[i].append(measured.metrics.throughput or 0.0)
    out = []
    for i, config in enumerate(configs):
        if ctx.config.objective == "throughput":  # offline: one items/s per worker run, the unit of statistics
            stat, ci = _throughput_statistic(rates[i])
        else:
            stat, ci = _statistic(samples[i], config.batch, ctx.config.objective)
        is_baseline = with_baseline and i == len(configs) - 1
        out.append(Finalist(config, config.label(), stat, ci, len(samples[i]), uids[i], is_baseline, failures[i]))
    return out


def _throughput_statistic(rates: list[float]) -> tuple[float | None, tuple[float, float] | None]:
    """Mean items/s of the runs and a bootstrap 95% CI of it (a single run: no interval beyond itself)."""
    if not rates:
        return None, None
    if len(rates) == 1:
        return rates[0], (rates[0], rates[0])
    return float(np.mean(rates)), bootstrap_mean_ci(rates, seed=0, n_boot=2000)


def _statistic(
    samples_ms: list[float], batch: int, objective: str
) -> tuple[float | None, tuple[float, float] | None]:
    """p90 ms with its bootstrap CI (latency), or items/s from the mean latency with a bootstrap CI (throughput)."""
    if len(samples_ms) < 2:
        return None, None
    if objective == "latency":
        stats = summarize(np.asarray(samples_ms) * 1e6)
        if stats.p90 is not None:
            return stats.p90, stats.p90_ci
        return stats.median, stats.median_ci
    mean_ms = float(np.mean(samples_ms))
    low, high = bootstrap_mean_ci(samples_ms, seed=0, n_boot=2000)
    return batch * 1000 / mean_ms, (batch * 1000 / high, batch * 1000 / low)


def _choose(name: str, objective: str, counts: dict[str, int], finalists: list[Finalist]) -> StudySummary:
    """Best statistic wins; finalists whose CI overlaps the best's are a tie, and the cheapest of the tie wins.

    The baseline (ORT fp32 default) competes too: when nothing the search found beats it, it is the winner.
    """
    candidates = [f for f in finalists if f.statistic is not None and f.ci is not None]
    baseline = next((f for f in finalists if f.baseline), None)
    if not candidates:
        return StudySummary(
            name, objective, counts, finalists, None, note="every finalist failed its re-measurement"
        )
    higher_is_better = objective == "throughput"
    best = (
        max(candidates, key=lambda f: f.statistic)
        if higher_is_better
        else min(candidates, key=lambda f: f.statistic)
    )
    tied = [f for f in candidates if f.ci[0] <= best.ci[1] and best.ci[0] <= f.ci[1]]

    def cost(f: Finalist) -> tuple[int, int]:
        # Fewer threads, then smaller batch; the engine's default thread count means "all cores".
        return (f.config.threads or 10**6, f.config.batch)

    winner = min(tied, key=cost)
    speedup = None
    if baseline is not None and baseline.statistic:
        speedup = (
            winner.statistic / baseline.statistic
            if higher_is_better
            else baseline.statistic / winner.statistic
        )
    return StudySummary(
        name, objective, counts, finalists, winner, [f.label for f in tied if f is not winner], speedup
    )


def _from_screening(t: optuna.trial.FrozenTrial) -> Finalist:
    config = TrialConfig.from_dict(t.user_attrs["config"])
    return Finalist(config, config.label(), t.values[0], None, 0, [t.user_attrs.get("uid", "")])


def _best_so_far(study: optuna.Study, objective: str, counts: dict[str, int], name: str) -> StudySummary:
    """No trial meets the constraints: show the best measured one anyway, labelled."""
    done = study.get_trials(deepcopy=False, states=(_state().COMPLETE,))
    if not done:
        return StudySummary(name, objective, counts, [], None, note="no trial produced a measurement")
    best = sorted(done, key=lambda t: t.values[0], reverse=objective in ("throughput", "server"))[0]
    return StudySummary(name, objective, counts, [_from_screening(best)], None,
                        note="no trial meets the constraints; the best-so-far is shown and is not a winner")  # fmt: skip
