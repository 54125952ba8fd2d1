"""Finalists and the winner: the best configs re-measured interleaved, round by round, judged paired by round.

:func:`decide` is the study's last step: it picks the finalists (:func:`_contenders`), runs their rounds
(:mod:`autodeploy.search.rounds`), chooses the winner on them (:mod:`autodeploy.search.winner`), pairs the
winner and the baseline again where load spoiled their rounds (:mod:`autodeploy.search.pairing`), and reads
the baseline against its history on this device. Each round gives each config one value (its p90, median or
items/s, as the objective's row says); the winner, a tie and the speed-up over the ONNX Runtime fp32 default
come from the per-round values paired by round; docs/architecture.md, "Measurement rules".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from autodeploy import objectives
from autodeploy.adapters import registry
from autodeploy.adapters.base import TrialConfig
from autodeploy.results_db.history import trial_history
from autodeploy.results_db.records import TrialFilter
from autodeploy.search.budget import Budget, duration_text
from autodeploy.search.context import StudyContext
from autodeploy.search.memory import Memory
from autodeploy.search.pairing import pair_rounds, unsteady
from autodeploy.search.reporter import Reporter
from autodeploy.search.rounds import interleaved, rounds_load
from autodeploy.search.storage import ranked, trial_state
from autodeploy.search.summary import Finalist, StudySummary
from autodeploy.search.winner import MIN_WINNER_ROUNDS, choose
from autodeploy.verdict import against_history

if TYPE_CHECKING:
    import optuna


def decide(ctx: StudyContext, study: optuna.Study, reporter: Reporter, memory: Memory, budget: Budget,
            counts: dict[str, int], runs: list[tuple[str, dict[str, float]]]) -> StudySummary:  # fmt: skip
    """The finalists and the winner: re-measured interleaved when the objective and the time allow."""
    cfg = ctx.config
    trials = ranked(study, cfg.objective)
    top = _contenders(trials, max(cfg.finalists.count, 1))
    if not top:
        return _best_so_far(study, cfg.objective, counts, ctx.name)
    remeasure = cfg.finalists.count > 0 and cfg.objective.remeasured
    if not remeasure or budget.left() <= 0:
        finalists = [_from_screening(t) for t in top]
        why = "not re-measured" if not remeasure else "the time budget ran out before the finalists"
        return StudySummary(ctx.name, cfg.objective.name, counts, finalists, finalists[0],
                            note=f"winner from screening values ({why})", screening_only=True,
                            confidence=f"screening only: one short run per config ({why})")  # fmt: skip
    configs = [TrialConfig.from_dict(t.user_attrs["config"]) for t in top]
    base = ctx.baseline()
    baseline_ok = registry.get(base.engine).probe(ctx.device).available
    with_baseline = baseline_ok and base.key() not in {c.key() for c in configs}
    configs += [base] if with_baseline else []
    screened = {TrialConfig.from_dict(t.user_attrs["config"]).key(): t.values[0] for t in trials}
    finalists, rounds, settled, statistic, reran = interleaved(ctx, configs, [screened.get(c.key()) for c in configs],
                                                               reporter, memory, budget, runs)  # fmt: skip
    summary = replace(choose(ctx.name, cfg.objective, counts, finalists, statistic),
                      load=rounds_load(finalists, rounds, reran))
    summary = pair_rounds(ctx, summary, reporter, memory, budget, runs)
    if moved := unsteady(summary):
        summary = replace(summary, load={**summary.load, "unsteady": moved})
    summary = _with_history(ctx, summary)
    confidence = f"re-measured interleaved: {rounds} of {cfg.finalists.rounds} rounds"
    if span := _rounds_span(finalists):
        confidence += f" over {duration_text(span)}"
    if rounds < cfg.finalists.rounds:
        confidence += " (every other finalist fell wholly behind)" if settled else " (the time budget ran out)"
    if summary.winner is not None:
        confidence += f", {summary.winner.n_samples} samples of the winner"
        what = objectives.statistic_of(statistic).words  # its p90, items/s
        confidence += f"; each round gives each config {what}, compared paired by round"
    if summary.screening_only:
        confidence += f"; screening only: a winner claim needs {MIN_WINNER_ROUNDS} rounds"
    if summary.load.get("pair_rounds"):
        confidence += (f"; the speed-up adds {summary.load['pair_rounds']} rounds of the winner and the baseline "
                       "alone (too few of their paired rounds ran quiet)")  # fmt: skip
    return replace(summary, confidence=confidence)


def _with_history(ctx: StudyContext, summary: StudySummary) -> StudySummary:
    """``summary`` with its baseline's history on this device: the baseline's value in each earlier study of this
    model, config, shape, scenario and engine version on this device fingerprint (this study's own runs left
    out; :func:`~autodeploy.results_db.history.trial_history`), judged by :func:`~autodeploy.verdict.
    against_history`. The winner line says when today's value lies outside their range, with the speed-up
    over that range. A study over several shapes has none yet: its baseline value is a weighted mix that no
    stored trial holds."""
    base = next((f for f in summary.finalists if f.baseline), None)
    if base is None or base.statistic is None or not base.uids or len(ctx.shape_cases()) > 1:
        return summary
    today = ctx.store.trial(TrialFilter(uid=base.uids[-1]), samples=False)
    if today is None or today.measurement is None:
        return summary
    where = TrialFilter(model_sha256=ctx.model.sha256, device=ctx.device.fingerprint, config_key=base.config.key(),
                        shape_key=ctx.shape_cases()[0].key, scenario=today.measurement.scenario,
                        engine_version=today.engine_version)  # fmt: skip
    earlier, kind = trial_history(ctx.store, where, summary.statistic, exclude_study=ctx.name)
    won = summary.winner
    found = against_history(summary.statistic, base.statistic, earlier, kind=kind,
                            higher_is_better=ctx.config.objective.higher_is_better,
                            winner=won.statistic if won is not None and not won.baseline else None)  # fmt: skip
    return summary if found is None else replace(summary, baseline_history=found.to_dict())


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


def _rounds_span(finalists: Sequence[Finalist]) -> float | None:
    """Seconds from the first finalist round's start to the last one's, over every finalist (``None``: one round)."""
    at = {(r, t) for f in finalists for r, t in enumerate(f.times) if t is not None}
    return float(max(t for _, t in at) - min(t for _, t in at)) if len({r for r, _ in at}) > 1 else None


def _from_screening(t: optuna.trial.FrozenTrial) -> Finalist:
    """A finalist from its screening trial: its value and, for latency, the 95% CI of that one short run."""
    config = TrialConfig.from_dict(t.user_attrs["config"])
    ci = t.user_attrs.get("ci")
    return Finalist(config, config.label(), t.values[0], None if ci is None else (ci[0], ci[1]), 0,
                    [t.user_attrs.get("uid", "")], per_shape=dict(t.user_attrs.get("shape_values") or {}))  # fmt: skip


def _best_so_far(study: optuna.Study, objective: objectives.Objective, counts: dict[str, int],
                 name: str) -> StudySummary:  # fmt: skip
    """No trial meets the constraints: show the best measured one anyway, labelled."""
    done = study.get_trials(deepcopy=False, states=(trial_state().COMPLETE,))
    if not done:
        return StudySummary(name, objective.name, counts, [], None, note="no trial produced a measurement")
    best = sorted(done, key=lambda t: t.values[0], reverse=objective.higher_is_better)[0]
    return StudySummary(name, objective.name, counts, [_from_screening(best)], None,
                        note="no trial meets the constraints; the best-so-far is shown and is not a winner")  # fmt: skip
