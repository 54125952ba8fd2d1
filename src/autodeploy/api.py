"""The library entry points: :func:`bench`, :func:`tune`, :func:`export`, :func:`gate`, :func:`run_bundle`
and :func:`quantize`, the pipelines the CLI calls.

Each reads top to bottom as named steps (resolve the model, probe the device, prepare the
data, run, store) and returns typed records. Failures of the user's input raise
:class:`~autodeploy.errors.AutodeployError` subclasses (the CLI turns them into one line and
an exit code); a trial that fails to build or run is a *result*, not an exception. Nothing
here prints.

    import autodeploy
    summary = autodeploy.tune("zoo:tiny-cnn", engines=["onnxruntime"], trials=3, db="sqlite:///r.db")
    path = autodeploy.export(summary, "ship", db="sqlite:///r.db")
    outputs = autodeploy.bundle.load(path).run(feeds)

Optuna and SQLAlchemy are imported when a pipeline runs, engines inside their workers.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autodeploy import verdict
from autodeploy.adapters import registry
from autodeploy.adapters.base import TrialConfig
from autodeploy.data import Dataset, inputs_record, shapes_from_data
from autodeploy.device import DeviceInfo, probe_device
from autodeploy.errors import DataError, UsageError
from autodeploy.gate.stats import ALPHA, MIN_ROUNDS
from autodeploy.harness.result import TrialResult
from autodeploy.harness.run import SYNTHETIC_NOTE, HarnessSettings, PreparedData, prepare_data, run_trial
from autodeploy.harness.timing import TimingPolicy
from autodeploy.images import Preprocess
from autodeploy.intake import ResolvedModel, choose_inputs, load_source, resolve_model
from autodeploy.model import ModelInfo, display_name
from autodeploy.search import config as study_config
from autodeploy.search.config import StudyConfig
from autodeploy.shapes import ShapeCase, ShapeSet
from autodeploy.verdict import DEFAULT_MAX_ACCURACY_DROP

if TYPE_CHECKING:
    from autodeploy.bundle.export import Source
    from autodeploy.gate.core import GateResult
    from autodeploy.gate.measure import Arm
    from autodeploy.harness.load import Load
    from autodeploy.harness.result import LatencyStats
    from autodeploy.inhouse.passes import PipelineReport
    from autodeploy.inhouse.quantize import QuantReport
    from autodeploy.results_db.store import Store
    from autodeploy.search.study import Reporter, StudySummary

__all__ = [
    "FORMATS",
    "BundleRun",
    "GateRun",
    "Quantized",
    "BenchRequest",
    "StoredTrial",
    "bench",
    "bench_shapes",
    "cache_dir",
    "default_study_name",
    "export",
    "find_source",
    "gate",
    "quantize",
    "run_bundle",
    "tune",
    "tune_per_shape",
]

#: What :func:`export` writes: a bundle folder (manifest, loader) or a Triton model repository.
FORMATS = ("bundle", "triton")
Progress = Callable[[str], None]
Shapes = Mapping[str, Sequence[int]]


@dataclass(frozen=True)
class StoredTrial:
    """One measured config as stored: ``Store.trial(TrialFilter(id=id))`` reads the same trial back.

    ``result.ok`` is false when the trial failed (``result.failure_kind`` says how); it is
    stored all the same.
    """

    id: int
    result: TrialResult
    model: ModelInfo
    device: DeviceInfo
    shape_key: str = ""  # the shapes fixed for it (``x=1x3x48x320``), "" for none

    @property
    def ok(self) -> bool:
        return self.result.ok

    @property
    def config(self) -> TrialConfig:
        return self.result.config


def cache_dir() -> Path:
    """Where zoo models, data, artifacts and references are cached: ``$AUTODEPLOY_CACHE`` or the user cache folder."""
    from platformdirs import user_cache_dir

    return Path(os.environ.get("AUTODEPLOY_CACHE") or user_cache_dir("autodeploy"))


# -- bench ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class BenchRequest:
    """What :func:`bench` and :func:`bench_shapes` measure, and how: their keywords, written once.

    Either pass the fields as keywords (``autodeploy.bench("m.onnx", engine="openvino", threads=4)``)
    or build the request and pass it (``autodeploy.bench("m.onnx", request=BenchRequest(...))``);
    keywords given beside a request replace its fields. The checks that need no model run when
    it is built, so a bad combination fails in one line before any work.

    Attributes:
        config: the config to measure; or give ``engine`` (default ``onnxruntime``; for a ``.tflite`` or an
            OpenVINO IR ``.xml`` taken as given, the engine that reads it), ``precision``
            (``fp32``), ``batch`` (1), ``threads`` (the engine's default) and ``knobs`` instead.
        shapes: fixed input shapes, ``{"input": (1, 3, 224, 224)}``, for dynamic dims. :func:`bench`
            takes one shape per input; :func:`bench_shapes` a :class:`~autodeploy.shapes.ShapeSet`
            or a study config's ``shapes`` mapping (a shape, a list of shapes or a weighted mix per input).
        batch_axes: an input's batch axis where the model's own is wrong, ``{"state": 1}`` (``None``:
            never batched); by default it is the symbolic dim inputs and outputs share.
        data: inputs (``.npz``, a folder of ``NAME.npy``, a folder of images (labelled by subfolder),
            ``"sample:images"``, or a :class:`~autodeploy.data.Dataset`; optional labels); default:
            the zoo model's own data, else synthetic inputs. :func:`bench_shapes` also takes a list,
            one source per shape in the set's order.
        preprocess: how images become the input (layout, RGB/BGR, mean and scale values), for image data.
        pins: synthetic inputs pinned to a constant, ``{"sample_rate": 16000}``.
        metric: the user's task metric, ``"module:function"`` receiving (outputs, labels), higher is better.
        max_metric_drop: the largest drop of ``metric`` from the FP32 reference's allowed (default: only reported).
        max_accuracy_drop: the accuracy budget of every output, as ``tune``'s (default 1%): each output's
            measure (top-1, exact, sequence, F1 of decisions, SQNR per channel group) may lose at most this much.
        accuracy: ``OUTPUT=MEASURE[:THRESHOLD]`` per output whose measure you choose (one of
            ``autodeploy.verdict.MEASURES``, e.g. ``scores=decision:0.3``); the others are judged by
            what they are (the producing node, the shape, the reference's values).
        timing: warm-up and sample counts (default: 64 samples and 2 s at least, 60 s at most).
        timeout_s: seconds before a worker that runs the model (the reference, the measurement) is killed.
        build_timeout_s: seconds before the worker that builds the artifact is killed.
        memory_cap_mb: the worker's memory cap (default: 75% of RAM).
        scenario: MLPerf LoadGen's ``single-stream`` (default), ``offline`` (items/s with the knob
            ``num_requests`` in flight, default the engine's optimum), ``multi-stream`` (latency with
            ``num_requests`` in flight) or ``server`` (highest Poisson rate whose p99 meets ``sla_ms``).
        sla_ms: the p99 bound of the ``server`` scenario (required there).
        db: a results database URL or an open :class:`~autodeploy.results_db.store.Store` (left
            open); default ``$AUTODEPLOY_DB`` or the user SQLite file.
        cache: the cache folder (default :func:`cache_dir`).
        progress: told each phase (``"onnxruntime/fp32/b1/t1: building"``).
        command: what to record as the command that reproduces this (default: the call, as Python).

    Raises:
        UsageError: a config beside engine/precision/batch/threads/knobs, an unknown scenario, a
            server scenario without a finite ``sla_ms``, or an ``accuracy`` entry that does not parse.
    """

    config: TrialConfig | None = None
    engine: str | None = None
    precision: str | None = None
    batch: int | None = None
    threads: int | None = None
    knobs: Mapping[str, Any] | None = None
    shapes: ShapeSet | Mapping[str, Any] | None = None
    batch_axes: Mapping[str, int | None] | None = None
    data: str | Path | Dataset | Sequence[str | Path | Dataset] | None = None
    preprocess: Preprocess | None = None
    pins: Mapping[str, float] | None = None
    metric: str | None = None
    max_metric_drop: float | None = None
    max_accuracy_drop: float = DEFAULT_MAX_ACCURACY_DROP
    accuracy: Sequence[str] = ()
    timing: TimingPolicy | None = None
    timeout_s: float = 600.0
    build_timeout_s: float = 1800.0
    memory_cap_mb: int | None = None
    scenario: str = "single-stream"
    sla_ms: float | None = None
    # Where it runs and reports; not part of the command that reproduces it.
    db: str | Store | None = None
    cache: Path | None = None
    progress: Progress | None = None
    command: str | None = None

    def __post_init__(self) -> None:
        settings = (self.engine, self.precision, self.batch, self.threads, self.knobs)
        if self.config is not None and settings != (None,) * 5:
            raise UsageError("give a TrialConfig or engine/precision/batch/threads/knobs, not both",
                             fix="put every setting in the TrialConfig")  # fmt: skip
        _check_scenario(self.scenario, self.sla_ms)
        _check_accuracy(self.accuracy)

    @classmethod
    def of(
        cls, request: BenchRequest | None, config: TrialConfig | None, keywords: Mapping[str, Any]
    ) -> BenchRequest:
        """``request`` (or the defaults) with ``config`` and ``keywords`` over it: how :func:`bench` reads its call.

        Raises:
            TypeError: a keyword that is no field, naming the fields (as Python does for a bad keyword).
        """
        unknown = sorted(set(keywords) - {f.name for f in fields(cls)})
        if unknown:
            raise TypeError(f"bench got unknown keyword(s) {', '.join(unknown)}; "
                            f"it takes: {', '.join(f.name for f in fields(cls))}")  # fmt: skip
        given = {**keywords, **({"config": config} if config is not None else {})}
        return replace(request, **given) if request is not None else cls(**given)

    def trial_config(self, default_engine: str = registry.BASELINE_ENGINE) -> TrialConfig:
        """The config to measure: ``config``, else one from engine/precision/batch/threads/knobs and their
        defaults (``default_engine``: the engine that reads the model, ONNX Runtime for ONNX)."""
        if self.config is not None:
            return self.config
        return TrialConfig(self.engine or default_engine, self.precision or "fp32", self.batch or 1,
                           self.threads, self.knobs or {})  # fmt: skip

    def given(self) -> dict[str, Any]:
        """The fields set away from their defaults, but for where it runs and reports: what the recorded call repeats."""
        unrecorded = ("db", "cache", "progress", "command")
        return {f.name: getattr(self, f.name) for f in fields(self)
                if f.name not in unrecorded and getattr(self, f.name) != f.default}  # fmt: skip


def bench(
    model: str | Path,
    config: TrialConfig | None = None,
    *,
    request: BenchRequest | None = None,
    **keywords: Any,
) -> StoredTrial:
    """Measure one config of ``model`` on this device in an isolated worker, and store it.

    ``autodeploy.bench("zoo:tiny-cnn", engine="openvino", threads=1, db="sqlite:///r.db")``

    Args:
        model: an ``.onnx`` path or ``zoo:NAME`` (or a ``.tflite``, or an OpenVINO IR ``.xml`` with its ``.bin``
            beside it: run as given on the engine that reads it).
        config: the config to measure (or give ``engine``, ``precision``, ... as keywords).
        request: the settings as one :class:`BenchRequest`.
        **keywords: :class:`BenchRequest`'s fields (``engine``, ``shapes``, ``data``, ``timing``, ``db``, ...),
            over ``request``'s; see it for what each means.

    Returns:
        The stored trial: its id in the store and its result (failed trials included).

    Raises:
        TypeError: a keyword that is no :class:`BenchRequest` field.
        UsageError: unknown engine, precision or knob, a shape that does not fit, or several shapes.
        ModelError, DataError, StoreError: the model, the data or the database is unusable.
    """
    request = BenchRequest.of(request, config, keywords)
    shapes = request.shapes
    shape_set = ShapeSet.of(shapes) if isinstance(shapes, ShapeSet) else ShapeSet.single(shapes)
    if shape_set.several:
        raise UsageError(f"bench measures one shape; {len(shape_set.cases)} were given",
                         fix="call autodeploy.bench_shapes to measure each of several shapes")  # fmt: skip
    command = request.command or _python_call("bench", model, **request.given())
    return bench_shapes(model, request=replace(request, shapes=shape_set, command=command))[0]


def bench_shapes(
    model: str | Path,
    config: TrialConfig | None = None,
    *,
    request: BenchRequest | None = None,
    **keywords: Any,
) -> list[StoredTrial]:
    """:func:`bench` at each case of a shape set: one trial per shape, each compiled for its shape and stored with it.

    ``shapes`` (a :class:`~autodeploy.shapes.ShapeSet` or a study config's ``shapes`` mapping) gives
    the set; the arguments are :func:`bench`'s. ``data`` is one source for every shape (images are
    resized to each shape; arrays must fit each) or a list of sources, one per case in the set's
    order (arrays of each shape). Every shape is checked against the model before the first worker starts.

    Returns:
        One stored trial per case, in the set's order.
    """
    request = BenchRequest.of(request, config, keywords)
    report = request.progress or _silent
    shape_set = ShapeSet.of(request.shapes)
    command = request.command or _python_call("bench_shapes", model,
                                              **{**request.given(), "shapes": shape_set.to_config()})  # fmt: skip
    cache = request.cache or cache_dir()
    _check_metric(request.metric, request.max_metric_drop)  # a bad --metric fails now, in one line
    # 1. resolve the model (a zoo model is built on first use), then fix it at each shape
    resolved = resolve_model(model, None, cache_dir=cache, progress=report)
    # the baseline engine by default: ONNX Runtime, or the one engine that reads a .tflite or an IR
    trial_config = request.trial_config(registry.baseline_config(resolved.info.format).engine)
    label = trial_config.label()
    sources = loaded = _data_per_case(request.data, shape_set)
    if len(sources) > len(shape_set.cases):  # several sources, no --shape: each one's arrays fix a shape
        shape_set, loaded = _shapes_of_data(resolved, request.batch_axes, sources, request.preprocess)
    cases = [_with_data(resolved, request.batch_axes, source, case, shape_set, request.preprocess)
             for source, case in zip(loaded, shape_set.cases, strict=True)]  # fmt: skip
    # 2. probe the device and check the config runs here, at every shape, before any work
    device = probe_device()
    for info, _ in cases:
        _check_runs_here(device, info, trial_config, request.accuracy)
    settings = _bench_settings(request, cache)
    # 3. open the store before measuring: a bad database fails in a second, not after a run
    stored = []
    with _store(request.db) as store:
        for case, source, (info, dataset) in zip(shape_set.cases, sources, cases, strict=True):
            at = f" at {case.key()}" if case.shapes and shape_set.several else ""
            # 4. prepare the data (each shape has its own inputs and reference)
            report(f"preparing data{at}")
            prepared = _prepare_data(resolved, info, settings, dataset, request.pins)
            # 5. run the trial in a fresh worker
            report(f"{label}{at}: starting worker")
            result = run_trial(info, trial_config, prepared, settings,
                               progress=lambda phase, at=at: report(f"{label}{at}: {phase}"),
                               scenario=request.scenario, sla_ms=request.sla_ms,
                               measured=store.artifact_files_measured)  # fmt: skip
            # 6. store it, with its shape
            fed = inputs_record(source, request.preprocess, _zoo_inputs(resolved))
            trial_id = _add_trial(store, result, info, device, command, case.key(), fed)
            stored.append(StoredTrial(trial_id, result, info, device, case.key()))
    return stored


def _check_runs_here(
    device: DeviceInfo, info: ModelInfo, config: TrialConfig, accuracy: Sequence[str]
) -> None:
    """The engine, precision and knobs exist here, every dynamic dim is fixed, and ``--accuracy`` names real outputs."""
    registry.get(config.engine).check(device, info, config)  # unknown engine/precision/knob
    for name in info.input_names:  # dynamic dims left unfixed: fail with the --shape fix now
        info.input_shape(name, config.batch)
    unknown = sorted({verdict.parse_override(t)[0] for t in accuracy} - set(info.output_names))
    if unknown:
        raise UsageError(f"--accuracy names output(s) {unknown} the model does not have",
                         fix=f"name one of its outputs: {', '.join(info.output_names)}")  # fmt: skip


def _bench_settings(request: BenchRequest, cache: Path) -> HarnessSettings:
    """How a bench trial runs: its timing, time limits, memory cap and accuracy budget."""
    drop = request.max_accuracy_drop
    return HarnessSettings(workdir=cache / "work", policy=request.timing or TimingPolicy(), timeout_s=request.timeout_s,
                           build_timeout_s=request.build_timeout_s, metric=request.metric,
                           max_metric_drop=request.max_metric_drop, max_accuracy_drop=drop,
                           min_cosine=verdict.cosine_for_drop(drop), accuracy_overrides=tuple(request.accuracy),
                           **({"memory_cap_mb": request.memory_cap_mb} if request.memory_cap_mb else {}))  # fmt: skip


def _check_scenario(scenario: str, sla_ms: float | None) -> None:
    from autodeploy.harness.scenarios import SCENARIOS

    if scenario not in SCENARIOS:
        raise UsageError(f"unknown scenario {scenario!r}", fix=f"choose one of {', '.join(SCENARIOS)}")
    if scenario == "server" and sla_ms is None:
        raise UsageError("the server scenario needs a p99 bound", fix="pass --sla-ms, e.g. --sla-ms 10")
    if sla_ms is not None and not (0 < sla_ms < math.inf):  # nan too: stored as an ok trial at rate 0
        raise UsageError(f"--sla-ms must be a finite number > 0, got {sla_ms:g}", fix="pass a positive p99 bound in ms")


# -- tune ----------------------------------------------------------------------------------


def tune(
    model: str | Path | None = None,
    *,
    config: str | Path | Mapping[str, Any] | None = None,
    name: str | None = None,
    objective: str | None = None,
    engines: Sequence[str] | None = None,
    precisions: Sequence[str] | None = None,
    batches: Sequence[int] | None = None,
    threads: Sequence[int] | None = None,
    knobs: Mapping[str, Mapping[str, Sequence[Any]]] | None = None,
    trials: int | None = None,
    timeout_s: float | None = None,
    build_timeout_s: float | None = None,
    screening_time_s: float | None = None,
    time_budget: str | float | None = None,
    sampler: str | None = None,
    seed: int | None = None,
    fresh: bool = False,
    resume: bool = False,
    max_accuracy_drop: float | None = None,
    max_memory_mb: float | None = None,
    sla_ms: float | None = None,
    finalists: int | None = None,
    rounds: int | None = None,
    min_samples: int | None = None,
    min_duration_s: float | None = None,
    shapes: Shapes | ShapeSet | Mapping[str, Any] | None = None,
    per_shape: bool | None = None,
    data: str | Path | None = None,
    preprocess: Preprocess | None = None,
    metric: str | None = None,
    max_metric_drop: float | None = None,
    db: str | Store | None = None,
    storage: str | None = None,
    cache: Path | None = None,
    reporter: Reporter | None = None,
    command: str | None = None,
) -> StudySummary:
    """Search the fastest config of ``model`` on this device, re-measure the finalists, pick the winner.

    Arguments override the study config (``config``), which overrides the defaults; the keys are
    :class:`~autodeploy.search.config.StudyConfig`'s (``finalists.count`` is ``finalists``,
    ``finalists.rounds`` is ``rounds``, ``screening.min_samples`` is ``min_samples``, …).

    Args:
        model: an ``.onnx`` path or ``zoo:NAME`` (or ``model`` in ``config``).
        config: a YAML study config file (or the name of an example in ``autodeploy/configs/``), or the same keys as a mapping.
        name: the study's name (default ``MODEL-OBJECTIVE-FINGERPRINT``).
        objective: ``latency``, ``throughput``, ``server`` (needs ``sla_ms``) or ``pareto``.
        engines, precisions, batches, threads, knobs: the search space (default: all available here).
        trials: trials this run adds (default 30; the whole grid for ``sampler="grid"``; with
            ``time_budget`` alone, as many as the space has configs).
        timeout_s, build_timeout_s: seconds before a worker running the model / building an artifact is
            killed, as for :func:`bench` (``screening.timeout_s``, ``screening.build_timeout_s``).
        screening_time_s: start no new screening trial after this many seconds (the finalists still run).
        time_budget: wall time of this run, finalists included: seconds, or ``"90s"``, ``"10m"``,
            ``"1h30m"``. The summary is the best found in it, with the confidence reached
            (``confidence``); every trial is kept for ``resume``.
        shapes: per input one shape, several (``{"x": [(1, 3, 48, 320), (1, 3, 48, 640)]}``), a weighted mix
            (``{"x": [{"shape": "1x3x48x320", "weight": 3}, ...]}``) or a :class:`~autodeploy.shapes.ShapeSet`:
            every config is measured at each shape and judged by the mix (:func:`tune_per_shape`: one study per shape).
        per_shape: the config key ``per_shape`` (one study per shape); :func:`tune` refuses it with several shapes
            and names :func:`tune_per_shape`, which honours it.
        fresh: re-measure configs already in the store.
        resume: add trials to the existing study of this name, within its stored search space.
        finalists: how many of the best are re-measured interleaved (0: none).
        data, preprocess, metric, max_metric_drop: as for :func:`bench` (``data`` and ``preprocess`` are
            also the config's ``data`` and ``preprocess`` keys, ``metric`` its ``metric``, the drop
            ``constraints.max_metric_drop``).
        db: a results database URL or an open :class:`~autodeploy.results_db.store.Store` (left open).
        storage: the Optuna storage URL shared by workers (default: the results database).
        cache: the cache folder (default :func:`cache_dir`).
        reporter: progress hooks (:class:`~autodeploy.search.study.Reporter`); default silent.
        command: what to record as the command that reproduces the study (default: this call).

    Returns:
        The study's summary: trial counts, finalists and the winner (``None`` when no config meets
        the constraints; ``note`` says why).

    Raises:
        UsageError: no model, an invalid config, a study that exists (without ``resume``) or was
            made with another search space or objective, a ``time_budget`` too small to measure
            even the baseline (the message says how long that takes here).
        ModelError, DataError, StoreError: the model, the data or the database is unusable.
    """
    from autodeploy.search.study import Reporter, StudyCase, StudyContext, run_study

    if model is None and config is None:
        raise UsageError(
            "no model given", fix="pass a model (an .onnx path or zoo:NAME), or `model` in the config"
        )
    reporter = reporter or Reporter()
    if time_budget is not None:
        from autodeploy.search.budget import parse_duration

        time_budget = parse_duration(time_budget)
    arguments = {"model": model, "name": name, "objective": objective, "engines": engines, "precisions": precisions,
                 "batches": batches, "threads": threads, "knobs": knobs, "trials": trials, "timeout_s": timeout_s,
                 "build_timeout_s": build_timeout_s, "screening_time_s": screening_time_s,
                 "time_budget_s": time_budget, "sampler": sampler, "seed": seed, "fresh": fresh or None, "resume": resume or None,
                 "max_accuracy_drop": max_accuracy_drop, "max_memory_mb": max_memory_mb, "sla_ms": sla_ms,
                 "finalists": finalists, "rounds": rounds, "min_samples": min_samples,
                 "min_duration_s": min_duration_s, "shapes": shapes, "per_shape": per_shape, "data": data,
                 "preprocess": preprocess.to_dict() if preprocess is not None else None, "metric": metric,
                 "max_metric_drop": max_metric_drop}  # fmt: skip
    given = {k: v for k, v in arguments.items() if k != "model"}
    command = command or _python_call("tune", model, config=config, **given)
    overrides = _study_overrides(arguments)
    # 1. the config as asked: the YAML read once, the arguments over it
    keys = dict(config) if isinstance(config, Mapping) else study_config.read(config)
    cfg = study_config.validate(keys, overrides)
    _check_metric(cfg.metric, cfg.constraints.max_metric_drop)
    with _store(db) as store:
        # 2. probe the device; name the study
        device = probe_device()
        study_name = study_config.check_study_name(
            cfg.name or default_study_name(display_name(cfg.model), cfg.objective, device.fingerprint)
        )
        # 3. on resume, the study's stored search space goes under the config and the arguments
        stored = store.get_study(study_name) if resume else None
        if stored is not None:
            cfg = study_config.validate(
                keys, overrides, base={**stored.settings, "trials": None, "fresh": False, "time_budget_s": None}
            )
        if cfg.per_shape and cfg.shape_set().several:
            raise UsageError("this study config asks for one study per shape (per_shape: true)",
                             fix="call autodeploy.tune_per_shape, or drop per_shape for one config weighted by the mix")  # fmt: skip
        # 4. resolve the model; it is fixed at each of the config's shapes below
        cache = cache or cache_dir()
        resolved = resolve_model(cfg.model, None, cache_dir=cache, progress=reporter.phase)
        # 5. screening settings; the harness labels a trial "inaccurate" by the study's own budget
        settings = _screening_settings(cfg, cache / "work")
        # 6. prepare the data per shape (arrays of a concrete shape fix the dims `shapes` left open)
        reporter.phase("preparing data")
        shape_set = cfg.shape_set()
        cases, synthetic, note = [], False, None
        for case in shape_set.cases:
            info, dataset = _with_data(resolved, None, cfg.data, case, shape_set, _preprocess_of(cfg))
            prepared = _prepare_data(resolved, info, settings, dataset)
            synthetic = synthetic or prepared.synthetic
            note = note or prepared.note
            cases.append(StudyCase(case.key(), case.weight, info, prepared))
        # 7. run the study: screening, finalists, winner; every trial stored with its shape
        storage = storage or store.engine.url.render_as_string(hide_password=False)
        ctx = StudyContext(cfg, study_name, cases[0].model, device, cases[0].data, settings, store, storage,
                           command, resume, tuple(cases) if shape_set.several else ())  # fmt: skip
        summary = run_study(ctx, reporter)
        return replace(summary, inputs=note or SYNTHETIC_NOTE) if synthetic else summary


def tune_per_shape(model: str | Path | None = None, *, config: str | Path | Mapping[str, Any] | None = None,
                   shapes: Shapes | ShapeSet | Mapping[str, Any] | None = None, name: str | None = None,
                   command: str | None = None, **kwargs: Any) -> list[StudySummary]:  # fmt: skip
    """:func:`tune` once per shape of the shape set: one study (and winner) per shape, named
    ``NAME@SHAPE``. The arguments are :func:`tune`'s; ``shapes`` (or the config's) gives the set.

    Returns:
        One summary per shape, in the set's order.
    """
    keys = dict(config) if isinstance(config, Mapping) else study_config.read(config)
    keys.pop("per_shape", None)
    shape_set = ShapeSet.of(shapes if shapes is not None else keys.get("shapes"))
    command = command or _python_call("tune_per_shape", model, config=config, shapes=shape_set.to_config(),
                                      name=name, **kwargs)  # fmt: skip
    base = name or keys.get("name")
    summaries = []
    for case in shape_set.cases:
        study = f"{base}@{case.key()}" if base else None
        if study is None:
            device = probe_device()
            ref = model if model is not None else keys.get("model")
            study = default_study_name(f"{display_name(str(ref))}@{case.key()}",
                                       kwargs.get("objective") or keys.get("objective") or "latency", device.fingerprint)  # fmt: skip
        summaries.append(tune(model, config={**keys, "shapes": ShapeSet((case,)).to_config()}, name=study,
                              command=command, **kwargs))  # fmt: skip
    return summaries


def default_study_name(model: str, objective: str, fingerprint: str) -> str:
    """``MODEL-OBJECTIVE-FINGERPRINT``, the model name reduced to letters, digits and ``_.-``."""
    model = re.sub(r"\.{2,}", ".", re.sub(r"[^A-Za-z0-9_.-]+", "-", model)).strip("-.")[:120]
    return f"{model}-{objective}-{fingerprint[:8]}"


# -- export --------------------------------------------------------------------------------


def export(
    study: str | StudySummary | None = None,
    output: str | Path | None = None,
    *,
    trial: int | None = None,
    source: Source | None = None,
    tar: bool = False,
    format: str = "bundle",
    model_name: str | None = None,
    db: str | Store | None = None,
    command: str | None = None,
    sign_key: str | Path | None = None,
) -> Path:
    """Ship a study's winner (or one stored trial) as a bundle or a Triton model repository, atomically.

    Args:
        study: the study (its name, or the summary :func:`tune` returned) whose winner to ship.
        output: the destination folder (or ``.tar.gz`` with ``tar``); it must not exist.
        trial: ship this stored trial instead (e.g. ``bench(...).id``).
        source: ship what :func:`find_source` found instead.
        tar: write one ``.tar.gz`` (the suffix is added when missing).
        format: ``bundle`` (load it with ``autodeploy.bundle.load``) or ``triton``.
        model_name: the Triton model name (default: from the model name).
        db: a results database URL or an open store (default ``$AUTODEPLOY_DB`` or the user SQLite file).
        command: what to record as the command that made the export (default: this call).
        sign_key: a PEM elliptic-curve private key: sign the bundle (OpenSSF model-signing) so that
            ``autodeploy.bundle.load(path, trust=PUBLIC_KEY)`` can check who made it.

    Returns:
        The path written: the bundle folder, the repository folder or the ``.tar.gz``.

    Raises:
        UsageError: no or several things to ship, no output, an unknown format or study.
        BundleError: the study has no winner, or the trial cannot be shipped (it failed).
    """
    from autodeploy.bundle import export as exporter
    from autodeploy.bundle import triton

    if sum(x is not None for x in (study, trial, source)) != 1:
        raise UsageError("give a study, a trial id or a source (one of them)",
                         fix="autodeploy.export('STUDY', 'ship') or autodeploy.export(trial=ID, output='ship')")  # fmt: skip
    if output is None:
        raise UsageError("no destination given", fix="pass output, a folder (or FILE.tar.gz with tar=True)")
    if format not in FORMATS:
        raise UsageError(f"unknown format {format!r}", fix=f"choose one of {', '.join(FORMATS)}")
    if sign_key is not None and format != "bundle":
        raise UsageError("only bundles are signed", fix="drop sign_key, or export format='bundle'")
    command = command or _python_call("export", study, output=output, trial=trial, tar=tar,
                                      format=None if format == "bundle" else format, model_name=model_name)  # fmt: skip
    # 1. what to ship: the study's winner or one stored trial, as stored
    source = source or find_source(study, trial=trial, db=db)
    # 2. where: a tar.gz keeps its suffix
    output = Path(output)
    if tar and not output.name.endswith((".tar.gz", ".tgz")):
        output = output.with_name(output.name + ".tar.gz")
    # 3. write it, atomically
    if format == "triton":
        path = triton.write_repository(source, output, tar=tar, model_name=model_name, command=command)
    else:
        path = exporter.write_bundle(source, output, tar=tar, command=command, sign_key=sign_key)
    # 4. remember it: `autodeploy bundle verify --db` can then name the trial a bundle came from
    with _store(db) as store:
        store.add_export(source.trial.id, manifest_sha256=exporter.manifest_digest(path), format=format,
                         destination=str(path.resolve()), signed=sign_key is not None, command=command)  # fmt: skip
    return path


def find_source(
    study: str | StudySummary | None = None, *, trial: int | None = None, db: str | Store | None = None
) -> Source:
    """What :func:`export` ships: the winning trial of ``study``, or the stored ``trial``.

    Raises:
        UsageError: neither or both given, or no such study or trial.
        BundleError: the study has no winner, or the trial cannot be shipped (it failed).
    """
    from autodeploy.bundle import export as exporter

    if (study is None) == (trial is None):
        raise UsageError(
            "give a study or a trial id (one of them)", fix="find_source('STUDY') or find_source(trial=ID)"
        )
    with _store(db, readonly=True) as store:
        if trial is not None:
            return exporter.stored_trial(store, trial)
        return exporter.study_winner(store, study if isinstance(study, str) else study.name)


# -- gate ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class GateRun:
    """What :func:`gate` returns: the verdict (``result.exit_code`` is the CI's exit status), and
    where it was stored (``id`` and ``db``: ``None`` when not stored)."""

    result: GateResult
    id: int | None = None
    db: str | None = None

    @property
    def exit_code(self) -> int:
        return self.result.exit_code


def gate(
    baseline: str | Path,
    candidate: str | Path,
    *,
    max_regression: float = 0.05,
    max_accuracy_drop: float = DEFAULT_MAX_ACCURACY_DROP,
    rounds: int = 16,
    min_samples: int = MIN_ROUNDS,
    alpha: float = ALPHA,
    metrics: Sequence[str] = (),
    against_db: bool = False,
    engine: str = registry.BASELINE_ENGINE,
    precision: str = "fp32",
    batch: int = 1,
    threads: int = 1,
    shapes: Shapes | None = None,
    data: str | Path | Dataset | None = None,
    preprocess: Preprocess | None = None,
    reference_model: str | Path | None = None,
    calls: int = 100,
    duration_s: float = 0.1,
    timeout_s: float = 300.0,
    store: bool = True,
    db: str | Store | None = None,
    seed: int = 0,
    cache: Path | None = None,
    progress: Progress | None = None,
    command: str | None = None,
) -> GateRun:
    """Gate ``candidate`` against ``baseline``: interleaved A/B worker runs on this machine, a statistical verdict.

    Args:
        baseline, candidate: an ``.onnx`` path, ``zoo:NAME``, or a bundle folder or ``.tar.gz``.
        max_regression: the largest tolerated latency increase, relative (0.05: 5%).
        max_accuracy_drop: the largest tolerated accuracy drop, absolute on a 0..1 score.
        rounds: worker runs per side, interleaved A B, B A, ...
        min_samples: fewer runs per side than this is inconclusive (at least 2: a rank test needs two).
        alpha: the significance level for the whole family of metrics.
        metrics: latency metrics per run (``autodeploy.gate.core.LATENCY_METRICS``; default p10 and median).
        against_db: compare the candidate with the stored trials of the baseline's model and config on
            this device; the baseline is not run (weaker: drift between then and now is not cancelled).
        engine, precision, batch, threads: the config of model arms (bundles use their own).
        shapes, data, preprocess: as for :func:`bench`, for model arms.
        reference_model: the source ONNX model of a bundle arm, for its accuracy reference.
        calls, duration_s: timed calls and seconds per run, at least.
        timeout_s: seconds before a worker is killed.
        store: store the gate run (for the dashboard); ``db`` is opened also for ``against_db``.
        seed: the seed of synthetic inputs and of the bootstrap.
        progress: told each phase (``"baseline round 3/16"``).
        command: what to record as the command that reproduces it (default: this call).

    Raises:
        UsageError, ModelError, DataError, UnsupportedConfigError, BundleError: the input is wrong
            (the CLI's exit 64).
        AutodeployError: anything else that stopped the gate: an engine, the reference, the store (exit 70).
    """
    from autodeploy.gate.core import DEFAULT_METRICS, LATENCY_METRICS, GateSettings, run_gate
    from autodeploy.gate.stats import Criteria
    from autodeploy.results_db.store import DeviceRecord

    report = progress or _silent
    metrics = tuple(metrics) or DEFAULT_METRICS
    unknown = [m for m in metrics if m not in LATENCY_METRICS]
    if unknown:
        raise UsageError(f"unknown --metric {', '.join(unknown)}", fix=f"choose from {', '.join(LATENCY_METRICS)}")  # fmt: skip
    if min_samples < 2:
        raise UsageError("--min-samples must be >= 2: a rank test needs two runs per side", fix="--min-samples 2")  # fmt: skip
    command = command or _python_call("gate", str(baseline), str(candidate), engine=engine, precision=precision,
                                      batch=batch, threads=threads, against_db=against_db)  # fmt: skip
    # 1. what is judged and how: the criteria, the rounds, the timing of each worker run
    criteria = Criteria(max_regression=max_regression, max_accuracy_drop=max_accuracy_drop, alpha=alpha,
                        min_rounds=min_samples, seed=seed)  # fmt: skip
    settings = GateSettings(rounds=rounds, metrics=metrics, criteria=criteria, against_db=against_db)
    policy = TimingPolicy(warmup_min_calls=10, warmup_max_s=2.0, min_samples=calls, min_duration_s=duration_s,
                          max_duration_s=max(30.0, 4 * duration_s))  # fmt: skip
    cache = cache or cache_dir()
    harness = HarnessSettings(workdir=cache / "work", policy=policy, timeout_s=timeout_s, seed=seed)
    config = TrialConfig(engine=engine, precision=precision, batch=batch, threads=threads)
    device = probe_device()
    with ExitStack() as stack:
        # 2. the store first: a bad database fails in a second, not after the rounds
        opened = stack.enter_context(_store(db)) if store or against_db else None
        # 3. both arms, each checked to run here before any worker starts
        arms = _gate_arms((str(baseline), str(candidate)), config, harness, shapes=shapes, data=data,
                          preprocess=preprocess, reference_model=reference_model, cache=cache, progress=report,
                          stack=stack)  # fmt: skip
        for arm in arms:
            if arm.kind == "model":
                registry.get(arm.config.engine).check(device, arm.model, arm.config)
                arm.model.input_shape(arm.model.inputs[0].name, arm.config.batch)
        # 4. measure and judge
        report("starting")
        result = run_gate(*arms, settings, harness, device=device, store=opened, progress=report)
        # 5. store it for the dashboard
        if opened is None or not store:
            return GateRun(result)
        gate_id = opened.add_gate_run(result.to_record(), device=DeviceRecord.of(device), command=command)
        return GateRun(result, gate_id, opened.url)


def _gate_arms(refs: tuple[str, str], config: TrialConfig, harness: HarnessSettings, *, shapes: Shapes | None,
               data: str | Path | Dataset | None, preprocess: Preprocess | None,
               reference_model: str | Path | None, cache: Path, progress: Progress, stack: ExitStack,
               ) -> list[Arm]:  # fmt: skip
    """The baseline and candidate arms. Model arms first: a bundle arm's accuracy reference is the
    other arm's model when that is the bundle's source model (``--baseline model.onnx --candidate BUNDLE``)."""
    from autodeploy import bundle
    from autodeploy.gate.measure import bundle_arm, model_arm
    from autodeploy.model import load_model

    fixed = {k: tuple(v) for k, v in (shapes or {}).items()}
    roles = dict(zip(("baseline", "candidate"), refs, strict=True))
    models = {}
    for role, ref in roles.items():
        if not (Path(ref).is_dir() or ref.endswith((".tar.gz", ".tgz"))):  # a bundle folder or archive
            resolved = resolve_model(ref, fixed, cache_dir=cache, progress=progress)
            inputs = choose_inputs(resolved.info, load_source(data, resolved.info, preprocess), resolved,
                                   items=harness.calibration_items + harness.evaluation_items, seed=harness.seed)  # fmt: skip
            models[role] = model_arm(role, ref, resolved.info, config, data=inputs.data,
                                     calibration=inputs.calibration)  # fmt: skip
    arms = []
    for role, ref in roles.items():
        if role in models:
            arms.append(models[role])
            continue
        root = stack.enter_context(bundle.opened(Path(ref)))
        reference = load_model(reference_model, fixed) if reference_model else None
        others = [arm.model for arm in models.values()]
        arms.append(bundle_arm(role, ref, root, reference_model=reference, others=others))
    return arms


# -- bundle run ----------------------------------------------------------------------------


@dataclass(frozen=True)
class BundleRun:
    """A bundle timed on this machine (:func:`run_bundle`), beside what its manifest recorded."""

    manifest: dict[str, Any]
    device: DeviceInfo  # this machine
    stats: LatencyStats  # per call, here
    warmup_calls: int
    throughput: float  # items/s, here
    load: Load | None  # how busy this machine was while it was timed
    warnings: tuple[str, ...]  # the loader's (another engine version, another device)

    @property
    def same_device(self) -> bool:
        return self.device.fingerprint == self.manifest["device"]["fingerprint"]


def run_bundle(
    path: str | Path,
    *,
    data: str | Path | Dataset | None = None,
    preprocess: Preprocess | None = None,
    timing: TimingPolicy | None = None,
    allow_other_version: bool = False,
    trust: str | Path | None = None,
    quiet: Callable[[], AbstractContextManager[None]] = nullcontext,
    progress: Progress | None = None,
) -> BundleRun:
    """Load the bundle at ``path`` (a folder or ``.tar.gz``; verified first), time it here, in this process.

    Args:
        data: inputs as for :func:`bench` (default synthetic); images are preprocessed as the bundle was
            measured (its manifest's ``inputs``) unless ``preprocess`` is given.
        timing: warm-up and sample counts (default: 64 samples and 2 s at least, 60 s at most).
        allow_other_version: run under another engine version than benchmarked (the result warns).
        trust: a PEM public key: the bundle's signature must verify with it.
        quiet: wraps loading the engine and its first call (the CLI hides the engines' native log lines).
        progress: told each phase.

    Raises:
        BundleError: a file is missing or changed, the signature does not verify, or it cannot run here.
        DataError: the data does not fit the bundle's model.
    """
    from autodeploy.bundle import loader, opened
    from autodeploy.harness.stats import summarize
    from autodeploy.harness.timing import time_calls

    report = progress or _silent
    with opened(path) as root:
        # 1. verify and open it
        with quiet():
            predictor = loader.load(root, allow_other_version=allow_other_version, trust=trust)
        with predictor:
            # 2. one batch of inputs, as it was measured
            manifest = predictor.manifest
            feeds = _bundle_feeds(manifest, root, data, preprocess)
            with quiet():  # some engines (LiteRT) create their delegates on the first call
                predictor.run(feeds)
            # 3. time it
            report(f"timing {path} ({len(next(iter(feeds.values())))} items per call)")
            timed = time_calls(lambda: predictor.run(feeds), timing or TimingPolicy())
    batch = manifest["settings"]["batch"]
    throughput = batch * len(timed.samples_ns) / (timed.samples_ns.sum() / 1e9)
    return BundleRun(manifest, probe_device(), summarize(timed.samples_ns), timed.warmup_calls, throughput,
                     timed.load, tuple(predictor.warnings))  # fmt: skip


def _bundle_feeds(manifest: dict[str, Any], root: Path, data: str | Path | Dataset | None,
                  preprocess: Preprocess | None) -> dict[str, Any]:  # fmt: skip
    """One batch at the bundle's batch size: the user's first items (images preprocessed by ``preprocess``,
    else as the bundle was measured), or synthetic ones."""
    from autodeploy import images

    model, shapes = manifest["model"], manifest.get("shapes") or {}
    info = ModelInfo.from_dict({**model, "path": str(root), "opset": 0, "external_files": [],
                                "batch_axes": shapes.get("batch_axes") or {}})  # fmt: skip
    measured = (manifest.get("inputs") or {}).get("preprocess")
    if preprocess is None and measured and data is not None and not isinstance(data, Dataset):
        is_images = str(data) == images.SAMPLE_IMAGES or images.is_image_folder(Path(data))
        preprocess = Preprocess.from_dict(measured) if is_images else None
    batch = manifest["settings"]["batch"]
    inputs = choose_inputs(info, load_source(data, info, preprocess), items=batch)
    return inputs.data.batches(batch, {s.name: info.batch_axis(s.name) for s in info.inputs})[0]


# -- inhouse quantize ----------------------------------------------------------------------


@dataclass(frozen=True)
class Quantized:
    """What :func:`quantize` wrote and did: the QDQ model, the graph passes' report, the quantizer's."""

    path: Path
    passes: PipelineReport
    quantization: QuantReport


def quantize(
    model: str | Path,
    output: str | Path,
    *,
    calibration: str = "percentile",
    symmetric: bool = False,
    fallback: bool = True,
    reduce_range: bool = False,
    budget: float = DEFAULT_MAX_ACCURACY_DROP,
    bias_correction: bool = True,
    data: str | Path | Dataset | None = None,
    preprocess: Preprocess | None = None,
    items: int = 64,
    timeout_s: float = 1800.0,
    memory_cap_mb: int | None = None,
    cache: Path | None = None,
    progress: Progress | None = None,
) -> Quantized:
    """Optimize ``model`` with the graph passes, then quantize it to QDQ INT8 (the in-house engine's
    build chain), in a worker under a timeout and memory cap; write it to ``output``.

    Args:
        calibration: ``minmax``, ``percentile`` or ``entropy``.
        symmetric: symmetric int8 activations.
        fallback: keep sensitive layers in float to meet ``budget`` on the calibration data.
        reduce_range: 7-bit weights (for ONNX Runtime on x86 CPUs without VNNI).
        budget: the accuracy budget per output, judged as :func:`bench` judges each output.
        bias_correction: subtract each Conv/Gemm's mean int8 output shift from its bias.
        data, preprocess: the calibration data as for :func:`bench` (default: the zoo model's own
            calibration split, else ``items`` synthetic items).
        timeout_s, memory_cap_mb: bounds of the worker (as ``build_timeout_s``; default cap 75% of RAM).
        progress: told each phase of the worker (optimizing, calibrating, quantizing).

    Raises:
        BuildError: the worker failed, ran out of time or memory; nothing was written.
        ModelError, DataError, UsageError: the model, the data or a setting is unusable.
    """
    from autodeploy.harness.run import quantize_in_worker
    from autodeploy.inhouse.quantize import QuantConfig

    report = progress or _silent
    # 1. the model and what calibrates it: the user's data, else the zoo model's own, else synthetic
    resolved = resolve_model(model, None, cache_dir=cache or cache_dir(), progress=report)
    given = load_source(data, resolved.info, preprocess)
    inputs = choose_inputs(resolved.info, given, resolved, items=items, seed=1)
    # 2. the passes, then the quantizer, in a worker; the model is written only when it succeeded
    config = QuantConfig(calibration=calibration, activation_symmetric=symmetric, reduce_range=reduce_range,
                         max_accuracy_drop=budget if fallback else None, bias_correction=bias_correction)  # fmt: skip
    output = Path(output)
    passes, quantization = quantize_in_worker(resolved.info, inputs.for_calibration, config, output,
                                              timeout_s=timeout_s, memory_cap_mb=memory_cap_mb, progress=report)  # fmt: skip
    return Quantized(output, passes, quantization)


# -- steps shared by the pipelines ----------------------------------------------------------


@contextmanager
def _store(db: str | Store | None, *, readonly: bool = False) -> Iterator[Store]:
    """The caller's open store (left open), or the one at URL ``db`` (closed afterwards)."""
    from autodeploy.results_db.store import Store

    if isinstance(db, Store):
        yield db
        return
    with Store.open(db, readonly=readonly) as store:
        yield store


def _with_data(resolved: ResolvedModel, batch_axes: Mapping[str, int | None] | None,
               data: str | Path | Dataset | None, case: ShapeCase | None = None,
               shape_set: ShapeSet | None = None, preprocess: Preprocess | None = None,
               ) -> tuple[ModelInfo, Dataset | None]:  # fmt: skip
    """The model with the user's batch axes, fixed at ``case``'s shapes (its set's ranges kept
    when it has several) and the dims the user's data fixes, and that data (loaded, images
    preprocessed as ``preprocess`` says)."""
    info = resolved.info.with_batch_axes(batch_axes) if batch_axes else resolved.info
    if case is not None:
        info = info.at_shapes(case.shapes, shape_set.ranges() if shape_set and shape_set.several else None)
    try:
        dataset = load_source(data, info, preprocess)
    except DataError as exc:
        if data is None or case is None or shape_set is None or not shape_set.several:
            raise
        raise DataError(f"shape {case.key()} has no matching data: {exc.message}",
                        fix="give arrays of each shape (bench: one --data per --shape, in the same order), "
                            "or a folder of images or sample:images, resized to each shape") from None  # fmt: skip
    if dataset is None:
        return info, None
    return info.with_shapes(shapes_from_data(info, dataset)), dataset  # arrays of a concrete shape fix open dims


def _data_per_case(data: str | Path | Dataset | Sequence[str | Path | Dataset] | None,
                   shape_set: ShapeSet) -> list[str | Path | Dataset | None]:  # fmt: skip
    """One data source per case of the shape set: the one given for all, or the i-th for case i."""
    if data is None or isinstance(data, str | Path | Dataset):
        return [data] * len(shape_set.cases)
    sources = list(data)
    if len(sources) == 1:
        return sources * len(shape_set.cases)
    if len(sources) != len(shape_set.cases) and (shape_set.several or shape_set.cases[0].shapes):
        keys = ", ".join(c.key() or "(none)" for c in shape_set.cases)
        raise UsageError(f"{len(sources)} data sources for {len(shape_set.cases)} shapes ({keys})",
                         fix="give one --data for every shape, or one per --shape in the same order")  # fmt: skip
    return sources


def _shapes_of_data(resolved: ResolvedModel, batch_axes: Mapping[str, int | None] | None,
                    sources: Sequence[str | Path | Dataset | None], preprocess: Preprocess | None,
                    ) -> tuple[ShapeSet, list[str | Path | Dataset | None]]:  # fmt: skip
    """A shape set with one case per data source, each the shapes its arrays fix, and the loaded data."""
    info = resolved.info.with_batch_axes(batch_axes) if batch_axes else resolved.info
    loaded = [load_source(source, info, preprocess) for source in sources]
    shapes = [shapes_from_data(info, d) if d is not None else {} for d in loaded]
    if not all(shapes):
        raise UsageError(f"{len(sources)} data sources and no --shape, but the model's inputs "
                         f"{[s.name + s.shape_str() for s in info.inputs]} have no dynamic dims for data to fix",
                         fix="give one --data, or one --shape per --data")  # fmt: skip
    return ShapeSet(tuple(ShapeCase(s) for s in shapes)), list(loaded)


def _check_accuracy(accuracy: Sequence[str]) -> None:
    """Parse every ``--accuracy OUTPUT=MEASURE[:THRESHOLD]`` now, so a typo is one line before any work."""
    for text in accuracy:
        try:
            verdict.parse_override(text)
        except ValueError as exc:
            raise UsageError(str(exc), fix=f"measures: {', '.join(verdict.MEASURES)}") from None


def _check_metric(metric: str | None, max_metric_drop: float | None) -> None:
    """Import the user's metric now, so a wrong path is one line before any work (the worker imports it again)."""
    if metric is None:
        if max_metric_drop is not None:
            raise UsageError("--max-metric-drop was given without --metric", fix="add --metric MODULE:FUNCTION")
        return
    from autodeploy.harness.metric import load_metric

    load_metric(metric)


def _preprocess_of(cfg: StudyConfig) -> Preprocess | None:
    p = cfg.preprocess
    if p is None:
        return None
    return Preprocess(p.layout, p.reverse_input_channels, tuple(p.mean_values) if p.mean_values else None,
                      tuple(p.scale_values) if p.scale_values else None)  # fmt: skip


def _prepare_data(resolved: ResolvedModel, info: ModelInfo, settings: HarnessSettings, data: Dataset | None,
                  pins: Mapping[str, float] | None = None) -> PreparedData:  # fmt: skip
    """Save the inputs for the workers: the user's data, else the zoo model's own, else synthetic."""
    items = settings.calibration_items + settings.evaluation_items
    inputs = choose_inputs(info, data, resolved, items=items, seed=settings.seed, pins=pins)
    return prepare_data(info, settings, data=inputs.data, calibration=inputs.calibration,
                        made=inputs.synthetic)  # fmt: skip


def _screening_settings(cfg: StudyConfig, workdir: Path) -> HarnessSettings:
    """How screening trials run; the study's accuracy budget is also the harness's "inaccurate" line."""
    s, drop = cfg.screening, cfg.constraints.max_accuracy_drop
    policy = TimingPolicy(
        min_samples=s.min_samples, min_duration_s=s.min_duration_s, max_duration_s=s.max_duration_s
    )
    return HarnessSettings(workdir=workdir, policy=policy, timeout_s=s.timeout_s, build_timeout_s=s.build_timeout_s,
                           max_accuracy_drop=drop, metric=cfg.metric, max_metric_drop=cfg.constraints.max_metric_drop,
                           min_cosine=verdict.cosine_for_drop(drop))  # fmt: skip


def _study_overrides(arguments: Mapping[str, Any]) -> dict[str, Any]:
    """The arguments of :func:`tune` as study config keys (``None``: not given)."""
    renamed = {"max_accuracy_drop": "constraints.max_accuracy_drop", "max_memory_mb": "constraints.max_memory_mb",
               "sla_ms": "constraints.sla_ms", "finalists": "finalists.count", "rounds": "finalists.rounds",
               "min_samples": "screening.min_samples", "min_duration_s": "screening.min_duration_s",
               "max_metric_drop": "constraints.max_metric_drop", "timeout_s": "screening.timeout_s",
               "build_timeout_s": "screening.build_timeout_s"}  # fmt: skip
    overrides = {renamed.get(k, k): v for k, v in arguments.items() if k != "resume"}
    for key in ("engines", "precisions", "batches", "threads"):
        overrides[key] = list(overrides[key]) if overrides[key] is not None else None
    shapes = overrides["shapes"]  # none given ({}) keeps the config's
    if isinstance(shapes, ShapeSet):
        overrides["shapes"] = shapes.to_config() if shapes.cases[0].shapes else None
    else:
        overrides["shapes"] = {k: v if isinstance(v, str) else list(v) for k, v in shapes.items()} if shapes else None
    for key in ("model", "data"):  # paths are stored as text
        overrides[key] = str(overrides[key]) if overrides[key] is not None else None
    return overrides


def _add_trial(store: Store, result: TrialResult, info: ModelInfo, device: DeviceInfo, command: str,
               shape_key: str, inputs: Mapping[str, Any] | None = None) -> int:  # fmt: skip
    from autodeploy.results_db.records import DeviceRecord, ModelRecord

    return store.add_trial(result, model=ModelRecord.of(info), device=DeviceRecord.of(device), command=command,
                           shape_key=shape_key, shapes=info.measured_shapes(result.config.batch), inputs=inputs)  # fmt: skip


def _zoo_inputs(resolved: ResolvedModel) -> dict[str, Any] | None:
    """What a zoo model's own data is (its record for the store), ``None`` when it has none."""
    from autodeploy import zoo

    return zoo.own_inputs(resolved.info.name) if resolved.data is not None else None


def _silent(_: str) -> None:
    pass


def _python_call(function: str, *args: Any, **kwargs: Any) -> str:
    """How a call reads in Python, recorded as the command that reproduces it (the CLI records its argv)."""

    def show(value: Any) -> str:
        if isinstance(value, Path):
            return repr(str(value))
        if isinstance(value, Dataset):
            return f"<Dataset of {len(value)} items>"
        if isinstance(value, list | tuple) and value and not isinstance(value[0], int | float):
            return f"[{', '.join(show(v) for v in value)}]"  # several data sources, one per shape
        if hasattr(value, "name") and hasattr(value, "winner"):  # a StudySummary
            return repr(value.name)
        return repr(value)

    parts = [show(a) for a in args if a is not None]
    given = {k: v for k, v in kwargs.items() if v is not None and v is not False and v != {} and v != []}
    parts += [f"{k}={show(v)}" for k, v in given.items()]
    return f"autodeploy.{function}({', '.join(parts)})"
