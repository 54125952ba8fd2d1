"""The load pairing: the winner and the baseline measured alone as pairs when load spoiled their paired rounds.

A neighbour slows an all-cores baseline far more than a one-thread winner, so a round in which either ran under
load (``harness/load.py``) measures the neighbour, and the speed-up rests on the quiet pairs alone
(:func:`~autodeploy.search.winner.speedups`). While fewer of them ran quiet than the study has rounds, the two run
again as pairs (PAIR_ROUNDS_FACTOR, :func:`pair_rounds`); and where their quiet rounds still read far apart, the
machine moved them with no load its meter sees (:func:`unsteady`). docs/architecture.md, "Load".
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import numpy as np

from autodeploy.harness import load as machine_load
from autodeploy.harness import stats as rstats
from autodeploy.objectives import Objective
from autodeploy.search.budget import Budget
from autodeploy.search.context import StudyCase, StudyContext
from autodeploy.search.memory import Memory
from autodeploy.search.reporter import Reporter
from autodeploy.search.rounds import entry, finalist_ctx, one_round, round_values
from autodeploy.search.screening import Measured
from autodeploy.search.summary import Finalist, StudySummary
from autodeploy.search.winner import MIN_WINNER_ROUNDS, quiet_pairs, speedups

#: When some of the winner's rounds paired with the baseline ran under load, the speed-up rests on fewer
#: quiet pairs than the study's rounds (a neighbour slows an all-cores baseline far more than a one-thread
#: winner, so a loaded round's ratio measures the neighbour). The two then run alone as pairs until as many
#: pairs ran quiet as the study has rounds (at least MIN_WINNER_ROUNDS): a busy machine costs time, not
#: evidence. At most this many times the finalist rounds, and no more once as many pair rounds in a row as
#: the finalist rounds ran under load (the machine stays busy). A quiet machine never pays for them.
PAIR_ROUNDS_FACTOR = 2


def pair_rounds(ctx: StudyContext, summary: StudySummary, reporter: Reporter, memory: Memory, budget: Budget,
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
    cases, objective, statistic = ctx.shape_cases(), ctx.config.objective, summary.statistic
    long_ctx, added, loaded_in_a_row, started = finalist_ctx(ctx), 0, 0, time.monotonic()
    rounds = ctx.config.finalists.rounds
    # which runs first, per pair: a strict alternation has a period of its own (two pairs) that a periodic
    # neighbour can lock onto; a seeded random order has none and still balances the order on average
    rng = np.random.default_rng(ctx.config.seed)
    limit, target = PAIR_ROUNDS_FACTOR * rounds, _quiet_target(rounds)
    pair_s = 2 * max((sum(w.values()) for _, w in runs), default=0.0)  # a pair: two of the longest finalist runs
    while added < limit:
        quiet, loaded = quiet_pairs(base, winner)
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
        ran = one_round(long_ctx, configs, order, f"speed-up pair {added + 1}", reporter, memory, runs)
        base, winner = (_with_round(f, ran[k], cases, objective, statistic) for k, f in enumerate((base, winner)))
        added += 1
        loaded_in_a_row = 0 if len(quiet_pairs(base, winner)[0]) > len(quiet) else loaded_in_a_row + 1
    if not added:
        return summary
    finalists[at], finalists[won] = base, winner
    ratios = speedups(base, winner, objective, statistic, not summary.screening_only)
    main = ratios.get(statistic)
    load = {**summary.load, "pair_rounds": added}
    return replace(summary, finalists=finalists, winner=winner, speedups=ratios, load=load,
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


def _with_round(f: Finalist, measured: Measured, cases: tuple[StudyCase, ...], objective: Objective,
                statistic: str) -> Finalist:  # fmt: skip
    """``f`` with one more pair round: ``measured`` reduced to the statistic its other rounds were reduced to.
    Its statistic, interval, samples and per-shape values stay those of the finalist rounds (what it was
    chosen on); the pair round serves the speed-up only."""
    calls, rate, load = entry(measured, cases)
    value = round_values([[calls]], [[rate]], cases, objective, statistic)[0][0][0]
    median = round_values([[calls]], [[rate]], cases, objective, rstats.MEDIAN)[0][0][0] if f.medians else None
    times = (*f.times, *[None] * (len(f.rounds) - len(f.times)), measured.started)  # aligned with the rounds
    return replace(f, uids=[*f.uids, measured.uid], rounds=(*f.rounds, value), loads=(*f.loads, load),
                   medians=(*f.medians, median) if f.medians else (), times=times)  # fmt: skip


def unsteady(summary: StudySummary) -> list[dict[str, Any]]:
    """The winner and the baseline, where the rounds in which neither ran under load read values more than
    UNSTEADY_SPREAD apart (``harness/load.py``): the machine moved them with no load its meter sees, and the
    speed-up moves with it. Each: the config's label and its lowest and highest value over those rounds."""
    base = next((f for f in summary.finalists if f.baseline), None)
    if summary.winner is None or base is None or summary.winner.baseline:
        return []
    quiet, _ = quiet_pairs(base, summary.winner)
    out = []
    for f in (summary.winner, base):
        values = [f.rounds[r] for r in quiet if f.rounds[r] is not None]
        if machine_load.unsteady(values):
            out.append({"config": f.label, "baseline": f.baseline, "low": min(values), "high": max(values)})
    return out
