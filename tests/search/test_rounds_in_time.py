"""Finalist rounds that sample the machine over time, and the baseline against its history (issue 42).

A shared VM's host takes a vCPU for seconds to minutes: rounds a few seconds apart all read one state of it, agree
with each other, and the next run lands elsewhere. The rounds are spread over time at random points drawn from the
study's seed; the speed-up says how long its rounds span; a baseline outside the range of its earlier studies on
this device is said, with the speed-up over that range. One real study (a tiny model, a real SQLite store whose
history is stored through the Store API); the rest on synthetic values.
"""

from __future__ import annotations

from dataclasses import replace

import jsonschema
import numpy as np
import pytest

from autodeploy.harness.result import LatencyStats, Measurement, TrialResult
from autodeploy.harness.stats import CLAIMED_COVERAGE
from autodeploy.objectives import of as objective_of
from autodeploy.report import SCHEMA, study_record
from autodeploy.results_db import DeviceRecord, ModelRecord, TrialFilter
from autodeploy.search.config import Finalists
from autodeploy.search.context import shape_key
from autodeploy.search.rounds import SPREAD_MAX_S, _Schedule, _spread
from autodeploy.search.study import BASELINE, run_study
from autodeploy.search.summary import history_text
from autodeploy.search.winner import choose as _choose
from autodeploy.verdict import HISTORY_MIN_RUNS, against_history
from tests.search.test_study import make_ctx
from tests.search.test_winner import finalist


def test_rounds_are_due_at_random_points_of_the_span_in_an_order_drawn_from_the_seed():
    one, same, other = _Schedule(7, 5, 120.0), _Schedule(7, 5, 120.0), _Schedule(8, 5, 120.0)
    assert one.due == same.due and one.due != other.due  # reproducible by the study's seed, another seed differs
    assert one.due[0] == 0.0 and one.due[-1] == pytest.approx(120.0)  # the rounds cover the span, first to last
    gaps = np.diff(one.due)
    assert np.all(gaps > 0) and gaps.max() > 1.5 * gaps.min()  # spaced at random, not evenly
    orders = [one.order([0, 1, 2, 3]) for _ in range(6)]
    assert orders == [same.order([0, 1, 2, 3]) for _ in range(6)]
    assert all(sorted(o) == [0, 1, 2, 3] for o in orders) and len({tuple(o) for o in orders}) > 2
    assert _Schedule(7, 5, 0.0).due == (0.0,) * 5  # no spread: back to back
    # the span: the config's, else the study's own time so far (at most SPREAD_MAX_S); none for one round
    assert _spread(Finalists(rounds=5), 80.0) == 80.0 and _spread(Finalists(rounds=5), 10_000.0) == SPREAD_MAX_S
    assert _spread(Finalists(rounds=5, spread_s=0), 80.0) == 0.0 and _spread(Finalists(rounds=1), 80.0) == 0.0


def test_the_speedup_states_the_span_of_its_rounds_and_no_more_coverage_than_claimed():
    times = (1000.0, 1040.0, 1095.0, 1130.0, 1180.0)
    win = replace(finalist("openvino", "bf16", 1, [1.0, 1.03, 0.98, 1.01, 0.99]), times=times)
    base = replace(finalist("", "", None, [4.0, 4.3, 3.9, 4.1, 4.05], baseline=True), times=tuple(t + 3 for t in times))
    main = _choose("s", objective_of("latency"), {}, [win, base]).speedups["p90"]
    assert main.span_s == pytest.approx(183.0) and main.level == CLAIMED_COVERAGE < 0.9375  # 5 rounds: min..max
    record = study_record(_choose("s", objective_of("latency"), {}, [win, base]))
    jsonschema.validate(record, SCHEMA, cls=jsonschema.Draft202012Validator)
    assert record["speedups"]["p90"]["span_s"] == pytest.approx(183.0) and record["winner"]["round_times"] == list(times)
    assert f"intervals over 5 rounds across 3.0 min, {CLAIMED_COVERAGE:.0%} coverage" in record["headline"]


def test_a_baseline_outside_its_history_is_said_with_both_numbers_and_the_speedup_over_that_range():
    earlier = [4.9, 5.2, 6.0, 8.0, 8.4, 8.7]
    found = against_history("p90", 9.5, earlier, winner=4.0)
    assert found.outside and (found.low, found.high, found.runs) == (4.9, 8.7, 6)
    assert found.over_range == pytest.approx((4.9 / 4.0, 8.7 / 4.0))
    text = history_text(found.to_dict(), "the ORT fp32 default", "latency")
    assert text == "the ORT fp32 default read p90 9.500 ms today; 4.900–8.700 ms in 6 earlier studies on this device: 1.23–2.17x over that range"
    assert not against_history("p90", 6.5, earlier, winner=4.0).outside  # inside the range: nothing to say
    assert not against_history("p90", 9.5, earlier[: HISTORY_MIN_RUNS - 1]).outside  # too few earlier studies
    assert against_history("p90", 9.5, []) is None
    rate = against_history("items/s", 50.0, [100.0, 120.0, 110.0], higher_is_better=True, winner=200.0)
    assert rate.outside and rate.over_range == pytest.approx((200 / 120, 200 / 100))


def _stored_baseline(p90: float, uid: str, version: str, config=BASELINE) -> TrialResult:
    """A measured trial as a worker stores it, reading ``p90`` ms (its median 0.9 of that)."""
    latency = LatencyStats(n=200, median=p90 * 0.9, mean=p90 * 0.92, stdev=0.1, cv=0.01, min=p90 * 0.8, max=p90 * 1.2,
                           median_ci=(p90 * 0.89, p90 * 0.91), p90=p90, p90_ci=(p90 * 0.99, p90 * 1.01), p99=None,
                           p99_ci=None, unstable=False)  # fmt: skip
    measurement = Measurement(scenario="single-stream", batch=1, latency=latency, throughput=1000 / p90, peak_rss_mb=10.0,
                              artifact_mb=0.1, build_s=0.1, warmup_calls=5, duration_s=1.0, accuracy=None)  # fmt: skip
    return TrialResult(uid=uid, config=config, status="ok", engine_version=version, measurement=measurement)


@pytest.mark.slow  # one small study with three rounds spread over 1.5 s: about 10 s here
def test_a_study_spreads_its_rounds_and_says_when_its_baseline_left_its_history(tmp_path):
    from autodeploy.adapters import registry

    db = f"sqlite:///{tmp_path / 'r.db'}"
    ctx = make_ctx(tmp_path, db, trials=1, knobs={"onnxruntime": {"execution_mode": ["ORT_SEQUENTIAL"]}},
                   finalists={"count": 1, "rounds": 3, "min_samples": 64, "min_duration_s": 0.1, "spread_s": 1.5})  # fmt: skip
    # Three earlier studies of this model's baseline on this device read 50-60 ms (a tiny MLP reads microseconds);
    # a trial of this study's own name and one on another device are no history.
    model, device = ModelRecord.of(ctx.model), DeviceRecord.of(ctx.device)
    version = registry.get(BASELINE.engine).probe_version()
    for i, (p90, study, on) in enumerate([(50.0, "old-1", device), (60.0, "old-2", device), (55.0, "old-3", device),
                                          (900.0, "s", device), (1.0, "old-4", replace(device, fingerprint="elsewhere"))]):  # fmt: skip
        ctx.store.add_trial(_stored_baseline(p90, f"old{i}", version), model=model, device=on, study=study,
                            phase="finalist", shape_key=shape_key(ctx.model))  # fmt: skip
    summary = run_study(ctx)

    base = next(f for f in summary.finalists if f.baseline)
    started = base.times[: len(summary.load["rounds"])]  # the finalist rounds (pair rounds may follow under load)
    assert len(started) == 3 and max(started) - min(started) >= 1.5  # the rounds span the time asked for
    assert "rounds over " in summary.confidence
    history = summary.baseline_history
    assert history["outside"] and (history["low"], history["high"], history["runs"]) == (50.0, 60.0, 3)
    assert history["today"] == base.statistic and history["statistic"] == summary.statistic
    record = study_record(ctx.store.get_study("s"))  # as stored, as the dashboard and --format json read it
    jsonschema.validate(record, SCHEMA, cls=jsonschema.Draft202012Validator)
    assert record["baseline_history"] == history
    if summary.winner is not None and not summary.winner.baseline:  # the baseline may win on a tiny model
        assert history["over_range"][0] == pytest.approx(50.0 / summary.winner.statistic)
        assert "50.00–60.00 ms in 3 earlier studies on this device: " in record["headline"]
        assert record["speedups"][summary.statistic]["span_s"] >= 1.5
    else:
        assert history["over_range"] is None and "earlier studies on this device" in record["headline"]
    assert {r.study for r in ctx.store.trials(TrialFilter(study="s", phase="finalist"))} == {"s"}
