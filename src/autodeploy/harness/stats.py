"""Latency statistics: point estimates plus bootstrap confidence intervals.

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

import numpy as np

from autodeploy.harness.result import LatencyStats

#: A p90 claim needs at least this many samples (DESIGN.md, "Measurement rules").
MIN_SAMPLES_P90 = 64
#: A p99 claim needs at least this many samples.
MIN_SAMPLES_P99 = 662
#: A coefficient of variation above this marks the result unstable.
UNSTABLE_CV = 0.10

_PERCENTILE_METHOD = "linear"
_CI_LEVEL = 0.95


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

    qs = [50.0]
    insufficient = []
    if n >= MIN_SAMPLES_P90:
        qs.append(90.0)
    else:
        insufficient.append(f"p90 needs >= {MIN_SAMPLES_P90} samples, have {n}")
    if n >= MIN_SAMPLES_P99:
        qs.append(99.0)
    else:
        insufficient.append(f"p99 needs >= {MIN_SAMPLES_P99} samples, have {n}")

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
        insufficient=tuple(insufficient),
    )


def _bootstrap_percentile_cis(
    values: np.ndarray, qs: list[float], *, seed: int, n_boot: int
) -> list[tuple[float, float]]:
    """Percentile-bootstrap confidence intervals of the percentiles ``qs`` of ``values``.

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
    rng = np.random.default_rng(seed)
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

    alpha = (1.0 - _CI_LEVEL) / 2.0
    cis = []
    for h, lo in zip(pos, lows, strict=True):
        below, above = value_at[lo], value_at[min(lo + 1, n - 1)]
        replicates = below + (above - below) * (h - lo)
        a, b = np.percentile(replicates, [100.0 * alpha, 100.0 * (1.0 - alpha)], method=_PERCENTILE_METHOD)
        cis.append((float(a), float(b)))
    return cis
