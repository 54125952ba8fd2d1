"""What each objective means, as data: one table that the search, the verdicts, the report, the CLI and
the dashboard read (docs/architecture.md, "How to add … An objective").

An objective is the scenario its trials run in, the statistic its finalists are ranked by (with the
unit the JSON record gives it), Optuna's direction for each value, and the words the CLI and the
dashboard print for it. A new objective is a new row here plus its values in
:func:`autodeploy.search.objective.values`; every other place reads the row.

Stdlib only and imports nothing of autodeploy's, so that :mod:`autodeploy.verdict` can read it too.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["NAMES", "OBJECTIVES", "Objective", "of"]


@dataclass(frozen=True)
class Objective:
    """One objective. ``directions`` has one entry per value Optuna optimizes (``pareto``: three)."""

    name: str
    #: The MLPerf scenario its trials are measured in (:data:`autodeploy.harness.scenarios.SCENARIOS`).
    scenario: str
    #: Optuna's direction of each value: ``minimize`` or ``maximize``.
    directions: tuple[str, ...]
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
    #: Whether the finalists are re-measured interleaved (else the winner is the screening's best).
    remeasured: bool
    #: ``latency``: the SLA bounds each trial's latency; ``rate``: the objective is the highest
    #: rate whose p99 meets the SLA (:func:`autodeploy.verdict.sla_bounds_latency`).
    sla: str = "latency"

    @property
    def higher_is_better(self) -> bool:
        """A rate (its first value is maximized); the others are times."""
        return self.directions[0] == "maximize"

    @property
    def latency_statistic(self) -> str | None:
        """The latency statistic its values are (``p90``), ``None`` for a rate."""
        return self.statistic.removesuffix("_ms") if self.unit == "ms" else None

    @property
    def single(self) -> bool:
        """One value to optimize (everything but ``pareto``)."""
        return len(self.directions) == 1

    @property
    def in_flight(self) -> bool:
        """Measured with requests in flight, so the engines' throughput knobs (requests, streams) are searched."""
        return self.scenario != "single-stream"

    def value_text(self, value: float | None, ci: tuple[float, float] | None = None) -> str:
        """The statistic with its unit (and interval): ``91.85 µs [90.1, 93.2]``, ``1234.5 items/s``, ``412.0 q/s``."""
        from autodeploy.units import fmt_ms_ci

        if self.unit == "ms":
            return fmt_ms_ci(value, ci)
        if value is None:
            return "-"
        bounds = "" if ci is None else f" [{ci[0]:.1f}, {ci[1]:.1f}]"
        return f"{value:.1f}{bounds} {self.shown_unit}"


#: Every objective, by name (the study config's ``objective``, ``tune --objective``).
OBJECTIVES: dict[str, Objective] = {o.name: o for o in (
    Objective(  # single-stream p90 (the median where a run has too few calls for a p90 claim)
        name="latency", scenario="single-stream", directions=("minimize",),
        statistic="p90_ms", unit="ms", shown_unit="ms", words="p90", label="p90 ms",
        statistic_label="p90 latency (ms)", trial_metric="latency", remeasured=True,
    ),
    Objective(  # items/s at the trial's batch, requests in flight through the engine's own parallel API
        name="throughput", scenario="offline", directions=("maximize",),
        statistic="throughput_items_per_s", unit="items/s", shown_unit="items/s", words="throughput",
        label="items/s", statistic_label="throughput (items/s)", trial_metric="throughput", remeasured=True,
    ),
    Objective(  # the highest Poisson rate (queries/s) whose p99 meets the SLA
        name="server", scenario="server", directions=("maximize",),
        statistic="max_rate_qps", unit="queries/s", shown_unit="q/s", words="max rate under the SLA",
        label="max q/s under SLA", statistic_label="max rate under the SLA (queries/s)", trial_metric="latency",
        remeasured=False, sla="rate",
    ),
    Objective(  # p90 ms × accuracy drop × peak memory MB, all minimized
        name="pareto", scenario="single-stream", directions=("minimize", "minimize", "minimize"),
        statistic="p90_ms", unit="ms", shown_unit="ms", words="p90, accuracy drop, memory",
        label="p90 ms, accuracy drop, MB", statistic_label="p90 latency (ms)", trial_metric="latency",
        remeasured=False,
    ),
)}  # fmt: skip
#: The objectives' names, in the table's order (the study config's choices).
NAMES = tuple(OBJECTIVES)


def of(name: str) -> Objective:
    """The objective called ``name``.

    Raises:
        ValueError: no such objective, naming the known ones.
    """
    try:
        return OBJECTIVES[name]
    except KeyError:
        raise ValueError(f"unknown objective {name!r}: expected one of {', '.join(NAMES)}") from None
