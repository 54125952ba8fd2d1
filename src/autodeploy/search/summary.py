"""What a study run says: its finalists, the winner, the speed-up over the baseline, what constraints rejected.

Its words live here too, beside the summary they read: the winner line (:func:`headline`), the speed-up
(:func:`ratio_text`, :func:`speedup_text`), the shapes, the load (:func:`load_text`), the runner-up, the
distance to the limit and the baseline's name. Each reads a summary as stored (:meth:`StudySummary.to_dict`),
so a study read back from the store says the same; the JSON record (:mod:`autodeploy.report`) quotes them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from autodeploy import objectives
from autodeploy.adapters.base import TrialConfig
from autodeploy.objectives import ITEMS_PER_S, P90


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
    It rests on the ``rounds`` in which neither run of the pair ran under load (:func:`.winner.quiet_pairs`);
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
    #: the constraints first (:func:`autodeploy.search.study._rejected`).
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
        """The winner line, naming its statistic (:func:`headline`); "" without a winner."""
        return headline(self.to_dict())

    def limit_text(self) -> str:
        """The winner's distance to this device's limit in words (:func:`limit_text`); "" without one."""
        return limit_text(self.to_dict())


def limit_text(summary: Mapping[str, Any]) -> str:
    """The winner's distance to the limit in words (:func:`autodeploy.roofline.distance_text`), a rate for an
    objective where higher is better; "" without one."""
    from autodeploy.adapters.registry import runs_on_gpu
    from autodeploy.roofline import distance_text

    known = objectives.stored(summary.get("objective"))
    limit = summary.get("roofline") or {}
    return distance_text(limit, items_per_s=known is not None and known.higher_is_better,
                         gpu=runs_on_gpu(str(limit.get("engine", ""))))  # fmt: skip


def baseline_name(summary: Mapping[str, Any]) -> str:
    """What a study's baseline is called (``StudySummary.baseline_name``): ``the ORT fp32 default``, or for a
    model file run as given ``LiteRT fp32, the file as given``. A summary stored before it said so: from the
    engine of its baseline finalist (the engine that runs a file as given is its format's baseline)."""
    if summary.get("baseline_name"):
        return str(summary["baseline_name"])
    from autodeploy.adapters.registry import engine_baseline_name

    base = next((f for f in summary.get("finalists") or () if f.get("baseline")), None) or {}
    engine = str(base.get("label") or "").split("/")[0]  # no label: no format's engine, so the ONNX baseline
    return engine_baseline_name(engine)


def ratio_text(r: Mapping[str, Any]) -> str:
    """A paired speed-up as read: ``3.78x [3.50, 4.00]``, or ``3.78x`` without an interval (screening only)."""
    ci, value = r.get("ci"), r["value"] if "value" in r else r["ratio"]  # a Ratio's dict, or the record's
    return f"{value:.2f}x" + ("" if ci is None else f" [{ci[0]:.2f}, {ci[1]:.2f}]")


def speedup_text(record: Mapping[str, Any]) -> str:
    """A study record's speed-up naming its statistic: ``3.78x [3.50, 4.00] (p90)``, then ``, under load``,
    ``, unsteady machine`` (``load.unsteady``) and ``, screening only`` where they apply; ``-`` without one. A record stored before the ratios were paired by round says "pooled calls"."""
    main = (record.get("speedups") or {}).get(record.get("optimised") or "")
    if main is not None:
        text = f"{ratio_text(main)} ({record['optimised']})"
    elif record.get("speedup_vs_baseline") is not None:
        text = f"{record['speedup_vs_baseline']:.2f}x ({record['statistic'].removesuffix('_ms')}, pooled calls)"
    else:
        return "-"
    return ", ".join([text, *caveats(record)])


def caveats(record: Mapping[str, Any]) -> list[str]:
    """Why a study's winner is weaker than a finalist-proven one, in a table's words: ``under load`` (every paired
    round ran under load), ``unsteady machine`` (``load.unsteady``), ``screening only`` (no finalist interval).
    Empty for a winner proven by quiet finalist rounds. ``record``: :meth:`StudySummary.to_dict` (as stored), or a
    study record of the report (its statistic under ``optimised``)."""
    main = (record.get("speedups") or {}).get(record.get("optimised") or record.get("statistic") or "") or {}
    said = [("under load", bool(main.get("under_load"))), ("unsteady machine", bool((record.get("load") or {}).get("unsteady"))),
            ("screening only", bool(record.get("screening_only")))]  # fmt: skip
    return [words for words, holds in said if holds]


def shapes_text(summary: Mapping[str, Any]) -> str:
    """The shapes a study's numbers are at (``StudySummary.shapes``), as the winner line says them: `` at
    x=1x3x320x320``, or for several `` over shapes x=1x3x160x160 and x=1x3x320x320 (their mean, weighted 3:1)``;
    "" where no shape was fixed (or a summary stored before it said)."""
    shapes = list(summary.get("shapes") or ())
    if not shapes:
        return ""
    if len(shapes) == 1:
        return f" at {shapes[0]['shape']}"
    keys = [str(s["shape"]) for s in shapes]
    weights = [float(s.get("weight") or 1.0) for s in shapes]
    weighted = "" if len(set(weights)) == 1 else f", weighted {':'.join(f'{w:g}' for w in weights)}"
    return f" over shapes {', '.join(keys[:-1])} and {keys[-1]} (their mean{weighted})"


def _value(value: float | None, statistic: str, objective: str) -> str:
    from autodeploy.units import fmt_ms

    if value is None:
        return "-"
    known = objectives.stored(objective)
    if known is not None and known.higher_is_better:
        return known.value_text(value)
    if known is not None and known.latency_statistic is None:  # a cost (CPU time, energy): its words name it
        return f"{known.words} {known.value_text(value)}"
    return f"{statistic} {fmt_ms(value)}"


def headline(summary: Mapping[str, Any]) -> str:
    """The winner line, naming its statistic: ``winner: openvino/bf16/b1/t2, p90 7.49 ms vs 28.30 ms for the ORT
    fp32 default: 3.78x [3.50, 4.00] (median 3.60x [3.41, 3.82]; intervals over 3 rounds, 75% coverage)``.

    ``summary`` is :meth:`StudySummary.to_dict` (as stored); "" without a winner. A screening-only
    winner says so and its speed-up carries no interval. A summary stored before the ratios were
    paired by round shows its ratio under the objective's statistic.
    """
    winner = summary.get("winner")
    if winner is None:
        return ""
    objective = summary["objective"]
    known = objectives.stored(objective)  # a summary stored before the statistic was: its objective's, for times
    statistic = summary.get("statistic") or ((known and known.latency_statistic) or "")
    baseline = next((f for f in summary.get("finalists") or () if f.get("baseline")), None)
    speedups = summary.get("speedups") or {}
    main = speedups.get(statistic)
    # Rounds left out for load are left out of the two numbers too: the line shows what its ratio rests on.
    shown = main.get("values") if main is not None and main.get("left_out") else None
    won = shown[1] if shown else winner.get("statistic")
    text = f"winner: {winner['label']}, {_value(won, statistic, objective)}{shapes_text(summary)}"
    if winner.get("baseline"):
        text += f": the baseline itself ({baseline_name(summary)}), no config the search found beat it"
    elif main is not None and baseline is not None:
        base = _value(shown[0] if shown else baseline.get("statistic"), "", objective).strip()
        text += f" vs {base} for {baseline_name(summary)}: {ratio_text(main)}"
        extra = [f"{k} {ratio_text(m)}" for k, m in speedups.items() if k != statistic]
        if main.get("ci") is not None:
            across = f" across {span_text(main['span_s'])}" if main.get("span_s") else ""
            extra.append(f"intervals over {main['rounds']} rounds{across}, {main['level']:.0%} coverage")
        extra += _pairs_text(main)
        if extra:
            text += f" ({'; '.join(extra)})"
    elif summary.get("speedup_vs_baseline") is not None:
        text += f", {summary['speedup_vs_baseline']:.2f}x the {statistic or 'value'} of {baseline_name(summary)}"
    if summary.get("screening_only"):
        rounds = summary.get("rounds") or 0
        text += (f"; screening only ({rounds} finalist round{'s' if rounds != 1 else ''}, no interval)"
                 if rounds else "; screening only")  # fmt: skip
    history = summary.get("baseline_history") or {}
    if history.get("outside"):
        text += f"; {history_text(history, baseline_name(summary), objective)}"
    return text


def span_text(seconds: float) -> str:
    """How long a stretch of rounds took: ``45 s``, ``3.2 min``."""
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"


def history_text(history: Mapping[str, Any], name: str, objective: str) -> str:
    """The baseline today beside its earlier studies (:class:`autodeploy.verdict.BaselineHistory`'s dict):
    ``the ORT fp32 default read p90 8.700 ms today; 4.900-8.700 ms in 6 earlier studies on this device:
    1.12-1.99x over that range``."""
    from autodeploy.units import fmt_ms_range

    known = objectives.stored(objective)
    if known is not None and known.higher_is_better:
        today = known.value_text(history["today"])
        low, high = known.value_text(history["low"]), known.value_text(history["high"])
        span = f"{low.rpartition(' ')[0]}–{high}"  # one unit: 100.0–120.0 items/s
    else:
        today, span = _value(history["today"], history.get("statistic") or "", objective).strip(), fmt_ms_range(history["low"], history["high"])
    runs = history.get("runs") or 0
    noun = {"studies": ("study", "studies"), "runs": ("run", "runs")}[history.get("kind") or "studies"][runs != 1]
    text = f"{name} read {today} today; {span} in {runs} earlier {noun} on this device"
    over = history.get("over_range")
    return text + (f": {over[0]:.2f}–{over[1]:.2f}x over that range" if over else "")


def _pairs_text(ratio: Mapping[str, Any]) -> list[str]:
    """What a speed-up's rounds say about load: ``2 rounds under load left out``, or that every one ran under load."""
    if ratio.get("under_load"):
        return ["every paired round ran under load: confirm it on a quiet machine"]
    left = ratio.get("left_out") or 0
    return [f"{left} round{'s' if left != 1 else ''} under load left out of these numbers"] if left else []


def load_text(summary: Mapping[str, Any]) -> str:
    """What the finalist rounds' load says about the winner's numbers, one line; "" when the load was not read.

    ``summary`` is :meth:`StudySummary.to_dict`: its ``load`` (``rounds``, ``under_load``, ``reran``).
    """
    from autodeploy.harness.load import UNDER_LOAD_CORES

    load = summary.get("load") or {}
    per_round = [c for c in load.get("rounds") or () if c is not None]
    if not per_round:
        return ""
    parts = []
    for again in load.get("reran") or ():
        first, second = again["other_cores"]
        which = "second" if again["kept"] == "again" else "first"
        why = "its load was not read" if second is None else f"{second:.2f} cores; the less loaded is kept"
        parts.append(f"finalist round {again['round']} ran under load ({first:.2f} cores of other processes) and "
                     f"once more ({why}): the {which} run counts")  # fmt: skip
    under = load.get("under_load") or []
    if under:
        worst = max(c for c in load["rounds"] if c is not None)
        rounds = ", ".join(map(str, under))
        parts.append(f"finalist round{'s' if len(under) > 1 else ''} {rounds} ran under load (other processes kept up "
                     f"to {worst:.2f} cores busy, more than {UNDER_LOAD_CORES}): the winner's numbers are noisier "
                     "than their intervals say; confirm it on a quiet machine")  # fmt: skip
    elif not parts:
        parts.append(f"the finalist rounds ran quiet (other processes kept at most {max(per_round):.2f} cores busy)")
    if load.get("pair_rounds"):
        parts.append(f"the winner and {baseline_name(summary)} ran {load['pair_rounds']} more rounds alone, paired, "
                     "for a speed-up on quiet rounds")  # fmt: skip
    parts += [_unsteady_text(u, summary.get("objective") or "", baseline_name(summary))
              for u in load.get("unsteady") or ()]  # fmt: skip
    return "load: " + "; ".join(parts)


def _unsteady_text(u: Mapping[str, Any], objective: str, baseline: str) -> str:
    """``the ORT fp32 default read 4.97-9.27 ms (1.87x apart) in rounds the meter calls quiet: …``."""
    from autodeploy.harness.load import UNSTEADY_SPREAD

    who = baseline if u.get("baseline") else f"the winner ({u['config']})"
    known = objectives.stored(objective)  # a summary without one: its values are times
    unit = (ITEMS_PER_S if known is not None and known.higher_is_better else P90).unit
    return (f"{who} read {u['low']:.2f}-{u['high']:.2f} {unit} ({u['high'] / u['low']:.2f}x apart, more than "
            f"{UNSTEADY_SPREAD}x) in rounds with no load the meter sees (a host sharing this VM's cores can do that "
            "without reporting steal): the speed-up moves with it; confirm it on dedicated cores")


def finalist_load_text(finalist: Mapping[str, Any]) -> str:
    """A finalist's load as a table cell: ``quiet``, ``under load in rounds 1, 3 (up to 0.93 cores)``, or ``-`` (not read)."""
    from autodeploy.harness.load import busy

    loads = list(finalist.get("loads") or ())
    if all(c is None for c in loads):
        return "-"
    under = [(r + 1, c) for r, c in enumerate(loads) if c is not None and busy(c)]
    if not under:
        return "quiet"
    rounds = ", ".join(str(r) for r, _ in under)
    return f"under load in round{'s' if len(under) > 1 else ''} {rounds} (up to {max(c for _, c in under):.2f} cores)"


def runner_up(summary: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The finalist that ranks next after the winner by the study's statistic (``None`` without a winner).

    ``summary`` is :meth:`StudySummary.to_dict` (as the store keeps it). Finalists that failed or
    have no statistic never rank; the baseline (ORT fp32 default) does, like any finalist. In a
    statistical tie the winner is the cheaper config, so the runner-up may have the better number.
    """
    winner = summary.get("winner")
    if winner is None:
        return None
    others = [f for f in summary.get("finalists") or () if f["label"] != winner["label"]
              and f.get("statistic") is not None and not f.get("failure")]  # fmt: skip
    if not others:
        return None
    known = objectives.stored(summary["objective"])
    pick = max if known is not None and known.higher_is_better else min
    return pick(others, key=lambda f: f["statistic"])
