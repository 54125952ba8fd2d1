"""The objectives' table: every row complete and consistent with the places that read it."""

import pytest

from autodeploy import verdict
from autodeploy.objectives import CALLS, NAMES, OBJECTIVES, RATE, SCENARIOS, of, scenario_of
from autodeploy.search.config import StudyConfig
from autodeploy.search.objective import Metrics, values


@pytest.mark.parametrize("name", NAMES)
def test_every_objective_has_one_measure_per_direction_and_a_known_scenario(name):
    o = OBJECTIVES[name]
    m = Metrics("u", median_ms=1.0, p90_ms=1.5, throughput=800.0, peak_rss_mb=12.0, accuracy_drop=0.002,
                server_rate=300.0)  # fmt: skip
    assert len(values(m, o)) == len(o.directions) == len(o.measures)
    assert all(hasattr(m, measure) for measure in o.measures)  # a field (or property) of Metrics
    assert set(o.directions) <= {"minimize", "maximize"} and o.scenario in SCENARIOS
    assert o.words and o.label and o.statistic_label and o.batches and min(o.batches) >= 1


def test_each_objective_s_values_are_the_measures_its_row_names():
    m = Metrics("u", median_ms=1.0, p90_ms=1.5, throughput=800.0, peak_rss_mb=None, accuracy_drop=0.002,
                server_rate=None)  # fmt: skip
    assert values(m, of("latency")) == [1.5] and values(m, of("throughput")) == [800.0]
    assert values(m, of("server")) == [0.0]  # no rate met the SLA
    assert values(m, of("pareto")) == [1.5, 0.002, 0.0]  # memory not measured


@pytest.mark.parametrize("name", NAMES)
def test_a_re_measured_objective_reduces_its_rounds_as_its_values_compare(name):
    """A time's rounds are a statistic of their calls and a rate's their items/s: a re-measured objective whose
    rounds and direction disagree would take latency arithmetic in one place and throughput arithmetic in another."""
    o = OBJECTIVES[name]
    assert o.rounds in (None, CALLS, RATE) and o.remeasured == (o.rounds is not None)
    if o.remeasured:
        assert o.single and (o.rounds == RATE) == o.higher_is_better == (o.unit != "ms")
        assert o.from_calls == (o.latency_statistic is not None)


def test_costs_make_a_speed_up_of_a_ratio_and_a_mix_is_a_mean_of_times_or_of_rates():
    latency, throughput = OBJECTIVES["latency"], OBJECTIVES["throughput"]
    assert latency.cost(2.0) == 2.0 and latency.cost(None) is None
    assert throughput.cost(400.0) == 1 / 400.0 and throughput.cost(0.0) is None  # seconds per item
    # a speed-up is the baseline's cost over the config's: 8 ms -> 2 ms and 100 -> 400 items/s are both 4x
    assert latency.cost(8.0) / latency.cost(2.0) == pytest.approx(throughput.cost(100.0) / throughput.cost(400.0)) == 4.0
    assert latency.mix([3.0, 1.0], [2.0, 8.0]) == pytest.approx(3.5)  # the weighted mean
    assert throughput.mix([3.0, 1.0], [1000.0, 250.0]) == pytest.approx(4 / (3 / 1000 + 1 / 250))  # items/s of the mix


def test_the_study_config_accepts_exactly_the_tables_objectives():
    for name in NAMES:
        sla = {} if OBJECTIVES[name].sla_bounds_latency else {"sla_ms": 5.0}
        config = StudyConfig(model="zoo:tiny-cnn", objective=name, constraints=sla)
        assert config.objective is OBJECTIVES[name] and config.model_dump()["objective"] == name  # the row, written as its name
        assert config.default_batches() == list(OBJECTIVES[name].batches)
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
    assert [n for n in NAMES if not verdict.sla_bounds_latency(of(n))] == ["server"]
    assert verdict.sla_bounds_latency(None)  # a trial outside any study
    assert verdict.meets_sla(10.0, 10.0) and not verdict.meets_sla(10.001, 10.0)


def test_the_scenarios_say_what_runs_in_flight_and_what_searches_a_rate():
    assert list(SCENARIOS) == ["single-stream", "offline", "multi-stream", "server"]  # LoadGen's order
    assert [s.name for s in SCENARIOS.values() if not s.in_flight] == ["single-stream"]
    assert [s.name for s in SCENARIOS.values() if s.rate_under_sla] == ["server"]
    assert [n for n in NAMES if OBJECTIVES[n].in_flight] == ["throughput", "server"]
    assert OBJECTIVES["server"].knobs == ("max_queue_delay_us",) and OBJECTIVES["latency"].knobs == ()
    with pytest.raises(ValueError, match="unknown scenario 'batch': expected one of single-stream, offline"):
        scenario_of("batch")
