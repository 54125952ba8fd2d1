"""The study driver: screen configs with Optuna, re-measure the finalists interleaved, pick the winner.

Plain Optuna through ask-and-tell, so each trial can be pruned with its reason, failed with
its kind, or taken from the store, and the loop can stop cleanly at any point.
"""

from __future__ import annotations

import math
import os
import threading
import time
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any
from uuid import uuid4

import numpy as np

from autodeploy.adapters import registry
from autodeploy.adapters.base import TrialConfig
from autodeploy.errors import StoreError, TrialFailed, UsageError
from autodeploy.harness import load as machine_load
from autodeploy.harness import stats as rstats
from autodeploy.harness.result import Accuracy, TrialResult, headline
from autodeploy.harness.run import HarnessSettings, PreparedData, prepare, reference, run_trial
from autodeploy.harness.stats import bootstrap_mean_ci, summarize
from autodeploy.harness.timing import TimingPolicy
from autodeploy.results_db.records import TrialFilter
from autodeploy.results_db.store import DeviceRecord, ModelRecord, Store
from autodeploy.search.budget import SLOW_BUILD_GUESS_S, Budget, duration_text
from autodeploy.search.config import StudyConfig, check_study_name
from autodeploy.search.memory import Memory, accuracy_key
from autodeploy.search.objective import DIRECTIONS, Metrics, rejections, values, violations
from autodeploy.search.portfolio import enqueue_grid, enqueue_neighbours, enqueue_portfolio, unseen_branches
from autodeploy.search.space import SearchSpace, build_space, suggest, unsupported_reason
from autodeploy.verdict import Rejection, feasible, mb_text, pareto_front

if TYPE_CHECKING:
    import optuna

    from autodeploy.device import DeviceInfo
    from autodeploy.model import ModelInfo

BASELINE = registry.BASELINE_CONFIG
DEFAULT_TRIALS = 30
#: Without --trials (or a time budget), screening stops once every engine × precision has had its look and this many
#: measurements (or repeats the sampler asked for) in a row have not improved the best by IMPROVEMENT (the
#: number of trials is then a cap, not a target).
PATIENCE = 6
IMPROVEMENT = 0.02
#: A finalist whose median per-round ratio to the best is within this fraction of 1, and whose paired
#: interval of that ratio holds 1, ties with it (and the cheaper one wins). An interval holding 1 alone
#: would tie configs far apart when the rounds are noisy (all cores on a busy machine).
TIE_TOLERANCE = 0.03
#: After the finalists' first round a config leaves the rounds only when it is this fraction slower
#: than the leader in that round; after later rounds, when it is slower in every round so far and the
#: paired interval of its ratio to the leader lies above 1 (it is wholly behind).
FIRST_ROUND_MARGIN = 0.10
#: Rounds a winner claim needs (docs/architecture.md, "Measurement rules"); fewer is labelled screening only.
MIN_WINNER_ROUNDS = 3
#: A finalist round that ran under load (``harness/load.py``) runs once more, the less loaded of the two
#: kept; at most this many times per study run, so a machine that stays busy costs one round, not a doubled study.
LOAD_RERUNS = 1
# A running trial beats every HEARTBEAT_S; one silent for GRACE_S (its process was killed) is
# failed by the next run or worker of the study (Optuna's fail_stale_trials).
HEARTBEAT_S = 5
GRACE_S = 20


@dataclass(frozen=True)
class StudyCase:
    """One shape of a study over several: the model fixed at it, its own inputs, its weight in the mix."""

    key: str  # ShapeCase.key(): "x=1x3x48x320"
    weight: float
    model: ModelInfo
    data: PreparedData


@dataclass(frozen=True)
class StudyContext:
    """Everything a study run needs, resolved and validated by the caller (the CLI).

    ``cases`` are the shapes every config is measured at, when there are several: the objective
    is then their weighted mean (throughput: the mix's items/s), accuracy and memory the worst
    of them. Without cases, ``model`` and ``data`` are the one shape.
    """

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
    cases: tuple[StudyCase, ...] = ()

    def shape_cases(self) -> tuple[StudyCase, ...]:
        if self.cases:
            return self.cases
        return (StudyCase(shape_key(self.model), 1.0, self.model, self.data),)


def shape_key(model: ModelInfo) -> str:
    """The :meth:`~autodeploy.shapes.ShapeCase.key` of a model's fixed shapes."""
    from autodeploy.shapes import ShapeCase

    return ShapeCase(dict(model.shapes)).key()


class Reporter:
    """Progress hooks; the CLI draws a progress bar, tests pass this silent one."""

    def study(self, name: str, objective: str) -> None: ...  # the study being run, before start
    def start(self, total: int, space: SearchSpace) -> None: ...
    def finalists(self, runs: int) -> None: ...  # the interleaved re-measurement begins: runs to come
    def phase(self, text: str) -> None: ...
    def note(self, text: str) -> None: ...  # something the user should read, e.g. a slow conversion skipped
    def rerun(self, runs: int) -> None: ...  # a finalist round runs again (it ran under load): runs added
    def trial_done(self, done: int, best: str | None) -> None: ...


@dataclass(frozen=True)
class Finalist:
    config: TrialConfig
    label: str
    #: Re-measured: the median over its rounds of each round's value (the summary's ``statistic``: p90
    #: or median ms, or items/s); the screening value otherwise.
    statistic: float | None
    ci: tuple[float, float] | None  # re-measured: the order-statistic interval over its rounds
    n_samples: int
    uids: list[str]
    baseline: bool = False
    failure: str | None = None
    #: Per shape (several only): the statistic at that shape, as ``statistic`` is for the mix.
    per_shape: dict[str, float | None] = field(default_factory=dict)
    #: One value per finalist round (``None``: it did not run that round, or failed); the winner is chosen on these.
    rounds: tuple[float | None, ...] = ()
    #: Per round, its median latency (ms; latency objective): the median's speed-up is paired on these.
    medians: tuple[float | None, ...] = ()
    #: The statistic over every call of every round pooled: display only (one noisy round owns its tail).
    pooled: float | None = None
    #: Per round, the cores other processes kept busy while it ran (``None``: not run, or not read).
    loads: tuple[float | None, ...] = ()


@dataclass(frozen=True)
class Ratio:
    """A speed-up paired by round: the median over rounds of the per-round ratios, >1 is faster.

    ``ci`` is the order-statistic interval of that median (:func:`autodeploy.harness.stats.median_interval`)
    and ``level`` its exact coverage; both ``None`` for a screening-only result (too few rounds).
    """

    value: float
    ci: tuple[float, float] | None
    level: float | None
    rounds: int


@dataclass(frozen=True)
class Rejected:
    """A config a constraint rejected: the constraint it misses most (:class:`autodeploy.verdict.Rejection`),
    with the value and the limit in ``unit``; ``reason`` names every constraint it breaks, as read."""

    config: str  # its label
    constraint: str  # max_accuracy_drop | max_memory_mb | sla_ms
    value: float | None
    limit: float | None
    unit: str
    reason: str

    def text(self) -> str:
        """``onnxruntime/int8/b1/t1: output 'y': top-1 agreement 0.95 < 0.99 (max accuracy drop 1%)``."""
        return f"{self.config}: {self.reason}"


@dataclass(frozen=True)
class StudySummary:
    name: str
    objective: str
    trials: dict[str, int]  # state -> count, over the whole study
    finalists: list[Finalist]
    winner: Finalist | None
    tie_with: list[str] = field(default_factory=list)  # labels statistically tied with the winner
    speedup_vs_baseline: float | None = None  # the ``statistic``'s ratio (``speedups[statistic].value``)
    note: str = ""  # e.g. "no trial meets the constraints: best-so-far shown"
    inputs: str = ""  # what accuracy was judged on, when it was not the user's data
    #: Where the wall time went, per engine, over the whole study (screening trials of every run,
    #: and this run's finalists): build, accuracy and timing seconds, and how many worker runs.
    time_by_engine: dict[str, dict[str, float]] = field(default_factory=dict)
    reference_s: float | None = None  # the ONNX Runtime fp32 reference, when this run computed it first
    wall_s: float | None = None  # this run, start to summary
    time_budget_s: float | None = None
    stopped_by: str = ""  # why screening stopped: "trials", "time budget", "screening time", "search space"
    confidence: str = ""  # what the winner's numbers rest on (interleaved rounds, or screening only)
    deprioritized: dict[str, str] = field(default_factory=dict)  # "engine/precision" -> why no more trials
    skipped: list[str] = field(default_factory=list)  # slow conversions the time budget could not pay for
    #: Failed trials by failure kind: how many, and the first one's config and reason.
    failures: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: What each finalist round was reduced to and the winner chosen on: "p90" or "median" (latency), "items/s".
    statistic: str = ""
    #: The winner's speed-up over the ORT fp32 default per statistic ("p90", "median", "items/s"), paired by round.
    speedups: dict[str, Ratio] = field(default_factory=dict)
    rounds: int = 0  # finalist rounds the winner ran
    #: Fewer than MIN_WINNER_ROUNDS rounds (or none): the winner is a screening result, its speed-up has no interval.
    screening_only: bool = False
    #: Every config a constraint rejected (measured, or pruned by the memory plan), once, closest to meeting
    #: the constraints first (:func:`_rejected`).
    rejected: list[Rejected] = field(default_factory=list)
    #: When no trial meets the constraints: the rejected config that came closest (``rejected[0]``).
    closest: Rejected | None = None
    #: How busy the machine was (``harness/load.py``): ``before`` the study (a Load's dict), the finalist
    #: ``rounds`` (the most other processes' cores over each round's runs), the rounds ``under_load`` (1-based)
    #: and the rounds run again for it (``reran``: round, cores of each run, which one was kept, the trials
    #: of the other: stored, but no finalist's numbers rest on them).
    load: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def headline(self) -> str:
        """The winner line, naming its statistic (:func:`autodeploy.report.headline`); "" without a winner."""
        from autodeploy.report import headline

        return headline(self.to_dict())


def run_study(ctx: StudyContext, reporter: Reporter | None = None) -> StudySummary:
    """Run (or resume) the study ``ctx.name``: screening trials, then finalists and the winner.

    With ``time_budget_s`` the whole run (finalists included) fits the budget: a worker running
    when it ends is stopped (``timeout``), screening leaves room for the finalists, and the
    summary says what the winner's confidence rests on. Every trial stays for ``--resume``.
    """
    reporter = reporter or Reporter()
    cfg = ctx.config
    budget = Budget(cfg.time_budget_s)
    check_study_name(ctx.name)
    _check_same_model_and_device(ctx)
    before = machine_load.sample()
    if before.under_load:
        reporter.note(f"the machine is busy before the study starts: {before.text()}; measurements that run "
                      "under load are flagged, and a finalist round under load runs once more")  # fmt: skip
    study, storage = _open_study(ctx)
    space = build_space(cfg, ctx.device, ctx.model)
    # Store the resolved space, so a resume searches the same one even if engines were installed since.
    settings = {**cfg.model_dump(mode="json"), "engines": list(space.engines), "threads": list(space.threads),
                "batches": list(space.batches),
                "knobs": {e: {k: list(v) for k, v in c.knobs.items()} for e, c in space.engines.items()}}  # fmt: skip
    ctx.store.save_study(ctx.name, model=ModelRecord.of(ctx.model), device=DeviceRecord.of(ctx.device),
                         objective=cfg.objective, settings=settings, command=ctx.command)  # fmt: skip
    reference_s = _check_budget(ctx, budget, reporter) if budget.seconds is not None else None
    if cfg.trials is not None:
        trials = cfg.trials
    else:  # a time budget without --trials: every config may get its look, the budget decides
        trials = space.size() if budget.seconds is not None else DEFAULT_TRIALS
    if cfg.sampler == "grid":
        trials = min(cfg.trials if cfg.trials is not None else 10**9, enqueue_grid(study, space))
    else:
        enqueue_portfolio(study, space, ctx.device.isa)  # its first stage; the others as each is asked
    # --trials counts measurements: pruned configs and repeats cost nothing, so more may be asked
    # (the grid asks each of its points once).
    max_asks = trials if cfg.sampler == "grid" else trials + space.size()
    reporter.study(ctx.name, cfg.objective)
    reporter.start(trials, space)
    measured, asked, stopped_by = 0, 0, "trials"
    memory = Memory.of(study)
    # without --trials or a time budget, the search ends when refining stops paying off
    patient = cfg.trials is None and budget.seconds is None and cfg.sampler != "grid" and len(DIRECTIONS[cfg.objective]) == 1
    best, stale = _best_value(study, cfg.objective), 0  # measurements since the best last improved
    while measured < trials:
        if patient and stale >= PATIENCE:
            stopped_by = "no improvement"
            break
        if asked >= max_asks or (asked and len(memory.looked) >= space.size()):
            stopped_by = "search space"
            break
        if cfg.screening_time_s is not None and time.monotonic() - budget.started > cfg.screening_time_s:
            stopped_by = "screening time"
            break
        if budget.left() <= _finalist_reserve(cfg, memory, budget):
            stopped_by = "time budget"
            break
        _fail_stale_trials(study)
        memory = Memory.of(study)  # read afresh: workers sharing the study learn from each other
        if cfg.sampler != "grid" and not enqueue_portfolio(study, space, ctx.device.isa) and len(DIRECTIONS[cfg.objective]) == 1:
            enqueue_neighbours(study, space, memory, ranked(study, cfg.objective))
        with warnings.catch_warnings():
            # "Heartbeat ... is supposed to be used with Study.optimize": _heartbeat beats for us.
            warnings.filterwarnings("ignore", "Heartbeat of storage")
            trial = study.ask()
        asked += 1
        try:
            with _heartbeat(storage, study, trial):
                counted = _screen(ctx, study, trial, space, reporter, memory, budget)
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
            now = _best_value(study, cfg.objective)
            if _improved(best, now, memory.minimize):
                best, stale = now, 0
            elif _refining(study, cfg, space):
                stale += 1
        elif "repeat_of" in trial.user_attrs and _refining(study, cfg, space):
            stale += 1  # the sampler proposes what it has measured: it has nothing new to try
    if budget.left() <= 0:  # the last worker ran into the end of the budget
        stopped_by = "time budget"
    summary = _finalize(ctx, study, reporter, Memory.of(study), budget, space)
    summary = replace(summary, reference_s=reference_s, wall_s=time.monotonic() - budget.started,
                      time_budget_s=budget.seconds, stopped_by=stopped_by,
                      load={"before": before.to_dict(), **summary.load})  # fmt: skip
    ctx.store.finish_study(ctx.name, winner_uid=summary.winner.uids[-1] if summary.winner and summary.winner.uids else None,
                           summary=summary.to_dict())  # fmt: skip
    return summary


def _check_budget(ctx: StudyContext, budget: Budget, reporter: Reporter) -> float:
    """Compute the reference and build the baseline, timed; refuse a budget that cannot measure even
    the baseline (ORT fp32 default). Returns the seconds the reference took.

    A baseline measurement is the reference (once), a build worker and a measure worker (which
    costs at least what the build worker did, plus the screening's timed phase).
    """
    started = time.monotonic()
    try:
        reference(ctx.model, ctx.data, ctx.settings, lambda p: reporter.phase(f"reference: {p}"))
    except TrialFailed as failure:  # stored like any trial whose reference failed, then raised
        failed = TrialResult.failed(uuid4().hex, BASELINE, failure.kind, failure.detail, extra={"reference_failed": True})
        ctx.store.add_trial(failed, model=ModelRecord.of(ctx.model), device=DeviceRecord.of(ctx.device),
                            command=ctx.command, study=ctx.name, phase="screening")  # fmt: skip
        raise
    referenced = time.monotonic()
    prepare(ctx.model, BASELINE, ctx.data, ctx.settings, progress=lambda p: reporter.phase(f"baseline: {p}"))
    build_s = time.monotonic() - referenced
    need = (time.monotonic() - started) + build_s + ctx.settings.policy.min_duration_s
    if budget.seconds is not None and budget.seconds < need:
        raise UsageError(f"--time-budget {duration_text(budget.seconds)} is too small: measuring even the baseline "
                         f"(ONNX Runtime fp32) takes about {duration_text(need)} here",
                         fix=f"give --time-budget {math.ceil(need * 2)}s or more")  # fmt: skip
    return referenced - started


def _finalist_reserve(cfg: StudyConfig, memory: Memory, budget: Budget) -> float:
    """Seconds screening leaves for the finalists: their runs at the screening's cost per run, each
    longer by the extra timed seconds; at least one round, else at most 30% of the budget (fewer
    rounds fit then)."""
    if budget.seconds is None or cfg.finalists.count == 0 or cfg.objective not in ("latency", "throughput"):
        return 0.0
    if not memory.timing_s:
        return 0.0
    f = cfg.finalists
    per_run = sum(memory.timing_s) / len(memory.timing_s) + max(0.0, f.min_duration_s - cfg.screening.min_duration_s)
    one_round = per_run * (f.count + 1)  # the finalists and the baseline
    return min(one_round * f.rounds, max(one_round, 0.3 * budget.seconds))


def _best_value(study: optuna.Study, objective: str) -> float | None:
    """The best feasible screening value so far (single objective), or ``None``."""
    if len(DIRECTIONS[objective]) != 1:
        return None
    top = ranked(study, objective)
    return top[0].values[0] if top else None


def _improved(old: float | None, new: float | None, minimize: bool) -> bool:
    """``new`` beats ``old`` by more than IMPROVEMENT (a first value always does)."""
    if new is None:
        return False
    if old is None:
        return True
    return new < old * (1 - IMPROVEMENT) if minimize else new > old * (1 + IMPROVEMENT)


def _refining(study: optuna.Study, cfg: StudyConfig, space: SearchSpace) -> bool:
    """Every engine × precision has had its look (none waits, none is left): the sampler refines now."""
    if cfg.sampler == "grid":
        return False
    return not study.get_trials(deepcopy=False, states=(_state().WAITING,)) and not unseen_branches(study, space)


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


def _screen(ctx: StudyContext, study: optuna.Study, trial: optuna.Trial, space: SearchSpace,
            reporter: Reporter, memory: Memory, budget: Budget) -> bool:  # fmt: skip
    """Tell the study about one suggested config; True when it cost a measurement (pruned and repeated configs don't)."""
    state = _state()
    config = suggest(trial, space)
    trial.set_user_attr("config", config.to_dict())
    artifact = _artifact_key(ctx, config)
    trial.set_user_attr("artifact_key", artifact)
    reason = next((r for c in ctx.shape_cases() if (r := unsupported_reason(config, ctx.device, c.model))), None)
    branch = f"{config.engine}/{config.precision}"
    reason = reason or memory.dead.get(artifact) or memory.slower.get(branch)
    earlier = memory.seen.get(config.key())
    if not reason and earlier is None and _refining(study, ctx.config, space):  # every branch had its look: refine only contenders
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
    measured = _measure(replace(ctx, settings=budget.capped(ctx.settings)), config, reporter, memory=memory)
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
        if kind in ("build_failed", "load_failed"):  # the artifact's fault, whatever the runtime knobs
            verb = "built" if kind == "build_failed" else "loaded"
            _bury(trial, memory, artifact, f"trial {trial.number} {verb} the same artifact and failed: "
                  f"{measured.failure}")  # fmt: skip
        study.tell(trial, state=state.FAIL)
        return True
    found = violations(measured.metrics, ctx.config.constraints, ctx.config.objective)
    if not feasible(found):  # what the summary lists: each broken constraint with its value and limit
        trial.set_user_attr("rejected", [asdict(r) for r in _rejections(ctx, measured)])
    if found.get("accuracy_drop", 0.0) > 0:
        _bury(trial, memory, artifact, f"trial {trial.number} measured the same artifact and it breaks the "
              f"accuracy budget (drop {measured.metrics.accuracy_drop:.2%})")  # fmt: skip
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


def _rejections(ctx: StudyContext, measured: _Measured) -> list[Rejection]:
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
    if budget.seconds is None or not registry.get(config.engine).slow_build or artifact in memory.artifacts:
        return ""
    build_s = memory.build_s.get(config.engine, SLOW_BUILD_GUESS_S)
    need = build_s + ctx.settings.policy.min_duration_s + _finalist_reserve(ctx.config, memory, budget)
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
class _Measured:
    metrics: Metrics | None
    uid: str
    failure: str | None = None
    reused: bool = False  # taken from the store: nothing ran
    samples_ms: tuple[float, ...] = ()
    #: Per shape key, that shape's measurement (several shapes only).
    per_shape: dict[str, _Measured] = field(default_factory=dict)
    accuracy: Accuracy | None = None
    accuracy_uid: str = ""  # the trial that measured ``accuracy`` (this one, unless it was reused)
    artifact_path: str | None = None
    artifact_reused: bool = False  # measured on an artifact built for an earlier config: no build worker
    wall_s: dict[str, float] = field(default_factory=dict)  # build, timing, accuracy seconds
    ci: tuple[float, float] | None = None  # the screening value's 95% CI (latency)
    load: machine_load.Load | None = None  # how busy the machine was while it was timed (the busiest shape)

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


#: The MLPerf scenario each objective is measured in: throughput with requests in flight (offline).
SCENARIO_OF = {"latency": "single-stream", "pareto": "single-stream", "throughput": "offline", "server": "server"}


def _measure(ctx: StudyContext, config: TrialConfig, reporter: Reporter, phase: str = "screening",
             memory: Memory | None = None) -> _Measured:  # fmt: skip
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
            return _Measured(None, measured.uid, failure, per_shape=per_shape, wall_s=_walls(per_shape))
    metrics = combine([(c.weight, per_shape[c.key].metrics) for c in cases])  # type: ignore[misc]
    last = per_shape[cases[-1].key]
    loads = [m.load for m in per_shape.values() if m.load is not None]
    return _Measured(metrics, last.uid, reused=all(m.reused for m in per_shape.values()), per_shape=per_shape,
                     wall_s=_walls(per_shape), load=max(loads, key=lambda x: x.other_cores, default=None))  # fmt: skip


def _walls(per_shape: dict[str, _Measured]) -> dict[str, float]:
    """Build, timing and accuracy seconds over every shape."""
    out: dict[str, float] = {}
    for measured in per_shape.values():
        for part, seconds in measured.wall_s.items():
            out[part] = out.get(part, 0.0) + seconds
    return out


def combine(weighted: list[tuple[float, Metrics]]) -> Metrics:
    """One set of metrics for a weighted mix of shapes: latencies are the mix's expected latency
    (weighted mean), throughput the mix's items/s (weighted harmonic mean), accuracy drop and
    memory the worst shape's, so a config that fails at one shape fails for the mix."""
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
                   max(m.accuracy_drop for m in ms), rate([m.server_rate for m in ms]))  # fmt: skip


def _measure_case(
    ctx: StudyContext, case: StudyCase, config: TrialConfig, reporter: Reporter, phase: str,
    memory: Memory | None,
) -> _Measured:
    """Metrics of ``config`` at one shape: from the store when measured before here, else a fresh trial (stored)."""
    cfg = ctx.config
    at = f" at {case.key}" if len(ctx.shape_cases()) > 1 else ""
    if not cfg.fresh and cfg.objective != "server" and phase == "screening":
        version = registry.get(config.engine).probe_version()
        repeat = TrialFilter(model_sha256=case.model.sha256, device=ctx.device.fingerprint, config_key=config.key(),
                             engine_version=version, shape_key=case.key, scenario=SCENARIO_OF[cfg.objective],
                             measured_only=True, newest_first=True)  # fmt: skip
        row = ctx.store.trial(repeat, samples=False)
        if row is not None and row.accuracy is not None:
            return _Measured(Metrics.of_row(row), row.uid, reused=True, accuracy=row.accuracy, accuracy_uid=row.uid)
    artifact_key = _artifact_key(ctx, config) if memory is not None else ""
    built = memory.artifacts.get(artifact_key) if memory is not None else None
    if built is not None and not (Path(built) / "artifact.json").is_file():
        built = None  # removed since (a cleared cache): build it again
    known = memory.accuracy.get(accuracy_key(artifact_key, config.batch)) if memory is not None else None
    reporter.phase(f"{config.label()}{at}: starting")
    result = run_trial(case.model, config, case.data, ctx.settings,
                       progress=lambda p: reporter.phase(f"{config.label()}{at}: {p}"),
                       scenario=SCENARIO_OF[cfg.objective],
                       sla_ms=cfg.constraints.sla_ms if cfg.objective == "server" else None,
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
        return _Measured(None, result.uid, f"{result.failure_kind}: {headline(result.failure_message)}", **common)
    used = result.extra.get("accuracy_reused_from") or result.uid
    if memory is not None:
        memory.learn({"config": config.to_dict(), "artifact_key": artifact_key, "uid": result.uid,
                      "artifact_path": result.artifact_path, "accuracy": asdict(result.accuracy), "accuracy_uid": used})  # fmt: skip
    latency = result.latency
    ci = latency.p90_ci if latency.p90_ci is not None else latency.median_ci
    return _Measured(Metrics.of_result(result), result.uid, samples_ms=result.samples_ms, accuracy=result.accuracy,
                     accuracy_uid=used, ci=ci if cfg.objective == "latency" else None,
                     load=result.measurement.load if result.measurement is not None else None, **common)  # fmt: skip


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


def _finalize(ctx: StudyContext, study: optuna.Study, reporter: Reporter, memory: Memory,
              budget: Budget, space: SearchSpace) -> StudySummary:  # fmt: skip
    counts: dict[str, int] = {}
    trials = study.get_trials(deepcopy=False)
    for t in trials:
        kind = "repeated" if "repeat_of" in t.user_attrs else t.state.name.lower()  # repeats cost nothing
        counts[kind] = counts.get(kind, 0) + 1
    skipped = list(dict.fromkeys(t.user_attrs["budget_skip"] for t in trials if t.user_attrs.get("budget_skip")))
    behind = memory.behind if _refining(study, ctx.config, space) else {}
    rejected = _rejected(trials)
    learned = {"deprioritized": {**behind, **memory.slower}, "skipped": _first_per_branch(skipped),
               "failures": _failures(trials), "rejected": rejected}  # fmt: skip
    runs: list[tuple[str, dict[str, float]]] = []  # this run's finalist workers: engine, wall seconds
    summary = _decide(ctx, study, reporter, memory, budget, counts, runs)
    if rejected and not feasible_trials(study):  # no trial meets the constraints: say which came closest, by what
        closest = rejected[0]
        learned["closest"] = closest
        learned["note"] = f"no trial meets the constraints; closest: {closest.text()}" + (
            "; the fastest measured is shown as best-so-far and is not a winner" if summary.finalists else "")
    return replace(summary, time_by_engine=_time_by_engine(trials, runs), **learned)


def _rejected(trials: list[optuna.trial.FrozenTrial]) -> list[Rejected]:
    """Every config a constraint rejected (the ``rejected`` its trials recorded), once, closest first: fewest
    constraints broken, then the smallest miss summed over them (each as a fraction of its limit). A
    config that also has a trial meeting every constraint is not rejected."""
    ok = {TrialConfig.from_dict(t.user_attrs["config"]).key() for t in trials
          if t.state.name == "COMPLETE" and t.constraints and feasible(t.constraints)}  # fmt: skip
    best: dict[str, tuple[tuple[int, float], Rejected]] = {}
    for t in trials:
        found = [Rejection(**r) for r in t.user_attrs.get("rejected") or ()]
        config = TrialConfig.from_dict(t.user_attrs["config"]) if found else None
        if config is None or config.key() in ok:
            continue
        rank = (len(found), sum(r.miss for r in found))
        main = max(found, key=lambda r: r.miss)
        entry = Rejected(config.label(), main.constraint, main.value, main.limit, main.unit,
                         "; ".join(r.reason for r in found))  # fmt: skip
        if config.key() not in best or rank < best[config.key()][0]:
            best[config.key()] = (rank, entry)
    return [entry for _, entry in sorted(best.values(), key=lambda pair: pair[0])]


def failure_kind(failure: str | None) -> str | None:
    """``build_failed`` from a trial's stored failure, ``"build_failed: ..."`` or ``"at x=1x3: build_failed: ..."``."""
    if not failure:
        return None
    text = failure.split(": ", 1)[1] if failure.startswith("at ") and ": " in failure else failure
    return text.split(":", 1)[0].strip() or None


def _failures(trials: list[optuna.trial.FrozenTrial]) -> dict[str, dict[str, Any]]:
    """Failed trials by kind, each with a count and its first example (config and reason)."""
    found: dict[str, dict[str, Any]] = {}
    for t in trials:
        kind = failure_kind(t.user_attrs.get("failure")) if t.state.name == "FAIL" else None
        if kind is None:
            continue
        entry = found.setdefault(kind, {"count": 0, "config": TrialConfig.from_dict(t.user_attrs["config"]).label(),
                                        "reason": t.user_attrs["failure"]})  # fmt: skip
        entry["count"] += 1
    return found


def _decide(ctx: StudyContext, study: optuna.Study, reporter: Reporter, memory: Memory, budget: Budget,
            counts: dict[str, int], runs: list[tuple[str, dict[str, float]]]) -> StudySummary:  # fmt: skip
    """The finalists and the winner: re-measured interleaved when the objective and the time allow."""
    cfg = ctx.config
    top = _contenders(ranked(study, cfg.objective), max(cfg.finalists.count, 1))
    if not top:
        return _best_so_far(study, cfg.objective, counts, ctx.name)
    remeasure = cfg.finalists.count > 0 and cfg.objective in ("latency", "throughput")
    if not remeasure or budget.left() <= 0:
        finalists = [_from_screening(t) for t in top]
        why = "not re-measured" if not remeasure else "the time budget ran out before the finalists"
        return StudySummary(ctx.name, cfg.objective, counts, finalists, finalists[0],
                            note=f"winner from screening values ({why})", screening_only=True,
                            confidence=f"screening only: one short run per config ({why})")  # fmt: skip
    configs = [TrialConfig.from_dict(t.user_attrs["config"]) for t in top]
    baseline_ok = registry.get(BASELINE.engine).probe(ctx.device).available
    with_baseline = baseline_ok and BASELINE.key() not in {c.key() for c in configs}
    finalists, rounds, settled, statistic, reran = _interleaved(ctx, [*configs, *([BASELINE] if with_baseline else [])],
                                                                reporter, memory, budget, runs)  # fmt: skip
    summary = replace(_choose(ctx.name, cfg.objective, counts, finalists, statistic),
                      load=_rounds_load(finalists, rounds, reran))
    confidence = f"re-measured interleaved: {rounds} of {cfg.finalists.rounds} rounds"
    if rounds < cfg.finalists.rounds:
        confidence += " (every other finalist fell wholly behind)" if settled else " (the time budget ran out)"
    if summary.winner is not None:
        confidence += f", {summary.winner.n_samples} samples of the winner"
        what = "items/s" if statistic == "items/s" else f"its {statistic}"
        confidence += f"; each round gives each config {what}, compared paired by round"
    if summary.screening_only:
        confidence += f"; screening only: a winner claim needs {MIN_WINNER_ROUNDS} rounds"
    return replace(summary, confidence=confidence)


def _contenders(ranked_trials: list[optuna.trial.FrozenTrial], count: int) -> list[optuna.trial.FrozenTrial]:
    """The finalists: the best config of each engine × precision first (the interleaved runs judge
    branches against each other, and one lucky screening run must not crowd out the other branches),
    then the next best configs; in screening order. The rounds drop those that fall wholly behind."""
    firsts, seen = [], set()
    for t in ranked_trials:
        c = t.user_attrs["config"]
        if (c["engine"], c["precision"]) not in seen:
            seen.add((c["engine"], c["precision"]))
            firsts.append(t)
    rest = [t for t in ranked_trials if t not in firsts]
    chosen = [*firsts, *rest][:count]
    return sorted(chosen, key=ranked_trials.index)


def _first_per_branch(reasons: list[str]) -> list[str]:
    """One skip reason per ``engine/precision``: the first, as the user was told it."""
    by: dict[str, str] = {}
    for reason in reasons:
        by.setdefault(reason.split(":")[0], reason)
    return list(by.values())


def _time_by_engine(trials: list[optuna.trial.FrozenTrial],
                    runs: list[tuple[str, dict[str, float]]]) -> dict[str, dict[str, float]]:  # fmt: skip
    """Build, accuracy and timing seconds per engine, and the worker runs they add up over."""
    walls = [(t.user_attrs["config"]["engine"], t.user_attrs["wall_s"]) for t in trials if t.user_attrs.get("wall_s")]
    out: dict[str, dict[str, float]] = {}
    for engine, wall in [*walls, *runs]:
        row = out.setdefault(engine, {"build_s": 0.0, "accuracy_s": 0.0, "timing_s": 0.0, "runs": 0})
        for part in ("build", "accuracy", "timing"):
            row[f"{part}_s"] += float(wall.get(part, 0.0))
        row["runs"] += 1
    return out


def _interleaved(ctx: StudyContext, configs: list[TrialConfig], reporter: Reporter, memory: Memory, budget: Budget,
                 runs: list[tuple[str, dict[str, float]]]) -> tuple[list[Finalist], int, bool, str, list[dict[str, Any]]]:  # fmt: skip
    """A B C A B C …: every round runs each config once (at every shape), in a rotated order, so drift hits all alike.

    Each round gives each config one value (:func:`_round_values`). Successive halving on
    measurement length: after each round a config wholly behind the leader, paired by round
    (:func:`_still_in`), runs no more rounds; its values stay those of the rounds it ran. The
    baseline (ORT fp32 default) runs every round: the speed-up is paired on its rounds. Under a
    time budget a round starts only when the time left pays for one more (as long as the rounds
    so far took). A round that ran under load runs once more when the time left pays for it (at most
    LOAD_RERUNS per study run), and the less loaded of its two runs is kept, whole: each round's values
    stay paired. Returns the finalists, the rounds run, whether the rounds ended early because one
    config was left, the statistic each round was reduced to, and the rounds run again.
    """
    f = ctx.config.finalists
    objective = ctx.config.objective
    policy = TimingPolicy(min_samples=f.min_samples, min_duration_s=f.min_duration_s,
                          max_duration_s=max(60.0, 4 * f.min_duration_s))  # fmt: skip
    long_ctx = replace(ctx, settings=replace(ctx.settings, policy=policy))
    cases = ctx.shape_cases()
    # per config, per round: that run's calls at each shape (None: not run or failed), and its items/s
    calls: list[list[dict[str, list[float]] | None]] = [[] for _ in configs]
    rates: list[list[float | None]] = [[] for _ in configs]
    uids: list[list[str]] = [[] for _ in configs]
    failures: list[str | None] = [None for _ in configs]
    loads: list[list[float | None]] = [[] for _ in configs]  # cores other processes kept busy over each run
    reran: list[dict[str, Any]] = []
    baseline = next((i for i, c in enumerate(configs) if c.key() == BASELINE.key()), None)
    reporter.finalists(f.rounds * len(configs))
    started, rounds, settled = time.monotonic(), 0, False
    active = list(range(len(configs)))

    for r in range(f.rounds):
        if r > 0 and budget.left() < (time.monotonic() - started) / r:
            reporter.note(f"the time budget pays for {r} of {f.rounds} finalist rounds; the winner rests on those")
            break
        if r > 0:
            # after one round only a clear gap counts (drift between A and B is not yet averaged out)
            margin = FIRST_ROUND_MARGIN if r == 1 else 0.0
            values, _ = _round_values(calls, rates, cases, objective)
            # before a winner claim's rounds have run, the leader keeps its closest rival (one round's gap
            # ended the rounds with a screening-only winner whose interval rested on nothing)
            active = _still_in([(i, values[i]) for i in active], objective, margin, keep=baseline,
                               rival=r < MIN_WINNER_ROUNDS)  # fmt: skip
            if len(active) == 1:
                settled = True
                break  # one config left: every other one is wholly behind it
        order = [active[(j + r) % len(active)] for j in range(len(active))]
        ran = _one_round(long_ctx, configs, order, f"{r + 1}/{f.rounds}", reporter, memory, runs)
        first = _busiest(ran)
        if (first is not None and first.under_load and len(reran) < LOAD_RERUNS
                and budget.left() >= (time.monotonic() - started) / (r + 1)):  # fmt: skip
            reporter.note(f"finalist round {r + 1} ran under load ({first.text()}); running it once more")
            reporter.rerun(len(order))
            again = _one_round(long_ctx, configs, order, f"{r + 1}/{f.rounds} again", reporter, memory, runs)
            second = _busiest(again)
            kept = "again" if second is None or second.other_cores <= first.other_cores else "first"
            ran, dropped = (again, ran) if kept == "again" else (ran, again)
            reran.append({"round": r + 1, "other_cores": [first.other_cores, None if second is None else second.other_cores],
                          "kept": kept, "dropped_uids": [m.uid for m in dropped.values()]})  # fmt: skip
        for i, measured in ran.items():
            uids[i].append(measured.uid)
            ok = measured.metrics is not None
            if not ok:
                failures[i] = measured.failure
            per_shape = measured.per_shape or {cases[0].key: measured}
            calls[i].append({k: list(one.samples_ms) for k, one in per_shape.items()} if ok else None)
            rates[i].append((measured.metrics.throughput or None) if ok else None)  # type: ignore[union-attr]
            loads[i].append(None if measured.load is None else measured.load.other_cores)
        for i in range(len(configs)):  # those that left the rounds: nothing this round
            calls[i] += [None] * (r + 1 - len(calls[i]))
            rates[i] += [None] * (r + 1 - len(rates[i]))
            loads[i] += [None] * (r + 1 - len(loads[i]))
        rounds += 1
    values, statistic = _round_values(calls, rates, cases, objective)
    medians, _ = _round_values(calls, rates, cases, objective, rstats.MEDIAN) if objective == "latency" else ([], "")
    out = []
    for i, config in enumerate(configs):
        pooled = {c.key: [x for one in calls[i] if one for x in one[c.key]] for c in cases}
        stat, ci = _over_rounds(values[i])
        per_shape = _per_shape_over_rounds(calls[i], cases, statistic) if len(cases) > 1 else {}
        shown = None  # the pooled calls' statistic, for display only
        if objective == "latency":
            shown = _mix([(c.weight, *_statistic(pooled[c.key], config.batch, objective)) for c in cases], objective)[0]
        out.append(Finalist(config, config.label(), stat, ci, sum(len(v) for v in pooled.values()), uids[i],
                            i == baseline, failures[i], per_shape, tuple(values[i]),
                            tuple(medians[i]) if medians else (), shown, tuple(loads[i])))  # fmt: skip
    return out, rounds, settled, statistic, reran


def _one_round(ctx: StudyContext, configs: list[TrialConfig], order: list[int], name: str, reporter: Reporter,
               memory: Memory, runs: list[tuple[str, dict[str, float]]]) -> dict[int, _Measured]:  # fmt: skip
    """One finalist round: each config of ``order`` (indices into ``configs``) measured once, in that order."""
    ran = {}
    for i in order:
        reporter.phase(f"finalists round {name}: {configs[i].label()}")
        ran[i] = _measure(ctx, configs[i], reporter, phase="finalist", memory=memory)
        runs.append((configs[i].engine, ran[i].wall_s))
    return ran


def _busiest(ran: dict[int, _Measured]) -> machine_load.Load | None:
    """The most loaded run of a round (``None`` where no run read its load): the round's load."""
    return max((m.load for m in ran.values() if m.load is not None), key=lambda x: x.other_cores, default=None)


def _rounds_load(finalists: list[Finalist], rounds: int, reran: list[dict[str, Any]]) -> dict[str, Any]:
    """The summary's ``load`` of the finalist rounds: the most other processes' cores per round, the rounds under load."""
    per_round = [max((f.loads[r] for f in finalists if r < len(f.loads) and f.loads[r] is not None), default=None)
                 for r in range(rounds)]  # fmt: skip
    under = [r + 1 for r, cores in enumerate(per_round) if cores is not None and machine_load.busy(cores)]
    return {"threshold_cores": machine_load.UNDER_LOAD_CORES, "rounds": per_round, "under_load": under, "reran": reran}


def _round_values(calls: list[list[dict[str, list[float]] | None]], rates: list[list[float | None]],
                  cases: tuple[StudyCase, ...], objective: str,
                  statistic: str | None = None) -> tuple[list[list[float | None]], str]:  # fmt: skip
    """One value per config per round, and its statistic's name.

    Throughput: the round's items/s (of the mix). Latency: the round's p90 at each shape (weighted
    mean over the mix), or the median when some round has too few calls for a p90 claim: one
    statistic for every round and config, so each per-round ratio compares like with like.
    """
    if objective == "throughput":
        return [list(r) for r in rates], "items/s"
    if statistic is None:
        counts = [len(one[c.key]) for per in calls for one in per if one for c in cases]
        statistic = rstats.round_statistic(counts)
    total = sum(c.weight for c in cases)
    out = []
    for per in calls:
        row: list[float | None] = []
        for one in per:
            values = [rstats.round_value(one[c.key], statistic) for c in cases] if one else [None]
            row.append(None if any(v is None for v in values)
                       else sum(c.weight * v for c, v in zip(cases, values, strict=True)) / total)  # type: ignore[operator]
        out.append(row)
    return out, statistic


def _over_rounds(values: Sequence[float | None]) -> tuple[float | None, tuple[float, float] | None]:
    """A finalist's shown statistic: the median of its per-round values, with their order-statistic interval."""
    known = [v for v in values if v is not None]
    if not known:
        return None, None
    interval = rstats.median_interval(known)
    return float(np.median(known)), None if interval is None else interval[:2]


def _per_shape_over_rounds(calls: list[dict[str, list[float]] | None], cases: tuple[StudyCase, ...],
                           statistic: str) -> dict[str, float | None]:  # fmt: skip
    out = {}
    for c in cases:
        known = [v for one in calls if one and (v := rstats.round_value(one[c.key], statistic)) is not None]
        out[c.key] = float(np.median(known)) if known else None
    return out


def _costs(f: Finalist | Sequence[float | None], objective: str) -> list[float | None]:
    """Per-round values as costs, lower is better: ms, or seconds per item for a rate."""
    values = f if not isinstance(f, Finalist) else (f.rounds or (f.statistic,))
    if objective in ("throughput", "server"):
        return [1.0 / v if v else None for v in values]
    return list(values)


def _slower(a: Sequence[float | None], b: Sequence[float | None]) -> np.ndarray:
    """Per-round cost ratios ``a / b`` (costs), over the rounds both ran: >1 where ``a`` was slower."""
    return rstats.paired_ratios(a, b)


def _leader(costs: dict[int, list[float | None]]) -> int:
    """The config (key of ``costs``) whose worst median paired ratio to any other is smallest: the one
    that beats every other in most rounds when there is such a one (then its worst ratio is below 1)."""

    def worst(i: int) -> tuple[float, float]:
        meds = [float(np.median(r)) for j in costs if j != i and (r := _slower(costs[i], costs[j])).size]
        own = [v for v in costs[i] if v is not None]
        return max(meds, default=1.0), float(np.median(own)) if own else math.inf

    return min(costs, key=worst)


def _still_in(stats: list[tuple[int, Sequence[float | None]]], objective: str, margin: float = 0.0,
              keep: int | None = None, rival: bool = False) -> list[int]:  # fmt: skip
    """The configs (by index) that can still win or tie, given each one's per-round values.

    A config is wholly behind the leader (:func:`_leader`) when it was slower in every round both
    ran, by more than ``margin`` (a fraction), and the paired interval of its ratio to the leader
    lies above 1 (one round has no interval: the margin must speak alone). ``keep`` (the baseline)
    stays while it has values: the speed-up is paired on its rounds. A config without a value yet
    (it failed) stays only when nothing has one. With ``rival``, the leader is never left alone: the
    config closest to it (lowest median paired ratio) stays, so that the winner's rounds stay paired
    until it has the rounds a winner claim needs.
    """
    costs = {i: _costs(values, objective) for i, values in stats}
    known = {i: c for i, c in costs.items() if any(v is not None for v in c)}
    if not known:
        return [i for i, _ in stats]
    lead = _leader(known)

    def behind(i: int) -> bool:
        r = _slower(known[i], known[lead])
        interval = rstats.median_interval(r)
        return bool(r.size) and bool(np.all(r > 1 + margin)) and (interval is None or interval[0] > 1)

    left = [i for i in known if i == lead or i == keep or not behind(i)]
    others = [i for i in known if i != lead and _slower(known[i], known[lead]).size]
    if rival and len(left) == 1 and others:
        closest = min(others, key=lambda i: float(np.median(_slower(known[i], known[lead]))))
        left = sorted([lead, closest])
    return left


def _mix(weighted: list[tuple[float, float | None, tuple[float, float] | None]],
         objective: str) -> tuple[float | None, tuple[float, float] | None]:  # fmt: skip
    """One statistic and interval for a mix of shapes, each bound combined like the statistic
    (weighted mean of latencies, weighted harmonic mean of rates): wider than a joint interval, never narrower."""
    if len(weighted) == 1:
        return weighted[0][1], weighted[0][2]
    if any(stat is None or ci is None for _, stat, ci in weighted):
        return None, None
    total = sum(w for w, _, _ in weighted)

    def join(values: list[float]) -> float:
        if objective == "latency":
            return sum(w * v for (w, _, _), v in zip(weighted, values, strict=True)) / total
        return total / sum(w / v for (w, _, _), v in zip(weighted, values, strict=True))

    stat = join([s for _, s, _ in weighted])  # type: ignore[misc]
    low, high = join([ci[0] for _, _, ci in weighted]), join([ci[1] for _, _, ci in weighted])  # type: ignore[index]
    return stat, (min(low, high), max(low, high))


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


def _choose(name: str, objective: str, counts: dict[str, int], finalists: list[Finalist],
            statistic: str = "p90") -> StudySummary:  # fmt: skip
    """The winner, paired by round: the leader (:func:`_leader`) on the finalists' per-round values;
    a finalist whose median per-round ratio to it is within TIE_TOLERANCE of 1, with a paired interval
    holding 1 (or too few rounds for one), ties with it, and the cheapest of the tie wins.

    The baseline (ORT fp32 default) competes too: when nothing the search found beats it, it is the
    winner. The speed-up over it is the median of the per-round ratios, for ``statistic`` and (latency)
    for the median, each with its order-statistic interval when the winner ran MIN_WINNER_ROUNDS rounds.
    """
    candidates = [f for f in finalists if f.statistic is not None and any(v is not None for v in _costs(f, objective))]
    baseline = next((f for f in finalists if f.baseline), None)
    if not candidates:
        return StudySummary(name, objective, counts, finalists, None, note="every finalist failed its re-measurement",
                            statistic=statistic)  # fmt: skip
    costs = {i: _costs(f, objective) for i, f in enumerate(candidates)}
    best = _leader(costs)

    def ties(i: int) -> bool:
        r = _slower(costs[i], costs[best])
        if not r.size or abs(float(np.median(r)) - 1) > TIE_TOLERANCE:
            return False
        interval = rstats.median_interval(r)
        return interval is None or interval[0] <= 1 <= interval[1]

    tied = [candidates[i] for i in costs if i != best and ties(i)]

    def cost(f: Finalist) -> tuple[int, int]:
        # Fewer threads, then smaller batch; the engine's default thread count means "all cores".
        return (f.config.threads or 10**6, f.config.batch)

    group = [candidates[best], *tied]
    winner = min(group, key=cost)
    n_rounds = sum(v is not None for v in winner.rounds)
    claim = n_rounds >= MIN_WINNER_ROUNDS
    speedups: dict[str, Ratio] = {}
    if baseline is not None and baseline.statistic:
        pairs = [(statistic, _costs(baseline, objective), _costs(winner, objective))]
        if objective == "latency" and statistic != rstats.MEDIAN and baseline.medians and winner.medians:
            pairs.append((rstats.MEDIAN, list(baseline.medians), list(winner.medians)))
        for which, base, won in pairs:
            if (r := _slower(base, won)).size:
                interval = rstats.median_interval(r) if claim else None
                speedups[which] = Ratio(float(np.median(r)), None if interval is None else interval[:2],
                                        None if interval is None else interval[2], int(r.size))  # fmt: skip
    main = speedups.get(statistic)
    return StudySummary(name, objective, counts, finalists, winner, [f.label for f in group if f is not winner],
                        main.value if main else None, statistic=statistic, speedups=speedups, rounds=n_rounds,
                        screening_only=not claim)  # fmt: skip


def _from_screening(t: optuna.trial.FrozenTrial) -> Finalist:
    """A finalist from its screening trial: its value and, for latency, the 95% CI of that one short run."""
    config = TrialConfig.from_dict(t.user_attrs["config"])
    ci = t.user_attrs.get("ci")
    return Finalist(config, config.label(), t.values[0], None if ci is None else (ci[0], ci[1]), 0,
                    [t.user_attrs.get("uid", "")], per_shape=dict(t.user_attrs.get("shape_values") or {}))  # fmt: skip


def _best_so_far(study: optuna.Study, objective: str, counts: dict[str, int], name: str) -> StudySummary:
    """No trial meets the constraints: show the best measured one anyway, labelled."""
    done = study.get_trials(deepcopy=False, states=(_state().COMPLETE,))
    if not done:
        return StudySummary(name, objective, counts, [], None, note="no trial produced a measurement")
    best = sorted(done, key=lambda t: t.values[0], reverse=objective in ("throughput", "server"))[0]
    return StudySummary(name, objective, counts, [_from_screening(best)], None,
                        note="no trial meets the constraints; the best-so-far is shown and is not a winner")  # fmt: skip
