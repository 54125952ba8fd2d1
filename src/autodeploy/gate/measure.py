"""What the gate measures: two arms (a model + config, or a bundle), round by round.

An :class:`Arm` is either an ONNX model measured with a :class:`TrialConfig`, or an exported
bundle measured with its manifest's engine and settings and its shipped artifact (exactly as
benchmarked; the artifact is never rebuilt). :func:`run_rounds` runs them interleaved, each
round in a fresh harness worker process, alternating which arm goes first (A B, B A, A B, …)
so a slow drift of the machine and any order effect hit both arms alike. Every worker run
becomes one :class:`Round`: the unit of the gate's statistics (see :mod:`autodeploy.gate.stats`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from autodeploy.accuracy import rules
from autodeploy.adapters import registry
from autodeploy.adapters.base import Artifact, TrialConfig
from autodeploy.data import Dataset
from autodeploy.errors import UsageError
from autodeploy.harness.result import headline
from autodeploy.harness.run import HarnessSettings, Prepared, PreparedData, measure, prepare
from autodeploy.harness.stats import P90, round_value
from autodeploy.model import ModelInfo, TensorSpec

Progress = Callable[[str], None]


@dataclass(frozen=True)
class Arm:
    """One side of the comparison.

    ``model`` describes the interface and identity (for a bundle: its source model's SHA-256
    from the manifest). ``reference_model`` is the model whose baseline fp32 outputs accuracy is
    measured against (ONNX Runtime's for an ONNX file, LiteRT's for a ``.tflite``: its format's
    baseline); ``artifact`` is set for bundles (and after the build for models).
    """

    role: str  # "baseline" or "candidate"
    ref: str
    kind: str  # "model" or "bundle"
    model: ModelInfo
    config: TrialConfig
    reference_model: ModelInfo | None
    artifact: Path | None = None
    data: Dataset | None = None  # a zoo model's own (labelled) evaluation data
    calibration: Dataset | None = None
    notes: tuple[str, ...] = ()

    def describe(self) -> dict[str, Any]:
        return {"ref": self.ref, "kind": self.kind, "name": self.model.name, "sha256": self.model.sha256,
                "config": self.config.to_dict(), "label": self.config.label()}  # fmt: skip


@dataclass(frozen=True)
class Round:
    """One worker run of one arm: its per-call statistics, or why it failed."""

    role: str
    index: int
    p10_ms: float | None = None
    median_ms: float | None = None
    p90_ms: float | None = None  # None below 64 calls (docs/architecture.md)
    mean_ms: float | None = None
    calls: int = 0
    accuracy: float | None = None
    accuracy_metric: str | None = None
    eval_items: int | None = None
    engine_version: str | None = None
    failure: str | None = None
    source: str = "measured"  # or "stored trial N" (--against-db)

    @property
    def ok(self) -> bool:
        return self.failure is None

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@dataclass
class Rounds:
    """Every round of both arms, in the order they ran."""

    baseline: list[Round] = field(default_factory=list)
    candidate: list[Round] = field(default_factory=list)


def model_arm(role: str, ref: str, info: ModelInfo, config: TrialConfig, *, data: Dataset | None = None,
              calibration: Dataset | None = None) -> Arm:  # fmt: skip
    """An ONNX model measured with ``config`` (built once, in a worker, before the rounds)."""
    return Arm(role, ref, "model", info, config, info, data=data, calibration=calibration)


def bundle_arm(role: str, ref: str, root: Path, *, reference_model: ModelInfo | None,
               others: Sequence[ModelInfo] = ()) -> Arm:  # fmt: skip
    """A bundle folder measured with its manifest's engine, settings and shipped artifact.

    The files are verified against the manifest first. ``reference_model`` is the source model for
    the accuracy reference; without it, the other arm's model (``others``) serves when it is the
    bundle's source model (same SHA-256), and so does a bundle that ships its source file itself: an
    ONNX Runtime fp32 bundle's model.onnx, or a file run as given (a ``.tflite`` on LiteRT, an IR on
    OpenVINO), whose reference is its own baseline (``LiteRT fp32, the file as given``).

    Raises:
        BundleError: the bundle is damaged or cannot run here.
        UsageError: no source model for the accuracy reference.
    """
    from autodeploy import bundle, formats
    from autodeploy.model import load_model

    manifest = bundle.verify(root)
    notes = tuple(bundle.check_compatible(manifest, allow_other_version=True))
    m = manifest["model"]
    artifact = Artifact.read(root / "model")
    # A file run as given (a .tflite, an IR) is shipped unchanged: the artifact is the source model in its format,
    # under the name its runtime opens (a .tflite becomes model.tflite; an IR keeps its own).
    as_given = artifact.meta.get("as_given") and (manifest.get("runtime") or {}).get("model_file")
    info = ModelInfo(path=root / "model" / (as_given or artifact.files[0]), name=m["name"], sha256=m["sha256"],
                     inputs=_specs(m["inputs"]), outputs=_specs(m["outputs"]), opset=0,
                     shapes={k: tuple(v) for k, v in (m.get("shapes") or {}).items()},
                     format=formats.detect(root / "model" / as_given) if as_given else "onnx")  # fmt: skip
    if reference_model is None:
        reference_model = next((other for other in others if other.sha256 == info.sha256), None)
    baseline = (registry.BASELINE_CONFIG.engine, registry.BASELINE_CONFIG.precision)
    own_file = as_given or ("model.onnx" if (artifact.engine, artifact.precision) == baseline else None)
    if reference_model is None and own_file:  # the source itself, copied unchanged: its format's baseline judges
        own = load_model(root / "model" / own_file, info.shapes, name=info.name)
        reference_model = own if own.sha256 == info.sha256 else None
    if reference_model is None:
        given = "".join(f"; {other.name} is another model (SHA-256 {other.sha256[:12]})" for other in others)
        raise UsageError(
            f"bundle {ref} ships a {artifact.engine} {artifact.precision} artifact, not its source ONNX model "
            f"{m['name']} (SHA-256 {m['sha256'][:12]}), so its accuracy reference cannot be computed{given}",
            fix="gate it against its source model (--baseline SOURCE.onnx), or pass --reference-model SOURCE.onnx",
        )
    if reference_model.sha256 != info.sha256:
        notes += (
            f"{ref}: accuracy is measured against {reference_model.name}, not the bundle's source model",
        )
    config = TrialConfig.from_dict(manifest["settings"])
    return Arm(role, ref, "bundle", info, config, reference_model, artifact=root / "model", notes=notes)


def _specs(items: list[dict[str, Any]]) -> tuple[TensorSpec, ...]:
    return tuple(TensorSpec(i["name"], i["dtype"], tuple(i["shape"])) for i in items)


def check_same_inputs(baseline: Arm, candidate: Arm) -> None:
    """Both arms are fed the same evaluation inputs, so their inputs must agree."""

    def sig(arm: Arm) -> list[tuple[str, str]]:
        return sorted((s.name, s.dtype) for s in arm.model.inputs)

    if sig(baseline) != sig(candidate):
        raise UsageError(
            f"baseline and candidate take different inputs: {sig(baseline)} vs {sig(candidate)}",
            fix="gate two versions of the same model interface",
        )


def run_rounds(
    arms: list[Arm],
    rounds: int,
    data: PreparedData,
    settings: HarnessSettings,
    progress: Progress | None = None,
) -> Rounds:
    """Build what needs building, then measure ``rounds`` rounds of each arm, interleaved.

    A failed build or round is recorded in its :class:`Round` (``failure``), never raised.
    """
    say = progress or (lambda _: None)
    prepared: dict[str, Prepared] = {}  # by role
    built: dict[tuple[str, str, str], Prepared] = {}
    for arm in arms:
        key = (arm.model.sha256, arm.config.key(), str(arm.artifact))
        if key not in built:  # the same model and config twice (an A/A run) is built once
            say(f"{arm.role}: reference and build")
            built[key] = prepare(arm.model, arm.config, data, settings, artifact=arm.artifact,
                                 reference_model=arm.reference_model)  # fmt: skip
        prepared[arm.role] = built[key]
    out = Rounds()
    for r in range(rounds):
        order = arms if r % 2 == 0 else arms[::-1]
        for arm in order:
            say(f"round {r + 1}/{rounds}: {arm.role}")
            getattr(out, arm.role).append(_round(arm.role, r, prepared[arm.role], settings))
    return out


def _round(role: str, index: int, prepared: Prepared, settings: HarnessSettings) -> Round:
    result = measure(prepared, settings)
    if not result.samples_ms:  # the build or the run failed; "inaccurate" runs were measured
        stage = f"build failed ({result.failure_kind})" if prepared.spec is None else result.failure_kind
        return Round(role, index, failure=f"{stage}: {headline(result.failure_message)}")
    samples = np.asarray(result.samples_ms, dtype=float)
    score, metric = accuracy_score(asdict(result.accuracy) if result.accuracy else None)
    return Round(
        role, index, p10_ms=float(np.percentile(samples, 10)), median_ms=float(np.median(samples)),
        p90_ms=round_value(samples, P90),
        mean_ms=float(samples.mean()), calls=int(samples.size), accuracy=score, accuracy_metric=metric,
        eval_items=result.accuracy.n_samples if result.accuracy else None, engine_version=result.engine_version,
    )  # fmt: skip


def accuracy_score(accuracy: dict[str, Any] | None) -> tuple[float | None, str | None]:
    """One 0..1 score per run (:func:`autodeploy.accuracy.rules.accuracy_score`), from a stored accuracy dict."""
    return rules.accuracy_score((accuracy or {}).get("outputs") or ())


def history_rounds(store: Any, arm: Arm, fingerprint: str, *, limit: int) -> list[Round]:
    """The stored trials of ``arm``'s model and config on this device, as rounds (newest first)."""
    from autodeploy.results_db.records import TrialFilter

    where = TrialFilter(model_sha256=arm.model.sha256, device=fingerprint, config_key=arm.config.key(),
                        measured_only=True, newest_first=True, limit=limit)  # fmt: skip
    rows = store.trials(where, samples=True)  # one row per worker run
    out = []
    for i, row in enumerate(rows):
        score, metric = accuracy_score(asdict(row.accuracy) if row.accuracy else None)
        p10 = float(np.percentile(row.samples_ms, 10)) if row.samples_ms else None
        out.append(Round(arm.role, i, p10_ms=p10, median_ms=row.median_ms, p90_ms=row.p90_ms, mean_ms=row.mean_ms,
                         calls=row.n_samples or 0, accuracy=score, accuracy_metric=metric,
                         eval_items=row.accuracy.n_samples if row.accuracy else None,
                         engine_version=row.engine_version, source=f"stored trial {row.id}"))  # fmt: skip
    return out
