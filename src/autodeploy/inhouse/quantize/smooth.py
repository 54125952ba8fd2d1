"""SmoothQuant-style scaling (Xiao et al., 2023) for MatMul-heavy models, exact in float.

Transformer activations have a few channels with outliers 10-100x the rest; per-tensor int8
then spends its levels on them. SmoothQuant moves that range into the weights: with
``s_j = max|X_j|^alpha / max|W_j|^(1 - alpha)``, ``X W = (X / s) (s W)``. The division by
``s`` is folded into the producing ``LayerNormalization``'s scale and bias (as the paper does)
when every reader of its output is a MatMul with a constant 2-D weight; when others read it too
(BERT's residual Add), one ``Mul(x, 1 / s)`` feeds the MatMuls instead (OpenVINO folds it
into the FakeQuantize that follows).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnx
from onnx import numpy_helper

from autodeploy.inhouse.quantize import calibrate, qdq


def smooth(
    model: onnx.ModelProto, batches: Sequence[Mapping[str, np.ndarray]], alpha: float = 0.5
) -> tuple[onnx.ModelProto, int]:
    """A smoothed copy of ``model`` and how many LayerNormalizations were smoothed."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    consts = qdq.constants(graph)
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    outputs = {o.name for o in graph.output}
    targets = [n for n in graph.node if _smoothable(n, readers, consts, outputs)]
    if not targets:
        return out, 0
    absmax = _channel_absmax(model, [n.output[0] for n in targets], batches)
    inits = {t.name: t for t in graph.initializer}
    inserted: list[tuple[str, onnx.NodeProto]] = []
    for ln in targets:
        x_max = absmax[ln.output[0]]
        matmuls = [r for r in readers[ln.output[0]] if _weighted_matmul(r, ln.output[0], consts)]
        w_max = np.max([np.abs(consts[r.input[1]]).max(axis=1) for r in matmuls], axis=0)
        s = np.power(np.maximum(x_max, 1e-5), alpha) / np.power(np.maximum(w_max, 1e-5), 1 - alpha)
        s = np.clip(s, 1e-5, None).astype(np.float32)
        if len(matmuls) == len(readers[ln.output[0]]):
            _replace(graph, inits, ln, 1, consts[ln.input[1]] / s)
            if len(ln.input) > 2 and ln.input[2]:
                _replace(graph, inits, ln, 2, consts[ln.input[2]] / s)
        else:
            scaled, inv = f"{ln.output[0]}_smoothed", f"{ln.output[0]}_smooth_inv"
            graph.initializer.append(numpy_helper.from_array((1.0 / s).astype(np.float32), inv))
            mul = onnx.helper.make_node(
                "Mul", [ln.output[0], inv], [scaled], f"{ln.name or ln.output[0]}_smooth"
            )
            inserted.append((ln.output[0], mul))
            for reader in matmuls:
                reader.input[0] = scaled
        for reader in matmuls:
            _replace(graph, inits, reader, 1, consts[reader.input[1]] * s[:, None])
    _insert_after(graph, inserted)
    qdq.drop_unused_initializers(graph)
    return out, len(targets)


def _weighted_matmul(node: onnx.NodeProto, x: str, consts) -> bool:
    return (
        node.op_type == "MatMul"
        and node.input[0] == x
        and node.input[1] in consts
        and consts[node.input[1]].ndim == 2
    )


def _smoothable(node, readers, consts, outputs) -> bool:
    if node.op_type != "LayerNormalization" or node.input[1] not in consts:
        return False
    if len(node.input) > 2 and node.input[2] and node.input[2] not in consts:
        return False
    axis = next((a.i for a in node.attribute if a.name == "axis"), -1)
    users = readers.get(node.output[0], [])
    return axis == -1 and any(_weighted_matmul(u, node.output[0], consts) for u in users)


def _insert_after(graph: onnx.GraphProto, inserted: list[tuple[str, onnx.NodeProto]]) -> None:
    """Put each new node right after the producer of the tensor it reads (graph order stays topological)."""
    after = dict(inserted)
    nodes = []
    for node in graph.node:
        nodes.append(node)
        nodes.extend(after[o] for o in node.output if o in after)
    del graph.node[:]
    graph.node.extend(nodes)


def _channel_absmax(model: onnx.ModelProto, names: list[str], batches) -> dict[str, np.ndarray]:
    found: dict[str, np.ndarray] = {}
    for outputs in calibrate.run_with_outputs(model, names, batches):
        for name, value in outputs.items():
            m = np.abs(value).reshape(-1, value.shape[-1]).max(axis=0)
            found[name] = m if name not in found else np.maximum(found[name], m)
    return found


def _replace(
    graph: onnx.GraphProto, inits: dict, node: onnx.NodeProto, index: int, value: np.ndarray
) -> None:
    """Point ``node.input[index]`` at a new initializer holding ``value`` (others may share the old one)."""
    name = f"{node.input[index]}_smooth_{node.name or node.output[0]}"
    tensor = numpy_helper.from_array(value.astype(np.float32), name)
    graph.initializer.append(tensor)
    inits[name] = tensor
    node.input[index] = name
