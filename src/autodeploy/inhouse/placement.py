"""The runtimes an in-house artifact runs on (the engine's ``runtime`` knob), and what each asks of the quantizer.

One row per runtime, by its engine name: where int8's QDQ goes so that the runtime's fusions make integer
kernels of it (:func:`autodeploy.inhouse.quantize.qdq.plan`, read as the quantizer's ``placement``), what
the layers left float may run in, who judges the fallback's candidates, and which graph passes fp32 may use.
The engine (:mod:`autodeploy.adapters.inhouse`), the planner and the judge read this table rather than name a
runtime. Standard library only: the engine reads it without onnx.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Placement:
    """What running an in-house artifact on one runtime means for its QDQ, its float layers and its passes."""

    #: ``DQ -> op -> Q`` around each quantized op, fused into one QLinear kernel (ONNX Runtime's ``quantize_static``
    #: layout): the op's output is quantized too, a Relu/Clip after it folds into that output's quantizer, and
    #: every reader of a quantized tensor reads its dequantized copy. Else (NNCF's layout for OpenVINO's CPU
    #: plugin) QDQ goes on the inputs of the ops with int8 kernels only, fused into the producer's output as a
    #: post-op, and only the quantized readers read the dequantized copy.
    qlinear: bool
    #: NNCF's CPU rules besides: SE gates and SiLU stay float, a MaxPool's quantizer moves to its input, and a
    #: tensor read only by depthwise convolutions is quantized per channel.
    nncf: bool
    #: What the layers the quantizer leaves float may run in: ``f32``, and ``bf16`` where the runtime takes
    #: a precision hint (OpenVINO's ``INFERENCE_PRECISION_HINT``; ONNX Runtime's CPU kernels have no bf16).
    float_precisions: tuple[str, ...]
    #: The fallback's candidates are judged on this runtime itself where it is installed
    #: (:func:`autodeploy.inhouse.quantize.run.run_openvino`), so it sees the error the artifact will have;
    #: else on ONNX Runtime, which computes the fp32 reference.
    own_judge: bool
    #: What the fp32 graph passes may emit (:data:`autodeploy.inhouse.passes.TARGETS`): ``onnxruntime`` (ORT's
    #: fused contrib ops) or ``onnx`` (standard ops only). int8 keeps standard ops on every runtime.
    fp32_passes: str


#: By runtime, the ``runtime`` knob's values (the default first).
PLACEMENTS: dict[str, Placement] = {
    "onnxruntime": Placement(qlinear=True, nncf=False, float_precisions=("f32",), own_judge=False,
                             fp32_passes="onnxruntime"),  # fmt: skip
    "openvino": Placement(qlinear=False, nncf=True, float_precisions=("f32", "bf16"), own_judge=True,
                          fp32_passes="onnx"),  # fmt: skip
}
