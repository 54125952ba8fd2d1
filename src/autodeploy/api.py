"""The library entry points: :func:`bench`, :func:`tune` and :func:`export`, the pipelines the CLI calls.

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

import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autodeploy import verdict
from autodeploy.adapters import registry
from autodeploy.adapters.base import TrialConfig
from autodeploy.data import Dataset, load_user_data, shapes_from_data
from autodeploy.device import DeviceInfo, probe_device
from autodeploy.errors import UsageError
from autodeploy.harness.result import TrialResult
from autodeploy.harness.run import SYNTHETIC_NOTE, HarnessSettings, PreparedData, prepare_data, run_trial
from autodeploy.harness.timing import TimingPolicy
from autodeploy.model import ModelInfo, ResolvedModel, display_name, resolve_model
from autodeploy.search import config as study_config
from autodeploy.search.config import StudyConfig

if TYPE_CHECKING:
    from autodeploy.bundle.export import Source
    from autodeploy.results_db.store import Store
    from autodeploy.search.study import Reporter, StudySummary

__all__ = [
    "FORMATS",
    "StoredTrial",
    "bench",
    "cache_dir",
    "default_study_name",
    "export",
    "find_source",
    "tune",
]

#: What :func:`export` writes: a bundle folder (manifest, loader) or a Triton model repository.
FORMATS = ("bundle", "triton")
Progress = Callable[[str], None]
Shapes = Mapping[str, Sequence[int]]


@dataclass(frozen=True)
class StoredTrial:
    """One measured config as stored: ``Store.get_trial(id)`` reads the same trial back.

    ``result.ok`` is false when the trial failed (``result.failure_kind`` says how); it is
    stored all the same.
    """

    id: int
    result: TrialResult
    model: ModelInfo
    device: DeviceInfo

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


def bench(
    model: str | Path,
    config: TrialConfig | None = None,
    *,
    engine: str | None = None,
    precision: str | None = None,
    batch: int | None = None,
    threads: int | None = None,
    knobs: Mapping[str, Any] | None = None,
    shapes: Shapes | None = None,
    batch_axes: Mapping[str, int | None] | None = None,
    data: str | Path | Dataset | None = None,
    pins: Mapping[str, float] | None = None,
    timing: TimingPolicy | None = None,
    timeout_s: float = 600.0,
    build_timeout_s: float = 1800.0,
    memory_cap_mb: int | None = None,
    db: str | Store | None = None,
    cache: Path | None = None,
    progress: Progress | None = None,
    command: str | None = None,
    scenario: str = "single-stream",
    sla_ms: float | None = None,
) -> StoredTrial:
    """Measure one config of ``model`` on this device in an isolated worker, and store it.

    Args:
        model: an ``.onnx`` path or ``zoo:NAME``.
        config: the config to measure; or give ``engine`` (default ``onnxruntime``), ``precision``
            (``fp32``), ``batch`` (1), ``threads`` (the engine's default) and ``knobs`` instead.
        shapes: fixed input shapes, ``{"input": (1, 3, 224, 224)}``, for dynamic dims.
        batch_axes: an input's batch axis where the model's own is wrong, ``{"state": 1}`` (``None``:
            never batched); by default it is the symbolic dim inputs and outputs share.
        data: inputs (``.npz``, a folder of ``NAME.npy``, or a :class:`~autodeploy.data.Dataset`;
            optional labels); default: the zoo model's own data, else synthetic inputs.
        pins: synthetic inputs pinned to a constant, ``{"sample_rate": 16000}``.
        timing: warm-up and sample counts (default: 64 samples and 2 s at least, 60 s at most).
        timeout_s: seconds before a worker that runs the model (the reference, the measurement) is killed.
        build_timeout_s: seconds before the worker that builds the artifact is killed.
        memory_cap_mb: the worker's memory cap (default: 75% of RAM).
        db: a results database URL or an open :class:`~autodeploy.results_db.store.Store` (left
            open); default ``$AUTODEPLOY_DB`` or the user SQLite file.
        cache: the cache folder (default :func:`cache_dir`).
        progress: told each phase (``"onnxruntime/fp32/b1/t1: building"``).
        command: what to record as the command that reproduces this (default: this call).
        scenario: MLPerf LoadGen's ``single-stream`` (default), ``offline`` (items/s with the knob
            ``num_requests`` in flight, default the engine's optimum), ``multi-stream`` (latency with
            ``num_requests`` in flight) or ``server`` (highest Poisson rate whose p99 meets ``sla_ms``).
        sla_ms: the p99 bound of the ``server`` scenario (required there).

    Returns:
        The stored trial: its id in the store and its result (failed trials included).

    Raises:
        UsageError: unknown engine, precision or knob, or a shape that does not fit.
        ModelError, DataError, StoreError: the model, the data or the database is unusable.
    """
    if config is not None and (engine, precision, batch, threads, knobs) != (None,) * 5:
        raise UsageError("give a TrialConfig or engine/precision/batch/threads/knobs, not both",
                         fix="put every setting in the TrialConfig")  # fmt: skip
    _check_scenario(scenario, sla_ms)
    report = progress or _silent
    command = command or _python_call("bench", model, config=config, engine=engine, precision=precision,
                                      batch=batch, threads=threads, knobs=knobs, shapes=shapes, data=data,
                                      pins=pins, timing=timing)  # fmt: skip
    trial_config = config or TrialConfig(engine or "onnxruntime", precision or "fp32", batch or 1, threads,
                                         knobs or {})  # fmt: skip
    cache = cache or cache_dir()
    label = trial_config.label()
    # 1. resolve the model (a zoo model is built on first use)
    resolved = resolve_model(model, shapes, cache_dir=cache, progress=report)
    info, dataset = _with_data(resolved, batch_axes, data)
    # 2. probe the device and check the config runs here, before any work
    device = probe_device()
    registry.get(trial_config.engine).check(device, info, trial_config)  # unknown engine/precision/knob
    for name in info.input_names:  # dynamic dims left unfixed: fail with the --shape fix now
        info.input_shape(name, trial_config.batch)
    settings = HarnessSettings(workdir=cache / "work", policy=timing or TimingPolicy(), timeout_s=timeout_s,
                               build_timeout_s=build_timeout_s,
                               **({"memory_cap_mb": memory_cap_mb} if memory_cap_mb else {}))  # fmt: skip
    # 3. open the store before measuring: a bad database fails in a second, not after a run
    with _store(db) as store:
        # 4. prepare the data
        report("preparing data")
        prepared = _prepare_data(resolved, info, settings, dataset, pins)
        # 5. run the trial in a fresh worker
        report(f"{label}: starting worker")
        result = run_trial(info, trial_config, prepared, settings, progress=lambda phase: report(f"{label}: {phase}"),
                           scenario=scenario, sla_ms=sla_ms)  # fmt: skip
        # 6. store it
        trial_id = _add_trial(store, result, info, device, command)
    return StoredTrial(trial_id, result, info, device)


def _check_scenario(scenario: str, sla_ms: float | None) -> None:
    from autodeploy.harness.scenarios import SCENARIOS

    if scenario not in SCENARIOS:
        raise UsageError(f"unknown scenario {scenario!r}", fix=f"choose one of {', '.join(SCENARIOS)}")
    if scenario == "server" and sla_ms is None:
        raise UsageError("the server scenario needs a p99 bound", fix="pass --sla-ms, e.g. --sla-ms 10")
    if sla_ms is not None and sla_ms <= 0:
        raise UsageError(f"--sla-ms must be > 0, got {sla_ms:g}", fix="pass a positive p99 bound in ms")


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
    shapes: Shapes | None = None,
    data: str | Path | None = None,
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
        trials: trials this run adds (default 30; the whole grid for ``sampler="grid"``).
        fresh: re-measure configs already in the store.
        resume: add trials to the existing study of this name, within its stored search space.
        finalists: how many of the best are re-measured interleaved (0: none).
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
            made with another search space or objective.
        ModelError, DataError, StoreError: the model, the data or the database is unusable.
    """
    from autodeploy.search.study import Reporter, StudyContext, run_study

    if model is None and config is None:
        raise UsageError(
            "no model given", fix="pass a model (an .onnx path or zoo:NAME), or `model` in the config"
        )
    reporter = reporter or Reporter()
    arguments = {"model": model, "name": name, "objective": objective, "engines": engines, "precisions": precisions,
                 "batches": batches, "threads": threads, "knobs": knobs, "trials": trials, "timeout_s": timeout_s,
                 "sampler": sampler, "seed": seed, "fresh": fresh or None, "resume": resume or None,
                 "max_accuracy_drop": max_accuracy_drop, "max_memory_mb": max_memory_mb, "sla_ms": sla_ms,
                 "finalists": finalists, "rounds": rounds, "min_samples": min_samples,
                 "min_duration_s": min_duration_s, "shapes": shapes, "data": data}  # fmt: skip
    given = {k: v for k, v in arguments.items() if k != "model"}
    command = command or _python_call("tune", model, config=config, **given)
    overrides = _study_overrides(arguments)
    # 1. the config as asked: the YAML read once, the arguments over it
    keys = dict(config) if isinstance(config, Mapping) else study_config.read(config)
    cfg = study_config.validate(keys, overrides)
    with _store(db) as store:
        # 2. probe the device; name the study
        device = probe_device()
        study_name = cfg.name or default_study_name(
            display_name(cfg.model), cfg.objective, device.fingerprint
        )
        # 3. on resume, the study's stored search space goes under the config and the arguments
        stored = store.get_study(study_name) if resume else None
        if stored is not None:
            cfg = study_config.validate(
                keys, overrides, base={**stored.settings, "trials": None, "fresh": False}
            )
        # 4. resolve the model, with the final config's shapes
        cache = cache or cache_dir()
        resolved = resolve_model(cfg.model, cfg.shapes, cache_dir=cache, progress=reporter.phase)
        # 5. screening settings; the harness labels a trial "inaccurate" by the study's own budget
        settings = _screening_settings(cfg, cache / "work")
        # 6. prepare the data (arrays of a concrete shape fix the dims `shapes` left open)
        reporter.phase("preparing data")
        info, dataset = _with_data(resolved, None, cfg.data)
        prepared = _prepare_data(resolved, info, settings, dataset)
        # 7. run the study: screening, finalists, winner; every trial stored
        storage = storage or store.engine.url.render_as_string(hide_password=False)
        ctx = StudyContext(cfg, study_name, info, device, prepared, settings, store, storage, command, resume)
        summary = run_study(ctx, reporter)
        return replace(summary, inputs=SYNTHETIC_NOTE) if prepared.synthetic else summary


def default_study_name(model: str, objective: str, fingerprint: str) -> str:
    """``MODEL-OBJECTIVE-FINGERPRINT``, the model name reduced to letters, digits and ``_.-``."""
    return f"{re.sub(r'[^A-Za-z0-9_.-]+', '-', model).strip('-')}-{objective}-{fingerprint[:8]}"


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
               data: str | Path | Dataset | None) -> tuple[ModelInfo, Dataset | None]:  # fmt: skip
    """The model with the user's batch axes and the dims the user's data fixes, and that data (loaded)."""
    info = resolved.info.with_batch_axes(batch_axes) if batch_axes else resolved.info
    if data is None:
        return info, None
    dataset = data if isinstance(data, Dataset) else load_user_data(data, info)
    return info.with_shapes(shapes_from_data(info, dataset)), dataset  # arrays of a concrete shape fix open dims


def _prepare_data(resolved: ResolvedModel, info: ModelInfo, settings: HarnessSettings, data: Dataset | None,
                  pins: Mapping[str, float] | None = None) -> PreparedData:  # fmt: skip
    """Save the inputs for the workers: the user's data, else the zoo model's own, else synthetic."""
    if data is None:
        return prepare_data(info, settings, data=resolved.data, calibration=resolved.calibration,
                            pins=dict(pins) if pins else None)  # fmt: skip
    return prepare_data(info, settings, data=data, pins=dict(pins) if pins else None)


def _screening_settings(cfg: StudyConfig, workdir: Path) -> HarnessSettings:
    """How screening trials run; the study's accuracy budget is also the harness's "inaccurate" line."""
    s, drop = cfg.screening, cfg.constraints.max_accuracy_drop
    policy = TimingPolicy(
        min_samples=s.min_samples, min_duration_s=s.min_duration_s, max_duration_s=s.max_duration_s
    )
    return HarnessSettings(workdir=workdir, policy=policy, timeout_s=s.timeout_s, build_timeout_s=s.build_timeout_s,
                           max_top1_drop=drop,
                           min_cosine=verdict.cosine_for_drop(drop))  # fmt: skip


def _study_overrides(arguments: Mapping[str, Any]) -> dict[str, Any]:
    """The arguments of :func:`tune` as study config keys (``None``: not given)."""
    renamed = {"max_accuracy_drop": "constraints.max_accuracy_drop", "max_memory_mb": "constraints.max_memory_mb",
               "sla_ms": "constraints.sla_ms", "finalists": "finalists.count", "rounds": "finalists.rounds",
               "min_samples": "screening.min_samples", "min_duration_s": "screening.min_duration_s"}  # fmt: skip
    overrides = {renamed.get(k, k): v for k, v in arguments.items() if k != "resume"}
    for key in ("engines", "precisions", "batches", "threads"):
        overrides[key] = list(overrides[key]) if overrides[key] is not None else None
    shapes = overrides["shapes"]  # none given ({}) keeps the config's
    overrides["shapes"] = {k: list(v) for k, v in shapes.items()} if shapes else None
    for key in ("model", "data"):  # paths are stored as text
        overrides[key] = str(overrides[key]) if overrides[key] is not None else None
    return overrides


def _add_trial(store: Store, result: TrialResult, info: ModelInfo, device: DeviceInfo, command: str) -> int:
    from autodeploy.results_db.store import DeviceRecord, ModelRecord

    return store.add_trial(
        result, model=ModelRecord.of(info), device=DeviceRecord.of(device), command=command
    )


def _silent(_: str) -> None:
    pass


def _python_call(function: str, *args: Any, **kwargs: Any) -> str:
    """How a call reads in Python, recorded as the command that reproduces it (the CLI records its argv)."""

    def show(value: Any) -> str:
        if isinstance(value, Path):
            return repr(str(value))
        if isinstance(value, Dataset):
            return f"<Dataset of {len(value)} items>"
        if hasattr(value, "name") and hasattr(value, "winner"):  # a StudySummary
            return repr(value.name)
        return repr(value)

    parts = [show(a) for a in args if a is not None]
    given = {k: v for k, v in kwargs.items() if v is not None and v is not False and v != {} and v != []}
    parts += [f"{k}={show(v)}" for k, v in given.items()]
    return f"autodeploy.{function}({', '.join(parts)})"
