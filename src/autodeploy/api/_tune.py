""":func:`tune` and :func:`tune_per_shape`: the study config read once, the arguments over it, then
the study (screening, finalists, winner); Optuna is imported when one runs.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autodeploy.accuracy import records
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
from autodeploy.harness.cold_start import DEFAULT_STARTS
from autodeploy.harness.run import SYNTHETIC_NOTE, HarnessSettings
from autodeploy.harness.timing import TimingPolicy
from autodeploy.images import Preprocess
from autodeploy.intake import display_name, resolve_model
from autodeploy.objectives import DEFAULT_OBJECTIVE
from autodeploy.search import config as study_config
from autodeploy.search import settings as study_settings
from autodeploy.search.config import StudyConfig
from autodeploy.search.reporter import Reporter
from autodeploy.search.reporter import default as default_reporter
from autodeploy.shapes import ShapeSet

if TYPE_CHECKING:
    from autodeploy.results_db.store import Store
    from autodeploy.runtime.device import DeviceInfo
    from autodeploy.search.study import StudyCase, StudySummary


def tune(model: str | Path | None = None, *, config: str | Path | Mapping[str, Any] | None = None,
         db: str | Store | None = None, storage: str | None = None, cache: Path | None = None,
         reporter: Reporter | None = None, command: str | None = None, example_inputs: Any = None,
         dynamic_shapes: Any = None, batch_dim: int | None = 0, **settings: Any) -> StudySummary:  # fmt: skip
    """Search the fastest config of ``model`` on this device, re-measure the finalists, pick the winner.

    Args:
        model: an ``.onnx`` path or ``zoo:NAME`` (or ``model`` in ``config``), a PyTorch ``.pt2`` or a ``torch.nn.Module``
            (with ``example_inputs``, ``dynamic_shapes`` and ``batch_dim`` as for :func:`~autodeploy.api.bench`): judged
            against PyTorch's own outputs. A module is saved as a ``.pt2`` in the cache, the model the study records.
        config: a YAML study config file (or the name of an example in ``autodeploy/configs/``), or its keys as a mapping.
        db: a results database URL or an open :class:`~autodeploy.results_db.store.Store` (left open).
        storage: the Optuna storage URL shared by workers (default: the results database).
        cache: the cache folder (default :func:`cache_dir`).
        reporter: progress hooks (:class:`~autodeploy.search.reporter.Reporter`); default one line a step on stderr
            where it is a terminal, else silent (:func:`autodeploy.search.reporter.default`).
        command: what to record as the command that reproduces the study (default: this call).
        **settings: the study's settings, listed below (:data:`autodeploy.search.settings.SETTINGS`): each
            overrides its key in ``config``, which overrides the defaults.

    Returns:
        The study's summary: trial counts, finalists and the winner (``None`` when no config meets
        the constraints; ``note`` says why).

    Raises:
        TypeError: a keyword that is no setting (the closest one named).
        UsageError: no model, an invalid config, a study that exists (without ``resume``) or was made with another
            search space or objective, a ``time_budget`` too small to measure even the baseline (says how long here).
        ModelError, DataError, StoreError: the model, the data or the database is unusable.
    """
    from autodeploy.search.study import StudyContext, run_study

    values = study_settings.given("tune", settings)
    if model is None and config is None:
        raise UsageError(
            "no model given", fix="pass a model (an .onnx path or zoo:NAME), or `model` in the config"
        )
    reporter, cache, resume = reporter or default_reporter(), Path(cache) if cache else cache_dir(), bool(values.get("resume"))
    model, module = pytorch_model(model, example_inputs, dynamic_shapes, batch_dim, cache)
    command = command or python_call("tune", model, config=config, **values)
    # 1. the config as asked: the YAML read once, the arguments over it
    keys = dict(config) if isinstance(config, Mapping) else study_config.read(config)
    overrides = study_settings.overrides({"model": model, **values})
    cfg = study_config.validate(keys, overrides)
    check_metric(cfg.metric, cfg.constraints.max_metric_drop)
    with open_store(db) as store:
        # 2.-3. probe the device, name the study; on resume its stored search space goes under the config
        device = probe_device()
        cfg, study_name = _named(cfg, keys, overrides, store, device.fingerprint, resume)
        # 4.-6. the model fixed at each of the config's shapes, the screening settings, the data per shape
        harness, cases, said = _prepared(cfg, module, device, cache, reporter)
        # 7. run the study: screening, finalists, winner; every trial stored with its shape
        storage = storage or store.engine.url.render_as_string(hide_password=False)
        ctx = StudyContext(cfg, study_name, cases[0].model, device, cases[0].data, harness, store, storage,
                           command, resume, tuple(cases) if len(cases) > 1 else ())  # fmt: skip
        return replace(run_study(ctx, reporter), **said)


if tune.__doc__:  # help(autodeploy.tune) lists every setting, from the one table
    tune.__doc__ += study_settings.doc()


def _named(cfg: StudyConfig, keys: Mapping[str, Any], overrides: Mapping[str, Any], store: Store, fingerprint: str,
           resume: bool) -> tuple[StudyConfig, str]:  # fmt: skip
    """The study's name, and its config over a resumed study's stored settings (its search space stays)."""
    study_name = study_config.check_study_name(
        cfg.name or default_study_name(display_name(cfg.model), cfg.objective.name, fingerprint)
    )
    stored = store.get_study(study_name) if resume else None
    if stored is not None:
        cfg = study_config.validate(
            keys, overrides, base={**stored.settings, "trials": None, "fresh": False, "time_budget_s": None}
        )
    if cfg.per_shape and cfg.shape_set().several:
        raise UsageError("this study config asks for one study per shape (per_shape: true)",
                         fix="call autodeploy.tune_per_shape, or drop per_shape for one config weighted by the mix")  # fmt: skip
    return cfg, study_name


def _prepared(cfg: StudyConfig, module: Any, device: DeviceInfo, cache: Path,
              reporter: Reporter) -> tuple[HarnessSettings, list[StudyCase], dict[str, str]]:  # fmt: skip
    """The screening settings, one case per shape (the model resolved and fixed at it, its data) and what the
    summary says of them: the reference a PyTorch model is judged against, a note on synthetic inputs."""
    from autodeploy.search.study import StudyCase

    resolved = resolve_model(cfg.model, None, cache_dir=cache, progress=reporter.phase, module=module)
    # the harness labels a trial "inaccurate" by the study's own budget; every share of peak reads the peaks
    settings = _screening_settings(cfg, cache / "work")
    settings = replace(settings, peaks=peaks_of(device, cache, reporter.phase))
    # the data per shape (arrays of a concrete shape fix the dims `shapes` left open)
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
    said = {"inputs": note or SYNTHETIC_NOTE} if synthetic else {}
    if resolved.info.source:  # exported from PyTorch: judged against its own outputs
        from autodeploy.pytorch import reference_name

        said["reference"] = reference_name(resolved.info.source)
    return settings, cases, said


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
                                       kwargs.get("objective") or keys.get("objective") or DEFAULT_OBJECTIVE.name, device.fingerprint)  # fmt: skip
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
                           min_cosine=records.cosine_for_drop(drop),
                           cold_start=DEFAULT_STARTS if cfg.objective.cold_start else None)  # fmt: skip
