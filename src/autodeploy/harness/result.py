"""What a trial produces: typed records that round-trip through JSON (never pickle).

A trial's numbers have one shape from the worker to the bundle: :class:`Measurement`. Its
:meth:`Measurement.to_dict` (flat keys, times in ms: ``median_ms``, ``p90_ci``, ...) is the
worker's JSON, the source of the store's measurement columns and the bundle manifest's
``measurements``; :meth:`Measurement.from_dict` reads any of them back.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from autodeploy.accuracy.records import Accuracy
from autodeploy.adapters.base import TrialConfig
from autodeploy.errors import ConversionError
from autodeploy.harness.cold_start import ColdStart
from autodeploy.harness.energy import Cost
from autodeploy.harness.load import Load
from autodeploy.harness.stats import LatencyStats, insufficient
from autodeploy.roofline import Roofline

#: Why a trial produced no usable measurement (docs/architecture.md, "Measurement rules").
#: An engine's failure reason is kept whole up to this many lines, each up to REASON_LINE_CHARS: its first
#: line is often a file:line of the engine's own source, and the line that names the op or node comes later.
REASON_LINES = 40
REASON_LINE_CHARS = 2000  # ORT puts its C++ signature before the words that matter on one line

#: Lines of an engine's reason that say what failed (the op, the node), searched in this order.
_TELLING = (
    re.compile(r"Conversion is failed for|No conversion rule found for", re.IGNORECASE),
    re.compile(r"\b(node|op|operator|layer)\b[\s:(]", re.IGNORECASE),
)
#: Lines that only say where in the engine's source the error was raised.
_WHERE = re.compile(r"(Exception from|failed at|^File) \S+:\d+:?$|^\[?\s*GENERAL_ERROR\s*\]?$")


def reason(exc: BaseException) -> str:
    """``Type: message`` of an exception, every line kept up to :data:`REASON_LINES` (cut lines are counted)."""
    lines = [line.rstrip()[:REASON_LINE_CHARS] for line in str(exc).strip().splitlines() if line.strip()]
    if len(lines) > REASON_LINES:
        lines = [*lines[:REASON_LINES], f"... {len(lines) - REASON_LINES} more lines"]
    text = "\n".join(lines)
    return f"{type(exc).__name__}: {text}".rstrip(": ")


#: How a stored failure reason (:func:`reason`) starts where the engine's conversion failed: every precision of the
#: engine needs that conversion, so a study prunes them all and a bench of another precision fails at once.
CONVERSION_PREFIX = f"{ConversionError.__name__}: "


def conversion_failed(message: str | None) -> bool:
    """A stored failure (``"ConversionError: ..."``, or a study's ``"build_failed: ConversionError: ..."``) is the
    engine's conversion failing, not one precision's build."""
    return CONVERSION_PREFIX in (message or "")


def headline(message: str | None) -> str:
    """The one line of a stored failure reason that says what failed, for tables and progress lines.

    ``RuntimeError: Exception from src/inference/src/cpp/core.cpp:117:`` says where OpenVINO raised;
    ``Conversion is failed for: Loop-13`` or the line naming the node says what broke. The exception's
    type stays in front; a one-line reason is returned as it is.
    """
    lines = [line.strip() for line in (message or "").splitlines() if line.strip()]
    if len(lines) <= 1:
        return lines[0] if lines else ""
    kind, _, first = lines[0].partition(": ") if re.match(r"[\w.]+: ", lines[0]) else ("", "", lines[0])
    body = [first, *lines[1:]]
    # A telling line may end in a location (OpenVINO: "... node: opset1::Add X ... Check '...' failed at
    # src/core/src/node.cpp:304:"): it tells by what comes before it.
    best = next((line for pattern in _TELLING for line in body if pattern.search(_WHERE.sub("", line))),
                next((line for line in body if not _WHERE.search(line)), first))  # fmt: skip
    best = best.lstrip("- ")  # OpenVINO's summary lists its lines as "-- No conversion rule found for ..."
    return f"{kind}: {best}" if kind else best


FAILURE_KINDS = (
    "unavailable",  # the engine cannot run on this machine at all
    "unsupported",  # the engine cannot run this config here (pruned, with reason)
    "build_failed",
    "load_failed",
    "run_failed",
    "crashed",  # the worker died from a signal; the message names it
    "timeout",
    "oom",  # the worker went past its memory cap
    "inaccurate",  # measured, but breaks the accuracy constraint
    "conversion",  # measured, but the engine's fp32 conversion itself breaks the model (accuracy.rules.conversion_fault)
)
#: The failure kinds of a trial that was measured (latency and accuracy filled in), then judged.
JUDGED = ("inaccurate", "conversion")
STATUSES = ("ok", "failed")


#: :class:`LatencyStats` field -> its key in a measurement's flat dict (store columns, manifest).
#: ``insufficient`` is not kept: it follows from ``n`` (see :func:`_insufficient`).
LATENCY_KEYS = {"n": "n_samples", "median": "median_ms", "mean": "mean_ms", "stdev": "stdev_ms", "cv": "cv",
                "min": "min_ms", "max": "max_ms", "median_ci": "median_ci", "p90": "p90_ms", "p90_ci": "p90_ci",
                "p99": "p99_ms", "p99_ci": "p99_ci", "unstable": "unstable"}  # fmt: skip
#: Measurement fields whose flat form is not the value itself.
_NESTED = ("latency", "accuracy", "samples_ms", "serving", "load", "roofline", "cost", "cold_start")


def _insufficient(n: int) -> tuple[str, ...]:
    """The claims ``n`` samples cannot support (the rule is :func:`autodeploy.harness.stats.insufficient`)."""
    return insufficient(n)


def _pair(value: Any) -> tuple[float, float] | None:
    return None if value is None else (value[0], value[1])


@dataclass(frozen=True)
class Measurement:
    """What the harness measured for one trial in one scenario (times in ms, memory in MB).

    ``samples_ms`` is ``None`` when the raw per-call latencies were not loaded (the store
    reads them only on request). ``accuracy`` is ``None`` only for records made without it;
    ``load`` for records made before the load was read (stored before revision 0006, or an older bundle's).
    """

    scenario: str
    batch: int
    latency: LatencyStats
    throughput: float | None  # items per second
    peak_rss_mb: float | None  # above the worker's baseline before load
    artifact_mb: float | None
    build_s: float | None  # None when the artifact came from the cache
    warmup_calls: int
    duration_s: float
    accuracy: Accuracy | None
    samples_ms: tuple[float, ...] | None = None
    #: offline, multi-stream and server: what ran in flight, read back from the engine (``concurrency``:
    #: requests, streams, threads as compiled) and the server search (``server``: max rate, queueing/compute split).
    serving: dict[str, Any] | None = None
    #: How busy the machine was over the timed phase (:mod:`autodeploy.harness.load`).
    load: Load | None = None
    #: The operations one call does at its shape, the GOP/s achieved and their share of the precision's
    #: peak on this device (:mod:`autodeploy.roofline`); ``None`` for a model whose ops were not counted
    #: (a model file run as given) and for records made before it (stored before revision 0008).
    roofline: Roofline | None = None
    #: The worker's CPU time over the timed phase and, where the machine has a meter, the energy, per inference
    #: (:mod:`autodeploy.harness.energy`); ``None`` for records made before it (stored before revision 0013).
    cost: Cost | None = None
    #: The time from a new process to the first result, in fresh processes, with and without the engine's compiled
    #: cache (:mod:`autodeploy.harness.cold_start`); ``None`` where not asked for (``bench --cold-start``, the
    #: objective ``cold-start``) and for records made before it (stored before revision 0013).
    cold_start: ColdStart | None = None

    @property
    def under_load(self) -> bool:
        """Whether other processes kept the machine busy while this ran (``False`` when not recorded)."""
        return self.load is not None and self.load.under_load

    def to_dict(self, *, samples: bool = True) -> dict[str, Any]:
        """The flat, JSON-ready form, keys in :meth:`keys` order: the latency statistics under their
        :data:`LATENCY_KEYS`, ``accuracy`` as a dict, ``samples_ms`` only with ``samples``; then
        ``serving``, ``load``, ``roofline``, ``cost`` and ``cold_start`` where they are set (a record without them keeps the format of bundle
        schema 1)."""
        flat = {key: getattr(self.latency, name) for name, key in LATENCY_KEYS.items()}
        flat.update({f.name: getattr(self, f.name) for f in fields(self) if f.name not in _NESTED})
        flat["accuracy"] = None if self.accuracy is None else asdict(self.accuracy)
        flat["samples_ms"] = None if self.samples_ms is None else list(self.samples_ms)
        out = {key: flat[key] for key in self.keys(samples=samples)}
        if self.serving is not None:
            out["serving"] = self.serving
        if self.load is not None:
            out["load"] = self.load.to_dict()
        if self.roofline is not None:
            out["roofline"] = self.roofline.to_dict()
        if self.cost is not None:
            out["cost"] = self.cost.to_dict()
        if self.cold_start is not None:
            out["cold_start"] = self.cold_start.to_dict()
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Measurement:
        """Read :meth:`to_dict`'s form back (lists for pairs are fine; missing ``samples_ms``, ``serving``,
        ``load``, ``roofline``, ``cost`` and ``cold_start`` are ``None``)."""
        lat = {name: d[key] for name, key in LATENCY_KEYS.items()}
        for name in ("median_ci", "p90_ci", "p99_ci"):
            lat[name] = _pair(lat[name])
        latency = LatencyStats(**lat, insufficient=_insufficient(lat["n"]))
        rest = {f.name: d[f.name] for f in fields(cls) if f.name not in _NESTED}
        samples = d.get("samples_ms")
        accuracy = None if d.get("accuracy") is None else Accuracy.from_dict(d["accuracy"])
        load = None if d.get("load") is None else Load.from_dict(d["load"])
        roofline = None if d.get("roofline") is None else Roofline.from_dict(d["roofline"])
        cost = None if d.get("cost") is None else Cost.from_dict(d["cost"])
        cold = None if d.get("cold_start") is None else ColdStart.from_dict(d["cold_start"])
        return cls(**rest, latency=latency, accuracy=accuracy, serving=d.get("serving"), load=load,
                   roofline=roofline, cost=cost, cold_start=cold,
                   samples_ms=None if samples is None else tuple(samples))  # fmt: skip

    @classmethod
    def keys(cls, *, samples: bool = True) -> tuple[str, ...]:
        """The keys of :meth:`to_dict`, in order (the bundle manifest's order since schema 1)."""
        own = tuple(f.name for f in fields(cls) if f.name not in _NESTED and f.name not in ("scenario", "batch"))
        return ("scenario", "batch", *LATENCY_KEYS.values(), *own, "accuracy", *(("samples_ms",) if samples else ()))


class MeasuredShortcuts:
    """Shortcuts to a ``measurement`` (``None`` without one), for code that reads a trial's numbers.

    Shared by :class:`TrialResult` (fresh from a worker) and the store's ``TrialRow``.
    """

    measurement: Measurement | None

    @property
    def latency(self) -> LatencyStats | None:
        return None if self.measurement is None else self.measurement.latency

    @property
    def accuracy(self) -> Accuracy | None:
        return None if self.measurement is None else self.measurement.accuracy

    @property
    def throughput(self) -> float | None:
        return None if self.measurement is None else self.measurement.throughput

    @property
    def peak_rss_mb(self) -> float | None:
        return None if self.measurement is None else self.measurement.peak_rss_mb

    @property
    def artifact_mb(self) -> float | None:
        return None if self.measurement is None else self.measurement.artifact_mb

    @property
    def n_samples(self) -> int | None:
        return None if self.measurement is None else self.measurement.latency.n

    @property
    def median_ms(self) -> float | None:
        return None if self.measurement is None else self.measurement.latency.median

    @property
    def p90_ms(self) -> float | None:
        return None if self.measurement is None else self.measurement.latency.p90

    @property
    def mean_ms(self) -> float | None:
        return None if self.measurement is None else self.measurement.latency.mean


@dataclass(frozen=True)
class TrialResult(MeasuredShortcuts):
    """Everything one trial produced, successful or not.

    ``uid`` is chosen when the trial is launched, so storing the same result twice is a
    no-op. On failure ``failure_kind`` is one of :data:`FAILURE_KINDS` and ``measurement`` is
    ``None``, except for ``inaccurate`` trials (measured, then judged). ``extra`` holds what
    only this run reports (why timing stopped, the server scenario's rates); it is not stored.
    """

    uid: str
    config: TrialConfig
    status: str
    engine_version: str | None = None
    failure_kind: str | None = None
    failure_message: str | None = None
    measurement: Measurement | None = None
    artifact_path: str | None = None
    #: SHA-256 of every artifact file as measured (``artifact.json`` included): export ships only these bytes.
    artifact_files: dict[str, str] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def samples_ms(self) -> tuple[float, ...]:
        return () if self.measurement is None else self.measurement.samples_ms or ()

    @property
    def warmup_calls(self) -> int:
        return 0 if self.measurement is None else self.measurement.warmup_calls

    @property
    def duration_s(self) -> float:
        return 0.0 if self.measurement is None else self.measurement.duration_s

    @property
    def build_s(self) -> float | None:
        return None if self.measurement is None else self.measurement.build_s

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["config"] = self.config.to_dict()
        out["measurement"] = None if self.measurement is None else self.measurement.to_dict()
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TrialResult:
        d = dict(d)
        d["config"] = TrialConfig.from_dict(d["config"])
        if d.get("measurement") is not None:
            d["measurement"] = Measurement.from_dict(d["measurement"])
        return cls(**d)

    @classmethod
    def failed(cls, uid: str, config: TrialConfig, kind: str, message: str, **kw: Any) -> TrialResult:
        if kind not in FAILURE_KINDS:
            raise ValueError(f"unknown failure kind {kind!r}")
        return cls(uid=uid, config=config, status="failed", failure_kind=kind, failure_message=message, **kw)
