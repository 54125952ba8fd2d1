"""What each objective, each scenario and each round statistic means, as data: the tables that the search, the
harness, the verdicts, the report, the CLI and the dashboard read (docs/architecture.md, "How to add … An
objective"), each with its default row (:data:`DEFAULT_OBJECTIVE`, :data:`DEFAULT_SCENARIO`). The CLI and the API
parse a name into its row once (:func:`of`, :func:`scenario_of`, :func:`statistic_of`); code inside reads rows.

An objective is the scenario its trials run in, the measures Optuna optimizes (with their directions), the
statistic its finalists are ranked by (with the unit the JSON record gives it), the batches searched by
default, how a finalist round reduces to one value, and the words the CLI and the dashboard print for it. Its
behaviour follows from the row: how values compare (:meth:`Objective.cost`: a ratio of costs, the baseline's
over a config's, is the speed-up), how the shapes of a mix combine (:meth:`Objective.mix`), whether the SLA
bounds each trial's latency or the rate searched (its scenario's). A new objective is a new row here; a new
measure is a field of :class:`autodeploy.search.objective.Metrics` too. Nothing outside this file compares
an objective's, a scenario's or a statistic's name, keys a dict literal by them or spells them as a default
(``tests/test_objective_names.py``).

Stdlib only and imports nothing of autodeploy's, so that :mod:`autodeploy.verdict` and the harness can read it too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

__all__ = [
    "CALLS", "DEFAULT_OBJECTIVE", "DEFAULT_SCENARIO", "ITEMS_PER_S", "MEDIAN", "NAMES", "OBJECTIVES", "P10", "P90",
    "RATE", "SCENARIOS", "STATISTICS", "Objective", "Scenario", "Statistic", "of", "scenario_of", "statistic_of",
    "stored",
]  # fmt: skip


@dataclass(frozen=True)
class Scenario:
    """One MLPerf scenario, by LoadGen's name, as the harness runs it (:mod:`autodeploy.harness.scenarios`)."""

    name: str
    #: Requests in flight through the engine's parallel API (a closed loop): the engines' throughput knobs
    #: (requests, streams) are searched, and a call's operations count at the rate sustained. Else one call at a time.
    in_flight: bool
    #: Poisson arrivals, and the highest rate whose p99 meets the SLA is searched: it needs ``sla_ms``, and the
    #: SLA bounds that rate, not each trial's latency (:func:`autodeploy.verdict.sla_bounds_latency`).
    rate_under_sla: bool = False
    #: The harness's own knobs a study searches in it: the dynamic batcher's delay (the batch is its max batch size).
    knobs: tuple[str, ...] = ()
    #: How its calls came, in words: what "load" a number was measured under (a bundle's numbers line).
    words: str = ""


#: Every scenario, by LoadGen's name (``bench --scenario``), in LoadGen's order.
SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    Scenario("single-stream", in_flight=False, words="one call at a time"),  # batch-1 latency
    Scenario("offline", in_flight=True, words="requests in flight"),  # the most items/s, N requests in flight
    Scenario("multi-stream", in_flight=True, words="a fixed number of queries in flight"),  # per-query percentiles
    Scenario("server", in_flight=True, rate_under_sla=True, knobs=("max_queue_delay_us",),
             words="Poisson arrivals"),  # through the dynamic batcher
)}  # fmt: skip
#: The scenario a run is measured in when it names none (``bench --scenario``'s default).
DEFAULT_SCENARIO = SCENARIOS["single-stream"]


_Row = TypeVar("_Row")


def _row(table: dict[str, _Row], kind: str, name: str) -> _Row:
    """The row called ``name`` of ``table``; a ``ValueError`` naming the known ones when there is none."""
    try:
        return table[name]
    except KeyError:
        raise ValueError(f"unknown {kind} {name!r}: expected one of {', '.join(table)}") from None


def scenario_of(name: str) -> Scenario:
    """The scenario called ``name``.

    Raises:
        ValueError: no such scenario, naming the known ones.
    """
    return _row(SCENARIOS, "scenario", name)


@dataclass(frozen=True)
class Statistic:
    """A statistic one round (a worker run) reduces to, by the name a study's summary and the gate record
    (:func:`autodeploy.harness.stats.round_statistic` picks p90 or median; a rate's rounds give items/s)."""

    name: str
    #: The measurement's field that holds it (a stored trial's, a gate round's): ``p90_ms``.
    field: str
    #: The study record's field-style name for it, unit in the name (``autodeploy.study``'s ``statistic``).
    record: str
    unit: str
    #: What each round gives each config, in a sentence (``each round gives each config its p90``).
    words: str

    def value(self, row: object) -> float | None:
        """Its value in a measured record (a stored trial): ``None`` for a rate of 0 (none measured)."""
        value = getattr(row, self.field)
        return value if self.unit == "ms" else value or None


#: Every round statistic, by name; the latency ones (``ms``), in this order, are the gate's choices.
STATISTICS: dict[str, Statistic] = {s.name: s for s in (
    Statistic("p10", field="p10_ms", record="p10_ms", unit="ms", words="its p10"),
    Statistic("median", field="median_ms", record="median_ms", unit="ms", words="its median"),
    Statistic("p90", field="p90_ms", record="p90_ms", unit="ms", words="its p90"),
    Statistic("mean", field="mean_ms", record="mean_ms", unit="ms", words="its mean"),
    Statistic("items/s", field="throughput", record="throughput_items_per_s", unit="items/s", words="items/s"),
)}  # fmt: skip
#: The rows the code names: a latency round's p90 (its median where a round has too few calls for a p90 claim),
#: the gate's low and central statistics, a rate's round.
P10, MEDIAN, P90, ITEMS_PER_S = (STATISTICS[n] for n in ("p10", "median", "p90", "items/s"))


def statistic_of(name: str) -> Statistic:
    """The round statistic called ``name``.

    Raises:
        ValueError: no such statistic, naming the known ones.
    """
    return _row(STATISTICS, "statistic", name)


#: How a finalist round reduces to one value (:attr:`Objective.rounds`): a latency statistic of the round's
#: calls (its p90, or the median where some round has too few calls for a p90 claim:
#: :func:`autodeploy.harness.stats.round_statistic`), shapes mixed by their weighted mean ...
CALLS = "calls"
#: ... or the round's items/s, shapes mixed by their weighted harmonic mean (the items/s of the mix).
RATE = "rate"


@dataclass(frozen=True)
class Objective:
    """One objective. ``directions`` has one entry per value Optuna optimizes (``pareto``: three)."""

    name: str
    #: The MLPerf scenario its trials are measured in (:data:`SCENARIOS`).
    scenario: str
    #: Optuna's direction of each value: ``minimize`` or ``maximize``.
    directions: tuple[str, ...]
    #: What each value is, one per direction: a field of :class:`autodeploy.search.objective.Metrics`
    #: (one not measured counts as 0).
    measures: tuple[str, ...]
    #: The study record's ``statistic`` (field-style, unit in the name) and ``statistic_unit``.
    statistic: str
    unit: str
    #: How tables print the unit of a rate (times are scaled by :func:`autodeploy.units.fmt_ms`).
    shown_unit: str
    #: What the CLI's progress bar and tables call the statistic (``best p90: ...``).
    words: str
    #: The values with their units, as the dashboard's trial history heads them.
    label: str
    #: The statistic as the dashboard's charts name it.
    statistic_label: str
    #: The per-trial measure the dashboard compares configs by (a key of ``dashboard.queries.METRICS``):
    #: the store keeps no server rate per trial, so server and pareto studies are shown by latency.
    trial_metric: str
    #: The batches a study searches when it names none (the server's: the dynamic batcher's max batch size).
    batches: tuple[int, ...]
    #: How each finalist round reduces to one value when the finalists are re-measured interleaved: :data:`CALLS`
    #: or :data:`RATE`. ``None``: not re-measured, the winner is the screening's best.
    rounds: str | None = None
    #: Its measure is read from an energy meter (``autodeploy.harness.energy``): a study on a machine without one
    #: is refused before it starts.
    needs_meter: bool = False
    #: Its trials also time their start in fresh processes (``autodeploy.harness.cold_start``), with and without
    #: the engine's compiled cache.
    cold_start: bool = False

    @property
    def remeasured(self) -> bool:
        """Whether the finalists are re-measured interleaved (else the winner is the screening's best)."""
        return self.rounds is not None

    @property
    def from_calls(self) -> bool:
        """Its finalists' values are a latency statistic of their calls (:data:`CALLS`): each round's median is
        kept beside for the median's speed-up, the calls pooled over the rounds are shown, and a screening value
        carries its run's interval."""
        return self.rounds == CALLS

    @property
    def higher_is_better(self) -> bool:
        """A rate (its first value is maximized); the others are times."""
        return self.directions[0] == "maximize"

    @property
    def latency_statistic(self) -> str | None:
        """The latency statistic its values are (``p90``), ``None`` for a rate or a cost (CPU time, energy)."""
        latencies = {s.record for s in STATISTICS.values() if s.unit == "ms"}
        return self.statistic.removesuffix("_ms") if self.statistic in latencies else None

    @property
    def single(self) -> bool:
        """One value to optimize (everything but ``pareto``): several are ranked by their Pareto front."""
        return len(self.directions) == 1

    @property
    def in_flight(self) -> bool:
        """Measured with requests in flight, so the engines' throughput knobs (requests, streams) are searched."""
        return SCENARIOS[self.scenario].in_flight

    @property
    def knobs(self) -> tuple[str, ...]:
        """The harness's own knobs its studies search (its scenario's: the dynamic batcher's delay)."""
        return SCENARIOS[self.scenario].knobs

    @property
    def sla_bounds_latency(self) -> bool:
        """Whether the SLA bounds each trial's latency; else the objective is the highest rate whose p99 meets
        it (its scenario searches that rate), which is then measured under the study's SLA."""
        return not SCENARIOS[self.scenario].rate_under_sla

    def cost(self, value: float | None) -> float | None:
        """A value as a cost, lower is better: a time as it is, a rate as its inverse (seconds per item; 0 or
        ``None``: ``None``). A ratio of costs, the baseline's over a config's, is the speed-up either way:
        baseline / config for times, config / baseline for rates."""
        if self.higher_is_better:
            return 1.0 / value if value else None
        return value

    def mix(self, weights: Sequence[float], values: Sequence[float]) -> float:
        """One value for a mix of shapes: the weighted mean of times; of rates, the weighted harmonic mean
        (the items/s of the mix)."""
        total = sum(weights)
        if self.higher_is_better:
            return total / sum(w / v for w, v in zip(weights, values, strict=True))
        return sum(w * v for w, v in zip(weights, values, strict=True)) / total

    def value_text(self, value: float | None, ci: tuple[float, float] | None = None) -> str:
        """The statistic with its unit (and interval): ``91.85 µs [90.1, 93.2]``, ``1234.5 items/s``, ``412.0 q/s``."""
        from autodeploy.units import fmt_mj, fmt_ms_ci

        if self.unit == "ms":
            return fmt_ms_ci(value, ci)
        if self.unit == "mJ":
            return fmt_mj(value)
        if value is None:
            return "-"
        bounds = "" if ci is None else f" [{ci[0]:.1f}, {ci[1]:.1f}]"
        return f"{value:.1f}{bounds} {self.shown_unit}"


#: Every objective, by name (the study config's ``objective``, ``tune --objective``).
OBJECTIVES: dict[str, Objective] = {o.name: o for o in (
    Objective(  # single-stream p90 (the median where a run has too few calls for a p90 claim)
        name="latency", scenario="single-stream", directions=("minimize",), measures=("latency_ms",),
        statistic="p90_ms", unit="ms", shown_unit="ms", words="p90", label="p90 ms",
        statistic_label="p90 latency (ms)", trial_metric="latency", batches=(1,), rounds=CALLS,
    ),
    Objective(  # items/s at the trial's batch, requests in flight through the engine's own parallel API
        name="throughput", scenario="offline", directions=("maximize",), measures=("throughput",),
        statistic="throughput_items_per_s", unit="items/s", shown_unit="items/s", words="throughput",
        label="items/s", statistic_label="throughput (items/s)", trial_metric="throughput",
        batches=(1, 2, 4, 8, 16, 32), rounds=RATE,
    ),
    Objective(  # the highest Poisson rate (queries/s) whose p99 meets the SLA
        name="server", scenario="server", directions=("maximize",), measures=("server_rate",),
        statistic="max_rate_qps", unit="queries/s", shown_unit="q/s", words="max rate under the SLA",
        label="max q/s under SLA", statistic_label="max rate under the SLA (queries/s)", trial_metric="latency",
        batches=(1, 2, 4, 8),
    ),
    Objective(  # p90 ms × accuracy drop × peak memory MB, all minimized
        name="pareto", scenario="single-stream", directions=("minimize", "minimize", "minimize"),
        measures=("latency_ms", "accuracy_drop", "peak_rss_mb"),
        statistic="p90_ms", unit="ms", shown_unit="ms", words="p90, accuracy drop, memory",
        label="p90 ms, accuracy drop, MB", statistic_label="p90 latency (ms)", trial_metric="latency",
        batches=(1, 2, 4, 8, 16, 32),
    ),
    Objective(  # the worker's user + system CPU time per inference over the timed calls: a cost, never called energy
        name="cpu-time", scenario="single-stream", directions=("minimize",), measures=("cpu_ms",),
        statistic="cpu_ms_per_inference", unit="ms", shown_unit="ms", words="CPU time per inference",
        label="CPU ms per inference", statistic_label="CPU time per inference (ms)", trial_metric="latency",
        batches=(1,),
    ),
    Objective(  # joules per inference from the machine's energy meter, the idle draw subtracted; refused without one
        name="energy", scenario="single-stream", directions=("minimize",), measures=("energy_mj",),
        statistic="energy_mj_per_inference", unit="mJ", shown_unit="mJ", words="energy per inference",
        label="mJ per inference", statistic_label="energy per inference (mJ)", trial_metric="latency",
        batches=(1,), needs_meter=True,
    ),
    Objective(  # from a new process to its first result (load + first inference), from the compiled cache where used
        name="cold-start", scenario="single-stream", directions=("minimize",), measures=("cold_start_ms",),
        statistic="cold_start_ms", unit="ms", shown_unit="ms", words="cold start",
        label="cold start ms", statistic_label="cold start (ms)", trial_metric="latency", batches=(1,),
        cold_start=True,
    ),
)}  # fmt: skip
#: The objectives' names, in the table's order (the study config's choices).
NAMES = tuple(OBJECTIVES)
#: The objective a study optimizes when it names none (``tune --objective``'s default).
DEFAULT_OBJECTIVE = OBJECTIVES["latency"]


def of(name: str) -> Objective:
    """The objective called ``name``.

    Raises:
        ValueError: no such objective, naming the known ones.
    """
    return _row(OBJECTIVES, "objective", name)


def stored(name: str | None) -> Objective | None:
    """The objective a stored record names, ``None`` for none or one this version has no row for (a record
    written by another version is read, not refused)."""
    return OBJECTIVES.get(name or "")
