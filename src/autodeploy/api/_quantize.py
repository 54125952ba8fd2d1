""":func:`quantize`: the in-house engine's build chain (graph passes, then QDQ INT8), in a worker.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from autodeploy.accuracy.records import DEFAULT_MAX_ACCURACY_DROP
from autodeploy.api._common import Progress, cache_dir, silent
from autodeploy.data import Dataset
from autodeploy.images import Preprocess
from autodeploy.intake import choose_inputs, load_source, resolve_model

if TYPE_CHECKING:
    from autodeploy.inhouse.passes import PipelineReport
    from autodeploy.inhouse.quantize import QuantReport


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

    report = progress or silent
    # 1. the model and what calibrates it: the user's data, else the zoo model's own, else synthetic
    resolved = resolve_model(model, None, cache_dir=Path(cache) if cache else cache_dir(), progress=report)
    given = load_source(data, resolved.info, preprocess)
    inputs = choose_inputs(resolved.info, given, resolved, items=items, seed=1)
    # 2. the passes, then the quantizer, in a worker; the model is written only when it succeeded
    config = QuantConfig(calibration=calibration, activation_symmetric=symmetric, reduce_range=reduce_range,
                         max_accuracy_drop=budget if fallback else None, bias_correction=bias_correction)  # fmt: skip
    output = Path(output)
    passes, quantization = quantize_in_worker(resolved.info, inputs.for_calibration, config, output,
                                              timeout_s=timeout_s, memory_cap_mb=memory_cap_mb, progress=report)  # fmt: skip
    return Quantized(output, passes, quantization)
