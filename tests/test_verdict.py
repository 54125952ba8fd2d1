"""The one place "accurate enough" and "better" are decided: the rules, and every caller agreeing on them."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from autodeploy import verdict
from autodeploy.accuracy.measure import compare as _compare
from autodeploy.search.config import Constraints
from autodeploy.search.objective import Metrics, values, violations
from autodeploy.verdict import (
    DEFAULT_MAX_ACCURACY_DROP,
    DEFAULT_MIN_COSINE,
    Accuracy,
    Limits,
    Measured,
    OutputAccuracy,
    accuracy_drop,
    accuracy_verdict,
    constraint_verdicts,
    dominates,
    feasible,
    pareto_front,
    reasons,
)
from tests.accuracy.test_measure import flip_argmax, logits


def compare(outputs, reference, **kw):
    """:func:`autodeploy.accuracy.measure.compare`, the outputs named ``logits`` here being class logits,
    as a graph that reads their argmax proves (a float ``[N, C]`` alone is judged as a regression)."""
    return _compare(outputs, reference, readers={"logits": "ArgMax"}, **kw)


def out(name="y", cosine=1.0, top1=None, task=None, ref_task=None, exact=None) -> OutputAccuracy:
    return OutputAccuracy(name, 0.0, 0.0, cosine, top1, task, ref_task, exact)


def accuracy(*outputs: OutputAccuracy) -> Accuracy:
    return Accuracy(outputs, 100, "", True)


def test_defaults_are_the_design_budget():
    assert DEFAULT_MAX_ACCURACY_DROP == 0.01 and DEFAULT_MIN_COSINE == pytest.approx(0.99)
    assert Limits() == Limits(0.01, None, None)
    assert Constraints().max_accuracy_drop == DEFAULT_MAX_ACCURACY_DROP


def test_import_loads_no_heavy_package():
    code = "import sys, autodeploy.verdict; print(sorted(m for m in ('optuna', 'sqlalchemy', 'pandas', 'numpy') if m in sys.modules))"
    printed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert printed.strip() == "[]"


# -- the accuracy rule ---------------------------------------------------------------------


def test_each_output_is_judged_by_what_it_is_and_the_worst_is_named():
    """A classifier by top-1, an embedding beside it by SQNR (issue 14: judged per output; issue 25: SQNR)."""
    decided = logits()
    decided[np.arange(len(decided)), np.argmax(decided, axis=1)] += 3.0  # every class decided: each flip counts
    ref = {"logits": decided, "embedding": logits(classes=1)}
    good = {"logits": flip_argmax(ref["logits"], 2), "embedding": ref["embedding"] * 1.001}
    acc = compare(good, ref)
    assert acc.constraint == "top-1 agreement >= 0.99 and SQNR >= 17 dB" and acc.passed
    assert accuracy_drop(acc) == pytest.approx(0.01)
    bad = compare({**good, "embedding": -ref["embedding"]}, ref)  # noise 4x the signal: -6 dB, a total loss
    assert not bad.passed and accuracy_drop(bad) == pytest.approx(1.0)
    assert verdict.worst(bad.outputs) == ("output 'embedding': SQNR -6.0 dB, limit 17 dB "
                                          "(max abs error 4.796, p99 4.651, in the output's units)")
    assert not compare({**good, "logits": flip_argmax(ref["logits"], 3)}, ref).passed


def test_integer_outputs_are_compared_exactly():
    """Ids have no "close": 1 wrong id in 100 is a 1% drop whatever the ids' values; int [N, T] is no classifier."""
    ids = np.arange(200, dtype=np.int64).reshape(100, 2) % 7
    got = ids.copy()
    got[5, 1] += 1
    acc = compare({"ids": got}, {"ids": ids})
    (o,) = acc.outputs
    assert o.exact_agreement == pytest.approx(0.995) and o.top1_agreement is None
    assert acc.constraint == "exact agreement >= 0.99" and acc.passed
    got[6:9, 0] += 1
    worse = compare({"ids": got}, {"ids": ids})
    assert not worse.passed and verdict.worst(worse.outputs) == "output 'ids': exact agreement 0.98"


def test_non_classifier_outputs_are_judged_on_cosine():
    v = accuracy_verdict([out(cosine=0.995), out("z", cosine=0.985)])
    assert v == verdict.AccuracyVerdict("cosine >= 0.99", False)
    assert accuracy_verdict([out(cosine=0.995)], min_cosine=0.99).passed
    assert accuracy_drop(accuracy(out(cosine=0.995), out("z", cosine=0.985))) == pytest.approx(0.015)


def test_exactly_at_the_budget_passes_everywhere():
    """99 of 100 rows agree at a 1% budget: float rounding (1 - 0.99 > 0.01) must not fail it anywhere."""
    at = accuracy(out(top1=0.99))
    assert accuracy_verdict(at.outputs).passed
    drop = accuracy_drop(at)
    assert drop > 0.01  # 0.010000000000000009: the rounding the tolerance absorbs
    assert violations(_metrics(drop=drop), Constraints(), "latency")["accuracy_drop"] == 0.0
    assert reasons(Measured(1.0, drop), Limits(), "latency") == []
    assert not accuracy_verdict([out(top1=0.989)]).passed


def test_labels_add_the_task_accuracy_drop():
    ref = logits()
    labels = np.argmax(ref, axis=-1)
    acc = compare({"logits": flip_argmax(ref, 2)}, {"logits": ref}, labels=labels)
    assert acc.constraint == "top-1 agreement >= 0.99 and task accuracy drop <= 0.01" and acc.passed
    worse = [out(top1=1.0, task=0.90, ref_task=0.95)]
    assert not accuracy_verdict(worse).passed and accuracy_verdict(worse, max_accuracy_drop=0.05).passed
    assert accuracy_drop(accuracy(*worse)) == pytest.approx(0.05)


def test_non_finite_outputs_always_fail():
    ref = logits()
    bad = ref.copy()
    bad[0, 0] = np.nan  # argmax still agrees on every row: top-1 alone would pass it
    acc = compare({"logits": bad}, {"logits": ref})
    assert acc.outputs[0].top1_agreement >= 0.99 and not acc.passed
    assert accuracy_drop(acc) == 1.0
    found = violations(_metrics(drop=accuracy_drop(acc)), Constraints(max_accuracy_drop=0.5), "latency")
    assert found["accuracy_drop"] > 0  # even a loose budget: the study never picks it
    assert not accuracy_verdict([out(cosine=float("nan"))], min_cosine=-1.0).passed


@pytest.mark.parametrize("seed", range(20))
def test_the_pass_rule_and_the_drop_agree(seed):
    """With min_cosine = 1 - max_accuracy_drop, compare() passes exactly when accuracy_drop is within the budget."""
    rng = np.random.default_rng(seed)
    outputs = [
        out(f"o{i}", cosine=float(rng.uniform(0.97, 1.0)),
            top1=float(rng.uniform(0.97, 1.0)) if rng.random() < 0.5 else None,
            exact=float(rng.uniform(0.97, 1.0)) if rng.random() < 0.3 else None)
        for i in range(int(rng.integers(1, 4)))
    ]  # fmt: skip
    max_accuracy_drop = float(rng.uniform(0.0, 0.03))
    passed = accuracy_verdict(outputs, max_accuracy_drop=max_accuracy_drop, min_cosine=1 - max_accuracy_drop).passed
    assert passed == verdict.within(accuracy_drop(accuracy(*outputs)), max_accuracy_drop)


def test_gate_score_prefers_task_then_top1_then_cosine():
    rows = [{"cosine": 0.9, "top1_agreement": 0.97, "task_accuracy": None}, {"cosine": 0.8}]
    assert verdict.accuracy_score(rows) == (0.97, "top-1 agreement vs FP32")
    assert verdict.accuracy_score([{"cosine": 0.9, "task_accuracy": 0.5}]) == (0.5, "task accuracy")
    assert verdict.accuracy_score([]) == (None, None)
    nan = float("nan")
    assert verdict.accuracy_score([{"cosine": 0.9}, {"cosine": nan}]) == (0.0, "cosine vs FP32")
    assert verdict.accuracy_score([{"cosine": nan}, {"cosine": 0.9}]) == (0.0, "cosine vs FP32")


# -- constraints ---------------------------------------------------------------------------


def _metrics(latency=2.0, drop=0.0, mb=50.0, rate=None, uid="u") -> Metrics:
    return Metrics(uid, median_ms=latency, p90_ms=latency, throughput=None, peak_rss_mb=mb, accuracy_drop=drop,
                   server_rate=rate)  # fmt: skip


def test_the_sla_bounds_latency_except_for_the_server_objective():
    limits = Constraints(sla_ms=1.0)
    slow = _metrics(latency=2.0, rate=100.0)
    for objective in ("latency", "throughput", "pareto"):
        assert violations(slow, limits, objective)["latency_ms"] == 1.0
    server = violations(slow, limits, "server")
    assert "latency_ms" not in server and server["server_rate"] == 0.0 and feasible(server)
    assert violations(_metrics(rate=0.0), limits, "server")["server_rate"] == 1.0
    # Outside the study the server rate is not recorded: its constraint is not judged, not failed.
    assert "server_rate" not in verdict.violations(Measured(2.0, 0.0), Limits(sla_ms=1.0), "server")
    assert reasons(Measured(2.0, 0.0), Limits(sla_ms=1.0), "latency") == ["latency 2.000 ms > SLA 1 ms"]
    assert reasons(Measured(2.0, 0.0, server_rate=0.0), Limits(sla_ms=1.0), "server") == [
        "no rate meets the SLA of 1 ms"
    ]


def test_limits_from_stored_settings_and_from_the_config():
    assert Limits.of({"max_memory_mb": 100}) == Limits(0.01, 100, None)
    assert Limits.of({"max_accuracy_drop": None, "sla_ms": 5}) == Limits(0.01, None, 5)
    assert Limits.of(Constraints(max_accuracy_drop=0.05, sla_ms=2)) == Limits(0.05, None, 2)
    assert Limits.of(None) == Limits()


def test_constraint_verdicts_state_limit_measured_and_passed():
    found = constraint_verdicts(Measured(2.0, 0.02, 80.0), Limits(0.01, 100.0, 1.0), "latency")
    assert found == {
        "accuracy_drop": {"limit": 0.01, "measured": 0.02, "passed": False},
        "memory_mb": {"limit": 100.0, "measured": 80.0, "passed": True},
        "latency_ms": {"limit": 1.0, "measured": 2.0, "passed": False},
    }
    assert set(constraint_verdicts(Measured(2.0, 0.0), Limits(sla_ms=1.0), "server")) == {"accuracy_drop"}
    assert feasible({}) and not feasible({"a": 0.0, "b": 1e-6})


# -- Pareto --------------------------------------------------------------------------------


def test_dominance_and_the_front_on_a_hand_made_set():
    points = [
        [1.0, 0.00, 10.0],  # 0: front
        [0.5, 0.01, 12.0],  # 1: front (faster, less accurate)
        [2.0, 0.00, 11.0],  # 2: dominated by 0
        [1.0, 0.00, 10.0],  # 3: equal to 0: neither dominates, both on the front
        [0.5, 0.02, 12.0],  # 4: dominated by 1
        [3.0, 0.00, 5.0],  # 5: front (least memory)
    ]
    assert pareto_front(points) == [0, 1, 3, 5]
    assert dominates(points[0], points[2]) and not dominates(points[0], points[3])
    assert not dominates(points[1], points[0]) and not dominates(points[0], points[1])
    assert pareto_front([]) == []


# -- the dashboard and the study agree -----------------------------------------------------


ROWS = [  # uid, p90 ms, accuracy drop, MB, server rate
    ("a", 1.0, 0.000, 40.0, 90.0),
    ("b", 0.5, 0.005, 60.0, 120.0),
    ("c", 2.0, 0.000, 45.0, 50.0),  # dominated by a
    ("d", 0.4, 0.030, 30.0, 150.0),  # breaks the 1% accuracy budget
    ("e", 0.3, 0.000, 300.0, 200.0),  # breaks the memory budget
    ("f", 1.5, 0.010, 20.0, 70.0),  # exactly at the accuracy budget; breaks a 1.2 ms SLA
    ("g", 0.9, 0.0099999999999, 35.0, 80.0),
]


@pytest.mark.parametrize("objective", ["latency", "throughput", "pareto", "server"])
@pytest.mark.parametrize("constraints", [{"max_accuracy_drop": 0.01, "max_memory_mb": 100},
                                         {"max_accuracy_drop": 0.01, "max_memory_mb": 100, "sla_ms": 1.2},
                                         {"max_accuracy_drop": 0.05}])  # fmt: skip
def test_dashboard_and_study_agree_on_the_same_rows(objective, constraints):
    pd = pytest.importorskip("pandas")
    from autodeploy.dashboard import queries

    metrics = [_metrics(latency, drop, mb, rate, uid) for uid, latency, drop, mb, rate in ROWS]
    study = Constraints(**constraints)
    feasible_uids = {m.uid for m in metrics if feasible(violations(m, study, objective))}
    ok = [m for m in metrics if m.uid in feasible_uids]
    front_uids = {ok[i].uid for i in pareto_front([values(m, "pareto") for m in ok])}

    df = pd.DataFrame([{"config_label": uid, "uid": uid, "status": "ok", "failure_kind": None, "failure_message": None,
                        "latency_ms": latency, "accuracy_drop": drop, "peak_rss_mb": mb}
                       for uid, latency, drop, mb, _ in ROWS])  # fmt: skip
    shown = queries.verdicts(df, constraints, winner=None, objective=objective).set_index("uid")["verdict"]
    assert set(shown[shown != "rejected"].index) == feasible_uids
    assert set(shown[shown == "pareto"].index) == front_uids
    sla_binds = "sla_ms" in constraints and objective != "server"
    budget = constraints["max_accuracy_drop"]
    rejected = ({"d", "e"} if budget == 0.01 else set()) | ({"c", "f"} if sla_binds else set())
    expected = set("abcdefg") - rejected
    assert feasible_uids == expected


def test_a_rejection_names_the_constraint_the_value_and_the_limit():
    seq = OutputAccuracy("probs", 0.0, 0.0, 0.999, kind="sequence", sequence_agreement=0.98, token_agreement=0.999)
    ok = OutputAccuracy("ids", 0.0, 0.0, 1.0, kind="exact", exact_agreement=1.0)
    acc = accuracy(ok, seq)
    (r,) = verdict.rejections(Measured(1.0, accuracy_drop(acc)), Limits(), "latency", acc)
    assert (r.constraint, r.value, r.limit, r.unit) == ("max_accuracy_drop", 0.98, pytest.approx(0.99), "")
    assert r.reason == "output 'probs': sequence agreement 0.98 < 0.99 (max accuracy drop 1%)"
    assert r.miss == pytest.approx(1.0)  # a 2% drop against a 1% budget: 100% past it
    # the SQNR of the worst channel group, with the limit the budget sets
    group = OutputAccuracy("output0", 0.0, 0.0, 0.9999, kind="sqnr", sqnr_db=7.5, channels="axis 1, channels 4-21")
    (r,) = verdict.rejections(Measured(1.0, accuracy_drop(accuracy(group))), Limits(), "latency", accuracy(group))
    assert r.reason == "output 'output0', axis 1, channels 4-21: SQNR 7.5 dB < 17 dB (max accuracy drop 1%)"
    assert (r.value, r.unit) == (7.5, "dB") and r.limit == pytest.approx(verdict.sqnr_for_drop(0.01))
    # memory and the SLA at once, each with its numbers; nothing broken: nothing
    both = verdict.rejections(Measured(3.0, 0.0, peak_rss_mb=812.0), Limits(max_memory_mb=500, sla_ms=2), "latency")
    assert [(r.constraint, r.value, r.limit, r.unit) for r in both] == [("max_memory_mb", 812.0, 500, "MB"),
                                                                        ("sla_ms", 3.0, 2, "ms")]  # fmt: skip
    assert [r.reason for r in both] == ["peak memory 812.0 MB > 500 MB", "latency 3.000 ms > SLA 2 ms"]
    assert verdict.rejections(Measured(1.0, 0.0, peak_rss_mb=400.0), Limits(max_memory_mb=500), "latency") == []
    # without the outputs (a summary stored before), the drop as one number; a NaN output is named, no value
    (r,) = verdict.rejections(Measured(1.0, 0.05), Limits(), "latency")
    assert r.reason == "accuracy drop 5.00% > 1.00%" and (r.value, r.limit) == (0.05, 0.01)
    broken = accuracy(out("y", cosine=float("nan")))
    (r,) = verdict.rejections(Measured(1.0, accuracy_drop(broken)), Limits(), "latency", broken)
    assert r.reason.startswith("output 'y': NaN or inf") and r.value is None


def test_a_conversion_fault_is_fp32_losing_ten_times_the_budget():
    """An engine's fp32 at top-1 0.07 is a broken conversion; a reduced precision's loss, or fp32 rounding, is not."""
    assert verdict.conversion_fault("fp32", 0.93)
    assert verdict.conversion_fault("fp32", 0.10) and not verdict.conversion_fault("fp32", 0.099)
    assert not verdict.conversion_fault("int8", 0.93) and not verdict.conversion_fault("fp16", 0.5)
    assert not verdict.conversion_fault("fp32", None)
    assert not verdict.conversion_fault("fp32", 0.4, max_accuracy_drop=0.05)  # a 5% budget: fp32 needs 50% lost
