"""Empirical bias correction (NNCF's FastBiasCorrection): each Conv/Gemm's bias minus the mean
per-channel shift that int8 adds to its output, and the way back for layers the fallback keeps float."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
import onnx

from autodeploy.inhouse.quantize import qdq
from autodeploy.inhouse.quantize.run import layer_outputs

if TYPE_CHECKING:
    from autodeploy.inhouse.quantize.common import QuantConfig

#: The suffix of a corrected bias's initializer, by which :func:`original_biases` finds it.
SUFFIX = "_bias_corrected"


def correct(
    model: onnx.ModelProto,
    the_plan: qdq.Plan,
    ranges: Mapping[str, tuple[float, float]],
    config: QuantConfig,
    batches: list,
) -> tuple[onnx.ModelProto, int]:
    """A copy of ``model`` whose Conv/Gemm biases offset the mean shift int8 adds to each layer's
    output, measured layer by layer on FP32 inputs; and how many biases changed."""
    from onnx import numpy_helper

    out = onnx.ModelProto()
    out.CopyFrom(model)
    consts = qdq.constants(out.graph)
    by_name = {n.name: n for n in out.graph.node}
    layers = [n for n in the_plan.weighted if by_name[n].op_type in ("Conv", "Gemm")]
    changed = 0
    for node, want, got in layer_outputs(model, layers, ranges, config, batches):
        axis = 1 if node.op_type == "Conv" else want.ndim - 1
        shift = np.moveaxis(got - want, axis, 0).reshape(want.shape[axis], -1).mean(axis=1)
        if not np.all(np.isfinite(shift)) or not np.any(shift):
            continue
        target = by_name[node.name]
        old = consts.get(target.input[2]) if len(target.input) > 2 and target.input[2] else None
        if old is not None and (old.ndim != 1 or old.shape[0] != shift.shape[0]):
            continue
        bias = (
            np.zeros(shift.shape[0], np.float32) if old is None else old.astype(np.float32)
        ) - shift.astype(np.float32)
        name = f"{node.name}{SUFFIX}"
        out.graph.initializer.append(numpy_helper.from_array(bias.astype(np.float32), name))
        if len(target.input) > 2:
            target.input[2] = name
        else:
            target.input.append(name)
        changed += 1
    qdq.drop_unused_initializers(out.graph)
    return out, changed


def original_biases(
    corrected: onnx.ModelProto, original: onnx.ModelProto, keep_float: Sequence[str]
) -> onnx.ModelProto:
    """``corrected`` with the layers kept in float back on their own biases: the correction offsets
    the int8 output shift, which a float layer does not have."""
    if not keep_float:
        return corrected
    out = onnx.ModelProto()
    out.CopyFrom(corrected)
    before = {n.name: n for n in original.graph.node}
    initializers = {t.name: t for t in original.graph.initializer}
    present = {t.name for t in out.graph.initializer}
    for node in out.graph.node:
        if node.name not in keep_float or node.name not in before or len(node.input) < 3:
            continue
        if not node.input[2].endswith(SUFFIX):
            continue
        old = before[node.name].input[2] if len(before[node.name].input) > 2 else ""
        if not old:  # the correction added a bias the layer did not have
            del node.input[2]
            continue
        node.input[2] = old
        if old not in present and old in initializers:
            out.graph.initializer.append(initializers[old])
            present.add(old)
    qdq.drop_unused_initializers(out.graph)
    return out
