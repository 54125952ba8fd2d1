import numpy as np
import pytest

from autodeploy.harness.stats import MIN_SAMPLES_P90, MIN_SAMPLES_P99, UNSTABLE_CV, summarize

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
