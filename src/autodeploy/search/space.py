"""The search space of one study on one device, and the define-by-run suggestion.

Parameter names are per engine where the choices differ (``onnxruntime.precision``,
``openvino.PERFORMANCE_HINT``), so every Optuna distribution keeps one fixed set of choices.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from autodeploy.adapters import registry
from autodeploy.adapters.base import TrialConfig
from autodeploy.errors import ShapeError, UnsupportedConfigError, UsageError

if TYPE_CHECKING:
    import optuna

    from autodeploy.model import ModelInfo
    from autodeploy.runtime.device import DeviceInfo
    from autodeploy.search.config import StudyConfig


@dataclass(frozen=True)
class EngineChoices:
    precisions: tuple[str, ...]
    knobs: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    #: False for engines whose speed does not depend on a CPU thread count (TensorRT): threads stay default.
    threads: bool = True
    #: Knobs searched with some precisions only (``Engine.precision_knobs``): knob -> those precisions.
    only: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def knobs_of(self, precision: str) -> dict[str, tuple[Any, ...]]:
        """The knobs searched with ``precision``."""
        return {k: v for k, v in self.knobs.items() if k not in self.only or precision in self.only[k]}


@dataclass(frozen=True)
class SearchSpace:
    """What the study may suggest; ``skipped`` says why an engine is left out."""

    engines: dict[str, EngineChoices]
    batches: tuple[int, ...]
    threads: tuple[int, ...]
    skipped: dict[str, str] = field(default_factory=dict)

    def size(self) -> int:
        per_engine = (
            len(self.threads_of(c)) * _product(len(v) for v in c.knobs_of(precision).values())
            for c in self.engines.values()
            for precision in c.precisions
        )
        return sum(per_engine) * len(self.batches)

    def threads_of(self, choices: EngineChoices) -> tuple[int | None, ...]:
        """The thread counts an engine is searched over: ``(None,)`` (its default) when threads do not apply."""
        return self.threads if choices.threads else (None,)

    def grid(self) -> list[dict[str, Any]]:
        """Every combination, as Optuna params (for ``study.enqueue_trial``)."""
        points = []
        for engine, choices in self.engines.items():
            for precision in choices.precisions:
                searched = choices.knobs_of(precision)
                for batch, threads, *knobs in itertools.product(
                    self.batches, self.threads_of(choices), *searched.values()
                ):
                    params = {"engine": engine, f"{engine}.precision": precision, "batch": batch}
                    if threads is not None:
                        params["threads"] = threads
                    params.update({f"{engine}.{k}": v for k, v in zip(searched, knobs, strict=True)})
                    points.append(params)
        return points


def default_threads(logical_cores: int) -> tuple[int, ...]:
    """Powers of two up to the logical core count, and the core count itself."""
    values = {1, logical_cores}
    values.update(2**i for i in range(1, 8) if 2**i < logical_cores)
    return tuple(sorted(values))


def build_space(config: StudyConfig, device: DeviceInfo, model: ModelInfo) -> SearchSpace:
    """The engines available here and what each offers; user-asked precisions the engine lacks stay in, to be pruned with the reason."""
    engines: dict[str, EngineChoices] = {}
    skipped: dict[str, str] = {}
    for name in config.engines or list(registry.targets()):
        engine = registry.get(name)  # unknown name: UnknownEngineError listing the known ones
        unreadable = engine.unreadable(model)  # a .tflite or an IR: only the engine that reads it
        if unreadable:
            skipped[name] = unreadable.removeprefix(f"{name}: ")
            continue
        availability = engine.probe(device)
        if not availability.available:
            skipped[name] = str(availability)
            continue
        offered = engine.space(device, model)
        if not (config.precisions or offered.precisions):  # e.g. tflite on ONNX without its converter
            skipped[name] = _main_reason(offered.unsupported)
            continue
        precisions = tuple(config.precisions or offered.precisions)
        if config.knobs and name in config.knobs:
            knobs = {k: tuple(v) for k, v in config.knobs[name].items()}
        else:
            objective = config.objective  # its scenario's knobs: the dynamic batcher's delay (server)
            wanted = set(engine.search_knobs) | (set(engine.throughput_knobs) if objective.in_flight else set())
            wanted |= set(objective.knobs)
            knobs = {k: tuple(offered.knobs[k]) for k in sorted(wanted) if k in offered.knobs}
        only = {k: tuple(sorted(p)) for k, p in engine.precision_knobs.items() if k in knobs}
        engines[name] = EngineChoices(precisions, knobs, offered.threads, only)
    if not engines:
        reasons = "; ".join(f"{k}: {v}" for k, v in skipped.items())
        raise UsageError(f"no engine to search on this device ({reasons})", fix="see `autodeploy engines`")
    threads = tuple(sorted(set(config.threads))) if config.threads else default_threads(device.logical_cores)
    return SearchSpace(engines, tuple(config.default_batches()), threads, skipped)


def _main_reason(unsupported: Mapping[str, str]) -> str:
    """Why an engine offers no precision for a model: the reason that takes most of them away (the
    converter's absence, not bf16's lack of kernels that every model shares)."""
    reasons = Counter(unsupported.values()).most_common(1)
    return reasons[0][0] if reasons else "offers no precision for this model"


def suggest(trial: optuna.Trial, space: SearchSpace) -> TrialConfig:
    """Define-by-run: engine → precision → batch → threads (where they apply) → that engine's knobs (those of
    that precision: ``float_layers`` is asked of int8 alone)."""
    engine = trial.suggest_categorical("engine", list(space.engines))
    choices = space.engines[engine]
    precision = trial.suggest_categorical(f"{engine}.precision", list(choices.precisions))
    batch = trial.suggest_categorical("batch", list(space.batches))
    threads = trial.suggest_categorical("threads", list(space.threads)) if choices.threads else None
    knobs = {k: trial.suggest_categorical(f"{engine}.{k}", list(v)) for k, v in choices.knobs_of(precision).items()}
    return TrialConfig(engine, precision, batch, threads, knobs)


def unsupported_reason(config: TrialConfig, device: DeviceInfo, model: ModelInfo) -> str | None:
    """Why this combination cannot run here (the study prunes it), or ``None``."""
    try:
        engine = registry.get(config.engine)
        engine.check(device, model, config)
        over = engine.oversubscription(config, device.logical_cores)
        if over:
            return f"{config.label()} {over}"
        if config.batch == 1 and config.knobs.get("max_queue_delay_us", 0):
            return f"{config.label()}: a queue delay changes nothing at batch 1 (the batcher's max batch size)"
        for spec in model.inputs:
            model.input_shape(spec.name, config.batch)
    except (UnsupportedConfigError, ShapeError) as exc:
        return str(exc)
    return None


def _product(values: Any) -> int:
    out = 1
    for v in values:
        out *= v
    return out
