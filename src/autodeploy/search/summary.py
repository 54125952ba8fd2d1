"""What a study run says: its finalists, the winner, the speed-up over the baseline, what constraints rejected."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from autodeploy.adapters.base import TrialConfig

if TYPE_CHECKING:
    pass


@dataclass(frozen=True)
class Finalist:
    config: TrialConfig
    label: str
    #: Re-measured: the median over its rounds of each round's value (the summary's ``statistic``: p90
    #: or median ms, or items/s); the screening value otherwise.
    statistic: float | None
    ci: tuple[float, float] | None  # re-measured: the order-statistic interval over its rounds
    n_samples: int
    uids: list[str]
    baseline: bool = False
    failure: str | None = None
    #: Per shape (several only): the statistic at that shape, as ``statistic`` is for the mix.
    per_shape: dict[str, float | None] = field(default_factory=dict)
    #: One value per finalist round (``None``: it did not run that round, or failed); the winner is chosen on these.
    #: The winner and the baseline may have more: pair rounds run for the speed-up (``load["pair_rounds"]``), which
    #: ``statistic``, ``ci``, ``n_samples`` and ``per_shape`` leave out.
    rounds: tuple[float | None, ...] = ()
    #: Per round, its median latency (ms; latency objective): the median's speed-up is paired on these.
    medians: tuple[float | None, ...] = ()
    #: The statistic over every call of every round pooled: display only (one noisy round owns its tail).
    pooled: float | None = None
    #: Per round, the cores other processes kept busy while it ran (``None``: not run, or not read).
    loads: tuple[float | None, ...] = ()
    #: Per round, when its run started (seconds since the epoch; ``None``: not run): the rounds' span in time.
    times: tuple[float | None, ...] = ()


@dataclass(frozen=True)
class Ratio:
    """A speed-up paired by round: the median over rounds of the per-round ratios, >1 is faster.

    ``ci`` is the order-statistic interval of that median (:func:`autodeploy.harness.stats.median_interval`)
    and ``level`` its exact coverage; both ``None`` for a screening-only result (too few rounds).
    It rests on the ``rounds`` in which neither run of the pair ran under load (:func:`_quiet_pairs`);
    ``left_out`` counts the paired rounds set aside for load. When every paired round ran under load,
    it rests on those and ``under_load`` says so. ``span_s``: seconds from the first of those rounds to the
    last (``None``: one round, or not recorded): how much of the host's time the interval sampled.
    ``values``: the baseline's and the winner's statistic, each its median over those same rounds, so that a
    winner line that left loaded rounds out shows the numbers its ratio rests on (``None``: not recorded).
    """

    value: float
    ci: tuple[float, float] | None
    level: float | None
    rounds: int
    left_out: int = 0
    under_load: bool = False
    span_s: float | None = None
    values: tuple[float, float] | None = None


@dataclass(frozen=True)
class Rejected:
    """A config a constraint rejected: the constraint it misses most (:class:`autodeploy.verdict.Rejection`),
    with the value and the limit in ``unit``; ``reason`` names every constraint it breaks, as read."""

    config: str  # its label
    constraint: str  # max_accuracy_drop | max_memory_mb | sla_ms
    value: float | None
    limit: float | None
    unit: str
    reason: str

    def text(self) -> str:
        """``onnxruntime/int8/b1/t1: output 'y': top-1 agreement 0.95 < 0.99 (max accuracy drop 1%)``."""
        return f"{self.config}: {self.reason}"


@dataclass(frozen=True)
class StudySummary:
    name: str
    objective: str
    trials: dict[str, int]  # state -> count, over the whole study
    finalists: list[Finalist]
    winner: Finalist | None
    tie_with: list[str] = field(default_factory=list)  # labels statistically tied with the winner
    speedup_vs_baseline: float | None = None  # the ``statistic``'s ratio (``speedups[statistic].value``)
    #: What the baseline is called (``registry.baseline_name``): the ORT fp32 default, LiteRT fp32 for a .tflite.
    baseline_name: str = ""
    #: The shapes every number is at: ``{"shape": ShapeCase.key, "weight"}`` per case, in the study's order (several:
    #: each statistic is their weighted mean); empty where no input shape was fixed (the model's own).
    shapes: list[dict[str, Any]] = field(default_factory=list)
    note: str = ""  # e.g. "no trial meets the constraints: best-so-far shown"
    inputs: str = ""  # what accuracy was judged on, when it was not the user's data
    #: Where the wall time went, per engine, over the whole study (screening trials of every run,
    #: and this run's finalists): build, accuracy and timing seconds, and how many worker runs.
    time_by_engine: dict[str, dict[str, float]] = field(default_factory=dict)
    reference_s: float | None = None  # the ONNX Runtime fp32 reference, when this run computed it first
    wall_s: float | None = None  # this run, start to summary
    time_budget_s: float | None = None
    stopped_by: str = ""  # why screening stopped: "trials", "time budget", "screening time", "search space"
    confidence: str = ""  # what the winner's numbers rest on (interleaved rounds, or screening only)
    deprioritized: dict[str, str] = field(default_factory=dict)  # "engine/precision" -> why no more trials
    skipped: list[str] = field(default_factory=list)  # slow conversions the time budget could not pay for
    #: Failed trials by failure kind: how many, and the first one's config and reason.
    failures: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: What each finalist round was reduced to and the winner chosen on: "p90" or "median" (latency), "items/s".
    statistic: str = ""
    #: The winner's speed-up over the baseline per statistic ("p90", "median", "items/s"), paired by round.
    speedups: dict[str, Ratio] = field(default_factory=dict)
    rounds: int = 0  # finalist rounds the winner ran
    #: Fewer than MIN_WINNER_ROUNDS rounds (or none): the winner is a screening result, its speed-up has no interval.
    screening_only: bool = False
    #: Every config a constraint rejected (measured, or pruned by the memory plan), once, closest to meeting
    #: the constraints first (:func:`_rejected`).
    rejected: list[Rejected] = field(default_factory=list)
    #: When no trial meets the constraints: the rejected config that came closest (``rejected[0]``).
    closest: Rejected | None = None
    #: How far the winner is from this device's limit (:func:`autodeploy.roofline.distance`): its GOP/s, their share
    #: of its precision's peak, and what int8 at the same share would take (``what_if``); empty without a count.
    roofline: dict[str, Any] = field(default_factory=dict)
    #: How busy the machine was (``harness/load.py``): ``before`` the study (a Load's dict), the finalist
    #: ``rounds`` (the most other processes' cores over each round's runs), the rounds ``under_load`` (1-based)
    #: and the rounds run again for it (``reran``: round, cores of each run, which one was kept, the trials
    #: of the other: stored, but no finalist's numbers rest on them).
    load: dict[str, Any] = field(default_factory=dict)
    #: What accuracy was judged against when it was not the baseline engine's fp32 (``PyTorch (...)``).
    reference: str = ""
    #: The baseline today beside its earlier studies on this device, model and shape
    #: (:meth:`autodeploy.verdict.BaselineHistory.to_dict`); empty without a stored history.
    baseline_history: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def headline(self) -> str:
        """The winner line, naming its statistic (:func:`autodeploy.report.headline`); "" without a winner."""
        from autodeploy.report import headline

        return headline(self.to_dict())

    def limit_text(self) -> str:
        """The winner's distance to this device's limit in words (:func:`autodeploy.report.limit_text`); "" without one."""
        from autodeploy.report import limit_text

        return limit_text(self.to_dict())
