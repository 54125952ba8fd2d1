"""Finalists and the winner: the best configs re-measured interleaved, round by round, judged paired by round.

Each round gives each config one value (its p90, median or items/s). The winner, a tie and the speed-up over
the ONNX Runtime fp32 default come from the per-round values paired by round; docs/architecture.md,
"Measurement rules".
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from autodeploy.adapters import registry
from autodeploy.adapters.base import TrialConfig
from autodeploy.harness import load as machine_load
from autodeploy.harness import stats as rstats
from autodeploy.harness.stats import latency_claim, summarize
from autodeploy.harness.timing import TimingPolicy
from autodeploy.objectives import OBJECTIVES, RATE
from autodeploy.results_db.history import trial_history
from autodeploy.results_db.records import TrialFilter
from autodeploy.search.budget import Budget, duration_text
from autodeploy.search.config import Finalists as FinalistsConfig
from autodeploy.search.context import Reporter, StudyCase, StudyContext
from autodeploy.search.memory import Memory
from autodeploy.search.screening import Measured, measure
from autodeploy.search.storage import ranked, trial_state
from autodeploy.search.summary import Finalist, Ratio, StudySummary
from autodeploy.verdict import FIRST_ROUND_MARGIN, TIE_TOLERANCE, against_history

if TYPE_CHECKING:
    import optuna


# TIE_TOLERANCE and FIRST_ROUND_MARGIN, what "tied" and "wholly behind" mean, are rules: autodeploy.verdict.
#: Rounds a winner claim needs (docs/architecture.md, "Measurement rules"); fewer is labelled screening only.
MIN_WINNER_ROUNDS = 3
#: A finalist round that ran under load (``harness/load.py``) runs once more, the less loaded of the two
#: kept; at most this many times per study run, so a machine that stays busy costs one round, not a doubled study.
LOAD_RERUNS = 1
#: When some of the winner's rounds paired with the baseline ran under load, the speed-up rests on fewer
#: quiet pairs than the study's rounds (a neighbour slows an all-cores baseline far more than a one-thread
#: winner, so a loaded round's ratio measures the neighbour). The two then run alone as pairs until as many
#: pairs ran quiet as the study has rounds (at least MIN_WINNER_ROUNDS): a busy machine costs time, not
#: evidence. At most this many times the finalist rounds, and no more once as many pair rounds in a row as
#: the finalist rounds ran under load (the machine stays busy). A quiet machine never pays for them.
PAIR_ROUNDS_FACTOR = 2
#: Without ``finalists.spread_s`` the finalist rounds span, first to last, at least this share of the time the study
#: ran before them (the reference and screening), so that they sample the host over a stretch like the one the
#: study did, not one moment of it: on a shared VM the host takes a vCPU for seconds to minutes without reporting
#: steal, and rounds a few seconds apart all read the same state (issue 42: 8 runs, 3 rounds each, agreed inside
#: each run and spread 1.6-2.8x between runs). The rounds' own time counts; only the rest is waited.
SPREAD_SHARE = 1.0
#: ... and at most this many seconds: waiting longer buys little more of the host's states and costs the user.
SPREAD_MAX_S = 300.0


def decide(ctx: StudyContext, study: optuna.Study, reporter: Reporter, memory: Memory, budget: Budget,
            counts: dict[str, int], runs: list[tuple[str, dict[str, float]]]) -> StudySummary:  # fmt: skip
    """The finalists and the winner: re-measured interleaved when the objective and the time allow."""
    cfg = ctx.config
    trials = ranked(study, cfg.objective)
    top = _contenders(trials, max(cfg.finalists.count, 1))
    if not top:
        return _best_so_far(study, cfg.objective, counts, ctx.name)
    remeasure = cfg.finalists.count > 0 and OBJECTIVES[cfg.objective].remeasured
    if not remeasure or budget.left() <= 0:
        finalists = [_from_screening(t) for t in top]
        why = "not re-measured" if not remeasure else "the time budget ran out before the finalists"
        return StudySummary(ctx.name, cfg.objective, counts, finalists, finalists[0],
                            note=f"winner from screening values ({why})", screening_only=True,
                            confidence=f"screening only: one short run per config ({why})")  # fmt: skip
    configs = [TrialConfig.from_dict(t.user_attrs["config"]) for t in top]
    base = ctx.baseline()
    baseline_ok = registry.get(base.engine).probe(ctx.device).available
    with_baseline = baseline_ok and base.key() not in {c.key() for c in configs}
    configs += [base] if with_baseline else []
    screened = {TrialConfig.from_dict(t.user_attrs["config"]).key(): t.values[0] for t in trials}
    finalists, rounds, settled, statistic, reran = _interleaved(ctx, configs, [screened.get(c.key()) for c in configs],
                                                                reporter, memory, budget, runs)  # fmt: skip
    summary = replace(choose(ctx.name, cfg.objective, counts, finalists, statistic),
                      load=_rounds_load(finalists, rounds, reran))
    summary = _pair_rounds(ctx, summary, reporter, memory, budget, runs)
    if unsteady := _unsteady(summary):
        summary = replace(summary, load={**summary.load, "unsteady": unsteady})
    summary = _with_history(ctx, summary)
    confidence = f"re-measured interleaved: {rounds} of {cfg.finalists.rounds} rounds"
    if span := _rounds_span(finalists):
        confidence += f" over {duration_text(span)}"
    if rounds < cfg.finalists.rounds:
        confidence += " (every other finalist fell wholly behind)" if settled else " (the time budget ran out)"
    if summary.winner is not None:
        confidence += f", {summary.winner.n_samples} samples of the winner"
        what = "items/s" if statistic == "items/s" else f"its {statistic}"
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
                            higher_is_better=OBJECTIVES[summary.objective].higher_is_better,
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


class _Schedule:
    """When each finalist round is due (seconds after the first one started) and the order its runs go in, both
    drawn from the study's seed, so a study's rounds are reproducible and another seed draws others.

    The rounds start at random points of the span (the last at its end; the spacings are those of uniform order
    statistics, a Poisson process's arrivals given their count): random times see each state of the host in
    proportion to the time it lasts, and a host state with a period of its own cannot lock onto them, as it can
    onto equal gaps. The order of each round's runs is a random permutation: no config always runs first, or
    always right after another one.
    """

    def __init__(self, seed: int, rounds: int, span_s: float) -> None:
        self.rng = np.random.default_rng((seed, 1))  # (seed, 1): a stream apart from the pair rounds' (seed)
        gaps = self.rng.exponential(1.0, max(rounds - 1, 0))
        due = span_s * np.cumsum(gaps) / gaps.sum() if gaps.size and span_s > 0 else np.zeros(gaps.size)
        self.span_s = float(span_s)
        self.due: tuple[float, ...] = (0.0, *(float(d) for d in due))

    def order(self, active: Sequence[int]) -> list[int]:
        """The configs of one round (indices), in a random order."""
        return [active[j] for j in self.rng.permutation(len(active))]


def _spread(f: FinalistsConfig, elapsed_s: float) -> float:
    """The seconds the finalist rounds span at least: ``f.spread_s``, else SPREAD_SHARE of the ``elapsed_s``
    the study ran before them, at most SPREAD_MAX_S; 0 for a single round."""
    if f.rounds < 2:
        return 0.0
    return f.spread_s if f.spread_s is not None else min(SPREAD_MAX_S, SPREAD_SHARE * elapsed_s)


def _wait(schedule: _Schedule, r: int, since: float, rounds_left: int, per_round_s: float, budget: Budget,
          reporter: Reporter) -> float:  # fmt: skip
    """Sleeps until round ``r`` is due (``since``: when the first round started); under a time budget no longer than
    leaves time for the ``rounds_left`` rounds at ``per_round_s`` each. Returns the seconds waited."""
    wait = schedule.due[r] - (time.monotonic() - since)
    if budget.seconds is not None:
        wait = min(wait, budget.left() - rounds_left * per_round_s)
    if wait <= 0:
        return 0.0
    reporter.phase(f"finalists: round {r + 1} starts in {wait:.0f} s (the rounds are spread over {schedule.span_s:.0f} s "
                   "at random times, so they sample the machine over time)")  # fmt: skip
    time.sleep(wait)
    return wait


def _interleaved(ctx: StudyContext, configs: list[TrialConfig], screened: Sequence[float | None], reporter: Reporter,
                 memory: Memory, budget: Budget, runs: list[tuple[str, dict[str, float]]],
                 ) -> tuple[list[Finalist], int, bool, str, list[dict[str, Any]]]:  # fmt: skip
    """A B C, C A B, …: every round runs each config once (at every shape), in a random order, so drift hits all alike.

    Each round gives each config one value (:func:`_round_values`). Successive halving on
    measurement length: after each round a config wholly behind the leader, paired by round
    (:func:`_still_in`; on one pair, by more than the machine moved one config between two of its
    runs: ``screened``, each config's screening value, and the rounds so far, :func:`_one_pair_margin`),
    runs no more rounds; its values stay those of the rounds it ran. The
    baseline (ORT fp32 default) runs every round: the speed-up is paired on its rounds. Under a
    time budget a round starts only when the time left pays for one more (as long as the rounds
    so far took). A round that ran under load runs once more when the time left pays for it (at most
    LOAD_RERUNS per study run), and the less loaded of its two runs is kept, whole: each round's values
    stay paired. The rounds are spread over time (:func:`_spread`, :class:`_Schedule`): a round that is not due
    yet waits, when the time budget pays for the wait beside the rounds left. Returns the finalists, the rounds
    run, whether the rounds ended early because one config was left, the statistic each round was reduced to,
    and the rounds run again.
    """
    f = ctx.config.finalists
    objective = ctx.config.objective
    long_ctx = _finalist_ctx(ctx)
    cases = ctx.shape_cases()
    # per config, per round: that run's calls at each shape (None: not run or failed), and its items/s
    calls: list[list[dict[str, list[float]] | None]] = [[] for _ in configs]
    rates: list[list[float | None]] = [[] for _ in configs]
    uids: list[list[str]] = [[] for _ in configs]
    failures: list[str | None] = [None for _ in configs]
    loads: list[list[float | None]] = [[] for _ in configs]  # cores other processes kept busy over each run
    times: list[list[float | None]] = [[] for _ in configs]  # when each run started (seconds since the epoch)
    reran: list[dict[str, Any]] = []
    baseline = next((i for i, c in enumerate(configs) if c.key() == ctx.baseline().key()), None)
    reporter.finalists(f.rounds * len(configs))
    schedule = _Schedule(ctx.config.seed, f.rounds, _spread(f, time.monotonic() - budget.started))
    started, busy_s, rounds, settled = time.monotonic(), 0.0, 0, False  # busy_s: the rounds' own time, no waits
    active = list(range(len(configs)))

    for r in range(f.rounds):
        if r > 0 and budget.left() < busy_s / r:
            reporter.note(f"the time budget pays for {r} of {f.rounds} finalist rounds; the winner rests on those")
            break
        if r > 0:
            values, _ = _round_values(calls, rates, cases, objective)
            # before a winner claim's rounds have run, the leader keeps its closest rival (one round's gap
            # ended the rounds with a screening-only winner whose interval rested on nothing; beside the
            # baseline, round 1's gap put out a faster config on a host that moved configs 2x)
            margin = _one_pair_margin([[s, *v] for s, v in zip(screened, values, strict=True)])
            active = _still_in([(i, values[i]) for i in active], objective, keep=baseline,
                               rival=r < MIN_WINNER_ROUNDS, loads=dict(enumerate(loads)), margin=margin)  # fmt: skip
            if len(active) == 1:
                settled = True
                break  # one config left: every other one is wholly behind it
            _wait(schedule, r, started, f.rounds - r, busy_s / r, budget, reporter)
        round_started = time.monotonic()
        order = schedule.order(active)
        ran = _one_round(long_ctx, configs, order, f"{r + 1}/{f.rounds}", reporter, memory, runs)
        first = _busiest(ran)
        if (first is not None and first.under_load and len(reran) < LOAD_RERUNS
                and budget.left() >= (busy_s + time.monotonic() - round_started) / (r + 1)):  # fmt: skip
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
            if measured.metrics is None:
                failures[i] = measured.failure
            one, rate, load = _entry(measured, cases)
            calls[i].append(one)
            rates[i].append(rate)
            loads[i].append(load)
            times[i].append(measured.started)
        for i in range(len(configs)):  # those that left the rounds: nothing this round
            calls[i] += [None] * (r + 1 - len(calls[i]))
            rates[i] += [None] * (r + 1 - len(rates[i]))
            loads[i] += [None] * (r + 1 - len(loads[i]))
            times[i] += [None] * (r + 1 - len(times[i]))
        busy_s += time.monotonic() - round_started
        rounds += 1
    values, statistic = _round_values(calls, rates, cases, objective)
    medians, _ = _round_values(calls, rates, cases, objective, rstats.MEDIAN) if OBJECTIVES[objective].from_calls else ([], "")
    out = []
    for i, config in enumerate(configs):
        pooled = {c.key: [x for one in calls[i] if one for x in one[c.key]] for c in cases}
        stat, ci = _over_rounds(values[i])
        per_shape = _per_shape_over_rounds(calls[i], cases, statistic) if len(cases) > 1 else {}
        shown = None  # the pooled calls' statistic, for display only
        if OBJECTIVES[objective].from_calls:
            shown = _mix([(c.weight, *_pooled(pooled[c.key])) for c in cases], objective)[0]
        out.append(Finalist(config, config.label(), stat, ci, sum(len(v) for v in pooled.values()), uids[i],
                            i == baseline, failures[i], per_shape, tuple(values[i]),
                            tuple(medians[i]) if medians else (), shown, tuple(loads[i]), tuple(times[i])))  # fmt: skip
    return out, rounds, settled, statistic, reran


def _finalist_ctx(ctx: StudyContext) -> StudyContext:
    """The study's context with the finalists' longer timing policy (their rounds measure longer than screening)."""
    f = ctx.config.finalists
    policy = TimingPolicy(min_samples=f.min_samples, min_duration_s=f.min_duration_s,
                          max_duration_s=max(60.0, 4 * f.min_duration_s))  # fmt: skip
    return replace(ctx, settings=replace(ctx.settings, policy=policy))


def _entry(measured: Measured, cases: tuple[StudyCase, ...]) -> tuple[dict[str, list[float]] | None, float | None, float | None]:
    """One run of a round as the rounds keep it: its calls at each shape (``None``: failed), its items/s,
    and the cores other processes kept busy while it ran (``None``: not read)."""
    ok = measured.metrics is not None
    per_shape = measured.per_shape or {cases[0].key: measured}
    calls = {k: list(one.samples_ms) for k, one in per_shape.items()} if ok else None
    rate = (measured.metrics.throughput or None) if ok else None  # type: ignore[union-attr]
    return calls, rate, None if measured.load is None else measured.load.other_cores


def _one_round(ctx: StudyContext, configs: list[TrialConfig], order: list[int], name: str, reporter: Reporter,
               memory: Memory, runs: list[tuple[str, dict[str, float]]]) -> dict[int, Measured]:  # fmt: skip
    """One finalist round: each config of ``order`` (indices into ``configs``) measured once, in that order."""
    ran = {}
    for i in order:
        reporter.phase(f"finalists round {name}: {configs[i].label()}")
        at = time.time()
        ran[i] = replace(measure(ctx, configs[i], reporter, phase="finalist", memory=memory), started=at)
        runs.append((configs[i].engine, ran[i].wall_s))
    return ran


def _busiest(ran: dict[int, Measured]) -> machine_load.Load | None:
    """The most loaded run of a round (``None`` where no run read its load): the round's load."""
    return max((m.load for m in ran.values() if m.load is not None), key=lambda x: x.other_cores, default=None)


def _rounds_load(finalists: list[Finalist], rounds: int, reran: list[dict[str, Any]]) -> dict[str, Any]:
    """The summary's ``load`` of the finalist rounds: the most other processes' cores per round, the rounds under load."""
    per_round = [max((f.loads[r] for f in finalists if r < len(f.loads) and f.loads[r] is not None), default=None)
                 for r in range(rounds)]  # fmt: skip
    under = [r + 1 for r, cores in enumerate(per_round) if cores is not None and machine_load.busy(cores)]
    return {"threshold_cores": machine_load.UNDER_LOAD_CORES, "rounds": per_round, "under_load": under, "reran": reran}


def _unsteady(summary: StudySummary) -> list[dict[str, Any]]:
    """The winner and the baseline, where the rounds in which neither ran under load read values more than
    UNSTEADY_SPREAD apart (``harness/load.py``): the machine moved them with no load its meter sees, and the
    speed-up moves with it. Each: the config's label and its lowest and highest value over those rounds."""
    base = next((f for f in summary.finalists if f.baseline), None)
    if summary.winner is None or base is None or summary.winner.baseline:
        return []
    quiet, _ = _quiet_pairs(base, summary.winner)
    out = []
    for f in (summary.winner, base):
        values = [f.rounds[r] for r in quiet if f.rounds[r] is not None]
        if machine_load.unsteady(values):
            out.append({"config": f.label, "baseline": f.baseline, "low": min(values), "high": max(values)})
    return out


def _round_values(calls: list[list[dict[str, list[float]] | None]], rates: list[list[float | None]],
                  cases: tuple[StudyCase, ...], objective: str,
                  statistic: str | None = None) -> tuple[list[list[float | None]], str]:  # fmt: skip
    """One value per config per round, and its statistic's name, as the objective's row says
    (:attr:`~autodeploy.objectives.Objective.rounds`).

    :data:`~autodeploy.objectives.RATE`: the round's items/s (of the mix). :data:`~autodeploy.objectives.CALLS`:
    the round's p90 at each shape (mixed as the row mixes them: :meth:`~autodeploy.objectives.Objective.mix`),
    or the median when some round has too few calls for a p90 claim: one statistic for every round and
    config, so each per-round ratio compares like with like.
    """
    rule = OBJECTIVES[objective]
    if rule.rounds == RATE:
        return [list(r) for r in rates], "items/s"
    if statistic is None:
        counts = [len(one[c.key]) for per in calls for one in per if one for c in cases]
        statistic = rstats.round_statistic(counts)
    weights = [c.weight for c in cases]
    out = []
    for per in calls:
        row: list[float | None] = []
        for one in per:
            values = [rstats.round_value(one[c.key], statistic) for c in cases] if one else [None]
            row.append(None if any(v is None for v in values) else rule.mix(weights, values))  # type: ignore[arg-type]
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
    """Per-round values as costs, lower is better (:meth:`~autodeploy.objectives.Objective.cost`): ms, or seconds
    per item for a rate."""
    values = f if not isinstance(f, Finalist) else (f.rounds or (f.statistic,))
    return [OBJECTIVES[objective].cost(v) for v in values]


def _loaded(loads: Sequence[float | None], r: int) -> bool:
    """Whether round ``r`` ran under load (``harness/load.py``); a load not read counts as quiet."""
    cores = loads[r] if r < len(loads) else None
    return cores is not None and machine_load.busy(cores)


def _quiet(costs: Sequence[float | None], loads: Sequence[float | None]) -> list[float | None]:
    """``costs`` with the rounds that ran under load left out (``None``)."""
    return [None if _loaded(loads, r) else v for r, v in enumerate(costs)]


def _pairing(costs: dict[int, list[float | None]],
             loads: dict[int, Sequence[float | None]]) -> Callable[[int, int], np.ndarray]:  # fmt: skip
    """Per-round ratios of config ``i`` to ``j`` on the rounds in which neither ran under load, or on every
    round both ran when there is none. A neighbour slows a config on every core far more than one on a
    single thread: a loaded round picks the thread count that suffers the neighbour least, not the fastest."""
    quiet = {i: _quiet(c, loads.get(i, ())) for i, c in costs.items()}

    def pairs(i: int, j: int) -> np.ndarray:
        return r if (r := _slower(quiet[i], quiet[j])).size else _slower(costs[i], costs[j])

    return pairs


def _slower(a: Sequence[float | None], b: Sequence[float | None]) -> np.ndarray:
    """Per-round cost ratios ``a / b`` (costs), over the rounds both ran: >1 where ``a`` was slower."""
    return rstats.paired_ratios(a, b)


def _leader(costs: dict[int, list[float | None]], pairs: Callable[[int, int], np.ndarray] | None = None) -> int:
    """The config (key of ``costs``) whose worst median paired ratio to any other is smallest: the one
    that beats every other in most rounds when there is such a one (then its worst ratio is below 1).
    ``pairs(i, j)`` gives the per-round ratios of ``i`` to ``j`` (default: every round both ran)."""
    pairs = pairs or (lambda i, j: _slower(costs[i], costs[j]))

    def worst(i: int) -> tuple[float, float]:
        meds = [float(np.median(r)) for j in costs if j != i and (r := pairs(i, j)).size]
        own = [v for v in costs[i] if v is not None]
        return max(meds, default=1.0), float(np.median(own)) if own else math.inf

    return min(costs, key=worst)


def _one_pair_margin(runs: Sequence[Sequence[float | None]]) -> float:
    """The gap one pair of runs must show to put a config out: FIRST_ROUND_MARGIN, or wider where the
    machine has moved one config more than that between two of its runs (``runs``: per config, its
    values so far, screening's and each round's; ms or items/s alike). Two equal configs can read as
    far apart as one config reads from itself: a shared VM's host, taking a vCPU without reporting
    steal, moved one ONNX Runtime config 1.99-2.13x between quiet runs, and a 10% margin then put out a
    config 1.5x faster than the winner after one round in 2 of 6 benchmark runs."""
    moved = 1.0
    for values in runs:
        known = [v for v in values if v is not None and v > 0]
        if len(known) > 1:
            moved = max(moved, max(known) / min(known))
    return max(FIRST_ROUND_MARGIN, moved - 1.0)


def _still_in(stats: list[tuple[int, Sequence[float | None]]], objective: str, keep: int | None = None,
              rival: bool = False, loads: dict[int, Sequence[float | None]] | None = None,
              margin: float = FIRST_ROUND_MARGIN) -> list[int]:  # fmt: skip
    """The configs (by index) that can still win or tie, given each one's per-round values.

    A config is wholly behind the leader (:func:`_leader`) when it was slower in every round both
    ran and the paired interval of its ratio to the leader lies above 1; on one pair (no interval)
    only by more than ``margin``, a gap the machine alone has not made (:func:`_one_pair_margin`). ``keep`` (the
    baseline) stays while it has values: the speed-up is paired on its rounds. A config without a
    value yet (it failed) stays only when nothing has one. With ``rival``, the leader never runs on
    alone: the config closest to it (lowest median paired ratio) stays, so that the winner's rounds stay
    paired. Beside ``keep`` alone (the baseline runs every round for the speed-up; it is the yardstick, no
    contender) the closest stays while its median ratio is within ``margin``: a contender that a
    swing of the machine could have put behind in the first rounds is judged on the rounds a winner
    claim needs. Configs are compared on the rounds in which neither ran under load (``loads`` per
    config; :func:`_pairing`).
    """
    costs = {i: _costs(values, objective) for i, values in stats}
    known = {i: c for i, c in costs.items() if any(v is not None for v in c)}
    if not known:
        return [i for i, _ in stats]
    pairs = _pairing(known, loads or {})
    lead = _leader(known, pairs)

    def behind(i: int) -> bool:
        r = pairs(i, lead)
        interval = rstats.median_interval(r)
        gap = margin if r.size == 1 else 0.0  # one pair: only a gap the machine's own swings do not explain
        return bool(r.size) and bool(np.all(r > 1 + gap)) and (interval is None or interval[0] > 1)

    left = [i for i in known if i == lead or i == keep or not behind(i)]
    beside = [i for i in left if i != lead]
    others = [i for i in known if i not in (lead, keep) and pairs(i, lead).size]
    if rival and others and all(i == keep for i in beside):
        closest = min(others, key=lambda i: float(np.median(pairs(i, lead))))
        if not beside or float(np.median(pairs(closest, lead))) <= 1 + margin:
            left = sorted([*left, closest])
    return left


def _mix(weighted: list[tuple[float, float | None, tuple[float, float] | None]],
         objective: str) -> tuple[float | None, tuple[float, float] | None]:  # fmt: skip
    """One statistic and interval for a mix of shapes, each bound combined like the statistic
    (:meth:`~autodeploy.objectives.Objective.mix`: the weighted mean of times, the weighted harmonic mean of
    rates): wider than a joint interval, never narrower."""
    if len(weighted) == 1:
        return weighted[0][1], weighted[0][2]
    if any(stat is None or ci is None for _, stat, ci in weighted):
        return None, None
    weights, rule = [w for w, _, _ in weighted], OBJECTIVES[objective]
    stat = rule.mix(weights, [s for _, s, _ in weighted])  # type: ignore[misc]
    low = rule.mix(weights, [ci[0] for _, _, ci in weighted])  # type: ignore[index]
    high = rule.mix(weights, [ci[1] for _, _, ci in weighted])  # type: ignore[index]
    return stat, (min(low, high), max(low, high))


def _pooled(samples_ms: list[float]) -> tuple[float | None, tuple[float, float] | None]:
    """The latency claim of calls pooled over the rounds (its p90 where it has the calls for one, else its median),
    with its interval; ``None`` below 2 calls."""
    if len(samples_ms) < 2:
        return None, None
    return latency_claim(summarize(np.asarray(samples_ms) * 1e6))


def choose(name: str, objective: str, counts: dict[str, int], finalists: list[Finalist],
            statistic: str = "p90") -> StudySummary:  # fmt: skip
    """The winner, paired by round: the leader (:func:`_leader`) on the finalists' per-round values;
    a finalist whose median per-round ratio to it is within TIE_TOLERANCE of 1, with a paired interval
    holding 1 (or too few rounds for one), ties with it, and the cheapest of the tie wins. Two configs
    are compared on the rounds in which neither ran under load (:func:`_pairing`).

    The baseline (ORT fp32 default) competes too: when nothing the search found beats it, it is the
    winner. The speed-up over it is the median of the per-round ratios, for ``statistic`` and, for a statistic
    of calls (:attr:`~autodeploy.objectives.Objective.from_calls`), for the median, each with its
    order-statistic interval when the winner ran MIN_WINNER_ROUNDS rounds.
    """
    candidates = [f for f in finalists if f.statistic is not None and any(v is not None for v in _costs(f, objective))]
    baseline = next((f for f in finalists if f.baseline), None)
    if not candidates:
        return StudySummary(name, objective, counts, finalists, None, note="every finalist failed its re-measurement",
                            statistic=statistic)  # fmt: skip
    costs = {i: _costs(f, objective) for i, f in enumerate(candidates)}
    pairs = _pairing(costs, {i: f.loads for i, f in enumerate(candidates)})
    best = _leader(costs, pairs)

    def ties(i: int) -> bool:
        r = pairs(i, best)
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
    speedups = _speedups(baseline, winner, objective, statistic, claim) if baseline is not None else {}
    main = speedups.get(statistic)
    return StudySummary(name, objective, counts, finalists, winner, [f.label for f in group if f is not winner],
                        main.value if main else None, statistic=statistic, speedups=speedups, rounds=n_rounds,
                        screening_only=not claim)  # fmt: skip


def _quiet_pairs(a: Finalist, b: Finalist) -> tuple[list[int], list[int]]:
    """The rounds (indices) both ``a`` and ``b`` have a value in, split into those in which neither run
    ran under load (:func:`_loaded`) and the others."""
    both = [r for r in range(min(len(a.rounds), len(b.rounds))) if a.rounds[r] is not None and b.rounds[r] is not None]
    quiet = [r for r in both if not _loaded(a.loads, r) and not _loaded(b.loads, r)]
    return quiet, [r for r in both if r not in quiet]


def _speedups(baseline: Finalist, winner: Finalist, objective: str, statistic: str, claim: bool) -> dict[str, Ratio]:
    """The winner's speed-up over the baseline per statistic: the median of the per-round ratios over the rounds
    in which neither ran under load, with its order-statistic interval when ``claim`` (the winner ran the rounds
    a winner claim needs), stating the coverage it claims from run to run (:func:`~autodeploy.harness.stats.
    claimed_coverage`), and the time those rounds span. A neighbour slows the all-cores baseline far more than a
    one-thread winner: a loaded round's ratio measures the neighbour. Only when no paired round ran quiet do the
    loaded ones count, flagged ``under_load``. A finalist without rounds (screening values) pairs its one value."""
    if not baseline.statistic:
        return {}
    quiet, loaded = _quiet_pairs(baseline, winner)
    kept = quiet or loaded if baseline.rounds and winner.rounds else [0]
    series = [(statistic, _costs(baseline, objective), _costs(winner, objective))]
    if OBJECTIVES[objective].from_calls and statistic != rstats.MEDIAN and baseline.medians and winner.medians:
        series.append((rstats.MEDIAN, list(baseline.medians), list(winner.medians)))
    out = {}
    for which, base, won in series:
        picked = [(r, base[r], won[r]) for r in kept if r < len(base) and r < len(won)]
        if (ratios := _slower([b for _, b, _ in picked], [w for _, _, w in picked])).size:
            interval = rstats.median_interval(ratios) if claim else None
            paired = [r for r, b, w in picked if b is not None and w is not None and w > 0]
            values = tuple(float(np.median([v[r] for r in paired])) for v in (base, won)) if paired else None
            if values and which == statistic and OBJECTIVES[objective].higher_is_better:  # costs back to rates
                values = tuple(1.0 / v for v in values)
            out[which] = Ratio(float(np.median(ratios)), None if interval is None else interval[:2],
                               None if interval is None else rstats.claimed_coverage(interval[2]), int(ratios.size),
                               len(loaded) if quiet else 0, not quiet and bool(loaded), _span(baseline, winner, paired),
                               values)  # fmt: skip
    return out


def _rounds_span(finalists: Sequence[Finalist]) -> float | None:
    """Seconds from the first finalist round's start to the last one's, over every finalist (``None``: one round)."""
    at = {(r, t) for f in finalists for r, t in enumerate(f.times) if t is not None}
    return float(max(t for _, t in at) - min(t for _, t in at)) if len({r for r, _ in at}) > 1 else None


def _span(a: Finalist, b: Finalist, rounds: Sequence[int]) -> float | None:
    """Seconds from the first to the last start of ``a``'s and ``b``'s runs in ``rounds`` (``None``: fewer than two
    rounds, or their times were not recorded)."""
    at = [t for f in (a, b) for r in rounds if r < len(f.times) and (t := f.times[r]) is not None]
    return float(max(at) - min(at)) if len(rounds) > 1 and at else None


def _pair_rounds(ctx: StudyContext, summary: StudySummary, reporter: Reporter, memory: Memory, budget: Budget,
                 runs: list[tuple[str, dict[str, float]]]) -> StudySummary:  # fmt: skip
    """Rounds of the winner and the baseline alone, in a seeded random order, while some of their paired rounds ran
    under load and fewer than :func:`_quiet_target` ran quiet: at most PAIR_ROUNDS_FACTOR times the finalist
    rounds, each while the time left pays for one more, and none once the finalist rounds' count of them in a
    row ran under load. They add to both finalists' rounds and only the speed-up is worked out again: the
    winner was chosen on the rounds every finalist ran."""
    finalists, winner = list(summary.finalists), summary.winner
    at = next((i for i, f in enumerate(finalists) if f.baseline), None)
    if winner is None or winner.baseline or at is None:
        return summary
    base, won = finalists[at], finalists.index(winner)
    cases, objective, statistic = ctx.shape_cases(), summary.objective, summary.statistic
    long_ctx, added, loaded_in_a_row, started = _finalist_ctx(ctx), 0, 0, time.monotonic()
    rounds = ctx.config.finalists.rounds
    # which runs first, per pair: a strict alternation has a period of its own (two pairs) that a periodic
    # neighbour can lock onto; a seeded random order has none and still balances the order on average
    rng = np.random.default_rng(ctx.config.seed)
    limit, target = PAIR_ROUNDS_FACTOR * rounds, _quiet_target(rounds)
    pair_s = 2 * max((sum(w.values()) for _, w in runs), default=0.0)  # a pair: two of the longest finalist runs
    while added < limit:
        quiet, loaded = _quiet_pairs(base, winner)
        if (why := _enough_pairs(len(quiet), len(loaded), target, loaded_in_a_row, rounds)) is not None:
            if why:
                reporter.note(why)
            break
        if budget.left() < ((time.monotonic() - started) / added if added else pair_s):
            reporter.note(f"the time budget pays for {added} of the speed-up's pair rounds")
            break
        if added == 0:
            reporter.note(f"{len(quiet)} of the winner's {len(quiet) + len(loaded)} rounds paired with "
                          f"{ctx.baseline_name()} ran quiet; the two run alone, up to {limit} more rounds, until "
                          f"{target} pairs run quiet")  # fmt: skip
            reporter.rerun(2 * limit)
        configs, order = [base.config, winner.config], [int(k) for k in rng.permutation(2)]
        ran = _one_round(long_ctx, configs, order, f"speed-up pair {added + 1}", reporter, memory, runs)
        base, winner = (_with_round(f, ran[k], cases, objective, statistic) for k, f in enumerate((base, winner)))
        added += 1
        loaded_in_a_row = 0 if len(_quiet_pairs(base, winner)[0]) > len(quiet) else loaded_in_a_row + 1
    if not added:
        return summary
    finalists[at], finalists[won] = base, winner
    speedups = _speedups(base, winner, objective, statistic, not summary.screening_only)
    main = speedups.get(statistic)
    load = {**summary.load, "pair_rounds": added}
    return replace(summary, finalists=finalists, winner=winner, speedups=speedups, load=load,
                   speedup_vs_baseline=main.value if main else None)  # fmt: skip


def _enough_pairs(quiet: int, loaded: int, target: int, loaded_in_a_row: int, rounds: int) -> str | None:
    """Whether the speed-up has the pairs it needs: ``None`` runs one more pair round; ``""`` stops (enough quiet
    pairs, or none ran under load); a sentence stops and says why (the last ``rounds`` pair rounds all ran under
    load: the machine stays busy, more rounds would cost time and find no quiet)."""
    if quiet >= target or not loaded:
        return ""
    if loaded_in_a_row >= rounds:
        return (f"the last {loaded_in_a_row} pair rounds ran under load: the machine stays busy, "
                f"the speed-up rests on {quiet} quiet pair{'s' if quiet != 1 else ''}")
    return None


def _quiet_target(rounds: int) -> int:
    """How many quiet pairs the speed-up rests on when load left some out: as many as the study has finalist
    rounds, and at least MIN_WINNER_ROUNDS, so a run beside a neighbour rests on as much as a quiet one."""
    return max(MIN_WINNER_ROUNDS, rounds)


def _with_round(f: Finalist, measured: Measured, cases: tuple[StudyCase, ...], objective: str,
                statistic: str) -> Finalist:  # fmt: skip
    """``f`` with one more pair round: ``measured`` reduced to the statistic its other rounds were reduced to.
    Its statistic, interval, samples and per-shape values stay those of the finalist rounds (what it was
    chosen on); the pair round serves the speed-up only."""
    calls, rate, load = _entry(measured, cases)
    value = _round_values([[calls]], [[rate]], cases, objective, statistic)[0][0][0]
    median = _round_values([[calls]], [[rate]], cases, objective, rstats.MEDIAN)[0][0][0] if f.medians else None
    times = (*f.times, *[None] * (len(f.rounds) - len(f.times)), measured.started)  # aligned with the rounds
    return replace(f, uids=[*f.uids, measured.uid], rounds=(*f.rounds, value), loads=(*f.loads, load),
                   medians=(*f.medians, median) if f.medians else (), times=times)  # fmt: skip


def _from_screening(t: optuna.trial.FrozenTrial) -> Finalist:
    """A finalist from its screening trial: its value and, for latency, the 95% CI of that one short run."""
    config = TrialConfig.from_dict(t.user_attrs["config"])
    ci = t.user_attrs.get("ci")
    return Finalist(config, config.label(), t.values[0], None if ci is None else (ci[0], ci[1]), 0,
                    [t.user_attrs.get("uid", "")], per_shape=dict(t.user_attrs.get("shape_values") or {}))  # fmt: skip


def _best_so_far(study: optuna.Study, objective: str, counts: dict[str, int], name: str) -> StudySummary:
    """No trial meets the constraints: show the best measured one anyway, labelled."""
    done = study.get_trials(deepcopy=False, states=(trial_state().COMPLETE,))
    if not done:
        return StudySummary(name, objective, counts, [], None, note="no trial produced a measurement")
    best = sorted(done, key=lambda t: t.values[0], reverse=OBJECTIVES[objective].higher_is_better)[0]
    return StudySummary(name, objective, counts, [_from_screening(best)], None,
                        note="no trial meets the constraints; the best-so-far is shown and is not a winner")  # fmt: skip
