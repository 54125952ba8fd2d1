"""What a study looks at before its sampler does: the grid's points, or the portfolio (every
engine × precision once, in stages) and then each contender's other thread counts.

Enqueued into the Optuna study (``enqueue_trial``), so each is asked, pruned, measured or
repeated like any suggestion, and a resume or a second worker sees what was asked already.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from autodeploy.adapters import registry
from autodeploy.adapters.base import NATIVE_ISA, TrialConfig
from autodeploy.search.memory import Memory
from autodeploy.verdict import feasible

if TYPE_CHECKING:
    import optuna

    from autodeploy.search.space import SearchSpace


def _waiting(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    from optuna.trial import TrialState

    return study.get_trials(deepcopy=False, states=(TrialState.WAITING,))


def enqueue_grid(study: optuna.Study, space: SearchSpace) -> int:
    """Enqueue every grid point the study has not run yet; return how many."""
    trials = study.get_trials(deepcopy=False)
    seen = [t.params for t in trials if "interrupted" not in t.user_attrs]
    redo = [t.system_attrs.get("fixed_params", t.params) for t in trials if "interrupted" in t.user_attrs]
    missing = [p for p in space.grid() if p not in seen]
    for params in missing:  # an interrupted point (Ctrl-C, kill -9) is asked again, though Optuna has it
        study.enqueue_trial(params, skip_if_exists=params not in redo)
    return len(missing)


def enqueue_portfolio(study: optuna.Study, space: SearchSpace, isa: tuple[str, ...] = ()) -> bool:
    """Cover before exploiting: one default config per engine × precision is looked at first, in
    stages, then the sampler refines batch, threads and knobs of the contenders. Returns whether
    the portfolio still has configs to ask (enqueued now or before).

    Stages, each enqueued once the one before has been asked: the cheap builds (precisions this
    CPU runs natively, ``isa``: bf16 with AVX512-BF16 or AMX, before the others); then int8 (its
    builds calibrate), the engine that ran fastest so far first (its int8 kernels are the likeliest
    to win); then slow converters (onnx2tf takes minutes), cheap precisions before int8.
    """
    if _waiting(study):
        return True  # a stage is still being asked
    left = unseen_branches(study, space)
    if not left:
        return False
    order = list(space.engines)
    native = {p for p, flags in NATIVE_ISA.items() if any(f in isa for f in flags)}
    stage = min(_stage(b) for b in left)
    group = [b for b in left if _stage(b) == stage]
    if stage % 2 == 0:  # cheap precisions
        group.sort(key=lambda b: (b[1] not in native, order.index(b[0])))
    else:  # int8: the fastest engine so far first, engines not measured yet after, in their order
        fastest = _engine_ranking(study)
        group.sort(key=lambda b: (fastest.index(b[0]) if b[0] in fastest else len(fastest), order.index(b[0])))
    for engine, precision in group:
        choices = space.engines[engine]
        params: dict[str, Any] = {"engine": engine, f"{engine}.precision": precision, "batch": space.batches[0]}
        if choices.threads:
            params["threads"] = max(space.threads)  # all cores: what an engine's default would use
        params.update({f"{engine}.{knob}": values[0] for knob, values in choices.knobs_of(precision).items()})
        study.enqueue_trial(params)
    return True


def enqueue_neighbours(study: optuna.Study, space: SearchSpace, memory: Memory,
                       ranked: list[optuna.trial.FrozenTrial]) -> None:  # fmt: skip
    """Once every branch has had its look: the best config of each contender branch at every other
    thread count, before the sampler goes on (the artifact is built already: a measure worker each).

    Threads are the runtime setting that moves latency most on a CPU, and the sampler, asked to
    exploit, would repeat the best config rather than try them. Nothing is enqueued while a trial
    waits, nor twice (a config looked at is skipped), so this is a local search that follows the best.
    """
    if _waiting(study):
        return
    leaders: dict[str, TrialConfig] = {}
    for t in ranked:  # feasible trials, best first (the study's ranking; single objective)
        config = TrialConfig.from_dict(t.user_attrs["config"])
        leaders.setdefault(f"{config.engine}/{config.precision}", config)
    for branch, config in leaders.items():
        choices = space.engines.get(config.engine)
        if choices is None or branch in memory.behind or branch in memory.slower or not choices.threads:
            continue
        for threads in space.threads:
            neighbour = replace(config, threads=threads)
            if neighbour.key() in memory.looked:
                continue
            params: dict[str, Any] = {"engine": config.engine, f"{config.engine}.precision": config.precision,
                                      "batch": config.batch, "threads": threads}  # fmt: skip
            params.update({f"{config.engine}.{k}": v for k, v in config.knobs.items()})
            study.enqueue_trial(params)


def _stage(branch: tuple[str, str]) -> int:
    """0: cheap builds, 1: int8 (calibrates), 2 and 3: the same on slow converters."""
    return 2 * registry.get(branch[0]).slow_build + branch[1].startswith("int8")


def unseen_branches(study: optuna.Study, space: SearchSpace) -> list[tuple[str, str]]:
    """The engine × precision branches no trial has looked at: a look stopped by a time budget, or
    interrupted (Ctrl-C, a killed run), is not one, so a resume asks the branch's first config again."""
    seen = {(t.params.get("engine"), t.params.get(f"{t.params.get('engine')}.precision"))
            for t in study.get_trials(deepcopy=False)
            if not t.user_attrs.get("budget_timeout") and "interrupted" not in t.user_attrs}  # fmt: skip
    return [(e, p) for e in space.engines for p in space.engines[e].precisions if (e, p) not in seen]


def _engine_ranking(study: optuna.Study) -> list[str]:
    """Engines by their best feasible screening value so far, best first (single objective)."""
    from optuna.trial import TrialState

    if len(study.directions) != 1:
        return []
    sign = 1 if study.directions[0].name == "MINIMIZE" else -1
    best: dict[str, float] = {}
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        if not t.constraints or not feasible(t.constraints):
            continue
        engine = t.user_attrs["config"]["engine"]
        best[engine] = min(best.get(engine, sign * t.values[0]), sign * t.values[0])
    return sorted(best, key=best.__getitem__)
