"""The finalist rounds: A B C, C A B, …, spread over time, each round reduced to one value per config.

Every round runs each config still in once (at every shape), in a seeded random order, at a seeded random
moment of a span about as long as the study ran before them (:class:`_Schedule`, :func:`_spread`), so drift and
the host's states hit every config alike. A round that ran under load runs once more (LOAD_RERUNS); after each
round a config wholly behind the leader leaves (:func:`~autodeploy.search.winner.still_in`). Each round gives
each config one value, as its objective's row says (:attr:`~autodeploy.objectives.Objective.rounds`:
:func:`round_values`); docs/architecture.md, "Measurement rules" and "Rounds over time".
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from autodeploy.adapters.base import TrialConfig
from autodeploy.harness import load as machine_load
from autodeploy.harness import stats as rstats
from autodeploy.harness.stats import latency_claim, summarize
from autodeploy.harness.timing import TimingPolicy
from autodeploy.objectives import ITEMS_PER_S, RATE, Objective
from autodeploy.search.budget import Budget
from autodeploy.search.config import SPREAD_MAX_S
from autodeploy.search.config import Finalists as FinalistsConfig
from autodeploy.search.context import StudyCase, StudyContext
from autodeploy.search.memory import Memory
from autodeploy.search.reporter import Reporter
from autodeploy.search.screening import Measured, measure
from autodeploy.search.summary import Finalist
from autodeploy.search.winner import MIN_WINNER_ROUNDS, one_pair_margin, still_in

#: A finalist round that ran under load (``harness/load.py``) runs once more, the less loaded of the two
#: kept; at most this many times per study run, so a machine that stays busy costs one round, not a doubled study.
LOAD_RERUNS = 1
#: Without ``finalists.spread_s`` the finalist rounds span, first to last, at least this share of the time the study
#: ran before them (the reference and screening), so that they sample the host over a stretch like the one the
#: study did, not one moment of it: on a shared VM the host takes a vCPU for seconds to minutes without reporting
#: steal, and rounds a few seconds apart all read the same state (issue 42: 8 runs, 3 rounds each, agreed inside
#: each run and spread 1.6-2.8x between runs). The rounds' own time counts; only the rest is waited.
SPREAD_SHARE = 1.0  # ... and at most config.SPREAD_MAX_S seconds

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
    reporter.wait(wait)  # a fleet agent's wakes on a stop or a cancel
    return wait


def interleaved(ctx: StudyContext, configs: list[TrialConfig], screened: Sequence[float | None], reporter: Reporter,
                memory: Memory, budget: Budget, runs: list[tuple[str, dict[str, float]]],
                ) -> tuple[list[Finalist], int, bool, str, list[dict[str, Any]]]:  # fmt: skip
    """A B C, C A B, …: every round runs each config once (at every shape), in a random order, so drift hits all alike.

    Each round gives each config one value (:func:`round_values`). Successive halving on
    measurement length: after each round a config wholly behind the leader, paired by round
    (:func:`still_in`; on one pair, by more than the machine moved one config between two of its
    runs: ``screened``, each config's screening value, and the rounds so far, :func:`one_pair_margin`),
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
    long_ctx = finalist_ctx(ctx)
    record = _Runs(len(configs), ctx.shape_cases())
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
            values, _ = record.values(objective)
            # before a winner claim's rounds have run, the leader keeps its closest rival (one round's gap
            # ended the rounds with a screening-only winner whose interval rested on nothing; beside the
            # baseline, round 1's gap put out a faster config on a host that moved configs 2x)
            margin = one_pair_margin([[s, *v] for s, v in zip(screened, values, strict=True)])
            active = still_in([(i, values[i]) for i in active], objective, keep=baseline,
                              rival=r < MIN_WINNER_ROUNDS, loads=dict(enumerate(record.loads)), margin=margin)  # fmt: skip
            if len(active) == 1:
                settled = True
                break  # one config left: every other one is wholly behind it
            _wait(schedule, r, started, f.rounds - r, busy_s / r, budget, reporter)
        round_started = time.monotonic()
        reporter.round(r + 1, f.rounds)
        order = schedule.order(active)
        ran = one_round(long_ctx, configs, order, f"{r + 1}/{f.rounds}", reporter, memory, runs)
        first = _busiest(ran)
        if (first is not None and first.under_load and len(reran) < LOAD_RERUNS
                and budget.left() >= (busy_s + time.monotonic() - round_started) / (r + 1)):  # fmt: skip
            reporter.note(f"finalist round {r + 1} ran under load ({first.text()}); running it once more")
            reporter.rerun(len(order))
            again = one_round(long_ctx, configs, order, f"{r + 1}/{f.rounds} again", reporter, memory, runs)
            second = _busiest(again)
            kept = "again" if second is None or second.other_cores <= first.other_cores else "first"
            ran, dropped = (again, ran) if kept == "again" else (ran, again)
            reran.append({"round": r + 1, "other_cores": [first.other_cores, None if second is None else second.other_cores],
                          "kept": kept, "dropped_uids": [m.uid for m in dropped.values()]})  # fmt: skip
        record.add(r, ran)
        busy_s += time.monotonic() - round_started
        rounds += 1
    out, statistic = record.finalists(configs, baseline, objective)
    return out, rounds, settled, statistic, reran


class _Runs:
    """What the rounds keep of each config's runs (index: the config's), round by round, aligned (``None`` where
    it ran no run that round, having left the rounds): that run's calls at each shape (``None``: failed), its
    items/s, the cores other processes kept busy over it and when it started (seconds since the epoch); and
    each config's trials' uids and last failure."""

    def __init__(self, n: int, cases: tuple[StudyCase, ...]) -> None:
        self.cases = cases
        self.calls: list[list[dict[str, list[float]] | None]] = [[] for _ in range(n)]
        self.rates: list[list[float | None]] = [[] for _ in range(n)]
        self.uids: list[list[str]] = [[] for _ in range(n)]
        self.failures: list[str | None] = [None for _ in range(n)]
        self.loads: list[list[float | None]] = [[] for _ in range(n)]
        self.times: list[list[float | None]] = [[] for _ in range(n)]

    def add(self, r: int, ran: dict[int, Measured]) -> None:
        """Round ``r``'s runs (:func:`one_round`); the configs that ran none get ``None`` for it."""
        for i, measured in ran.items():
            self.uids[i].append(measured.uid)
            if measured.metrics is None:
                self.failures[i] = measured.failure
            one, rate, load = entry(measured, self.cases)
            self.calls[i].append(one)
            self.rates[i].append(rate)
            self.loads[i].append(load)
            self.times[i].append(measured.started)
        for per_config in (self.calls, self.rates, self.loads, self.times):
            for row in per_config:
                row += [None] * (r + 1 - len(row))

    def values(self, objective: Objective,
               statistic: str | None = None) -> tuple[list[list[float | None]], str]:  # fmt: skip
        """One value per config per round so far (:func:`round_values`)."""
        return round_values(self.calls, self.rates, self.cases, objective, statistic)

    def finalists(self, configs: list[TrialConfig], baseline: int | None,
                  objective: Objective) -> tuple[list[Finalist], str]:  # fmt: skip
        """Each config as a finalist of its rounds: the median of its per-round values with their interval, its
        per-round values (and, of calls, medians) and loads, and the statistic the rounds were reduced to."""
        values, statistic = self.values(objective)
        of_calls = objective.from_calls
        medians, _ = self.values(objective, rstats.MEDIAN) if of_calls else ([], "")
        cases, out = self.cases, []
        for i, config in enumerate(configs):
            pooled = {c.key: [x for one in self.calls[i] if one for x in one[c.key]] for c in cases}
            stat, ci = _over_rounds(values[i])
            per_shape = _per_shape_over_rounds(self.calls[i], cases, statistic) if len(cases) > 1 else {}
            shown = None  # the pooled calls' statistic, for display only
            if of_calls:
                shown = _mix([(c.weight, *_pooled(pooled[c.key])) for c in cases], objective)[0]
            out.append(Finalist(config, config.label(), stat, ci, sum(len(v) for v in pooled.values()), self.uids[i],
                                i == baseline, self.failures[i], per_shape, tuple(values[i]),
                                tuple(medians[i]) if medians else (), shown, tuple(self.loads[i]),
                                tuple(self.times[i])))  # fmt: skip
        return out, statistic


def finalist_ctx(ctx: StudyContext) -> StudyContext:
    """The study's context with the finalists' longer timing policy (their rounds measure longer than screening)."""
    f = ctx.config.finalists
    policy = TimingPolicy(min_samples=f.min_samples, min_duration_s=f.min_duration_s,
                          max_duration_s=max(60.0, 4 * f.min_duration_s))  # fmt: skip
    return replace(ctx, settings=replace(ctx.settings, policy=policy))


def entry(measured: Measured, cases: tuple[StudyCase, ...]) -> tuple[dict[str, list[float]] | None, float | None, float | None]:
    """One run of a round as the rounds keep it: its calls at each shape (``None``: failed), its items/s,
    and the cores other processes kept busy while it ran (``None``: not read)."""
    ok = measured.metrics is not None
    per_shape = measured.per_shape or {cases[0].key: measured}
    calls = {k: list(one.samples_ms) for k, one in per_shape.items()} if ok else None
    rate = (measured.metrics.throughput or None) if ok else None  # type: ignore[union-attr]
    return calls, rate, None if measured.load is None else measured.load.other_cores


def one_round(ctx: StudyContext, configs: list[TrialConfig], order: list[int], name: str, reporter: Reporter,
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


def rounds_load(finalists: list[Finalist], rounds: int, reran: list[dict[str, Any]]) -> dict[str, Any]:
    """The summary's ``load`` of the finalist rounds: the most other processes' cores per round, the rounds under load."""
    per_round = [max((f.loads[r] for f in finalists if r < len(f.loads) and f.loads[r] is not None), default=None)
                 for r in range(rounds)]  # fmt: skip
    under = [r + 1 for r, cores in enumerate(per_round) if cores is not None and machine_load.busy(cores)]
    return {"threshold_cores": machine_load.UNDER_LOAD_CORES, "rounds": per_round, "under_load": under, "reran": reran}


def round_values(calls: list[list[dict[str, list[float]] | None]], rates: list[list[float | None]],
                 cases: tuple[StudyCase, ...], objective: Objective,
                 statistic: str | None = None) -> tuple[list[list[float | None]], str]:  # fmt: skip
    """One value per config per round, and its statistic's name, as the objective's row says
    (:attr:`~autodeploy.objectives.Objective.rounds`).

    :data:`~autodeploy.objectives.RATE`: the round's items/s (of the mix). :data:`~autodeploy.objectives.CALLS`:
    the round's p90 at each shape (mixed as the row mixes them: :meth:`~autodeploy.objectives.Objective.mix`),
    or the median when some round has too few calls for a p90 claim: one statistic for every round and
    config, so each per-round ratio compares like with like.
    """
    if objective.rounds == RATE:
        return [list(r) for r in rates], ITEMS_PER_S.name
    if statistic is None:
        counts = [len(one[c.key]) for per in calls for one in per if one for c in cases]
        statistic = rstats.round_statistic(counts)
    weights = [c.weight for c in cases]
    out = []
    for per in calls:
        row: list[float | None] = []
        for one in per:
            values = [rstats.round_value(one[c.key], statistic) for c in cases] if one else [None]
            row.append(None if any(v is None for v in values) else objective.mix(weights, values))  # type: ignore[arg-type]
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


def _mix(weighted: list[tuple[float, float | None, tuple[float, float] | None]],
         objective: Objective) -> tuple[float | None, tuple[float, float] | None]:  # fmt: skip
    """One statistic and interval for a mix of shapes, each bound combined like the statistic
    (:meth:`~autodeploy.objectives.Objective.mix`: the weighted mean of times, the weighted harmonic mean of
    rates): wider than a joint interval, never narrower."""
    if len(weighted) == 1:
        return weighted[0][1], weighted[0][2]
    if any(stat is None or ci is None for _, stat, ci in weighted):
        return None, None
    weights = [w for w, _, _ in weighted]
    stat = objective.mix(weights, [s for _, s, _ in weighted])  # type: ignore[misc]
    low = objective.mix(weights, [ci[0] for _, _, ci in weighted])  # type: ignore[index]
    high = objective.mix(weights, [ci[1] for _, _, ci in weighted])  # type: ignore[index]
    return stat, (min(low, high), max(low, high))


def _pooled(samples_ms: list[float]) -> tuple[float | None, tuple[float, float] | None]:
    """The latency claim of calls pooled over the rounds (its p90 where it has the calls for one, else its median),
    with its interval; ``None`` below 2 calls."""
    if len(samples_ms) < 2:
        return None, None
    return latency_claim(summarize(np.asarray(samples_ms) * 1e6))
