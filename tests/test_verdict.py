"""The one place "feasible" and "better" are decided: the rules, and every caller agreeing on them (the accuracy
rule itself: tests/accuracy/test_rules.py)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from autodeploy import verdict
from autodeploy.accuracy.records import (
    DEFAULT_MAX_ACCURACY_DROP,
    DEFAULT_MIN_COSINE,
    OutputAccuracy,
    sqnr_for_drop,
)
from autodeploy.accuracy.rules import accuracy_drop, accuracy_verdict
from autodeploy.objectives import of as objective_of
from autodeploy.search.config import Constraints
from autodeploy.search.objective import Metrics, values, violations
from autodeploy.verdict import (
    Limits,
    Measured,
    constraint_verdicts,
    dominates,
    feasible,
    pareto_front,
    reasons,
)
from tests.accuracy.test_measure import compare, logits
from tests.accuracy.test_rules import accuracy, out


def test_defaults_are_the_design_budget():
    assert DEFAULT_MAX_ACCURACY_DROP == 0.01 and DEFAULT_MIN_COSINE == pytest.approx(0.99)
    assert Limits() == Limits(0.01, None, None)
    assert Constraints().max_accuracy_drop == DEFAULT_MAX_ACCURACY_DROP


def test_import_loads_no_heavy_package():
    code = "import sys, autodeploy.verdict; print(sorted(m for m in ('optuna', 'sqlalchemy', 'pandas', 'numpy') if m in sys.modules))"
    printed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert printed.strip() == "[]"


# -- the accuracy budget as a constraint ---------------------------------------------------


def test_exactly_at_the_budget_passes_everywhere():
    """99 of 100 rows agree at a 1% budget: float rounding (1 - 0.99 > 0.01) must not fail it anywhere."""
    at = accuracy(out(top1=0.99))
    assert accuracy_verdict(at.outputs).passed
    drop = accuracy_drop(at)
    assert drop > 0.01  # 0.010000000000000009: the rounding the tolerance absorbs
    assert violations(_metrics(drop=drop), Constraints(), objective_of("latency"))["accuracy_drop"] == 0.0
    assert reasons(Measured(1.0, drop), Limits(), objective_of("latency")) == []
    assert not accuracy_verdict([out(top1=0.989)]).passed


def test_non_finite_outputs_always_fail():
    ref = logits()
    bad = ref.copy()
    bad[0, 0] = np.nan  # argmax still agrees on every row: top-1 alone would pass it
    acc = compare({"logits": bad}, {"logits": ref})
    assert acc.outputs[0].top1_agreement >= 0.99 and not acc.passed
    assert accuracy_drop(acc) == 1.0
    found = violations(_metrics(drop=accuracy_drop(acc)), Constraints(max_accuracy_drop=0.5), objective_of("latency"))
    assert found["accuracy_drop"] > 0  # even a loose budget: the study never picks it
    assert not accuracy_verdict([out(cosine=float("nan"))], min_cosine=-1.0).passed


# -- constraints ---------------------------------------------------------------------------


def _metrics(latency=2.0, drop=0.0, mb=50.0, rate=None, uid="u") -> Metrics:
    return Metrics(uid, median_ms=latency, p90_ms=latency, throughput=None, peak_rss_mb=mb, accuracy_drop=drop,
                   server_rate=rate)  # fmt: skip


def test_the_sla_bounds_latency_except_for_the_server_objective():
    limits = Constraints(sla_ms=1.0)
    slow = _metrics(latency=2.0, rate=100.0)
    for objective in ("latency", "throughput", "pareto"):
        assert violations(slow, limits, objective_of(objective))["latency_ms"] == 1.0
    server = violations(slow, limits, objective_of("server"))
    assert "latency_ms" not in server and server["server_rate"] == 0.0 and feasible(server)
    assert violations(_metrics(rate=0.0), limits, objective_of("server"))["server_rate"] == 1.0
    # Outside the study the server rate is not recorded: its constraint is not judged, not failed.
    assert "server_rate" not in verdict.violations(Measured(2.0, 0.0), Limits(sla_ms=1.0), objective_of("server"))
    assert reasons(Measured(2.0, 0.0), Limits(sla_ms=1.0), objective_of("latency")) == ["latency 2.000 ms > SLA 1 ms"]
    assert reasons(Measured(2.0, 0.0, server_rate=0.0), Limits(sla_ms=1.0), objective_of("server")) == [
        "no rate meets the SLA of 1 ms"
    ]


def test_limits_from_stored_settings_and_from_the_config():
    assert Limits.of({"max_memory_mb": 100}) == Limits(0.01, 100, None)
    assert Limits.of({"max_accuracy_drop": None, "sla_ms": 5}) == Limits(0.01, None, 5)
    assert Limits.of(Constraints(max_accuracy_drop=0.05, sla_ms=2)) == Limits(0.05, None, 2)
    assert Limits.of(None) == Limits()


def test_constraint_verdicts_state_limit_measured_and_passed():
    found = constraint_verdicts(Measured(2.0, 0.02, 80.0), Limits(0.01, 100.0, 1.0), objective_of("latency"))
    assert found == {
        "accuracy_drop": {"limit": 0.01, "measured": 0.02, "passed": False},
        "memory_mb": {"limit": 100.0, "measured": 80.0, "passed": True},
        "latency_ms": {"limit": 1.0, "measured": 2.0, "passed": False},
    }
    assert set(constraint_verdicts(Measured(2.0, 0.0), Limits(sla_ms=1.0), objective_of("server"))) == {"accuracy_drop"}
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
    feasible_uids = {m.uid for m in metrics if feasible(violations(m, study, objective_of(objective)))}
    ok = [m for m in metrics if m.uid in feasible_uids]
    front_uids = {ok[i].uid for i in pareto_front([values(m, objective_of("pareto")) for m in ok])}

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
    (r,) = verdict.rejections(Measured(1.0, accuracy_drop(acc)), Limits(), objective_of("latency"), acc)
    assert (r.constraint, r.value, r.limit, r.unit) == ("max_accuracy_drop", 0.98, pytest.approx(0.99), "")
    assert r.reason == "output 'probs': sequence agreement 0.98 < 0.99 (max accuracy drop 1%)"
    assert r.miss == pytest.approx(1.0)  # a 2% drop against a 1% budget: 100% past it
    # the SQNR of the worst channel group, with the limit the budget sets
    group = OutputAccuracy("output0", 0.0, 0.0, 0.9999, kind="sqnr", sqnr_db=7.5, channels="axis 1, channels 4-21")
    (r,) = verdict.rejections(Measured(1.0, accuracy_drop(accuracy(group))), Limits(), objective_of("latency"), accuracy(group))
    assert r.reason == "output 'output0', axis 1, channels 4-21: SQNR 7.5 dB < 17 dB (max accuracy drop 1%)"
    assert (r.value, r.unit) == (7.5, "dB") and r.limit == pytest.approx(sqnr_for_drop(0.01))
    # memory and the SLA at once, each with its numbers; nothing broken: nothing
    both = verdict.rejections(Measured(3.0, 0.0, peak_rss_mb=812.0), Limits(max_memory_mb=500, sla_ms=2), objective_of("latency"))
    assert [(r.constraint, r.value, r.limit, r.unit) for r in both] == [("max_memory_mb", 812.0, 500, "MB"),
                                                                        ("sla_ms", 3.0, 2, "ms")]  # fmt: skip
    assert [r.reason for r in both] == ["peak memory 812.0 MB > 500 MB", "latency 3.000 ms > SLA 2 ms"]
    assert verdict.rejections(Measured(1.0, 0.0, peak_rss_mb=400.0), Limits(max_memory_mb=500), objective_of("latency")) == []
    # without the outputs (a summary stored before), the drop as one number; a NaN output is named, no value
    (r,) = verdict.rejections(Measured(1.0, 0.05), Limits(), objective_of("latency"))
    assert r.reason == "accuracy drop 5.00% > 1.00%" and (r.value, r.limit) == (0.05, 0.01)
    broken = accuracy(out("y", cosine=float("nan")))
    (r,) = verdict.rejections(Measured(1.0, accuracy_drop(broken)), Limits(), objective_of("latency"), broken)
    assert r.reason.startswith("output 'y': NaN or inf") and r.value is None
