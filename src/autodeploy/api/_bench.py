""":func:`bench` and :func:`bench_shapes`: one config measured in an isolated worker and stored
(:class:`BenchRequest` says what and how; :class:`StoredTrial` is what comes back).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autodeploy.accuracy.kinds import MEASURES, parse_override
from autodeploy.accuracy.records import DEFAULT_MAX_ACCURACY_DROP, cosine_for_drop
from autodeploy.adapters import registry
from autodeploy.adapters.base import TrialConfig
from autodeploy.api._common import (
    Progress,
    cache_dir,
    check_metric,
    open_store,
    peaks_of,
    prepare_inputs,
    python_call,
    pytorch_model,
    with_data,
)
from autodeploy.data import Dataset, shapes_from_data
from autodeploy.device import probe_device
from autodeploy.errors import ConversionError, EngineUnavailableError, UsageError
from autodeploy.harness.cold_start import DEFAULT_STARTS
from autodeploy.harness.result import CONVERSION_PREFIX, TrialResult, conversion_failed, headline
from autodeploy.harness.run import HarnessSettings, run_trial
from autodeploy.harness.timing import TimingPolicy
from autodeploy.images import Preprocess
from autodeploy.intake import ResolvedModel, inputs_record, load_source, resolve_model
from autodeploy.model import ModelInfo
from autodeploy.objectives import DEFAULT_SCENARIO, SCENARIOS, scenario_of
from autodeploy.results_db.records import StoredTrial, TrialFilter
from autodeploy.runtime.device import DeviceInfo
from autodeploy.search.reporter import default as default_reporter
from autodeploy.shapes import ShapeCase, ShapeSet

if TYPE_CHECKING:
    from autodeploy.results_db.store import Store


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
            ``autodeploy.accuracy.kinds.MEASURES``, e.g. ``scores=decision:0.3``); the others are judged by
            what they are (the producing node, the shape, the reference's values).
        timing: warm-up and sample counts (default: 64 samples and 2 s at least, 60 s at most).
        timeout_s: seconds before a worker that runs the model (the reference, the measurement) is killed.
        build_timeout_s: seconds before the worker that builds the artifact is killed.
        memory_cap_mb: the worker's memory cap (default: 75% of RAM).
        scenario: MLPerf LoadGen's ``single-stream`` (default), ``offline`` (items/s with the knob
            ``num_requests`` in flight, default the engine's optimum), ``multi-stream`` (latency with
            ``num_requests`` in flight) or ``server`` (highest Poisson rate whose p99 meets ``sla_ms``).
        sla_ms: the p99 bound of the ``server`` scenario (required there).
        cold_start: also time the start in fresh processes (``True``: :data:`~autodeploy.harness.cold_start.DEFAULT_STARTS`
            of each kind; a number: that many): from a new process to the first result, split into the load and
            the first inference, without the engine's compiled cache and from it (``Measurement.cold_start``).
        retry_conversion: convert again although this engine's conversion of this model failed before (same engine
            version, device, shapes and build knobs, a stored trial): by default such a bench fails at once, in one
            line naming that trial, as a study prunes every precision of it.
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
    scenario: str = DEFAULT_SCENARIO.name
    sla_ms: float | None = None
    cold_start: bool | int = False
    retry_conversion: bool = False
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
        if self.cold_start is not True and int(self.cold_start) < 0:
            raise UsageError(f"cold_start must be True, False or a number of starts >= 1, got {self.cold_start}",
                             fix=f"pass cold_start=True ({DEFAULT_STARTS} starts of each kind) or cold_start=N")  # fmt: skip

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

    def starts(self) -> int | None:
        """Fresh processes per kind of start to time the cold start in, ``None`` where not asked for."""
        return DEFAULT_STARTS if self.cold_start is True else (int(self.cold_start) or None)

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
    example_inputs: Any = None,
    dynamic_shapes: Any = None,
    batch_dim: int | None = 0,
    **keywords: Any,
) -> StoredTrial:
    """Measure one config of ``model`` on this device in an isolated worker, and store it.

    ``autodeploy.bench("zoo:tiny-cnn", engine="openvino", threads=1, db="sqlite:///r.db")``

    Args:
        model: an ``.onnx`` path or ``zoo:NAME`` (or a ``.tflite``, or an OpenVINO IR ``.xml`` with its ``.bin``
            beside it: run as given on the engine that reads it), a PyTorch ``.pt2`` (``torch.export.save``)
            or a ``torch.nn.Module``: exported with ``torch.onnx.export(dynamo=True)`` and judged against
            PyTorch's own outputs (:mod:`autodeploy.pytorch`).
        example_inputs: an ``nn.Module``'s example inputs, a tuple of tensors (required for one).
        dynamic_shapes: ``torch.export``'s own; default: axis ``batch_dim`` of every tensor input is dynamic.
        batch_dim: an ``nn.Module``'s batch axis (``None``: it takes one item a call).
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
    command = request.command or python_call("bench", model, **request.given())
    return bench_shapes(model, request=replace(request, shapes=shape_set, command=command),
                        example_inputs=example_inputs, dynamic_shapes=dynamic_shapes, batch_dim=batch_dim)[0]


def bench_shapes(
    model: str | Path,
    config: TrialConfig | None = None,
    *,
    request: BenchRequest | None = None,
    example_inputs: Any = None,
    dynamic_shapes: Any = None,
    batch_dim: int | None = 0,
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
    report = request.progress or default_reporter().phase  # lines on stderr where it is a terminal, else silent
    shape_set = ShapeSet.of(request.shapes)
    command = request.command or python_call("bench_shapes", model,
                                             **{**request.given(), "shapes": shape_set.to_config()})  # fmt: skip
    cache = Path(request.cache) if request.cache else cache_dir()  # a str from a user is a path too
    check_metric(request.metric, request.max_metric_drop)  # a bad --metric fails now, in one line
    # 1. resolve the model (a zoo model is built on first use), then fix it at each shape
    model, module = pytorch_model(model, example_inputs, dynamic_shapes, batch_dim, cache)  # an nn.Module: a .pt2
    resolved = resolve_model(model, None, cache_dir=cache, progress=report, module=module)
    # the baseline engine by default: ONNX Runtime, or the one engine that reads a .tflite or an IR
    trial_config = request.trial_config(registry.baseline_config(resolved.info.format).engine)
    label = trial_config.label()
    sources = loaded = _data_per_case(request.data, shape_set)
    if len(sources) > len(shape_set.cases):  # several sources, no --shape: each one's arrays fix a shape
        shape_set, loaded = _shapes_of_data(resolved, request.batch_axes, sources, request.preprocess)
    cases = [with_data(resolved, request.batch_axes, source, case, shape_set, request.preprocess)
             for source, case in zip(loaded, shape_set.cases, strict=True)]  # fmt: skip
    # 2. probe the device and check the config runs here, at every shape, before any work
    device = probe_device()
    for info, _ in cases:
        version = _check_runs_here(device, info, trial_config, request.accuracy)
    settings = replace(_bench_settings(request, cache), peaks=peaks_of(device, cache, report))  # share of peak
    # 3. open the store before measuring: a bad database fails in a second, not after a run
    stored = []
    with open_store(request.db) as store:
        if not request.retry_conversion:  # a conversion that failed here before fails at once, as tune prunes it
            for case, (info, _) in zip(shape_set.cases, cases, strict=True):
                _check_not_failed_before(store, info, device, trial_config, version, case.key())
        for case, source, (info, dataset) in zip(shape_set.cases, sources, cases, strict=True):
            at = f" at {case.key()}" if case.shapes and shape_set.several else ""
            # 4. prepare the data (each shape has its own inputs and reference)
            report(f"preparing data{at}")
            prepared = prepare_inputs(resolved, info, settings, dataset, request.pins)
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
) -> str | None:
    """The engine runs here, its precision and knobs exist, every dynamic dim is fixed, and ``--accuracy`` names real
    outputs. Returns the engine's version (``None`` where it does not say).

    Raises:
        EngineUnavailableError: the engine cannot run on this machine (nothing is run or stored).
    """
    engine = registry.get(config.engine)  # unknown engine: UnknownEngineError listing the known ones
    availability = engine.probe(device)
    if not availability.available:  # a setup problem, as tune's skip line says it: no failed trial stored
        raise EngineUnavailableError(f"{config.engine} cannot run on this machine: {availability.reason}",
                                     fix=availability.fix or "bench it with another --engine (autodeploy engines lists them)")  # fmt: skip
    engine.check(device, info, config)  # unknown precision/knob
    for name in info.input_names:  # dynamic dims left unfixed: fail with the --shape fix now
        info.input_shape(name, config.batch)
    info.check_batch(config.batch)  # a --shape's batch dim is the batch fed, or 1
    unknown = sorted({parse_override(t)[0] for t in accuracy} - set(info.output_names))
    if unknown:
        raise UsageError(f"--accuracy names output(s) {unknown} the model does not have",
                         fix=f"name one of its outputs: {', '.join(info.output_names)}")  # fmt: skip
    return availability.version or engine.probe_version()


def _check_not_failed_before(store: Store, info: ModelInfo, device: DeviceInfo, config: TrialConfig,
                             version: str | None, shape_key: str) -> None:  # fmt: skip
    """Fail at once where a stored trial shows this engine's conversion of this model failing here, with this
    engine version, at these shapes and with these build knobs: every precision needs that conversion, so a bench
    of another precision would pay for it again only to fail the same way (a study prunes them: ``search/screening``).

    Raises:
        ConversionError: naming the trial that failed and its reason, with ``retry_conversion`` as the fix.
    """
    if version is None:
        return
    build_knobs = registry.get(config.engine).build_knobs
    mine = {k: v for k, v in config.knobs.items() if k in build_knobs}
    rows = store.trials(TrialFilter(model_sha256=info.sha256, device=device.fingerprint, engines=(config.engine,),
                                    engine_version=version, shape_key=shape_key, status="failed",
                                    newest_first=True))  # fmt: skip
    for row in rows:
        theirs = {k: v for k, v in row.config.knobs.items() if k in build_knobs}
        if row.failure_kind == "build_failed" and conversion_failed(row.failure_message) and theirs == mine:
            why, _, fix = headline(row.failure_message).removeprefix(CONVERSION_PREFIX).partition("; fix: ")
            raise ConversionError(
                f"{config.engine} {version} could not convert {info.name} in trial {row.id} ({row.config.label()}), "
                f"and every precision of it needs that conversion: {why}",
                fix=f"{fix or 'bench another engine'}; or pass --retry-conversion (retry_conversion=True) to convert "
                "again",
            )


def _bench_settings(request: BenchRequest, cache: Path) -> HarnessSettings:
    """How a bench trial runs: its timing, time limits, memory cap and accuracy budget."""
    drop = request.max_accuracy_drop
    return HarnessSettings(workdir=cache / "work", policy=request.timing or TimingPolicy(), timeout_s=request.timeout_s,
                           build_timeout_s=request.build_timeout_s, metric=request.metric,
                           max_metric_drop=request.max_metric_drop, max_accuracy_drop=drop,
                           min_cosine=cosine_for_drop(drop), accuracy_overrides=tuple(request.accuracy),
                           cold_start=request.starts(),
                           **({"memory_cap_mb": request.memory_cap_mb} if request.memory_cap_mb else {}))  # fmt: skip


def _check_scenario(scenario: str, sla_ms: float | None) -> None:
    try:
        row = scenario_of(scenario)  # the one place a bench's scenario name is read
    except ValueError:
        raise UsageError(f"unknown scenario {scenario!r}", fix=f"choose one of {', '.join(SCENARIOS)}") from None
    if row.rate_under_sla and sla_ms is None:
        raise UsageError(f"the {scenario} scenario needs a p99 bound", fix="pass --sla-ms, e.g. --sla-ms 10")
    if sla_ms is not None and not (0 < sla_ms < math.inf):  # nan too: stored as an ok trial at rate 0
        raise UsageError(f"--sla-ms must be a finite number > 0, got {sla_ms:g}", fix="pass a positive p99 bound in ms")


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
            parse_override(text)
        except ValueError as exc:
            raise UsageError(str(exc), fix=f"measures: {', '.join(MEASURES)}") from None


def _add_trial(store: Store, result: TrialResult, info: ModelInfo, device: DeviceInfo, command: str,
               shape_key: str, inputs: Mapping[str, Any] | None = None) -> int:  # fmt: skip
    from autodeploy.results_db.records import DeviceRecord, ModelRecord

    return store.add_trial(result, model=ModelRecord.of(info), device=DeviceRecord.of(device), command=command,
                           shape_key=shape_key, shapes=info.measured_shapes(result.config.batch), inputs=inputs)  # fmt: skip


def _zoo_inputs(resolved: ResolvedModel) -> dict[str, Any] | None:
    """What a zoo model's own data is (its record for the store), ``None`` when it has none."""
    from autodeploy import zoo

    return zoo.own_inputs(resolved.info.name) if resolved.data is not None else None
