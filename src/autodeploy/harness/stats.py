"""Latency statistics: point estimates plus bootstrap confidence intervals; the one bootstrap.

:func:`summarize` describes one run; :func:`bootstrap_mean_ci` (a throughput's interval) and
:func:`bootstrap_change_ci` (a relative change between two samples, the gate's effect) are the
generic pieces the study and the gate use. Every interval comes from ``np.random.default_rng(seed)``.

**Rounds.** The gate and the study's finalists both reduce a worker run (a round) to one value
(:func:`round_value`: its p90, or its median where the run has too few calls for a p90 claim):
calls inside one process share its luck, rounds are the independent draws. Configs measured in
the same rounds are compared *paired by round* (:func:`paired_ratios`): a round in which the whole
machine was slow slows every config alike and cancels out of each ratio. The median of the ratios
gets a distribution-free interval from order statistics (:func:`median_interval`); with a handful
of rounds a bootstrap would claim 95% over three numbers, the exact interval says what it covers.

Every percentile here (the point estimates and the bootstrap replicates) is computed with
``np.percentile(..., method="linear")``, numpy's default: linear interpolation between the
two nearest order statistics (Hyndman & Fan type 7). The confidence intervals are percentile
bootstrap intervals (2.5th and 97.5th percentile of the replicated statistic); replicates
are drawn by sampling the resample's order statistics directly, which has the same
distribution as resampling whole arrays but costs O(n_boot) instead of O(n_boot * n) time and
memory (see ``_bootstrap_percentile_cis``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from math import comb
from typing import Any, TypeVar

import numpy as np

from autodeploy import objectives


@dataclass(frozen=True)
class LatencyStats:
    """Per-call latency statistics in milliseconds.

    ``p90``/``p99`` are ``None`` when there are too few samples to claim them
    (:data:`autodeploy.harness.stats.CLAIMS`); ``insufficient`` then says which claims are missing.
    """

    n: int
    median: float
    mean: float
    stdev: float
    cv: float
    min: float
    max: float
    median_ci: tuple[float, float]
    p90: float | None
    p90_ci: tuple[float, float] | None
    p99: float | None
    p99_ci: tuple[float, float] | None
    unstable: bool
    insufficient: tuple[str, ...] = ()

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LatencyStats:
        d = dict(d)
        for k in ("median_ci", "p90_ci", "p99_ci"):
            if d.get(k) is not None:
                d[k] = tuple(d[k])
        d["insufficient"] = tuple(d.get("insufficient", ()))
        return cls(**d)



#: A p90 claim needs at least this many samples (docs/architecture.md, "Measurement rules").
MIN_SAMPLES_P90 = 64
#: A p99 claim needs at least this many samples.
MIN_SAMPLES_P99 = 662
#: The claims a sample count must support, with the samples each needs.
CLAIMS = (("p90", MIN_SAMPLES_P90), ("p99", MIN_SAMPLES_P99))
#: A coefficient of variation above this marks the result unstable.
UNSTABLE_CV = 0.10

_PERCENTILE_METHOD = "linear"
#: The round statistics' names, as :func:`round_value` returns them (:data:`autodeploy.objectives.STATISTICS`).
P90, MEDIAN = objectives.P90.name, objectives.MEDIAN.name
_CI_LEVEL = 0.95
#: Most resampled values :func:`bootstrap_mean_ci` holds at once (8 MB of float64).
_BLOCK = 2**20


def summarize(samples_ns: Sequence[int] | np.ndarray, *, seed: int = 0, n_boot: int = 2000) -> LatencyStats:
    """Summarize per-call latencies.

    Args:
        samples_ns: Per-call latencies in nanoseconds (one-dimensional, at least 2).
        seed: Seed of the bootstrap's random generator; the same samples and seed give the
            same intervals.
        n_boot: Number of bootstrap replicates.

    Returns:
        Statistics in milliseconds. ``p90``/``p99`` and their intervals are ``None`` below
        :data:`MIN_SAMPLES_P90`/:data:`MIN_SAMPLES_P99` samples, and ``insufficient`` says so.

    Raises:
        ValueError: fewer than 2 samples, not one-dimensional, non-finite values, or
            ``n_boot < 1``.
    """
    ms = np.asarray(samples_ns, dtype=np.float64) / 1e6
    if ms.ndim != 1:
        raise ValueError(f"samples_ns must be one-dimensional, got shape {ms.shape}")
    n = ms.size
    if n < 2:
        raise ValueError(f"need at least 2 latency samples to summarize, have {n}")
    if not np.all(np.isfinite(ms)):
        raise ValueError("latency samples contain NaN or inf")
    if n_boot < 1:
        raise ValueError(f"n_boot must be >= 1, got {n_boot}")

    qs = [50.0] + [q for q, need in ((90.0, MIN_SAMPLES_P90), (99.0, MIN_SAMPLES_P99)) if n >= need]

    point = np.percentile(ms, qs, method=_PERCENTILE_METHOD)
    cis = _bootstrap_percentile_cis(ms, qs, seed=seed, n_boot=n_boot)
    by_q = {q: (float(p), ci) for q, p, ci in zip(qs, point, cis, strict=True)}

    mean = float(ms.mean())
    stdev = float(ms.std(ddof=1))
    cv = stdev / mean if mean > 0 else (0.0 if stdev == 0 else float("inf"))
    p90, p90_ci = by_q.get(90.0, (None, None))
    p99, p99_ci = by_q.get(99.0, (None, None))
    return LatencyStats(
        n=n,
        median=by_q[50.0][0],
        mean=mean,
        stdev=stdev,
        cv=cv,
        min=float(ms.min()),
        max=float(ms.max()),
        median_ci=by_q[50.0][1],
        p90=p90,
        p90_ci=p90_ci,
        p99=p99,
        p99_ci=p99_ci,
        unstable=bool(cv > UNSTABLE_CV),
        insufficient=insufficient(n),
    )


def insufficient(n: int) -> tuple[str, ...]:
    """The claims ``n`` samples cannot support (:data:`CLAIMS`), worded as :attr:`LatencyStats.insufficient` keeps them."""
    return tuple(f"{name} needs >= {need} samples, have {n}" for name, need in CLAIMS if n < need)


_T = TypeVar("_T")


def claimed(p90: _T | None, median: _T) -> _T:
    """The latency a measurement claims: its p90 where it had the samples for one (:func:`summarize`
    leaves the p90 ``None`` below :data:`MIN_SAMPLES_P90`), else its median. The search ranks trials
    by it and the dashboard shows it; values and their intervals alike."""
    return p90 if p90 is not None else median


def latency_claim(stats: LatencyStats) -> tuple[float, tuple[float, float] | None]:
    """:func:`claimed` of one run's statistics: the p90 with its interval, else the median with its own."""
    if stats.p90 is not None:
        return stats.p90, stats.p90_ci
    return stats.median, stats.median_ci


def bootstrap_mean_ci(
    values: Sequence[float] | np.ndarray, *, seed: int = 0, n_boot: int = 2000, level: float = _CI_LEVEL
) -> tuple[float, float]:
    """Percentile-bootstrap interval of the mean of ``values`` (e.g. latencies, for a throughput).

    A resample's mean has no order-statistic shortcut, so the resamples are drawn, but in
    blocks of at most :data:`_BLOCK` values: memory stays bounded whatever ``len(values) * n_boot``.
    """
    x = _checked(values, "values")
    rng = np.random.default_rng(seed)
    rows = max(1, _BLOCK // x.size)
    means = np.concatenate([x[rng.integers(0, x.size, (min(rows, n_boot - start), x.size))].mean(axis=1)
                            for start in range(0, n_boot, rows)])  # fmt: skip
    return _interval(means, level)


def bootstrap_change_ci(
    baseline: Sequence[float] | np.ndarray,
    candidate: Sequence[float] | np.ndarray,
    *,
    q: float = 50.0,
    seed: int = 0,
    n_boot: int = 2000,
    level: float = _CI_LEVEL,
) -> tuple[float, float]:
    """Percentile-bootstrap interval of the relative change ``percentile(candidate, q) /
    percentile(baseline, q) - 1`` (+0.15: 15% higher), resampling each sample on its own.

    One generator seeded with ``seed`` draws the baseline's replicates, then the candidate's;
    each costs O(``n_boot``) (see :func:`_percentile_replicates`).
    """
    b, c = _checked(baseline, "baseline"), _checked(candidate, "candidate")
    rng = np.random.default_rng(seed)
    (rb,) = _percentile_replicates(b, [q], rng, n_boot)
    (rc,) = _percentile_replicates(c, [q], rng, n_boot)
    return _interval(rc / rb - 1.0, level)


def _checked(values: Sequence[float] | np.ndarray, name: str) -> np.ndarray:
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 1 or x.size == 0:
        raise ValueError(f"{name} must be a non-empty one-dimensional sample, got shape {x.shape}")
    return x


def _interval(replicates: np.ndarray, level: float) -> tuple[float, float]:
    tail = 100.0 * (1.0 - level) / 2.0
    low, high = np.percentile(replicates, [tail, 100.0 - tail], method=_PERCENTILE_METHOD)
    return float(low), float(high)


def _bootstrap_percentile_cis(
    values: np.ndarray, qs: list[float], *, seed: int, n_boot: int
) -> list[tuple[float, float]]:
    """Percentile-bootstrap 95% confidence intervals of the percentiles ``qs`` of ``values``."""
    replicates = _percentile_replicates(values, qs, np.random.default_rng(seed), n_boot)
    return [_interval(r, _CI_LEVEL) for r in replicates]


def _percentile_replicates(
    values: np.ndarray, qs: list[float], rng: np.random.Generator, n_boot: int
) -> list[np.ndarray]:
    """``n_boot`` bootstrap replicates of each percentile ``qs`` of ``values``, drawn from ``rng``.

    Each replicate is a resample of ``values`` with replacement, as in the textbook
    bootstrap, but instead of materializing ``n_boot x n`` resampled values (1.6 GB for 100k
    samples, and seconds of partitioning even when chunked) we draw only the order statistics
    that the linear-interpolated percentiles need, which has exactly the same distribution:

    * a resample is ``sorted_values[I_j]`` with ``I_j = floor(n * U_j)``, ``U_j`` iid uniform;
      ``floor`` is monotone, so the resample's k-th smallest value is
      ``sorted_values[floor(n * U_(k))]``;
    * the uniform order statistics are drawn jointly in increasing k: ``U_(k)`` of ``n``
      uniforms is ``Beta(k, n - k + 1)`` (1-based), and given ``U_(k) = u`` the remaining
      ``n - k`` uniforms are iid on ``(u, 1)``, so ``U_(k + g) = u + (1 - u) * Beta(g, n - k - g + 1)``.

    Cost and memory are ``O(n_boot * len(qs))``, independent of ``n``; vectorized over replicates.
    """
    n = values.size
    ordered = np.sort(values)
    pos = [(n - 1) * q / 100.0 for q in qs]  # numpy's "linear" virtual index, 0-based
    lows = [int(np.floor(h)) for h in pos]
    ranks = sorted({r for lo in lows for r in (lo, min(lo + 1, n - 1))})  # 0-based ranks needed

    u = np.zeros(n_boot)
    prev = -1  # 0-based rank of the order statistic drawn last (none yet)
    value_at: dict[int, np.ndarray] = {}
    for rank in ranks:
        gap, remaining = rank - prev, n - 1 - prev
        u = u + (1.0 - u) * rng.beta(gap, remaining - gap + 1, size=n_boot)
        value_at[rank] = ordered[np.minimum((u * n).astype(np.int64), n - 1)]
        prev = rank

    replicates = []
    for h, lo in zip(pos, lows, strict=True):
        below, above = value_at[lo], value_at[min(lo + 1, n - 1)]
        replicates.append(below + (above - below) * (h - lo))
    return replicates


def round_value(samples_ms: Sequence[float] | np.ndarray, statistic: str = P90) -> float | None:
    """One round's value from its per-call latencies: the ``statistic`` (``"p90"`` or ``"median"``).

    ``None`` when the round cannot make the claim: no calls, or a p90 from fewer than
    :data:`MIN_SAMPLES_P90` calls (:func:`round_statistic` picks the median for such rounds).
    """
    x = np.asarray(samples_ms, dtype=np.float64)
    if x.size == 0 or (statistic == P90 and x.size < MIN_SAMPLES_P90):
        return None
    q = 90.0 if statistic == P90 else 50.0
    return float(np.percentile(x, q, method=_PERCENTILE_METHOD))


def round_statistic(calls_per_round: Sequence[int]) -> str:
    """``"p90"`` when every round has the calls for a p90 claim, else ``"median"``: one statistic for
    every round compared, so no ratio sets one round's p90 against another's median."""
    return P90 if calls_per_round and min(calls_per_round) >= MIN_SAMPLES_P90 else MEDIAN


def paired_ratios(numerator: Sequence[float | None], denominator: Sequence[float | None]) -> np.ndarray:
    """``numerator[r] / denominator[r]`` for every round ``r`` both have a (positive) value in."""
    pairs = [(a, b) for a, b in zip(numerator, denominator, strict=False)
             if a is not None and b is not None and b > 0]  # fmt: skip
    return np.asarray([a / b for a, b in pairs], dtype=np.float64)


#: The coverage a speed-up's interval over rounds claims from one run of a study to the next: the share of runs whose
#: interval holds the median of many runs' speed-ups. The order statistics' coverage (:func:`median_interval`)
#: holds for rounds drawn independently; rounds of one run share the host's state of the moment (a shared VM's
#: host takes a vCPU for seconds to minutes), so it is capped at what ``benchmarks/interval_coverage.py`` measured
#: on quiet runs (README, "Benchmarks"): 8 runs of zoo:mobilenetv2 over 954 s, 5 rounds each over ~30 s, held the
#: median in 5 (62%). A speed-up states the lower of the two (:func:`claimed_coverage`); this is the one place.
CLAIMED_COVERAGE = 0.60


def claimed_coverage(exact: float) -> float:
    """The coverage a speed-up interval states: its order statistics' ``exact`` coverage, at most :data:`CLAIMED_COVERAGE`."""
    return min(exact, CLAIMED_COVERAGE)


def median_interval(values: Sequence[float] | np.ndarray, level: float = _CI_LEVEL) -> tuple[float, float, float] | None:
    """A distribution-free interval of the median of ``values``: ``(low, high, coverage)``.

    ``[x(k), x(n+1-k)]`` of the sorted values covers the true median with probability
    ``1 - 2 P(Binomial(n, 1/2) < k)``, whatever the distribution (the sign test's interval). The
    narrowest such interval covering at least ``level`` is returned; with fewer than 6 values
    none reaches 95%, so the widest, ``[min, max]``, comes back with the coverage it has (3 rounds:
    75%). ``None`` below 2 values: one round has no interval.
    """
    x = np.sort(np.asarray(values, dtype=np.float64))
    n = x.size
    if n < 2:
        return None

    def coverage(k: int) -> float:
        return 1.0 - 2.0 * sum(comb(n, i) for i in range(k)) / 2.0**n

    k = 1
    while k + 1 <= (n + 1) // 2 and coverage(k + 1) >= level:
        k += 1
    return float(x[k - 1]), float(x[n - k]), coverage(k)
