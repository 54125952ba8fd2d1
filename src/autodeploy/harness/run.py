"""The measurement pipeline, the parent side of the harness: a config's inputs, reference, build and measurement.

:func:`prepare_data` saves the calibration and evaluation inputs where the workers read them;
:func:`reference` computes the FP32 outputs every accuracy verdict compares against; :func:`prepare` builds
a config (cached by its engine); :func:`measure` times it and judges its accuracy; :func:`run_trial` does
both. Each step runs in a fresh worker (:mod:`autodeploy.harness.worker`) under the process supervisor
(:mod:`autodeploy.harness.supervisor`: timeout, memory cap, death classified), so nothing a worker does can
take the caller down: a failure is a result. :func:`quantize_in_worker` runs the in-house quantizer the same way.
"""

from __future__ import annotations

import functools
import json
import os
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autodeploy.accuracy import rules
from autodeploy.accuracy.records import DEFAULT_MAX_ACCURACY_DROP, DEFAULT_MIN_COSINE, Accuracy
from autodeploy.adapters.base import Artifact, TrialConfig, discard
from autodeploy.adapters.registry import (
    BASELINE_ENGINE,
    REFERENCE_NAME,
    baseline_config,
    runs_on_gpu,
    target_of,
)
from autodeploy.child import default_memory_cap_mb
from autodeploy.data import Dataset, split, synthetic
from autodeploy.errors import AutodeployError, BuildError, TrialFailed
from autodeploy.harness.result import Measurement, TrialResult, headline
from autodeploy.harness.spec import WorkerSpec
from autodeploy.harness.supervisor import Progress, run_worker
from autodeploy.harness.timing import TimingPolicy
from autodeploy.model import ModelInfo
from autodeploy.objectives import DEFAULT_SCENARIO, SCENARIOS
from autodeploy.roofline import OpCount, Peaks, Roofline, count_ops, roofline

if TYPE_CHECKING:
    from autodeploy.inhouse.passes import PipelineReport
    from autodeploy.inhouse.quantize import QuantConfig, QuantReport

REFERENCE_ENGINE = BASELINE_ENGINE
REFERENCE_FAILED = f"the {REFERENCE_NAME} reference could not run"
#: Said with every result measured without user data (``extra["inputs"]``), so no verdict on
#: noise passes for a verdict on real inputs.
SYNTHETIC_NOTE = (
    "accuracy was judged on synthetic inputs (random values), not on real data; "
    "give --data with real inputs for a verdict about them"
)
#: Added to :data:`SYNTHETIC_NOTE` for a model with an image-shaped input.
SAMPLE_IMAGES_HINT = (
    "; for this image input, --data sample:images gives crops of real photographs "
    "(with --mean-values/--scale-values/--reverse-input-channels as the model expects)"
)


#: How the reference lays its outputs out item by item (``worker.run_all``), in its cache file's name: a
#: reference cached under another layout is computed again, not compared shape against shape. 2: time-major
#: CTC logits split per item (``[N, T, V]``), where layout 1 repeated the call's ``[T, 1, V]`` per item.
REFERENCE_LAYOUT = 2


def synthetic_note(model: ModelInfo) -> str:
    """What every result measured on synthetic inputs says; for an image model it names ``sample:images``."""
    from autodeploy.images import image_input

    try:
        image_input(model)
    except AutodeployError:  # not an image model (or one whose size is open): the plain note
        return SYNTHETIC_NOTE
    return SYNTHETIC_NOTE + SAMPLE_IMAGES_HINT


@dataclass(frozen=True)
class HarnessSettings:
    """How trials are run. Defaults are the screening settings of docs/architecture.md.

    ``timeout_s`` bounds every worker that runs the model (the FP32 reference and each
    measurement), ``build_timeout_s`` the worker that builds an artifact.
    """

    workdir: Path
    policy: TimingPolicy = field(default_factory=TimingPolicy)
    timeout_s: float = 600.0
    build_timeout_s: float = 1800.0
    memory_cap_mb: int = field(default_factory=default_memory_cap_mb)
    calibration_items: int = 64
    evaluation_items: int = 64
    seed: int = 0
    max_accuracy_drop: float = DEFAULT_MAX_ACCURACY_DROP
    min_cosine: float = DEFAULT_MIN_COSINE
    metric: str | None = None  # the user's task metric, module:function (harness/metric.py)
    max_metric_drop: float | None = None
    #: ``OUTPUT=MEASURE[:THRESHOLD]``: the measure an output is judged by, where the user chose it
    #: (``autodeploy.accuracy.kinds.parse_override``); every other output's follows from what it is.
    accuracy_overrides: tuple[str, ...] = ()
    #: This device's peak GOP/s per precision (``harness/peaks.py``): each measurement's share of its
    #: precision's peak is read against them; ``None``: GOP/s only, no share.
    peaks: Peaks | None = None
    #: Seconds an int8 build's float-layer search may spend (every engine's: ``inhouse/quantize/mixed.py``), and
    #: at most :data:`FLOAT_SEARCH_SHARE` of ``build_timeout_s``, which a study's time budget caps.
    float_search_s: float = 300.0
    #: Fresh processes per kind of start (without the compiled cache, and from it) to time each measurement's cold
    #: start in (:mod:`autodeploy.harness.cold_start`); ``None``: not measured (``bench --cold-start``, the
    #: objective ``cold-start``).
    cold_start: int | None = None

    def search_s(self) -> float:
        """What a build's float-layer search may spend: its own limit, within its share of the build's."""
        return min(self.float_search_s, self.build_timeout_s * FLOAT_SEARCH_SHARE)


#: The share of a build's time limit that its float-layer search may take: the build ends with the best config
#: the search found, never killed mid-search, and a study's other configs keep the rest of its time.
FLOAT_SEARCH_SHARE = 0.25


@dataclass(frozen=True)
class PreparedData:
    """Calibration and evaluation inputs saved for the workers, and their hashes."""

    calibration_path: Path
    calibration_sha256: str
    evaluation_path: Path
    evaluation_sha256: str
    calibration_items: int
    evaluation_items: int
    has_labels: bool
    synthetic: bool = False  # made by :func:`synthetic`, not given
    note: str | None = None  # said with every result on these inputs (:func:`synthetic_note`)
    #: Every item given, calibration split included: what a config that calibrates nothing is judged on
    #: (:meth:`evaluation_for`). ``None`` when calibration data came apart from the evaluation data.
    all_path: Path | None = None
    all_sha256: str = ""
    all_items: int = 0

    def evaluation_for(self, config: TrialConfig | None) -> tuple[Path, str, int]:
        """(path, SHA-256, items) of the inputs ``config``'s accuracy is judged on.

        Only int8 calibrates, so only int8 is held to the items it was not calibrated on; fp32, bf16 and
        fp16 are judged on every item (half of a user's 32 tables were held back for nothing).
        ``None`` (the study's first reference) takes the held-out items.
        """
        if config is None or config.precision == "int8" or self.all_path is None:
            return self.evaluation_path, self.evaluation_sha256, self.evaluation_items
        return self.all_path, self.all_sha256, self.all_items


def prepare_data(
    model: ModelInfo,
    settings: HarnessSettings,
    *,
    data: Dataset | None = None,
    calibration: Dataset | None = None,
    pins: dict[str, float] | None = None,
    made: bool = False,
) -> PreparedData:
    """Save calibration and evaluation inputs where workers read them.

    With ``data`` only, it is split (seeded) into calibration and evaluation; with neither,
    synthetic inputs are made for both. ``made``: ``data`` is synthetic too
    (:func:`autodeploy.intake.choose_inputs` made it), and every result says so.
    """
    made = made or data is None
    if data is None:
        total = settings.calibration_items + settings.evaluation_items
        data = synthetic(model, total, seed=settings.seed, pins=pins)
    everything = data if calibration is None else None
    if calibration is None:
        calibration, evaluation = split(data, settings.calibration_items, seed=settings.seed)
    else:
        evaluation = data
    folder = settings.workdir / "data"
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for dataset in (calibration, evaluation, everything or evaluation):
        digest = dataset.sha256()
        path = folder / f"{digest[:24]}.npz"
        if not path.exists():
            tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp.npz")
            dataset.save(tmp)
            os.replace(tmp, path)
        paths.append((path, digest))
    (cal_path, cal_sha), (ev_path, ev_sha), (all_path, all_sha) = paths
    return PreparedData(
        cal_path, cal_sha, ev_path, ev_sha, len(calibration), len(evaluation), evaluation.labels is not None,
        made, synthetic_note(model) if made else None, all_path, all_sha, len(everything or evaluation),
    )


def reference(
    model: ModelInfo, data: PreparedData, settings: HarnessSettings, progress: Progress | None = None,
    config: TrialConfig | None = None,
) -> Path:
    """ONNX Runtime FP32 outputs on the inputs ``config`` is judged on (:meth:`PreparedData.evaluation_for`);
    computed once per model and inputs, in a worker. A model file run as given (a ``.tflite``, an
    OpenVINO IR) is its own engine's fp32 reference (:func:`~autodeploy.adapters.registry.baseline_config`).
    An ONNX exported from PyTorch (``model.source``) is judged against PyTorch: the ``.pt2``'s program, run
    in the worker, or the ``nn.Module``'s outputs its caller wrote (:mod:`autodeploy.harness.torch_reference`)."""
    path, sha256, _ = data.evaluation_for(config)
    out = reference_path(model, sha256, settings)
    if out.exists():
        return out
    if model.source.get("reference") == "module":  # written by the caller, where the module lives
        raise TrialFailed("run_failed", "the PyTorch module's own outputs (the reference) were not computed; "
                          "fix: pass the nn.Module to autodeploy.bench or autodeploy.tune again")  # fmt: skip
    out.parent.mkdir(parents=True, exist_ok=True)
    # a model that scales its int8 activations per call is run one item a call: each item as it is alone
    batch = 8 if model.batchable() and not model.scales_per_call() else (model.fixed_batch() or 1)
    engine = baseline_config(model.format).engine
    spec = _spec("reference", model, TrialConfig(engine, batch=batch), data, settings,
                 output_path=str(out), evaluation_path=str(path))  # fmt: skip
    outcome = run_worker(spec, settings.timeout_s, settings.memory_cap_mb, progress)
    if outcome.status != "ok":
        failed = REFERENCE_FAILED if engine == REFERENCE_ENGINE else f"the {engine} FP32 reference could not run"
        failed = "the PyTorch reference (the .pt2's ExportedProgram) could not run" if model.source else failed
        raise TrialFailed(outcome.failure_kind or "crashed", f"{failed}: {outcome.failure_message}")
    return out


def reference_path(model: ModelInfo, sha256: str, settings: HarnessSettings) -> Path:
    """Where the reference of ``model`` on the inputs of SHA-256 ``sha256`` is cached: per model, inputs, layout
    and source (PyTorch's own outputs are another reference than ONNX Runtime's on the same ONNX)."""
    tag = f"-pytorch-{model.source.get('reference')}" if model.source else ""
    return settings.workdir / "reference" / f"{model.sha256[:16]}-{sha256[:16]}-l{REFERENCE_LAYOUT}{tag}.npz"


def quantize_in_worker(
    model: ModelInfo, calibration: Dataset, config: QuantConfig, output: Path, *, timeout_s: float,
    memory_cap_mb: int | None = None, progress: Progress | None = None,
) -> tuple[PipelineReport, QuantReport]:
    """``autodeploy inhouse quantize`` in a worker: the graph passes, then the INT8 quantizer with
    ``config`` (the in-house engine's build chain), under the build's timeout and memory cap.

    The QDQ model is written to ``output`` only when the worker succeeded.

    Raises:
        BuildError: the worker failed, ran past ``timeout_s`` or over ``memory_cap_mb``; the message
            says which, and the fix.
    """
    from autodeploy.inhouse.passes import PipelineReport
    from autodeploy.inhouse.quantize import QuantReport

    phase = ""

    def seen(name: str) -> None:
        nonlocal phase
        phase = name
        if progress:
            progress(name)

    seen("starting the worker")
    output.parent.mkdir(parents=True, exist_ok=True)
    # Beside the output, so the finished model is renamed into place (never half written).
    with tempfile.TemporaryDirectory(prefix=".autodeploy-quantize-", dir=output.parent) as tmp:
        cal_path, model_path = Path(tmp, "calibration.npz"), Path(tmp, "model.onnx")
        calibration.save(cal_path)
        # The passes and the quantizer, not an engine's build: the job names no engine and no trial config.
        spec = WorkerSpec(mode="quantize", uid=uuid.uuid4().hex, engine_target="", config={}, model=model.to_dict(),
                          workdir=tmp, calibration_path=str(cal_path), output_path=str(model_path),
                          quant=asdict(config))  # fmt: skip
        outcome = run_worker(spec, timeout_s, memory_cap_mb or default_memory_cap_mb(), seen)
        if outcome.failure_kind == "timeout":
            raise BuildError(f"inhouse quantize still running after its timeout of {timeout_s:g} s "
                             f"(while {phase}); the worker was stopped and nothing was written",
                             fix="give it more time with --timeout SECONDS, or calibrate on fewer items "
                                 "(--items, or a smaller --data)")  # fmt: skip
        if outcome.status != "ok":
            raise BuildError(f"inhouse quantize failed ({outcome.failure_kind}): "
                             f"{headline(outcome.failure_message)}")  # fmt: skip
        os.replace(model_path, output)
    payload = outcome.payload
    return PipelineReport.from_dict(payload["passes"]), QuantReport.from_dict(payload["quantization"], config)


@dataclass(frozen=True)
class Prepared:
    """A config built (or an artifact given) and its reference computed: ready to be measured,
    once by :func:`run_trial` or again and again in fresh workers (the gate's rounds).

    ``failure`` is set, and ``spec`` is ``None``, when the build failed; :func:`measure` then
    returns that failure as a result.
    """

    uid: str
    config: TrialConfig
    scenario: str
    spec: WorkerSpec | None
    build_s: float | None = None
    engine_version: str | None = None
    failure: tuple[str, str] | None = None  # (kind, message)
    synthetic: bool = False  # the evaluation inputs were made up: every result says so
    note: str | None = None  # what every result says about its inputs
    #: The model measured, at the shapes fed: its operations are counted from it (``Measurement.roofline``).
    model: ModelInfo | None = None


def prepare(
    model: ModelInfo,
    config: TrialConfig,
    data: PreparedData,
    settings: HarnessSettings,
    *,
    artifact: Path | None = None,
    reference_model: ModelInfo | None = None,
    progress: Progress | None = None,
    uid: str | None = None,
    scenario: str = DEFAULT_SCENARIO.name,
    sla_ms: float | None = None,
    measured: Measured | None = None,
) -> Prepared:
    """Compute the FP32 reference of ``reference_model`` (default ``model``) and build ``config``
    in a worker (cached by the adapter), unless ``artifact`` is given: a folder built earlier,
    e.g. a bundle's, measured exactly as it is.

    With ``measured`` (a results store's :meth:`~autodeploy.results_db.Store.artifact_files_measured`),
    an artifact taken from the cache that the store measured before must still hold the files
    of one of those measurements; if not, it was changed since (``artifact.json`` resealed with
    it: anyone who can write the cache can), and it is built again from the model rather than
    measured and exported under the model's SHA-256.

    Raises:
        TrialFailed: the reference could not be computed (nothing to judge accuracy against).
    """
    known = SCENARIOS.get(scenario)
    if known is None or (known.rate_under_sla and not sla_ms):
        raise ValueError(f"scenario {scenario!r} needs to be one of {', '.join(SCENARIOS)} (server with sla_ms)")
    uid = uid or uuid.uuid4().hex
    ref = reference(reference_model or model, data, settings, progress, config)
    spec = _spec("build", model, config, data, settings, uid=uid, scenario=scenario, sla_ms=sla_ms)
    build_s = engine_version = None
    if artifact is None:
        for attempt in range(2):
            built = run_worker(spec, settings.build_timeout_s, settings.memory_cap_mb, progress)
            if built.status != "ok":
                failure = (built.failure_kind or "build_failed", built.failure_message or "")
                return Prepared(uid, config, scenario, None, engine_version=built.payload.get("engine_version"),
                                failure=failure, synthetic=data.synthetic, note=data.note)  # fmt: skip
            artifact = Path(built.payload["artifact_path"])
            distrust = _distrusted(artifact, built.payload, measured)
            if distrust is None:
                break
            if attempt:  # rebuilt, and again not what this build writes: someone is writing the cache
                failure = ("build_failed", f"{distrust}, again after a rebuild")
                return Prepared(uid, config, scenario, None, failure=failure, synthetic=data.synthetic,
                                note=data.note)
            if progress:
                progress(f"{distrust}: building it again")
            discard(artifact)
        build_s, engine_version = built.payload["build_s"], built.payload.get("engine_version")
    spec = replace(spec, mode="measure", artifact_path=str(artifact), reference_path=str(ref))
    return Prepared(uid, config, scenario, spec, build_s, engine_version, synthetic=data.synthetic, note=data.note,
                    model=model)


#: The files (``{name: SHA-256}``) of the artifact at a path, as each measurement a store holds recorded them.
Measured = Callable[[Path], list[dict[str, str]]]


def _distrusted(artifact: Path, payload: dict[str, Any], measured: Measured | None) -> str | None:
    """Why the artifact a build worker took from the cache is not to be measured, or ``None``."""
    if not payload.get("artifact_reused") or measured is None:
        return None
    recorded = measured(artifact)
    if not recorded or Artifact.read(artifact).digests() in recorded:
        return None
    return (f"the cached artifact {artifact.name} is not the one the results store measured "
            "(its files changed since)")  # fmt: skip


@dataclass(frozen=True)
class KnownAccuracy:
    """The accuracy trial ``uid`` measured on an artifact: any config of the same artifact and batch reuses it."""

    uid: str
    accuracy: Accuracy


def measure(prepared: Prepared, settings: HarnessSettings, progress: Progress | None = None,
            known: KnownAccuracy | None = None) -> TrialResult:  # fmt: skip
    """Measure a prepared config in one fresh worker; a failure is a result, never an exception.

    A run whose outputs break the accuracy constraint is measured all the same and returned as
    failed with kind ``inaccurate``, its latency and accuracy filled in. With ``known`` the
    worker times the artifact and takes the accuracy from ``known`` instead of comparing again
    (``extra["accuracy_reused_from"]`` names the trial that measured it).
    """
    uid, config = prepared.uid, prepared.config
    note = {"inputs": prepared.note or SYNTHETIC_NOTE} if prepared.synthetic else {}
    if prepared.spec is None:
        kind, message = prepared.failure or ("build_failed", "not built")
        return TrialResult.failed(uid, config, kind, message, engine_version=prepared.engine_version, extra=note)
    spec = prepared.spec
    if known is not None:
        spec = replace(spec, accuracy=asdict(known.accuracy), accuracy_from=known.uid)
    measured = run_worker(spec, settings.timeout_s, settings.memory_cap_mb, progress)
    if measured.status != "ok":
        return TrialResult.failed(uid, config, measured.failure_kind or "run_failed", measured.failure_message or "",
                                  engine_version=prepared.engine_version, extra=note)  # fmt: skip
    p = measured.payload
    measurement = replace(Measurement.from_dict(p["measurement"]), build_s=prepared.build_s)
    line, said = _roofline(prepared.model, config, measurement, settings.peaks)
    measurement = replace(measurement, roofline=line)
    fields: dict[str, Any] = dict(engine_version=p["engine_version"], measurement=measurement,
                                  artifact_path=p["artifact_path"], artifact_files=p["artifact_files"],
                                  extra={**p["extra"], **note, **said})  # fmt: skip
    accuracy = measurement.accuracy
    if accuracy is not None and not accuracy.passed:
        worst = rules.worst(accuracy.outputs, max_accuracy_drop=settings.max_accuracy_drop, min_cosine=settings.min_cosine)
        if accuracy.metric is not None and accuracy.metric_value is not None:
            worst += (f"; {accuracy.metric} {accuracy.metric_value:.4g} "
                      f"(reference {accuracy.reference_metric_value:.4g})")  # fmt: skip
        message = f"breaks the accuracy constraint ({accuracy.constraint}); worst: {worst}"
        drop = rules.accuracy_drop(accuracy)
        if rules.conversion_fault(config.precision, drop, settings.max_accuracy_drop):
            message = (f"{config.engine}'s fp32 conversion breaks the model (accuracy drop {drop:.2%}, "
                       f"{rules.CONVERSION_FACTOR:g}x the budget or more; no precision loses that much): {message}; "
                       f"every precision of {config.engine} is built from this conversion")  # fmt: skip
            return TrialResult.failed(uid, config, "conversion", message, **fields)
        return TrialResult.failed(uid, config, "inaccurate", message, **fields)
    return TrialResult(uid=uid, config=config, status="ok", **fields)


def _roofline(model: ModelInfo | None, config: TrialConfig, measurement: Measurement,
              peaks: Peaks | None) -> tuple[Roofline | None, dict[str, str]]:  # fmt: skip
    """The measurement's GOP/s and share of its precision's peak (:mod:`autodeploy.roofline`), from the ONNX
    graph's ops at the shapes it was fed; ``None`` for a model file run as given (no ONNX graph to count),
    and, with the reason in ``extra["roofline"]``, for a graph whose ops could not be counted."""
    shapes = model.measured_shapes(config.batch) if model is not None and model.format == "onnx" else None
    if shapes is None:
        return None, {}
    try:
        count = _op_count(str(model.path), model.sha256, json.dumps(shapes, sort_keys=True))
    except Exception as exc:  # onnx's shape inference refused the graph: the measurement stands, without its GOP/s
        return None, {"roofline": f"operations not counted: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}"}
    return roofline(count, precision=config.precision, batch=measurement.batch, gpu=runs_on_gpu(config.engine),
                    scenario=measurement.scenario, median_ms=measurement.latency.median,
                    throughput=measurement.throughput, peaks=peaks), {}  # fmt: skip


@functools.lru_cache(maxsize=16)
def _op_count(path: str, sha256: str, shapes: str) -> OpCount:
    """:func:`~autodeploy.roofline.count_ops` once per model (its SHA-256) and shapes: a study measures the
    same graph many times."""
    del sha256  # part of the cache key only: the file at ``path`` is the model of that hash
    return count_ops(path, json.loads(shapes))


def run_trial(
    model: ModelInfo,
    config: TrialConfig,
    data: PreparedData,
    settings: HarnessSettings,
    *,
    progress: Progress | None = None,
    uid: str | None = None,
    scenario: str = DEFAULT_SCENARIO.name,
    sla_ms: float | None = None,
    artifact: Path | None = None,
    known: KnownAccuracy | None = None,
    measured: Measured | None = None,
) -> TrialResult:
    """Build (once, cached) and measure one config; a failure is a result, never an exception.

    ``scenario="server"`` also finds the highest Poisson query rate whose p99 stays under ``sla_ms``
    (``result.extra["server"]``). When the FP32 reference itself cannot run (it hangs, crashes,
    runs out of memory), the result is failed with that kind and ``extra["reference_failed"]``.
    ``artifact`` (built before for the same build key) skips the build worker; ``known`` reuses
    the accuracy measured on that artifact (see :func:`measure`); ``measured`` checks a cached
    artifact against a store (see :func:`prepare`).

    ``extra["wall_s"]`` says where the wall time went: ``build`` (the build worker, or nothing
    when ``artifact`` was given), ``timing`` (the measure worker beside its accuracy: start,
    load, warm-up, timed calls) and ``accuracy`` (running the evaluation inputs and comparing).
    """
    uid = uid or uuid.uuid4().hex
    start = time.monotonic()
    try:
        prepared = prepare(model, config, data, settings, artifact=artifact, progress=progress, uid=uid,
                           scenario=scenario, sla_ms=sla_ms, measured=measured)  # fmt: skip
    except TrialFailed as failure:  # no reference, nothing to judge against: a failed trial, stored as such
        return TrialResult.failed(uid, config, failure.kind, failure.detail, extra={"reference_failed": True})
    built = time.monotonic()
    result = measure(prepared, settings, progress, known)
    measure_s = time.monotonic() - built
    accuracy_s = min(float(result.extra.get("accuracy_s", 0.0)), measure_s)
    wall = {"build": built - start, "timing": measure_s - accuracy_s, "accuracy": accuracy_s}
    source = {"source": dict(model.source)} if model.source else {}  # the exporter and its version
    return replace(result, extra={**result.extra, "wall_s": wall, **source})


def _spec(
    mode: str,
    model: ModelInfo,
    config: TrialConfig,
    data: PreparedData,
    settings: HarnessSettings,
    **extra: Any,
) -> WorkerSpec:
    from dataclasses import asdict

    return WorkerSpec(
        mode=mode,
        uid=extra.pop("uid", uuid.uuid4().hex),
        engine_target=target_of(config.engine),
        config=config.to_dict(),
        model=model.to_dict(),
        workdir=str(settings.workdir / "artifacts"),
        calibration_path=str(data.calibration_path),
        calibration_sha256=data.calibration_sha256,
        evaluation_path=extra.pop("evaluation_path", str(data.evaluation_for(config)[0])),
        policy=asdict(settings.policy),
        max_accuracy_drop=settings.max_accuracy_drop,
        min_cosine=settings.min_cosine,
        metric=settings.metric,
        max_metric_drop=settings.max_metric_drop,
        accuracy_overrides=tuple(settings.accuracy_overrides),
        search_s=settings.search_s() if mode == "build" else None,
        cold_start=settings.cold_start,
        **extra,
    )
