"""What the quantizer's steps share: its config (:class:`QuantConfig`), the calibration batches and opset 13.

Below the steps (:mod:`.bias`, :mod:`.fallback`, :mod:`.run`, :mod:`.scope`) and the pipeline that runs them
(:mod:`.pipeline`), so each imports it without importing the package.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import onnx

from autodeploy.accuracy.records import DEFAULT_MAX_ACCURACY_DROP, DEFAULT_MIN_COSINE
from autodeploy.errors import BuildError
from autodeploy.inhouse.placement import PLACEMENTS
from autodeploy.inhouse.quantize import calibrate, mixed

FLOAT_PRECISIONS = ("f32", "bf16")


@dataclass(frozen=True)
class QuantConfig:
    """How to quantize.

    Attributes:
        calibration: ``minmax``, ``percentile`` or ``entropy``.
        percentile: For ``percentile``: the kept share of values, in percent.
        activation_symmetric: Symmetric int8 activations (zero point 0) instead of asymmetric.
        per_channel: One weight scale per output channel instead of one per tensor.
        reduce_range: 7-bit weights, for x86 CPUs without VNNI, where the int8 kernels of ONNX
            Runtime and OpenVINO saturate with full-range weights (zoo:digits on AVX2: top-1
            agreement 98.3% with 8-bit weights in both, 100% with 7-bit; the QDQ graph itself
            is fine either way: run without fusions it agrees 99.8%).
        max_accuracy_drop: Allowed top-1 agreement drop vs FP32 on calibration data (cosine >=
            ``min_cosine`` for outputs that are not classifier-shaped); ``None`` disables the fallback.
        max_float_fraction: At most this share of weighted layers is kept in float.
        batch: Items per calibration run (1 for models with a static batch dim).
        placement: Where QDQ goes: a runtime of :data:`autodeploy.inhouse.placement.PLACEMENTS` (see :func:`.qdq.plan`).
        budget_share: The fallback meets this share of the budget on the calibration data, so the
            trial's own evaluation (other items) stays inside the whole budget (PP-OCR det with
            8 + 8 items: cosine 0.9906 on calibration data at the full budget, 0.9859 held out).
        bias_correction: Subtract each Conv/Gemm's mean int8 output shift from its bias.
        smoothquant: SmoothQuant's alpha (e.g. 0.5): move activation outliers of LayerNorm -> MatMul
            into the weights (:mod:`.smooth`); ``None`` leaves the model as is.
        float_precision: What the layers left float run in: ``f32``, or ``bf16`` (OpenVINO placement
            only: its ``INFERENCE_PRECISION_HINT``). With the ``openvino`` placement the budget is
            judged by running each candidate on OpenVINO in this precision (at static shapes), so the
            fallback sees the error the artifact will have; ONNX Runtime judges its own placement.
        float_layers: Which layers the fallback keeps float when int8 fails (:mod:`.mixed`): ``search`` (the
            failing channels' head, then layers ranked by their effect on them, until the budget holds),
            ``head`` (the head alone: the config "int8, head float"), ``none`` (every layer int8: the
            evidence is still recorded).
    """

    calibration: str = "minmax"
    percentile: float = 99.99
    activation_symmetric: bool = False
    per_channel: bool = True
    reduce_range: bool = False
    max_accuracy_drop: float | None = DEFAULT_MAX_ACCURACY_DROP
    min_cosine: float = DEFAULT_MIN_COSINE
    max_float_fraction: float = 0.5
    batch: int = 8
    placement: str = "onnxruntime"
    bias_correction: bool = False
    smoothquant: float | None = None
    budget_share: float = 0.5
    float_precision: str = "f32"
    float_layers: str = "search"

    def __post_init__(self) -> None:
        if self.float_precision not in FLOAT_PRECISIONS:
            raise ValueError(
                f"float_precision must be one of {', '.join(FLOAT_PRECISIONS)}, got {self.float_precision!r}"
            )
        if self.placement not in PLACEMENTS:
            raise ValueError(f"placement must be one of {', '.join(PLACEMENTS)}, got {self.placement!r}")
        if self.float_precision not in PLACEMENTS[self.placement].float_precisions:  # its runtime's row says
            takes = " or ".join(name for name, row in PLACEMENTS.items() if self.float_precision in row.float_precisions)
            raise ValueError(f"float_precision {self.float_precision} needs placement {takes} "
                             "(ONNX Runtime's CPU kernels have no bf16)")  # fmt: skip
        if self.float_layers not in mixed.FLOAT_LAYERS:
            raise ValueError(f"float_layers must be one of {', '.join(mixed.FLOAT_LAYERS)}, got {self.float_layers!r}")
        if self.calibration not in calibrate.METHODS:
            raise ValueError(f"calibration must be one of {', '.join(calibrate.METHODS)}, got {self.calibration!r}")


def opset_13(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` at opset 13 or newer, as QDQ int8 needs it (converted where older).

    Raises:
        BuildError: the conversion failed.
    """
    version = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=0)
    if version >= 13:
        return model
    try:
        return onnx.version_converter.convert_version(model, 13)
    except Exception as exc:
        raise BuildError(
            f"QDQ int8 needs opset >= 13; converting this opset-{version} model failed: {exc}",
            fix="re-export the model at opset 13 or newer",
        ) from exc


def calibration_batches(
    model: onnx.ModelProto, data: Mapping[str, np.ndarray], batch: int, axes: Mapping[str, int | None] | None
) -> list[dict[str, np.ndarray]]:
    """Calibration batches; one item at a time when a batched input has a static batch dim."""
    from autodeploy.data import feeds

    def static(value: onnx.ValueInfoProto) -> bool:
        axis = 0 if axes is None else axes.get(value.name, 0)
        dims = value.type.tensor_type.shape.dim
        return axis is not None and axis < len(dims) and dims[axis].HasField("dim_value")

    size = 1 if any(static(i) for i in model.graph.input if i.name in data) else max(1, batch)
    n = len(next(iter(data.values())))
    return [feeds(data, s, size, axes) for s in range(0, n, size)]
