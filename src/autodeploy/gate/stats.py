"""The gate's statistics: pure functions on one value per worker run.

**The unit is the round, not the call.** Each metric gets one value per worker process (that
run's median latency, its p90, ...). Per-call samples from one process are autocorrelated: a
co-runner on the sibling hyperthread, the CPU frequency, the memory layout of that process
hold for seconds, so thousands of calls from one process carry the information of a handful.
A test that pools per-call samples treats them as independent and becomes over-confident: on
a busy machine it "detects" differences between a model and itself. Per-round values are
independent draws of exactly that process-level noise, so the rank test over them keeps its
false-positive rate.

Per metric (higher is worse, e.g. latency): a one-sided Mann-Whitney U test ("the candidate is
slower"), Holm's step-down correction over the tested metrics, and the effect as the relative
change of the medians with a percentile-bootstrap 90% interval, whose upper end is a one-sided
95% bound. A metric **fails** only when the corrected p-value is at most ``alpha`` **and** the
change is beyond ``max_regression``. It **passes** when that bound rules a regression beyond
``max_regression`` out (the TOST idea: "no evidence of a regression" is not "evidence of no
regression"). Otherwise it is **inconclusive**: too few rounds (or so few that no outcome could
reach significance), or per-round values too noisy for the rounds taken. Noise enters through
the interval, which widens with the spread and narrows with more rounds, rather than through a
fixed cap on the coefficient of variation: one slow round out of twenty lifts the CV far above
10% yet hardly moves a median.

Accuracy on the fixed evaluation inputs is deterministic (the same inputs each round), so it
is a threshold on the drop, not a test, and is not part of the correction.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from math import comb

import numpy as np

from autodeploy.accuracy.records import DEFAULT_MAX_ACCURACY_DROP, within
from autodeploy.harness import stats

ALPHA = 0.01
MIN_ROUNDS = 5
#: Two-sided level of the change's interval; its upper end is the one-sided 95% bound a pass needs.
CHANGE_CI_LEVEL = 0.90
TEST_U = "Mann-Whitney U, one-sided (candidate slower), Holm-corrected"
TEST_THRESHOLD = "threshold on a deterministic value"


@dataclass(frozen=True)
class Criteria:
    """What the gate judges by (validated by the caller, e.g. the CLI)."""

    max_regression: float = 0.05  # relative, 0.05 = 5%
    max_accuracy_drop: float = DEFAULT_MAX_ACCURACY_DROP  # absolute, on a 0..1 score
    alpha: float = ALPHA
    min_rounds: int = MIN_ROUNDS
    seed: int = 0


@dataclass(frozen=True)
class MetricVerdict:
    """One metric compared: the numbers, the test, and the verdict with its reason."""

    name: str
    unit: str
    verdict: str
    reason: str
    test: str
    threshold: float
    n_baseline: int
    n_candidate: int
    baseline: float | None = None  # median of the per-round values
    candidate: float | None = None
    change: float | None = None  # relative for latency (+0.12 = 12% slower), absolute drop for accuracy
    change_ci: tuple[float, float] | None = None
    cv_baseline: float | None = None
    cv_candidate: float | None = None
    p_value: float | None = None
    p_adjusted: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def cv(values: Sequence[float]) -> float | None:
    """Coefficient of variation (sample stdev / mean); ``None`` below 2 values."""
    x = np.asarray(values, dtype=float)
    if x.size < 2:
        return None
    mean = float(x.mean())
    return float(x.std(ddof=1)) / mean if mean > 0 else float("inf")


def relative_change(baseline: Sequence[float], candidate: Sequence[float]) -> float:
    """``median(candidate) / median(baseline) - 1``: +0.15 means 15% slower."""
    return float(np.median(candidate)) / float(np.median(baseline)) - 1.0


def bootstrap_change_ci(
    baseline: Sequence[float],
    candidate: Sequence[float],
    *,
    seed: int = 0,
    n_boot: int = 4000,
    level: float = CHANGE_CI_LEVEL,
) -> tuple[float, float]:
    """Percentile-bootstrap interval of :func:`relative_change`, resampling each arm's rounds
    (:func:`autodeploy.harness.stats.bootstrap_change_ci` of the medians)."""
    return stats.bootstrap_change_ci(baseline, candidate, q=50.0, seed=seed, n_boot=n_boot, level=level)


def p_greater(baseline: Sequence[float], candidate: Sequence[float]) -> float:
    """One-sided Mann-Whitney U p-value of "candidate values tend to be larger"."""
    from scipy.stats import mannwhitneyu

    return float(mannwhitneyu(candidate, baseline, alternative="greater").pvalue)


def min_attainable_p(n1: int, n2: int) -> float:
    """The smallest one-sided exact Mann-Whitney p-value with these sample sizes: 1 / C(n1+n2, n1)."""
    return 1.0 / comb(n1 + n2, n1)


def holm(pvalues: Sequence[float | None]) -> list[float | None]:
    """Holm-adjusted p-values (step-down, family = the non-``None`` entries); ``None`` stays ``None``."""
    tested = sorted((p, i) for i, p in enumerate(pvalues) if p is not None)
    m = len(tested)
    adjusted: list[float | None] = [None] * len(pvalues)
    running = 0.0
    for rank, (p, i) in enumerate(tested):
        running = max(running, min(1.0, (m - rank) * p))
        adjusted[i] = running
    return adjusted


def judge_latency(
    metrics: Sequence[tuple[str, Sequence[float], Sequence[float]]], criteria: Criteria
) -> list[MetricVerdict]:
    """Judge each ``(name, baseline rounds, candidate rounds)`` latency metric (ms, higher is worse)."""
    tested = [len(b) >= 2 and len(c) >= 2 for _, b, c in metrics]
    raw = [p_greater(b, c) if ok else None for (_, b, c), ok in zip(metrics, tested, strict=True)]
    adjusted = holm(raw)
    per_test_alpha = criteria.alpha / max(1, sum(tested))  # Holm's first (strictest) step
    out = []
    for (name, b, c), p, p_adj in zip(metrics, raw, adjusted, strict=True):
        fields = dict(name=name, unit="ms", test=TEST_U, threshold=criteria.max_regression,
                      n_baseline=len(b), n_candidate=len(c), p_value=p, p_adjusted=p_adj)  # fmt: skip
        if len(b) and len(c):
            fields.update(baseline=float(np.median(b)), candidate=float(np.median(c)),
                          change=relative_change(b, c), cv_baseline=cv(b), cv_candidate=cv(c))  # fmt: skip
        if len(b) >= 2 and len(c) >= 2:
            fields["change_ci"] = bootstrap_change_ci(b, c, seed=criteria.seed)
        verdict, reason = _latency_verdict(fields, criteria, per_test_alpha)
        out.append(MetricVerdict(verdict=verdict, reason=reason, **fields))
    return out


def _latency_verdict(f: dict, criteria: Criteria, per_test_alpha: float) -> tuple[str, str]:
    n1, n2, limit = f["n_baseline"], f["n_candidate"], criteria.max_regression
    if min(n1, n2) < criteria.min_rounds:
        return (
            "inconclusive",
            f"too few samples: {n1} baseline and {n2} candidate rounds, need {criteria.min_rounds} each",
        )
    floor = min_attainable_p(n1, n2)
    if floor > per_test_alpha:
        return "inconclusive", (f"too few samples: with {n1} and {n2} rounds the smallest possible p is {floor:.2g}, "
                                f"above the corrected alpha {per_test_alpha:.2g}")  # fmt: skip
    change, p_adj, (_, bound) = f["change"], f["p_adjusted"], f["change_ci"]
    if p_adj <= criteria.alpha and change > limit:
        return (
            "fail",
            f"{change:+.1%} slower (limit {limit:.0%}), significant (p = {p_adj:.2g} <= {criteria.alpha:g})",
        )
    if bound > limit:
        worst = max(f["cv_baseline"], f["cv_candidate"])
        return "inconclusive", (f"too noisy to rule out a regression beyond {limit:.0%}: change {change:+.1%}, "
                                f"upper 95% bound {bound:+.1%} (per-run CV up to {worst:.0%}); add --rounds")  # fmt: skip
    if p_adj <= criteria.alpha:
        return (
            "pass",
            f"significant but within the limit: {change:+.1%}, upper 95% bound {bound:+.1%} <= {limit:.0%}",
        )
    return (
        "pass",
        f"no regression beyond {limit:.0%}: {change:+.1%}, upper 95% bound {bound:+.1%} (p = {p_adj:.2g})",
    )


def judge_accuracy(
    name: str, baseline: float, candidate: float, criteria: Criteria, *, n_items: int | None = None
) -> MetricVerdict:
    """Accuracy score (0..1, higher is better): fail when it drops by more than ``max_accuracy_drop``."""
    drop, limit = baseline - candidate, criteria.max_accuracy_drop
    on = f" on {n_items} evaluation items" if n_items else ""
    failed = not within(drop, limit)
    reason = f"drop {drop:+.2%}{on} {'>' if failed else '<='} limit {limit:.2%}"
    return MetricVerdict(name=name, unit="score", verdict="fail" if failed else "pass", reason=reason,
                         test=TEST_THRESHOLD, threshold=limit, n_baseline=1, n_candidate=1,
                         baseline=baseline, candidate=candidate, change=drop)  # fmt: skip


def overall(verdicts: Sequence[MetricVerdict]) -> str:
    """``fail`` if any metric fails, else ``inconclusive`` if any is, else ``pass``."""
    found = {v.verdict for v in verdicts}
    return (
        "fail" if "fail" in found else "inconclusive" if "inconclusive" in found or not verdicts else "pass"
    )
