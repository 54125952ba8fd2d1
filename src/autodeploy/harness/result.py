"""What a trial produces. Plain dataclasses that round-trip through JSON (never pickle)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

#: Why a trial produced no usable measurement (DESIGN.md, "Measurement rules").
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
)
STATUSES = ("ok", "failed")


@dataclass(frozen=True)
class LatencyStats:
    """Per-call latency statistics in milliseconds.

    ``p90``/``p99`` are ``None`` when there are too few samples to claim them
    (64 and 662 samples); ``insufficient`` then says which claims are missing.
    """

    n: int
    median: float
    mean: float
    stdev: float
    cv: float
    min: float
    max: float
    median_ci: tuple[float, float]
    p90: float | None
    p90_ci: tuple[float, float] | None
    p99: float | None
    p99_ci: tuple[float, float] | None
    unstable: bool
    insufficient: tuple[str, ...] = ()

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LatencyStats:
        d = dict(d)
        for k in ("median_ci", "p90_ci", "p99_ci"):
            if d.get(k) is not None:
                d[k] = tuple(d[k])
        d["insufficient"] = tuple(d.get("insufficient", ()))
        return cls(**d)


@dataclass(frozen=True)
class OutputAccuracy:
    """One output compared with the ONNX Runtime FP32 reference on the evaluation inputs."""

    name: str
    max_abs: float
    mean_rel: float
    cosine: float
    top1_agreement: float | None = None  # for classifier-shaped outputs [N, classes]
    task_accuracy: float | None = None  # when the user gave labels
    reference_task_accuracy: float | None = None
    exact_agreement: float | None = None  # for integer outputs (ids): the fraction of equal elements


@dataclass(frozen=True)
class Accuracy:
    outputs: tuple[OutputAccuracy, ...]
    n_samples: int
    #: The constraint checked (DESIGN.md default, per output: top-1 agreement >= 0.99 for
    #: classifiers, exact agreement >= 0.99 for integer outputs, else cosine >= 0.99).
    constraint: str
    passed: bool

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Accuracy:
        return cls(
            outputs=tuple(OutputAccuracy(**o) for o in d["outputs"]),
            n_samples=d["n_samples"],
            constraint=d["constraint"],
            passed=d["passed"],
        )


@dataclass(frozen=True)
class TrialResult:
    """Everything one trial produced, successful or not.

    ``uid`` is chosen when the trial is launched, so storing the same result twice is a
    no-op. On failure ``failure_kind`` is one of :data:`FAILURE_KINDS` and the measurement
    fields may be ``None``.
    """

    uid: str
    config: dict[str, Any]
    status: str
    scenario: str = "single-stream"
    engine_version: str | None = None
    failure_kind: str | None = None
    failure_message: str | None = None
    latency: LatencyStats | None = None
    throughput: float | None = None  # items per second
    samples_ms: tuple[float, ...] = ()
    warmup_calls: int = 0
    duration_s: float = 0.0
    peak_rss_mb: float | None = None  # above the worker's baseline before load
    artifact_mb: float | None = None
    artifact_path: str | None = None
    build_s: float | None = None
    accuracy: Accuracy | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrialResult:
        d = dict(d)
        if d.get("latency") is not None:
            d["latency"] = LatencyStats.from_dict(d["latency"])
        if d.get("accuracy") is not None:
            d["accuracy"] = Accuracy.from_dict(d["accuracy"])
        d["samples_ms"] = tuple(d.get("samples_ms", ()))
        return cls(**d)

    @classmethod
    def failed(cls, uid: str, config: dict[str, Any], kind: str, message: str, **kw: Any) -> TrialResult:
        if kind not in FAILURE_KINDS:
            raise ValueError(f"unknown failure kind {kind!r}")
        return cls(uid=uid, config=config, status="failed", failure_kind=kind, failure_message=message, **kw)
