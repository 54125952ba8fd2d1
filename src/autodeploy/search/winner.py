"""The choice of the winner: configs compared paired by round, the leader, a tie, the speed-up over the baseline.

Each finalist round gives each config one value. As costs (lower is better: :meth:`~autodeploy.objectives.
Objective.cost`, so that a ratio of costs, the baseline's over a config's, is the speed-up of a time and of a
rate alike) two configs are compared by the median of their per-round ratios, on the rounds in which neither
ran under load. The leader beats every other config in most rounds; a config within TIE_TOLERANCE of it ties,
and the cheapest of a tie wins, unless the baseline is in it: then the baseline stays; a config wholly behind it leaves the rounds (:func:`still_in`). The speed-up
over the baseline is the median of their per-round ratios with its order-statistic interval (:func:`speedups`);
docs/architecture.md, "Measurement rules".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from autodeploy.harness import load as machine_load
from autodeploy.harness import stats as rstats
from autodeploy.objectives import Objective
from autodeploy.search.summary import Finalist, Ratio, StudySummary
from autodeploy.verdict import FIRST_ROUND_MARGIN, TIE_TOLERANCE

# TIE_TOLERANCE and FIRST_ROUND_MARGIN, what "tied" and "wholly behind" mean, are rules: autodeploy.verdict.
#: Rounds a winner claim needs (docs/architecture.md, "Measurement rules"); fewer is labelled screening only.
MIN_WINNER_ROUNDS = 3


def choose(name: str, objective: Objective, counts: dict[str, int], finalists: list[Finalist],
            statistic: str = rstats.P90) -> StudySummary:  # fmt: skip
    """The winner, paired by round: the leader (:func:`_leader`) on the finalists' per-round values;
    a finalist whose median per-round ratio to it is within TIE_TOLERANCE of 1, with a paired interval
    holding 1 (or too few rounds for one), ties with it, and the cheapest of the tie wins; but where the baseline is
    in the tie, it wins: a config replaces the file as given only by beating it by more than TIE_TOLERANCE. Two
    configs are compared on the rounds in which neither ran under load (:func:`_pairing`).

    The baseline (ORT fp32 default) competes too: when nothing the search found beats it, it is the
    winner. The speed-up over it is the median of the per-round ratios, for ``statistic`` and, for a statistic
    of calls (:attr:`~autodeploy.objectives.Objective.from_calls`), for the median, each with its
    order-statistic interval when the winner ran MIN_WINNER_ROUNDS rounds.
    """
    candidates = [f for f in finalists if f.statistic is not None and any(v is not None for v in _costs(f, objective))]
    baseline = next((f for f in finalists if f.baseline), None)
    if not candidates:
        return StudySummary(name, objective.name, counts, finalists, None, note="every finalist failed its re-measurement",
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
    # The file as given stays unless the winner beats it by more than the tie margin (the median of the baseline's
    # per-round ratios to it above 1 + TIE_TOLERANCE): a tie with the baseline never ships another config, which
    # may be lossy (a bf16), whichever of the two led.
    base = next((i for i, f in enumerate(candidates) if f.baseline), None)
    if base is not None and winner is not candidates[base]:
        r = pairs(base, next(i for i, f in enumerate(candidates) if f is winner))
        if r.size and float(np.median(r)) <= 1 + TIE_TOLERANCE:
            winner = candidates[base]
    n_rounds = sum(v is not None for v in winner.rounds)
    claim = n_rounds >= MIN_WINNER_ROUNDS
    ratios = speedups(baseline, winner, objective, statistic, claim) if baseline is not None else {}
    main = ratios.get(statistic)
    return StudySummary(name, objective.name, counts, finalists, winner, [f.label for f in group if f is not winner],
                        main.value if main else None, statistic=statistic, speedups=ratios, rounds=n_rounds,
                        screening_only=not claim)  # fmt: skip


def quiet_pairs(a: Finalist, b: Finalist) -> tuple[list[int], list[int]]:
    """The rounds (indices) both ``a`` and ``b`` have a value in, split into those in which neither run
    ran under load (:func:`_loaded`) and the others."""
    both = [r for r in range(min(len(a.rounds), len(b.rounds))) if a.rounds[r] is not None and b.rounds[r] is not None]
    quiet = [r for r in both if not _loaded(a.loads, r) and not _loaded(b.loads, r)]
    return quiet, [r for r in both if r not in quiet]


def speedups(baseline: Finalist, winner: Finalist, objective: Objective, statistic: str, claim: bool) -> dict[str, Ratio]:
    """The winner's speed-up over the baseline per statistic: the median of the per-round ratios over the rounds
    in which neither ran under load, with its order-statistic interval when ``claim`` (the winner ran the rounds
    a winner claim needs), stating the coverage it claims from run to run (:func:`~autodeploy.harness.stats.
    claimed_coverage`), and the time those rounds span. A neighbour slows the all-cores baseline far more than a
    one-thread winner: a loaded round's ratio measures the neighbour. Only when no paired round ran quiet do the
    loaded ones count, flagged ``under_load``. A finalist without rounds (screening values) pairs its one value."""
    if not baseline.statistic:
        return {}
    quiet, loaded = quiet_pairs(baseline, winner)
    kept = quiet or loaded if baseline.rounds and winner.rounds else [0]
    series = [(statistic, _costs(baseline, objective), _costs(winner, objective))]
    if objective.from_calls and statistic != rstats.MEDIAN and baseline.medians and winner.medians:
        series.append((rstats.MEDIAN, list(baseline.medians), list(winner.medians)))
    out = {}
    for which, base, won in series:
        picked = [(r, base[r], won[r]) for r in kept if r < len(base) and r < len(won)]
        if (ratios := _slower([b for _, b, _ in picked], [w for _, _, w in picked])).size:
            interval = rstats.median_interval(ratios) if claim else None
            paired = [r for r, b, w in picked if b is not None and w is not None and w > 0]
            values = tuple(float(np.median([v[r] for r in paired])) for v in (base, won)) if paired else None
            if values and which == statistic and objective.higher_is_better:  # costs back to rates
                values = tuple(1.0 / v for v in values)
            out[which] = Ratio(float(np.median(ratios)), None if interval is None else interval[:2],
                               None if interval is None else rstats.claimed_coverage(interval[2]), int(ratios.size),
                               len(loaded) if quiet else 0, not quiet and bool(loaded), _span(baseline, winner, paired),
                               values)  # fmt: skip
    return out


def _span(a: Finalist, b: Finalist, rounds: Sequence[int]) -> float | None:
    """Seconds from the first to the last start of ``a``'s and ``b``'s runs in ``rounds`` (``None``: fewer than two
    rounds, or their times were not recorded)."""
    at = [t for f in (a, b) for r in rounds if r < len(f.times) and (t := f.times[r]) is not None]
    return float(max(at) - min(at)) if len(rounds) > 1 and at else None


def still_in(stats: list[tuple[int, Sequence[float | None]]], objective: Objective, keep: int | None = None,
             rival: bool = False, loads: dict[int, Sequence[float | None]] | None = None,
             margin: float = FIRST_ROUND_MARGIN) -> list[int]:  # fmt: skip
    """The configs (by index) that can still win or tie, given each one's per-round values.

    A config is wholly behind the leader (:func:`_leader`) when it was slower in every round both
    ran and the paired interval of its ratio to the leader lies above 1; on one pair (no interval)
    only by more than ``margin``, a gap the machine alone has not made (:func:`one_pair_margin`). ``keep`` (the
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


def one_pair_margin(runs: Sequence[Sequence[float | None]]) -> float:
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


def _costs(f: Finalist | Sequence[float | None], objective: Objective) -> list[float | None]:
    """Per-round values as costs, lower is better (:meth:`~autodeploy.objectives.Objective.cost`): ms, or seconds
    per item for a rate."""
    values = f if not isinstance(f, Finalist) else (f.rounds or (f.statistic,))
    return [objective.cost(v) for v in values]


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
