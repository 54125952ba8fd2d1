"""The gate's statistics on synthetic per-round values: no workers, milliseconds each."""

from __future__ import annotations

import numpy as np
import pytest

from autodeploy.gate.stats import (
    Criteria,
    MetricVerdict,
    bootstrap_change_ci,
    cv,
    holm,
    judge_accuracy,
    judge_latency,
    min_attainable_p,
    overall,
    p_greater,
    relative_change,
)

LOOSE = Criteria()


def rounds(rng: np.random.Generator, n: int, *, median: float = 1.0, cv: float = 0.03) -> list[float]:
    return list(median * np.exp(rng.normal(0.0, cv, n)))


def one(baseline, candidate, criteria=LOOSE) -> MetricVerdict:
    (verdict,) = judge_latency([("latency median", baseline, candidate)], criteria)
    return verdict


def test_holm_matches_the_textbook_step_down():
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert holm([0.5, None, 0.001]) == [pytest.approx(0.5), None, pytest.approx(0.002)]
    assert holm([0.9, 0.8]) == [1.0, 1.0]  # 2 * 0.8 capped at 1, and monotone


def test_smallest_attainable_p_is_one_over_the_arrangements():
    assert min_attainable_p(5, 5) == pytest.approx(1 / 252)
    assert min_attainable_p(3, 3) == pytest.approx(1 / 20)
    # Fully separated samples reach it.
    assert p_greater([1, 2, 3, 4, 5], [6, 7, 8, 9, 10]) == pytest.approx(1 / 252)


def test_relative_change_and_its_bootstrap_interval():
    b, c = [1.0, 1.1, 0.9, 1.0, 1.05], [1.2, 1.3, 1.1, 1.2, 1.25]
    assert relative_change(b, c) == pytest.approx(0.2)
    low, high = bootstrap_change_ci(b, c, seed=1)
    assert low <= 0.2 <= high and bootstrap_change_ci(b, c, seed=1) == (low, high)
    assert cv([1.0]) is None and cv([1.0, 1.0]) == 0.0


def test_same_distribution_passes():
    rng = np.random.default_rng(0)
    v = one(rounds(rng, 10), rounds(rng, 10))
    assert v.verdict == "pass" and "no regression beyond 5%" in v.reason
    assert v.change_ci[1] <= 0.05  # a pass is a bound, not just a missing test result


def test_a_clear_slowdown_fails_with_its_effect():
    rng = np.random.default_rng(1)
    v = one(rounds(rng, 10), rounds(rng, 10, median=1.3))
    assert v.verdict == "fail" and v.p_adjusted <= 0.01 and v.change == pytest.approx(0.3, abs=0.05)
    assert v.change_ci[0] > 0.05 and "slower" in v.reason


def test_a_significant_slowdown_within_the_limit_passes():
    rng = np.random.default_rng(2)
    v = one(rounds(rng, 10, cv=0.002), rounds(rng, 10, median=1.02, cv=0.002))
    assert v.verdict == "pass" and v.p_adjusted <= 0.01 and "within the limit" in v.reason


@pytest.mark.parametrize("n", [1, 3])
def test_too_few_rounds_are_inconclusive(n):
    rng = np.random.default_rng(3)
    v = one(rounds(rng, n), rounds(rng, n, median=2.0))
    assert v.verdict == "inconclusive" and "too few samples" in v.reason
    assert (v.p_value is None) == (n < 2)


def test_rounds_that_cannot_reach_significance_are_inconclusive():
    # 3 against 3: the smallest possible p is 1/20, far above alpha, whatever the data.
    v = one([1.0, 1.0, 1.0], [9.0, 9.0, 9.0], Criteria(min_rounds=2))
    assert v.verdict == "inconclusive" and "smallest possible p" in v.reason


def test_noise_too_high_for_the_rounds_is_inconclusive_unless_a_regression_is_proven():
    rng = np.random.default_rng(4)
    v = one(rounds(rng, 10, cv=0.3), rounds(rng, 10, cv=0.3))
    assert v.verdict == "inconclusive" and "too noisy" in v.reason and v.change_ci[1] > 0.05
    v = one(rounds(rng, 10, cv=0.3), rounds(rng, 10, median=5.0, cv=0.3))
    assert v.verdict == "fail"


def test_more_rounds_turn_noise_into_a_verdict():
    """The bound narrows with the rounds: A/A noise that is mostly inconclusive at 6 rounds passes at 40
    (per-round CV 5%; rates over 300 draws: 62% inconclusive at 6 rounds, 97% pass at 40)."""
    rng = np.random.default_rng(8)
    few = [one(rounds(rng, 6, cv=0.05), rounds(rng, 6, cv=0.05)) for _ in range(30)]
    many = [one(rounds(rng, 40, cv=0.05), rounds(rng, 40, cv=0.05)) for _ in range(30)]
    assert sum(v.verdict == "inconclusive" for v in few) >= 12
    assert sum(v.verdict == "pass" for v in many) >= 26

    def width(v: MetricVerdict) -> float:
        return v.change_ci[1] - v.change_ci[0]

    assert np.median([width(v) for v in many]) < np.median([width(v) for v in few]) / 2


def test_one_slow_round_does_not_make_a_steady_metric_inconclusive():
    """A fixed CV cap would: one process 60% slower in 16 lifts the CV past 10%, not the medians."""
    rng = np.random.default_rng(9)
    b, c = rounds(rng, 16, cv=0.02), rounds(rng, 16, cv=0.02)
    c[5] *= 1.6
    v = one(b, c)
    assert v.cv_candidate > 0.10 and v.verdict == "pass"


def test_holm_correction_spans_the_metrics():
    rng = np.random.default_rng(5)
    b, c = rounds(rng, 5), rounds(rng, 5, median=1.5)  # fully separated: raw p = 1/252
    (alone,) = judge_latency([("m", b, c)], LOOSE)
    two = judge_latency([("m", b, c), ("p90", b, c)], LOOSE)
    assert alone.p_adjusted == pytest.approx(1 / 252)
    assert [v.p_adjusted for v in two] == pytest.approx([2 / 252, 2 / 252])


def test_false_positive_rate_on_exchangeable_rounds_is_at_most_alpha():
    rng = np.random.default_rng(6)
    fails = sum(
        one(rounds(rng, 10, cv=0.05), rounds(rng, 10, cv=0.05), Criteria(max_regression=0.0)).verdict
        == "fail"
        for _ in range(200)
    )
    assert fails <= 5  # alpha 0.01: 2 expected at most; room for the draw


def test_pooling_per_call_samples_is_over_confident_and_per_round_values_are_not():
    """Why the unit is the round: every process has its own speed (placement, co-runners), so
    calls within one process are not independent. Pooled, an A/A comparison looks significant."""
    rng = np.random.default_rng(7)

    def process(offset: float) -> np.ndarray:
        return 1.0 * np.exp(offset + rng.normal(0.0, 0.01, 300))  # 300 calls around this process's speed

    pooled_hits = round_hits = 0
    for _ in range(50):
        a = [process(rng.normal(0.0, 0.05)) for _ in range(8)]
        b = [process(rng.normal(0.0, 0.05)) for _ in range(8)]
        pooled_hits += p_greater(np.concatenate(a), np.concatenate(b)) <= 0.01
        round_hits += p_greater([np.median(x) for x in a], [np.median(x) for x in b]) <= 0.01
    assert pooled_hits >= 10 and round_hits <= 2


def test_accuracy_is_a_threshold_on_the_drop():
    c = Criteria(max_accuracy_drop=0.01)
    assert judge_accuracy("accuracy", 0.95, 0.945, c, n_items=200).verdict == "pass"
    failed = judge_accuracy("accuracy", 0.95, 0.90, c, n_items=200)
    assert failed.verdict == "fail" and failed.change == pytest.approx(0.05) and "200" in failed.reason


def test_overall_verdict():
    def v(verdict: str) -> MetricVerdict:
        return MetricVerdict("m", "ms", verdict, "", "", 0.0, 1, 1)

    assert overall([v("pass"), v("pass")]) == "pass"
    assert overall([v("pass"), v("inconclusive")]) == "inconclusive"
    assert overall([v("inconclusive"), v("fail")]) == "fail"
    assert overall([]) == "inconclusive"
