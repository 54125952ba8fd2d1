import pytest

from autodeploy.accuracy.records import Accuracy, OutputAccuracy
from autodeploy.accuracy.rules import accuracy_drop
from autodeploy.objectives import of as objective_of
from autodeploy.search.config import Constraints
from autodeploy.search.objective import Metrics, values, violations


def _acc(**kw):
    return Accuracy((OutputAccuracy("y", 0.1, 0.01, kw.pop("cosine", 0.999), **kw),), 64, "c", True)


def test_accuracy_drop_prefers_top1_then_task_then_cosine():
    assert accuracy_drop(_acc(top1_agreement=0.97)) == pytest.approx(0.03)
    assert accuracy_drop(_acc(cosine=0.95)) == pytest.approx(0.05)
    worse_task = _acc(top1_agreement=0.99, task_accuracy=0.90, reference_task_accuracy=0.95)
    assert accuracy_drop(worse_task) == pytest.approx(0.05)
    assert accuracy_drop(_acc(cosine=float("nan"))) == 1.0


def test_values_and_violations():
    m = Metrics("u", median_ms=1.0, p90_ms=1.5, throughput=900.0, peak_rss_mb=80.0, accuracy_drop=0.02,
                server_rate=None)  # fmt: skip
    assert values(m, objective_of("latency")) == [1.5] and values(m, objective_of("throughput")) == [900.0]
    assert values(m, objective_of("pareto")) == [1.5, 0.02, 80.0]
    v = violations(m, Constraints(max_accuracy_drop=0.01, max_memory_mb=100, sla_ms=1.0), objective_of("latency"))
    assert v["accuracy_drop"] == pytest.approx(0.01) and v["memory_mb"] == -20 and v["latency_ms"] == 0.5
    assert violations(m, Constraints(sla_ms=5), objective_of("server"))["server_rate"] == 1.0
    no_p90 = Metrics("u", 1.0, None, None, None, 0.0)
    assert no_p90.latency_ms == 1.0
