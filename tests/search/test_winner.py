"""The winner, paired by round (issue 26): synthetic per-round values, no workers.

Each finalist round gives each config one value; configs are compared by the median of their
per-round ratios, so a round in which the whole machine was slow cancels out, and the calls
pooled across rounds (in which one noisy round owns the tail) never decide.
"""

from __future__ import annotations

from dataclasses import replace

import jsonschema
import numpy as np

from autodeploy.adapters.base import TrialConfig
from autodeploy.objectives import of as objective_of
from autodeploy.report import SCHEMA, study_record
from autodeploy.search.pairing import _enough_pairs, _quiet_target, unsteady
from autodeploy.search.rounds import round_values
from autodeploy.search.study import BASELINE, Finalist
from autodeploy.search.summary import load_text, speedup_text
from autodeploy.search.winner import MIN_WINNER_ROUNDS, still_in
from autodeploy.search.winner import choose as _choose


def finalist(engine, precision, threads, rounds, medians=(), *, baseline=False, loads=()):
    config = BASELINE if baseline else TrialConfig(engine, precision, threads=threads)
    known = [v for v in rounds if v is not None]
    return Finalist(config, config.label(), float(np.median(known)), (min(known), max(known)), 600, ["u"],
                    baseline, rounds=tuple(rounds), medians=tuple(medians), loads=tuple(loads))  # fmt: skip


QUIET = {"bf16": [1.00, 1.03, 0.98, 1.01, 0.99], "int8": [1.20, 1.22, 1.17, 1.21, 1.19], "base": [4.0, 4.3, 3.9, 4.1, 4.05]}


def test_one_round_three_times_slower_for_every_config_changes_neither_winner_nor_speedup():
    def study(values):
        return _choose("s", objective_of("latency"), {}, [finalist("openvino", "int8", 1, values["int8"]),
                                           finalist("openvino", "bf16", 2, values["bf16"]),
                                           finalist("", "", None, values["base"], baseline=True)])  # fmt: skip

    quiet = study(QUIET)
    noisy = study({k: [*v[:2], 3 * v[2], *v[3:]] for k, v in QUIET.items()})  # round 3: the machine was busy
    assert quiet.winner.label == noisy.winner.label == "openvino/bf16/b1/t2"
    ratios = np.asarray(QUIET["base"]) / np.asarray(QUIET["bf16"])
    assert abs(noisy.speedup_vs_baseline - quiet.speedup_vs_baseline) <= np.ptp(ratios)  # no more than the rounds move
    assert noisy.speedups["p90"].ci[0] <= noisy.speedup_vs_baseline <= noisy.speedups["p90"].ci[1]


def test_a_config_faster_in_most_rounds_wins_whatever_its_one_bad_round():
    good_mostly = finalist("openvino", "fp32", 1, [1.0, 1.0, 1.0, 1.0, 5.0])  # mean 1.8
    steady = finalist("onnxruntime", "fp32", 1, [1.1, 1.1, 1.1, 1.1, 1.2])  # mean 1.12
    assert _choose("s", objective_of("latency"), {}, [steady, good_mostly]).winner is good_mostly
    rates = [finalist("openvino", "fp32", 1, [900.0, 910.0, 300.0]), finalist("onnxruntime", "fp32", 1, [800.0, 810.0, 805.0])]
    assert _choose("s", objective_of("throughput"), {}, rates).winner is rates[0]  # items/s: higher is better, paired the same way


def _calls(low: float, high: float, n: int = 200) -> list[float]:
    return list(np.linspace(low, high, n))


def test_the_measured_case_picks_bf16_which_the_pooled_tail_got_wrong():
    """OpenVINO bf16/t2 was faster than int8/t1 in two quiet rounds; in one noisy round its tail was longer.
    The p90 of the calls pooled over the rounds picked int8 (1.5x slower when quiet); paired rounds pick bf16."""
    calls = {"bf16": [_calls(3.0, 3.8), _calls(3.0, 3.8), _calls(5.0, 13.5)],
             "int8": [_calls(5.0, 5.9), _calls(5.1, 6.0), _calls(5.0, 11.0)],
             "base": [_calls(18.0, 20.0), _calls(18.0, 20.5), _calls(20.0, 43.0)]}  # fmt: skip
    pooled = {k: float(np.percentile(np.concatenate(v), 90)) for k, v in calls.items()}
    assert pooled["int8"] < pooled["bf16"]  # the old rule's winner: int8
    order = ["int8", "bf16", "base"]
    per_round = [[{"x": c} for c in calls[k]] for k in order]
    values, statistic = round_values(per_round, [], (_Case(),), objective_of("latency"))
    medians, _ = round_values(per_round, [], (_Case(),), objective_of("latency"), "median")
    assert statistic == "p90"
    int8, bf16, base = (finalist(e, p, t, v, m, baseline=b) for (e, p, t, b), v, m in
                        zip([("openvino", "int8", 1, False), ("openvino", "bf16", 2, False), ("", "", None, True)],
                            values, medians, strict=True))  # fmt: skip
    summary = _choose("s", objective_of("latency"), {}, [int8, bf16, base], statistic)
    assert summary.winner is bf16 and not summary.tie_with and not summary.screening_only
    assert 4.5 < summary.speedup_vs_baseline < 6  # quiet rounds: ~19.8 / 3.7 ms, not the noisy round's
    assert set(summary.speedups) == {"p90", "median"} and summary.speedups["p90"].level == 0.6
    assert still_in([(0, values[0]), (1, values[1]), (2, values[2])], objective_of("latency"), keep=2) == [0, 1, 2]  # int8 won a round
    text = summary.headline()
    assert text.startswith("winner: openvino/bf16/b1/t2, p90 3.") and "for the ORT fp32 default: " in text
    assert "(median " in text and "intervals over 3 rounds, 60% coverage" in text
    record = study_record(summary)
    jsonschema.validate(record, SCHEMA, cls=jsonschema.Draft202012Validator)
    assert record["optimised"] == "p90" and record["statistic"] == "p90_ms" and record["rounds"] == 3
    assert set(record["speedups"]["p90"]) == {"ratio", "ci", "ci_level", "rounds", "left_out", "under_load", "span_s", "values"} and record["speedups"]["median"]["ci"]


class _Case:
    key, weight = "x", 1.0


def test_a_one_round_study_is_screening_only_and_its_speedup_has_no_interval():
    fast = finalist("openvino", "fp32", 1, [1.0], [0.9])
    base = finalist("", "", None, [3.0], [2.7], baseline=True)
    summary = _choose("s", objective_of("latency"), {}, [fast, base])
    assert summary.winner is fast and summary.screening_only and summary.rounds == 1
    assert summary.speedups["p90"].ci is None and summary.speedups["p90"].level is None
    assert summary.speedup_vs_baseline == 3.0
    record = study_record(summary)
    assert record["screening_only"] and record["speedups"]["p90"]["ci"] is None
    assert "3.00x (median 3.00x); screening only (1 finalist round, no interval)" in record["headline"]


def test_a_tie_is_close_in_most_rounds_and_the_cheaper_config_wins_it():
    quick = finalist("openvino", "fp32", 4, [1.00, 1.00, 1.00])
    cheap = finalist("openvino", "fp32", 1, [1.02, 0.99, 1.01])  # within 3%, faster in one round
    summary = _choose("s", objective_of("latency"), {}, [quick, cheap])
    assert summary.winner is cheap and summary.tie_with == [quick.label]
    behind = finalist("openvino", "fp32", 1, [1.02, 1.02, 1.025])  # within 3% but slower in every round
    assert _choose("s", objective_of("latency"), {}, [quick, behind]).winner is quick


# Measured beside a CPU hog (benchmarks/noisy_neighbour.py, zoo:mobilenetv2): the one-thread winner held
# ~4.5 ms while the all-cores baseline read 18-22 ms in the rounds the hog shared with it, 8.5 ms in the
# one it did not; quiet runs of the same study gave ratios of 1.6-2.8.
HOG = {"win": [5.04, 4.49, 4.85, 4.28, 4.48], "win_load": [0.90, 0.01, 0.53, 0.05, 0.26],
       "base": [18.49, 8.49, 19.61, 18.06, 21.72], "base_load": [0.92, 0.08, 0.88, 0.35, 0.88]}


def test_the_speedup_rests_on_the_rounds_in_which_neither_run_was_under_load():
    win = finalist("openvino", "bf16", 1, HOG["win"], loads=HOG["win_load"])
    base = finalist("", "", None, HOG["base"], baseline=True, loads=HOG["base_load"])
    summary = _choose("s", objective_of("latency"), {}, [win, base])
    main = summary.speedups["p90"]
    assert summary.winner is win and main.rounds == 1 and main.left_out == 4 and not main.under_load
    assert summary.speedup_vs_baseline == 8.49 / 4.49  # round 2 only: both quiet
    pooled_rounds = float(np.median(np.asarray(HOG["base"]) / np.asarray(HOG["win"])))
    assert pooled_rounds > 2 * summary.speedup_vs_baseline  # every round would have owned the neighbour's slowdown
    headline = study_record(summary)["headline"]
    assert "4 rounds under load left out of these numbers" in headline
    assert "p90 4.490 ms vs 8.490 ms" in headline  # the numbers the ratio rests on, not the medians over loaded rounds
    assert main.values == (8.49, 4.49)


def test_with_no_quiet_round_the_loaded_ones_count_and_say_so():
    win = finalist("openvino", "bf16", 1, HOG["win"], loads=[0.9] * 5)
    base = finalist("", "", None, HOG["base"], baseline=True, loads=HOG["base_load"])
    summary = _choose("s", objective_of("latency"), {}, [win, base])
    main = summary.speedups["p90"]
    assert main.under_load and main.rounds == 5 and main.left_out == 0
    record = study_record(summary)
    jsonschema.validate(record, SCHEMA, cls=jsonschema.Draft202012Validator)
    assert record["speedups"]["p90"]["under_load"] is True
    assert "every paired round ran under load" in record["headline"]


def test_a_load_that_was_not_read_counts_as_quiet():
    win = finalist("openvino", "bf16", 1, QUIET["bf16"])
    base = finalist("", "", None, QUIET["base"], baseline=True, loads=[None, 0.05, None, 0.1, None])
    main = _choose("s", objective_of("latency"), {}, [win, base]).speedups["p90"]
    assert main.rounds == 5 and main.left_out == 0 and not main.under_load


def test_pair_rounds_run_until_as_many_quiet_pairs_as_rounds_and_stop_on_a_machine_that_stays_busy():
    """The measured hog run above left 1 quiet pair of 5: pair rounds run until 5 are quiet, so a run beside a
    neighbour rests on as many pairs as a quiet one; none run when nothing was loaded; they stop, saying
    why, once the last 5 pair rounds all ran under load."""
    assert _quiet_target(5) == 5 and _quiet_target(1) == MIN_WINNER_ROUNDS
    assert _enough_pairs(quiet=1, loaded=4, target=5, loaded_in_a_row=0, rounds=5) is None
    assert _enough_pairs(quiet=4, loaded=6, target=5, loaded_in_a_row=4, rounds=5) is None
    assert _enough_pairs(quiet=5, loaded=6, target=5, loaded_in_a_row=0, rounds=5) == ""
    assert _enough_pairs(quiet=3, loaded=0, target=5, loaded_in_a_row=0, rounds=5) == ""  # ended early, quiet
    why = _enough_pairs(quiet=1, loaded=9, target=5, loaded_in_a_row=5, rounds=5)
    assert why == "the last 5 pair rounds ran under load: the machine stays busy, the speed-up rests on 1 quiet pair"


# A detector's quiet run (ppocrv5-det 160², OpenVINO fp32 t1 against the ORT fp32 default): the default read
# 5 or 10 ms with the meter at 0.06-0.09 cores (a host taking a vCPU); the winner held 5.7-6.6 ms.
UNSTEADY = {"win": [5.88, 6.07, 5.73, 5.94, 6.64], "base": [10.63, 10.25, 10.12, 5.33, 8.63]}


def test_a_baseline_whose_quiet_rounds_disagree_is_named_with_its_range():
    win = finalist("openvino", "fp32", 1, UNSTEADY["win"], loads=[0.05] * 5)
    base = finalist("", "", None, UNSTEADY["base"], baseline=True, loads=[0.06] * 5)
    summary = _choose("s", objective_of("latency"), {}, [win, base])
    (entry,) = unsteady(summary)
    assert entry == {"config": base.label, "baseline": True, "low": 5.33, "high": 10.63}
    record = study_record(replace(summary, load={"rounds": [0.06] * 5, "unsteady": [entry]}))
    jsonschema.validate(record, SCHEMA, cls=jsonschema.Draft202012Validator)
    assert "the ORT fp32 default read 5.33-10.63 ms (1.99x apart" in load_text(record)
    assert speedup_text(record).endswith(", unsteady machine")
    steady = _choose("s", objective_of("latency"), {}, [win, finalist("", "", None, [5.0, 5.3, 5.2, 5.6, 5.1], baseline=True)])
    assert unsteady(steady) == []  # within 1.5x: nothing to say
    loaded = finalist("", "", None, UNSTEADY["base"], baseline=True, loads=[0.06, 0.06, 0.06, 0.9, 0.06])
    assert unsteady(_choose("s", objective_of("latency"), {}, [win, loaded])) == []  # the 5.33 ms round ran under load


def test_configs_are_compared_on_the_rounds_in_which_neither_ran_under_load():
    """Beside a neighbour, OpenVINO bf16 on both cores read 8.5-9.2 ms and on one core 4.6-5.1 ms; in the
    rounds where neither ran under load both cores read 3.0 ms. The rounds where neither ran under load
    pick both cores (the fastest on this device); all rounds would pick one core, the config that
    suffers the neighbour least. With no round quiet for a pair, every round counts."""
    one = finalist("openvino", "bf16", 1, [4.61, 4.65, 4.50, 5.10, 4.92], loads=[1.00, 0.79, 0.08, 0.83, 0.07])
    both = finalist("openvino", "bf16", 2, [9.0, 8.5, 3.1, 9.2, 3.0], loads=[0.90, 0.85, 0.06, 0.95, 0.05])
    assert _choose("s", objective_of("latency"), {}, [one, both]).winner is both
    busy = [replace(f, loads=(0.9,) * 5) for f in (one, both)]
    assert _choose("s", objective_of("latency"), {}, busy).winner is busy[0]
    # nor does a config leave the rounds on the rounds it ran under load: two loaded rounds put both cores
    # 1.9x behind; in the quiet one it was 5% behind, inside the margin one pair needs
    values = [[4.61, 4.65, 4.50], [9.0, 8.5, 4.72]]
    assert still_in(list(enumerate(values)), objective_of("latency")) == [0]  # every round: both cores wholly behind
    assert still_in(list(enumerate(values)), objective_of("latency"), loads={0: one.loads, 1: both.loads}) == [0, 1]


def test_a_config_replaces_the_baseline_only_by_beating_it_by_more_than_the_tie_margin():
    """Issue 52 item 3: ties with the baseline were broken both ways (a cheaper bf16 at p90 11.66 ms shipped over the
    file as given at 11.56 ms; elsewhere the baseline stayed). One rule now: the baseline stays unless beaten by more
    than TIE_TOLERANCE (median of the per-round ratios)."""
    base = finalist("", "", None, [11.56, 11.60, 11.52, 11.58], baseline=True)
    lossy = finalist("openvino", "bf16", 1, [11.66, 11.50, 11.70, 11.55])  # cheaper (1 thread) and tied
    assert _choose("s", objective_of("latency"), {}, [lossy, base]).winner is base
    slightly = finalist("openvino", "bf16", 1, [11.40, 11.45, 11.38, 11.42])  # faster every round, by ~1.3%
    assert _choose("s", objective_of("latency"), {}, [slightly, base]).winner is base
    clearly = finalist("openvino", "bf16", 1, [10.90, 10.95, 10.88, 10.92])  # ~6% faster every round
    summary = _choose("s", objective_of("latency"), {}, [clearly, base])
    assert summary.winner is clearly and summary.speedup_vs_baseline > 1.03
    # Between two configs that are not the baseline, the cheaper of a tie still wins.
    far = finalist("", "", None, [20.0, 20.1, 19.9, 20.0], baseline=True)
    quick = finalist("openvino", "fp32", 4, [10.00, 10.00, 10.00, 10.00])
    cheap = finalist("openvino", "fp32", 1, [10.02, 9.99, 10.01, 10.00])
    assert _choose("s", objective_of("latency"), {}, [quick, cheap, far]).winner is cheap
