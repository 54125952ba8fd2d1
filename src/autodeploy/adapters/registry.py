"""Which engines exist: one explicit table, plus plug-ins through entry points.

Engines are named by ``"module:Class"`` strings and imported only when asked for, so a
broken or missing engine never breaks ``autodeploy`` itself: it becomes a
:class:`MissingEngine` that reports why. The same string travels to the worker process,
which imports the engine there.
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autodeploy.adapters.base import Artifact, Availability, Engine, EngineSpace, TrialConfig
from autodeploy.errors import EXTRAS, MissingExtraError, UnknownEngineError

if TYPE_CHECKING:
    from autodeploy.model import ModelInfo
    from autodeploy.runtime.device import DeviceInfo

#: The baseline engine, named here once (docs/architecture.md, "Measurement rules"): it computes the fp32
#: reference every accuracy verdict compares against, its fp32 default (:data:`BASELINE_CONFIG`) is what
#: every speed-up is over, and bench and gate run it unless told otherwise.
BASELINE_ENGINE = "onnxruntime"
BASELINE_CONFIG = TrialConfig(BASELINE_ENGINE, "fp32", batch=1, threads=None)


def baseline_config(model_format: str = "onnx") -> TrialConfig:
    """The baseline of a model in ``model_format``: :data:`BASELINE_CONFIG` for ONNX; for a file run as
    given (a ``.tflite``, an OpenVINO IR) the fp32 default of the one engine that reads it."""
    if model_format == "onnx":
        return BASELINE_CONFIG
    from autodeploy.formats import FORMATS

    return TrialConfig(FORMATS[model_format].engine, "fp32", batch=1, threads=None)


#: What the ONNX baseline (:data:`BASELINE_CONFIG`) is called wherever a speed-up is over it.
BASELINE_NAME = "the ORT fp32 default"


def baseline_name(model_format: str = "onnx") -> str:
    """What the baseline of a model in ``model_format`` is called (:func:`baseline_config`): ``the ORT fp32
    default``, or for a file run as given ``LiteRT fp32, the file as given`` (``Format.baseline``)."""
    if model_format == "onnx":
        return BASELINE_NAME
    from autodeploy.formats import FORMATS

    return FORMATS[model_format].baseline


def engine_baseline_name(engine: str) -> str:
    """What the baseline that ``engine`` runs is called: the baseline of the format ``engine`` runs as given
    (``LiteRT fp32, the file as given``), else the ONNX one's (:data:`BASELINE_NAME`)."""
    from autodeploy.formats import FORMATS

    return next((f.baseline for f in FORMATS.values() if f.engine == engine), BASELINE_NAME)


#: What the ONNX baseline's fp32 outputs are called as the reference every accuracy verdict compares against.
REFERENCE_NAME = "ONNX Runtime FP32"


def reference_name(model_format: str = "onnx") -> str:
    """What the accuracy of a model in ``model_format`` is judged against: :data:`REFERENCE_NAME` where the
    baseline engine runs it, else its baseline (``LiteRT fp32, the file as given``)."""
    if baseline_config(model_format).engine == BASELINE_ENGINE:
        return REFERENCE_NAME
    return baseline_name(model_format)


def unreadable(model: ModelInfo) -> dict[str, str]:
    """Every known engine that cannot take ``model``'s format, with its one-line reason (none for ONNX)."""
    if model.format == "onnx":
        return {}
    return {name: reason for name, target in targets().items() if (reason := load_target(name, target).unreadable(model))}

#: Built-in engines, in the order the CLI lists them.
ENGINES: dict[str, str] = {
    "onnxruntime": "autodeploy.adapters.ort:OnnxRuntimeEngine",
    "openvino": "autodeploy.adapters.openvino:OpenVinoEngine",
    "tflite": "autodeploy.adapters.tflite:TfliteEngine",
    "tensorrt": "autodeploy.adapters.tensorrt:TensorRTEngine",
    "inhouse": "autodeploy.adapters.inhouse:InhouseEngine",
}
ENTRY_POINT_GROUP = "autodeploy.engines"

_registered: dict[str, str] = {}


def register(name: str, target: str) -> None:
    """Add an engine at run time (tests, plug-ins loaded by hand). ``target`` is ``"module:Class"``."""
    if ":" not in target:
        raise ValueError(f"engine target must be 'module:Class', got {target!r}")
    _registered[name] = target


def unregister(name: str) -> None:
    _registered.pop(name, None)


def targets() -> dict[str, str]:
    """Every known engine name and its ``"module:Class"``: built-ins, entry points, then run-time."""
    table = dict(ENGINES)
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        table.setdefault(ep.name, ep.value)
    table.update(_registered)
    return table


def target_of(name: str) -> str:
    table = targets()
    if name not in table:
        raise UnknownEngineError(f"unknown engine {name!r}", fix=f"choose one of {', '.join(table)}")
    return table[name]


def get(name: str) -> Engine:
    """The engine called ``name``; a :class:`MissingEngine` when its module cannot be imported."""
    return load_target(name, target_of(name))


def load_target(name: str, target: str) -> Engine:
    module_name, _, attr = target.partition(":")
    try:
        cls = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        return MissingEngine(name, f"cannot import {target}: {exc}")
    engine = cls()
    if engine.name != name:
        raise ValueError(f"{target} names itself {engine.name!r}, registered as {name!r}")
    return engine


def runs_on_gpu(name: str) -> bool:
    """Whether the engine called ``name`` declares it runs on a GPU (:attr:`Engine.gpu`: the CPU's peaks say
    nothing about it); ``False`` for a name no longer known (a plug-in uninstalled since it was measured)."""
    target = targets().get(name)
    return target is not None and load_target(name, target).gpu


def all_engines() -> list[Engine]:
    return [load_target(name, target) for name, target in targets().items()]


class MissingEngine(Engine):
    """Stands in for an engine whose module failed to import; it is always unavailable."""

    runtime = ""

    def __init__(self, name: str, reason: str) -> None:
        self.name = name  # type: ignore[misc]  # instance attribute on purpose: one stub per name
        self.reason = reason

    def _probe(self, target: DeviceInfo) -> Availability:
        return Availability(False, reason=self.reason, fix="reinstall the plug-in that provides it")

    def _space(self, target: DeviceInfo, model: ModelInfo) -> EngineSpace:
        return EngineSpace(precisions=())

    def _build(self, model: ModelInfo, config: TrialConfig, calibration: Any, outdir: Path, target: DeviceInfo) -> None:
        raise UnknownEngineError(self.reason)

    def _runtime_settings(self, artifact: Artifact, config: TrialConfig, model: ModelInfo) -> dict[str, Any]:
        raise UnknownEngineError(self.reason)


def missing_extra(error: ModuleNotFoundError) -> MissingExtraError | None:
    """The install hint for a missing module: the extra that brings it (the table in
    :mod:`autodeploy.errors`, else the engine whose ``modules`` hold it), or ``None`` (a bug)."""
    extras: dict[str, str] = {}
    for engine in all_engines():
        for module in engine.modules:
            if engine.extra:
                extras.setdefault(module, engine.extra)
    return MissingExtraError.of(error, {**extras, **EXTRAS})
