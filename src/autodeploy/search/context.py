"""What a study run is given: its context (model, device, data, store), its shapes and the baseline it is
measured against (the reporter it tells its progress is :mod:`autodeploy.search.reporter`'s)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from autodeploy.adapters import registry
from autodeploy.harness.run import HarnessSettings, PreparedData
from autodeploy.results_db.store import Store
from autodeploy.search.config import StudyConfig

if TYPE_CHECKING:
    from autodeploy.adapters.base import TrialConfig
    from autodeploy.model import ModelInfo
    from autodeploy.runtime.device import DeviceInfo


BASELINE = registry.BASELINE_CONFIG


@dataclass(frozen=True)
class StudyCase:
    """One shape of a study over several: the model fixed at it, its own inputs, its weight in the mix."""

    key: str  # ShapeCase.key(): "x=1x3x48x320"
    weight: float
    model: ModelInfo
    data: PreparedData


@dataclass(frozen=True)
class StudyContext:
    """Everything a study run needs, resolved and validated by the caller (the CLI).

    ``cases`` are the shapes every config is measured at, when there are several: the objective
    is then their weighted mean (throughput: the mix's items/s), accuracy and memory the worst
    of them. Without cases, ``model`` and ``data`` are the one shape.
    """

    config: StudyConfig
    name: str
    model: ModelInfo
    device: DeviceInfo
    data: PreparedData
    settings: HarnessSettings
    store: Store
    storage: str  # Optuna's RDB storage URL (by default the results database itself)
    command: str
    resume: bool = False
    cases: tuple[StudyCase, ...] = ()

    def shape_cases(self) -> tuple[StudyCase, ...]:
        if self.cases:
            return self.cases
        return (StudyCase(shape_key(self.model), 1.0, self.model, self.data),)

    def baseline(self) -> TrialConfig:
        """The config every speed-up is over: ORT's fp32 default, or for a model file run as given (a
        ``.tflite``, an OpenVINO IR) the fp32 default of the engine that reads it."""
        return registry.baseline_config(self.model.format)

    def baseline_name(self) -> str:
        """What :meth:`baseline` is called: ``the ORT fp32 default``, ``LiteRT fp32, the file as given``."""
        return registry.baseline_name(self.model.format)


def shape_key(model: ModelInfo) -> str:
    """The :meth:`~autodeploy.shapes.ShapeCase.key` of a model's fixed shapes."""
    from autodeploy.shapes import ShapeCase

    return ShapeCase(dict(model.shapes)).key()

