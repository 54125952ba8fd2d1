""":func:`tune` and :func:`tune_per_shape`: the study config read once, the arguments over it, then
the study (screening, finalists, winner); Optuna is imported when one runs.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autodeploy import verdict
from autodeploy.api._common import (
    Shapes,
    cache_dir,
    check_metric,
    open_store,
    peaks_of,
    prepare_inputs,
    python_call,
    pytorch_model,
    with_data,
)
from autodeploy.device import probe_device
from autodeploy.errors import UsageError
from autodeploy.harness.run import SYNTHETIC_NOTE, HarnessSettings
from autodeploy.harness.timing import TimingPolicy
from autodeploy.images import Preprocess
from autodeploy.intake import display_name, resolve_model
from autodeploy.search import config as study_config
from autodeploy.search.config import StudyConfig
from autodeploy.shapes import ShapeSet

if TYPE_CHECKING:
    from autodeploy.results_db.store import Store
    from autodeploy.search.study import Reporter, StudySummary


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
    spread_s: float | None = None,
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
    example_inputs: Any = None,
    dynamic_shapes: Any = None,
    batch_dim: int | None = 0,
) -> StudySummary:
    """Search the fastest config of ``model`` on this device, re-measure the finalists, pick the winner.

    Arguments override the study config (``config``), which overrides the defaults; the keys are
    :class:`~autodeploy.search.config.StudyConfig`'s (``finalists.count`` is ``finalists``,
    ``finalists.rounds`` is ``rounds``, ``screening.min_samples`` is ``min_samples``, …).

    Args:
        model: an ``.onnx`` path or ``zoo:NAME`` (or ``model`` in ``config``), a PyTorch ``.pt2`` or a
            ``torch.nn.Module`` (with ``example_inputs``, ``dynamic_shapes`` and ``batch_dim`` as for
            :func:`~autodeploy.api.bench`): judged against PyTorch's own outputs. A module is saved as a
            ``.pt2`` in the cache, the model the study records.
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
        spread_s: the least seconds the finalist rounds span, waiting between them at random times
            (``finalists.spread_s``; default: as long as the study ran before them, at most 5 minutes; 0: back to back).
        data, preprocess, metric, max_metric_drop: as for :func:`bench` (``data`` and ``preprocess`` are
            also the config's ``data`` and ``preprocess`` keys, the drop ``constraints.max_metric_drop``;
            ``metric``, ``FILE.py:FUNCTION``, is an argument only: a config naming one is refused, and a
            resume must give the stored study's own).
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
    model, module = pytorch_model(model, example_inputs, dynamic_shapes, batch_dim, cache or cache_dir())
    if time_budget is not None:
        from autodeploy.search.budget import parse_duration

        time_budget = parse_duration(time_budget)
    arguments = {"model": model, "name": name, "objective": objective, "engines": engines, "precisions": precisions,
                 "batches": batches, "threads": threads, "knobs": knobs, "trials": trials, "timeout_s": timeout_s,
                 "build_timeout_s": build_timeout_s, "screening_time_s": screening_time_s,
                 "time_budget_s": time_budget, "sampler": sampler, "seed": seed, "fresh": fresh or None, "resume": resume or None,
                 "max_accuracy_drop": max_accuracy_drop, "max_memory_mb": max_memory_mb, "sla_ms": sla_ms,
                 "finalists": finalists, "rounds": rounds, "spread_s": spread_s, "min_samples": min_samples,
                 "min_duration_s": min_duration_s, "shapes": shapes, "per_shape": per_shape, "data": data,
                 "preprocess": preprocess.to_dict() if preprocess is not None else None, "metric": metric,
                 "max_metric_drop": max_metric_drop}  # fmt: skip
    given = {k: v for k, v in arguments.items() if k != "model"}
    command = command or python_call("tune", model, config=config, **given)
    overrides = _study_overrides(arguments)
    # 1. the config as asked: the YAML read once, the arguments over it
    keys = dict(config) if isinstance(config, Mapping) else study_config.read(config)
    cfg = study_config.validate(keys, overrides)
    check_metric(cfg.metric, cfg.constraints.max_metric_drop)
    with open_store(db) as store:
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
        resolved = resolve_model(cfg.model, None, cache_dir=cache, progress=reporter.phase, module=module)
        # 5. screening settings; the harness labels a trial "inaccurate" by the study's own budget
        settings = _screening_settings(cfg, cache / "work")
        settings = replace(settings, peaks=peaks_of(device, cache, reporter.phase))  # every share of peak reads these
        # 6. prepare the data per shape (arrays of a concrete shape fix the dims `shapes` left open)
        reporter.phase("preparing data")
        shape_set = cfg.shape_set()
        cases, synthetic, note = [], False, None
        for case in shape_set.cases:
            info, dataset = with_data(resolved, None, cfg.data, case, shape_set, _preprocess_of(cfg))
            for batch in cfg.default_batches():  # a shape's batch dim is the batch fed, or 1: refused now
                info.check_batch(batch)
            prepared = prepare_inputs(resolved, info, settings, dataset)
            synthetic = synthetic or prepared.synthetic
            note = note or prepared.note
            cases.append(StudyCase(case.key(), case.weight, info, prepared))
        # 7. run the study: screening, finalists, winner; every trial stored with its shape
        storage = storage or store.engine.url.render_as_string(hide_password=False)
        ctx = StudyContext(cfg, study_name, cases[0].model, device, cases[0].data, settings, store, storage,
                           command, resume, tuple(cases) if shape_set.several else ())  # fmt: skip
        summary = run_study(ctx, reporter)
        if resolved.info.source:  # exported from PyTorch: judged against its own outputs
            from autodeploy.pytorch import reference_name

            summary = replace(summary, reference=reference_name(resolved.info.source))
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
    command = command or python_call("tune_per_shape", model, config=config, shapes=shape_set.to_config(),
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


def _preprocess_of(cfg: StudyConfig) -> Preprocess | None:
    p = cfg.preprocess
    if p is None:
        return None
    return Preprocess(p.layout, p.reverse_input_channels, tuple(p.mean_values) if p.mean_values else None,
                      tuple(p.scale_values) if p.scale_values else None)  # fmt: skip


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
               "spread_s": "finalists.spread_s",
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
