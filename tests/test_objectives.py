"""The objectives' table: every row complete and consistent with the places that read it."""

import pytest

from autodeploy import verdict
from autodeploy.harness.scenarios import SCENARIOS
from autodeploy.objectives import NAMES, OBJECTIVES, of
from autodeploy.search.config import StudyConfig
from autodeploy.search.objective import Metrics, values


@pytest.mark.parametrize("name", NAMES)
def test_every_objective_has_one_value_per_direction_and_a_known_scenario(name):
    o = OBJECTIVES[name]
    m = Metrics("u", median_ms=1.0, p90_ms=1.5, throughput=800.0, peak_rss_mb=12.0, accuracy_drop=0.002,
                server_rate=300.0)  # fmt: skip
    assert len(values(m, name)) == len(o.directions)
    assert set(o.directions) <= {"minimize", "maximize"} and o.scenario in SCENARIOS
    assert o.sla in ("latency", "rate") and o.words and o.label and o.statistic_label


def test_the_study_config_accepts_exactly_the_tables_objectives():
    for name in NAMES:
        sla = {"sla_ms": 5.0} if OBJECTIVES[name].sla == "rate" else {}
        assert StudyConfig(model="zoo:tiny-cnn", objective=name, constraints=sla).objective == name
    with pytest.raises(ValueError, match="objective"):
        StudyConfig(model="zoo:tiny-cnn", objective="fastest")
    with pytest.raises(ValueError, match="server objective needs constraints.sla_ms"):
        StudyConfig(model="zoo:tiny-cnn", objective="server")


def test_rates_are_higher_is_better_and_printed_with_their_unit():
    assert [n for n in NAMES if OBJECTIVES[n].higher_is_better] == ["throughput", "server"]
    assert OBJECTIVES["latency"].value_text(0.09185) == "91.85 µs"
    assert OBJECTIVES["throughput"].value_text(1234.5, (1200.0, 1250.06)) == "1234.5 [1200.0, 1250.1] items/s"
    assert OBJECTIVES["server"].value_text(412.0) == "412.0 q/s" and OBJECTIVES["server"].value_text(None) == "-"
    with pytest.raises(ValueError, match="unknown objective 'fastest': expected one of latency, throughput"):
        of("fastest")


def test_the_sla_bounds_latency_except_where_it_is_the_objective():
    assert [n for n in NAMES if not verdict.sla_bounds_latency(n)] == ["server"]
    assert verdict.sla_bounds_latency(None)  # a trial outside any study
    assert verdict.meets_sla(10.0, 10.0) and not verdict.meets_sla(10.001, 10.0)
