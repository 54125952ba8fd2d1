"""The study driver: screen configs with Optuna, re-measure the finalists interleaved, pick the winner.

Plain Optuna through ask-and-tell, so each trial can be pruned with its reason, failed with
its kind, or taken from the store, and the loop can stop cleanly at any point.
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import replace
from typing import TYPE_CHECKING, Any
from uuid import uuid4

from autodeploy.adapters.base import TrialConfig
from autodeploy.errors import TrialFailed, UsageError
from autodeploy.harness import energy
from autodeploy.harness import load as machine_load
from autodeploy.harness.result import TrialResult
from autodeploy.harness.run import prepare, reference
from autodeploy.objectives import Objective
from autodeploy.results_db.store import DeviceRecord, ModelRecord
from autodeploy.search.budget import Budget, duration_text
from autodeploy.search.config import DEFAULT_TRIALS, check_study_name
from autodeploy.search.context import BASELINE, StudyCase, StudyContext
from autodeploy.search.finalists import decide
from autodeploy.search.memory import Memory
from autodeploy.search.portfolio import enqueue_grid, enqueue_neighbours, enqueue_portfolio
from autodeploy.search.reporter import Reporter
from autodeploy.search.screening import failure_kind, finalist_reserve, refining, screen
from autodeploy.search.space import SearchSpace, build_space
from autodeploy.search.storage import (
    best_label,
    claim,
    fail_stale_trials,
    feasible_trials,
    heartbeat,
    open_study,
    ranked,
    release_orphans,
    trial_state,
)
from autodeploy.search.summary import Finalist, Ratio, Rejected, StudySummary
from autodeploy.verdict import Rejection, feasible

if TYPE_CHECKING:
    import optuna


# The study's public face: run_study, what it is given and what it says (callers import them from here).
__all__ = ["BASELINE", "Finalist", "Ratio", "Rejected", "Reporter", "StudyCase", "StudyContext", "StudySummary",
           "ranked", "run_study"]  # fmt: skip

#: Without --trials (or a time budget), screening stops once every engine × precision has had its look and this many
#: measurements (or repeats the sampler asked for) in a row have not improved the best by IMPROVEMENT (the
#: number of trials is then a cap, not a target).
PATIENCE = 6
IMPROVEMENT = 0.02


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
    _check_meter(cfg.objective)
    _check_same_model_and_device(ctx)
    _check_same_judge(ctx)
    before = machine_load.sample()
    if before.under_load:
        reporter.note(f"the machine is busy before the study starts: {before.text()}; measurements that run "
                      "under load are flagged, and a finalist round under load runs once more")  # fmt: skip
    study, storage = open_study(ctx)
    release_orphans(storage, study)  # a killed run's trials, before the grid or the summary counts them
    space = build_space(cfg, ctx.device, ctx.model)
    # Store the resolved space, so a resume searches the same one even if engines were installed since.
    settings = {**cfg.model_dump(mode="json"), "engines": list(space.engines), "threads": list(space.threads),
                "batches": list(space.batches), "judge": _judge(ctx),
                "knobs": {e: {k: list(v) for k, v in c.knobs.items()} for e, c in space.engines.items()}}  # fmt: skip
    ctx.store.save_study(ctx.name, model=ModelRecord.of(ctx.model), device=DeviceRecord.of(ctx.device),
                         objective=cfg.objective.name, settings=settings, command=ctx.command)  # fmt: skip
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
    reporter.study(ctx.name, cfg.objective.name)
    reporter.start(trials, space)
    measured, asked, stopped_by = 0, 0, "trials"
    memory = Memory.of(study)
    # without --trials or a time budget, the search ends when refining stops paying off
    patient = cfg.trials is None and budget.seconds is None and cfg.sampler != "grid" and cfg.objective.single
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
        if budget.left() <= finalist_reserve(cfg, memory, budget):
            stopped_by = "time budget"
            break
        fail_stale_trials(study)
        release_orphans(storage, study)
        memory = Memory.of(study)  # read afresh: workers sharing the study learn from each other
        if cfg.sampler != "grid" and not enqueue_portfolio(study, space, ctx.device.isa) and cfg.objective.single:
            enqueue_neighbours(study, space, memory, ranked(study, cfg.objective))
        with warnings.catch_warnings():
            # "Heartbeat ... is supposed to be used with Study.optimize": heartbeat beats for us.
            warnings.filterwarnings("ignore", "Heartbeat of storage")
            trial = study.ask()
        claim(trial)
        asked += 1
        try:
            with heartbeat(storage, study, trial):
                counted = screen(ctx, study, trial, space, reporter, memory, budget)
        except ValueError as exc:
            study.tell(trial, state=trial_state().FAIL)
            if "dynamic value space" not in str(exc):
                raise
            raise UsageError(f"study {ctx.name!r} was created with another search space",
                             fix="resume it with the same engines, precisions, batches, threads and knobs, "
                             "or choose another --name") from None  # fmt: skip
        except BaseException as exc:  # Ctrl-C or a bug: close the Optuna trial so a resume starts clean
            if isinstance(exc, KeyboardInterrupt):  # not its config's failure: counted apart, asked again
                trial.set_user_attr("interrupted", "stopped by Ctrl-C")
            study.tell(trial, state=trial_state().FAIL)
            raise
        if counted:
            measured += 1
            reporter.trial_done(measured, best_label(study, cfg.objective))
            now = _best_value(study, cfg.objective)
            if _improved(best, now, memory.minimize):
                best, stale = now, 0
            elif refining(study, cfg, space):
                stale += 1
        elif "repeat_of" in trial.user_attrs and refining(study, cfg, space):
            stale += 1  # the sampler proposes what it has measured: it has nothing new to try
    if budget.left() <= 0:  # the last worker ran into the end of the budget
        stopped_by = "time budget"
    summary = _finalize(ctx, study, reporter, Memory.of(study), budget, space)
    summary = replace(summary, shapes=[{"shape": c.key, "weight": c.weight} for c in ctx.shape_cases() if c.key])
    summary = replace(summary, reference_s=reference_s, wall_s=time.monotonic() - budget.started,
                      baseline_name=ctx.baseline_name(),
                      time_budget_s=budget.seconds, stopped_by=stopped_by,
                      load={"before": before.to_dict(), **summary.load}, roofline=_limit(ctx, summary.winner))  # fmt: skip
    ctx.store.finish_study(ctx.name, winner_uid=summary.winner.uids[-1] if summary.winner and summary.winner.uids else None,
                           summary=summary.to_dict())  # fmt: skip
    return summary


def _limit(ctx: StudyContext, winner: Finalist | None) -> dict[str, Any]:
    """The winner's distance to this device's limit (:func:`autodeploy.roofline.distance`), from the rooflines
    its stored trials carry; ``{}`` without a winner or without counted operations."""
    from autodeploy.results_db.records import TrialFilter
    from autodeploy.roofline import distance

    if winner is None:
        return {}
    rows = [ctx.store.trial(TrialFilter(uid=uid), samples=False) for uid in winner.uids]
    lines = [r.measurement.roofline for r in rows if r is not None and r.measurement is not None
             and r.measurement.roofline is not None]  # fmt: skip
    return distance(lines, ctx.settings.peaks, label=winner.label, engine=winner.config.engine,
                    batch=winner.config.batch)  # fmt: skip


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
        failed = TrialResult.failed(uuid4().hex, ctx.baseline(), failure.kind, failure.detail, extra={"reference_failed": True})
        ctx.store.add_trial(failed, model=ModelRecord.of(ctx.model), device=DeviceRecord.of(ctx.device),
                            command=ctx.command, study=ctx.name, phase="screening")  # fmt: skip
        raise
    referenced = time.monotonic()
    prepare(ctx.model, ctx.baseline(), ctx.data, ctx.settings, progress=lambda p: reporter.phase(f"baseline: {p}"))
    build_s = time.monotonic() - referenced
    need = (time.monotonic() - started) + build_s + ctx.settings.policy.min_duration_s
    if budget.seconds is not None and budget.seconds < need:
        raise UsageError(f"--time-budget {duration_text(budget.seconds)} is too small: measuring even the baseline "
                         f"({ctx.baseline_name()}) takes about {duration_text(need)} here",
                         fix=f"give --time-budget {math.ceil(need * 2)}s or more")  # fmt: skip
    return referenced - started


def _best_value(study: optuna.Study, objective: Objective) -> float | None:
    """The best feasible screening value so far (single objective), or ``None``."""
    if not objective.single:
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


def _check_meter(objective: Objective) -> None:
    """An objective read from an energy meter runs only where the machine has one (its workers read the same)."""
    if not objective.needs_meter:
        return
    meters = energy.find()
    meters.close()
    if not meters.metered:
        raise UsageError(f"objective {objective.name!r} needs an energy meter and this machine has none "
                         f"({meters.why_none()})", fix="--objective cpu-time, the worker's CPU time per inference")  # fmt: skip


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


def _judge(ctx: StudyContext) -> dict[str, Any]:
    """What accuracy is judged by beyond the built-in rules: the user's metric (function and file hash) and the
    per-output overrides. Accuracy is reused per artifact and batch, so a study keeps one judge."""
    from autodeploy.harness.metric import identity

    s = ctx.settings
    return {"metric": identity(s.metric) if s.metric else None, "accuracy": list(s.accuracy_overrides)}


def _check_same_judge(ctx: StudyContext) -> None:
    """A resume judged by another metric (or overrides) would reuse accuracy measured without it: refused."""
    stored = ctx.store.get_study(ctx.name)
    if stored is None:
        return
    old = stored.settings.get("judge")
    if old is None:  # a study of an earlier version: its metric is known by name only, so any metric differs
        spec = stored.settings.get("metric")
        old = {"metric": {"function": spec.rpartition(":")[2], "sha256": None} if spec else None, "accuracy": []}
    new = _judge(ctx)
    if old != new:

        def said(judge: dict[str, Any]) -> str:
            m = judge["metric"]
            metric = "no --metric" if m is None else f"--metric …:{m['function']} (file sha256 {(m['sha256'] or '?')[:12]})"
            return metric + "".join(f", --accuracy {a}" for a in judge["accuracy"])

        raise UsageError(f"study {ctx.name!r} was judged by {said(old)}, this run by {said(new)}; its accuracy "
                         "records would be reused without the new judge",
                         fix="resume with the study's own --metric file, or choose another --name")  # fmt: skip


# -- finalists and the winner ------------------------------------------------------------


def _finalize(ctx: StudyContext, study: optuna.Study, reporter: Reporter, memory: Memory,
              budget: Budget, space: SearchSpace) -> StudySummary:  # fmt: skip
    counts: dict[str, int] = {}
    trials = study.get_trials(deepcopy=False)
    for t in trials:
        kind = ("repeated" if "repeat_of" in t.user_attrs  # repeats cost nothing
                else "interrupted" if "interrupted" in t.user_attrs else t.state.name.lower())
        counts[kind] = counts.get(kind, 0) + 1
    skipped = list(dict.fromkeys(t.user_attrs["budget_skip"] for t in trials if t.user_attrs.get("budget_skip")))
    behind = memory.behind if refining(study, ctx.config, space) else {}
    rejected = _rejected(trials)
    learned = {"deprioritized": {**behind, **memory.slower}, "skipped": _first_per_branch(skipped),
               "failures": _failures(trials), "rejected": rejected}  # fmt: skip
    runs: list[tuple[str, dict[str, float]]] = []  # this run's finalist workers: engine, wall seconds
    summary = decide(ctx, study, reporter, memory, budget, counts, runs)
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
