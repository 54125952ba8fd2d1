import numpy as np
import pytest

from autodeploy.harness.stats import (
    MIN_SAMPLES_P90,
    MIN_SAMPLES_P99,
    UNSTABLE_CV,
    bootstrap_change_ci,
    bootstrap_mean_ci,
    claimed,
    insufficient,
    latency_claim,
    summarize,
)

MEDIAN_NS = 2_000_000  # 2 ms: the true median of the generating lognormal


def lognormal_ns(n: int, sigma: float = 0.2, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.lognormal(np.log(MEDIAN_NS), sigma, n).astype(np.int64)


def test_point_estimates_match_numpy():
    x = lognormal_ns(1000)
    ms = x / 1e6
    s = summarize(x)
    assert s.n == 1000
    assert s.median == pytest.approx(np.percentile(ms, 50, method="linear"))
    assert s.p90 == pytest.approx(np.percentile(ms, 90, method="linear"))
    assert s.p99 == pytest.approx(np.percentile(ms, 99, method="linear"))
    assert s.mean == pytest.approx(ms.mean())
    assert s.stdev == pytest.approx(ms.std(ddof=1))
    assert s.cv == pytest.approx(ms.std(ddof=1) / ms.mean())
    assert (s.min, s.max) == (pytest.approx(ms.min()), pytest.approx(ms.max()))
    assert s.insufficient == ()


def test_cis_bracket_point_estimates_and_are_deterministic():
    x = lognormal_ns(1000)
    s = summarize(x, seed=3)
    for point, (lo, hi) in ((s.median, s.median_ci), (s.p90, s.p90_ci), (s.p99, s.p99_ci)):
        assert lo <= point <= hi
    assert summarize(x, seed=3) == s
    assert summarize(x, seed=4).median_ci != s.median_ci


def test_median_ci_contains_true_median_and_narrows_with_n():
    widths = []
    for n in (100, 1_000, 20_000):
        lo, hi = summarize(lognormal_ns(n, seed=7)).median_ci
        widths.append(hi - lo)
        if n == 20_000:
            assert lo <= MEDIAN_NS / 1e6 <= hi
    assert widths[0] > widths[1] > widths[2]


def test_bootstrap_matches_naive_resampling():
    # The order-statistic sampler must give the same intervals as resampling whole arrays.
    x = lognormal_ns(300, sigma=0.3, seed=1)
    ms = x / 1e6
    reps = np.percentile(ms[np.random.default_rng(9).integers(0, 300, (20_000, 300))], [50, 90], axis=1)
    s = summarize(x, n_boot=20_000)
    scale = s.median_ci[1] - s.median_ci[0]
    for ci, rep in ((s.median_ci, reps[0]), (s.p90_ci, reps[1])):
        naive = np.percentile(rep, [2.5, 97.5])
        assert np.abs(np.array(ci) - naive).max() < 0.1 * scale


def test_large_n_is_fast_and_bounded():
    s = summarize(lognormal_ns(100_000))
    assert s.p99 is not None and s.p99_ci[0] <= s.p99 <= s.p99_ci[1]


def test_p90_and_p99_need_enough_samples():
    s = summarize(lognormal_ns(MIN_SAMPLES_P90 - 1))
    assert s.p90 is None and s.p90_ci is None and s.p99 is None and s.p99_ci is None
    assert s.insufficient == (
        f"p90 needs >= 64 samples, have {MIN_SAMPLES_P90 - 1}",
        f"p99 needs >= 662 samples, have {MIN_SAMPLES_P90 - 1}",
    )
    s = summarize(lognormal_ns(150))
    assert s.p90 is not None and s.p90_ci is not None and s.p99 is None
    assert s.insufficient == ("p99 needs >= 662 samples, have 150",)
    s = summarize(lognormal_ns(MIN_SAMPLES_P99))
    assert s.p99 is not None and s.insufficient == ()


def test_unstable_flag():
    assert not summarize(lognormal_ns(500, sigma=0.02)).unstable
    noisy = summarize(lognormal_ns(500, sigma=0.5))
    assert noisy.cv > UNSTABLE_CV and noisy.unstable


def test_constant_samples():
    s = summarize([1_000_000] * 10)
    assert s.median == s.mean == 1.0 and s.stdev == 0.0 and s.cv == 0.0
    assert s.median_ci == (1.0, 1.0) and not s.unstable


@pytest.mark.parametrize("bad", [[], [5], np.zeros((2, 2))])
def test_rejects_too_few_or_malformed(bad):
    with pytest.raises(ValueError):
        summarize(bad)


def test_mean_ci_is_the_textbook_bootstrap_drawn_in_blocks():
    # Blocks of resamples draw the same stream as one n_boot x n array: the same interval, bounded memory.
    ms = lognormal_ns(5000, seed=2) / 1e6
    means = ms[np.random.default_rng(0).integers(0, ms.size, (2000, ms.size))].mean(axis=1)
    assert bootstrap_mean_ci(ms, seed=0) == pytest.approx(tuple(np.percentile(means, [2.5, 97.5])))
    low, high = bootstrap_mean_ci(ms, seed=1, level=0.5)
    assert low < ms.mean() < high and bootstrap_mean_ci(ms, seed=1, level=0.5) == (low, high)


def test_change_ci_matches_naive_resampling_of_both_samples():
    rng = np.random.default_rng(5)
    b, c = rng.lognormal(0.0, 0.1, 41), rng.lognormal(0.1, 0.1, 41)
    draw = np.random.default_rng(11)
    mb = np.median(b[draw.integers(0, b.size, (20_000, b.size))], axis=1)
    mc = np.median(c[draw.integers(0, c.size, (20_000, c.size))], axis=1)
    naive = np.percentile(mc / mb - 1.0, [5, 95])
    ci = bootstrap_change_ci(b, c, n_boot=20_000, level=0.90)
    point = np.median(c) / np.median(b) - 1.0
    assert ci[0] < point < ci[1] and np.abs(np.array(ci) - naive).max() < 0.1 * (naive[1] - naive[0])
    ninety = bootstrap_change_ci(b, c, q=90.0, seed=3)
    assert ninety[0] < np.percentile(c, 90) / np.percentile(b, 90) - 1.0 < ninety[1]


def test_change_ci_of_a_million_samples_is_fast_and_rejects_empty_samples():
    big = lognormal_ns(1_000_000).astype(float)
    low, high = bootstrap_change_ci(big, big * 1.1)
    assert low == pytest.approx(0.1, abs=0.01) and high == pytest.approx(0.1, abs=0.01)
    with pytest.raises(ValueError, match="non-empty"):
        bootstrap_change_ci([], [1.0])


def test_median_interval_is_the_exact_order_statistic_interval_with_its_coverage():
    from autodeploy.harness.stats import median_interval

    assert median_interval([2.0]) is None  # one round: no interval
    assert median_interval([3.0, 1.0, 2.0]) == (1.0, 3.0, 0.75)  # min..max of 3 covers 1 - 2/8
    low, high, coverage = median_interval(list(range(9)))
    assert (low, high) == (1.0, 7.0) and coverage >= 0.95  # enough rounds: narrower than min..max


def test_round_values_are_p90_with_the_calls_for_it_and_ratios_are_paired_by_round():
    from autodeploy.harness.stats import paired_ratios, round_statistic, round_value

    assert round_value(range(100), "p90") == pytest.approx(89.1) and round_value(range(10), "p90") is None
    assert round_value(range(10), "median") == 4.5
    assert round_statistic([200, 64]) == "p90" and round_statistic([200, 63]) == "median"
    assert paired_ratios([2.0, None, 9.0], [1.0, 1.0, 3.0]).tolist() == [2.0, 3.0]  # only rounds both ran


def test_a_latency_claims_its_p90_where_there_are_samples_for_one_else_its_median():
    few, enough = summarize(lognormal_ns(MIN_SAMPLES_P90 - 1)), summarize(lognormal_ns(MIN_SAMPLES_P90))
    assert latency_claim(few) == (few.median, few.median_ci)
    assert latency_claim(enough) == (enough.p90, enough.p90_ci) and enough.p90 != enough.median
    assert claimed(None, 2.0) == 2.0 and claimed(3.0, 2.0) == 3.0


def test_a_stored_measurement_reads_its_missing_claims_as_summarize_words_them():
    from autodeploy.harness.result import _insufficient

    for n in (MIN_SAMPLES_P90 - 1, 150, MIN_SAMPLES_P99):
        assert _insufficient(n) == insufficient(n) == summarize(lognormal_ns(n)).insufficient
