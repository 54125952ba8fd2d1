"""What the parent tells a worker process: a JSON file, never pickle."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from autodeploy.accuracy.records import DEFAULT_MAX_ACCURACY_DROP, DEFAULT_MIN_COSINE
from autodeploy.objectives import DEFAULT_SCENARIO


@dataclass(frozen=True)
class WorkerSpec:
    """One job for one worker process.

    ``mode`` is ``build`` (make the artifact), ``measure`` (load it, time it, compare with the
    reference), ``reference`` (ONNX Runtime FP32 outputs on the evaluation inputs) or
    ``quantize`` (``autodeploy inhouse quantize``: the graph passes, then the INT8 quantizer
    with ``quant``, the model written to ``output_path``; no engine runs, so ``engine_target`` and
    ``config`` are empty).
    """

    mode: Literal["build", "measure", "reference", "quantize"]
    uid: str
    engine_target: str
    config: dict[str, Any]
    model: dict[str, Any]
    workdir: str
    calibration_path: str | None = None
    calibration_sha256: str = ""
    evaluation_path: str | None = None
    reference_path: str | None = None
    artifact_path: str | None = None
    policy: dict[str, Any] = field(default_factory=dict)
    max_accuracy_drop: float = DEFAULT_MAX_ACCURACY_DROP
    min_cosine: float = DEFAULT_MIN_COSINE
    output_path: str | None = None  # reference mode: where to write the outputs; quantize mode: the model
    quant: dict[str, Any] | None = None  # quantize mode: the QuantConfig (``dataclasses.asdict`` form)
    scenario: str = DEFAULT_SCENARIO.name  # LoadGen's names (objectives.SCENARIOS); server needs sla_ms
    sla_ms: float | None = None
    metric: str | None = None  # the user's task metric, module:function
    max_metric_drop: float | None = None
    #: ``OUTPUT=MEASURE[:THRESHOLD]`` per output whose measure the user chose (``accuracy.kinds.parse_override``).
    accuracy_overrides: tuple[str, ...] = ()
    #: measure mode: the accuracy (``Accuracy.to_dict`` form) already measured on this same artifact
    #: and batch by trial ``accuracy_from``; the worker reuses it instead of comparing again.
    accuracy: dict[str, Any] | None = None
    accuracy_from: str | None = None
    #: build mode: seconds an int8 float-layer search may spend (``HarnessSettings.search_s``; ``None``: no limit).
    search_s: float | None = None
    #: measure mode: fresh processes per kind of start to time the cold start in (``harness/cold_start.py``);
    #: ``None``: not measured.
    cold_start: int | None = None

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=1))

    @classmethod
    def read(cls, path: Path) -> WorkerSpec:
        d = json.loads(Path(path).read_text())
        d["accuracy_overrides"] = tuple(d.get("accuracy_overrides", ()))
        return cls(**d)
