"""QDQ insertion: QuantizeLinear/DequantizeLinear pairs on activations, int8 weights, int32 biases.

Activations are uint8 when asymmetric (ONNX Runtime's recommended U8S8: with int8 activations
its x86 fusions left 15 of MobileNetV2's 52 Conv and all its Adds unfused), int8 when symmetric.

Which tensors are quantized (the layout ONNX Runtime's and OpenVINO's QDQ fusions expect):

* the float activation inputs and outputs of :data:`QUANT_OPS` nodes, once per tensor; every
  consumer reads the dequantized copy except nodes kept in float by the fallback;
* weights of Conv/Gemm/MatMul (and ConvTranspose for OpenVINO): int8, symmetric, per output
  channel (or per tensor);
* biases of Conv and Gemm: int32 with scale ``input_scale * weight_scale`` (zero point 0);
* data-movement ops (:data:`SHARED_SCALE_OPS`) give their output the input's scale, so the
  runtime can run them on int8 unchanged;
* with asymmetric activations, a ``Relu`` or ``Clip(0, hi)`` right after a quantized node is
  folded into that node's output quantization (its zero point is the uint8 minimum, so the
  saturating QuantizeLinear is the activation) - what ORT's quantizer does too;
* graph outputs stay float;
* a node whose output a subgraph reads (an ``If``/``Loop``/``Scan`` branch, from the outer scope),
  and the data-movement ops leading to it, read their inputs float (:func:`float_readers`);
* OpenVINO placement: a tensor read only by depthwise convolutions is quantized per channel
  (axis 1), as NNCF does for OpenVINO's CPU plugin; its consumers' biases then stay float.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from autodeploy.inhouse.placement import PLACEMENTS

#: Ops whose inputs/outputs get QDQ. Weighted ops map to (weight input, bias input or None).
#: ConvTranspose's bias stays float: OpenVINO adds it as a post-op of its int8 kernel.
WEIGHTED_OPS = {"Conv": (1, 2), "Gemm": (1, 2), "MatMul": (1, None), "ConvTranspose": (1, None)}
#: Weighted ops only OpenVINO runs in int8 (ConvolutionBackpropData, as NNCF quantizes it); ONNX
#: Runtime's CPU provider has no QLinearConvTranspose, so QDQ there would only add rounding.
OPENVINO_ONLY_OPS = frozenset({"ConvTranspose"})
QUANT_OPS = frozenset(
    {
        *(op for op in WEIGHTED_OPS if op not in OPENVINO_ONLY_OPS),
        "Add",
        "Mul",
        "Relu",
        "Clip",
        "MaxPool",
        "AveragePool",
        "GlobalAveragePool",
        "Concat",
        "Flatten",
        "Reshape",
        "Transpose",
        "Squeeze",
        "Unsqueeze",
    }
)
#: Ops whose output is the shape (or size) of their input, never its values: what they feed is no activation.
SHAPE_OF = frozenset({"Shape", "Size"})
#: Elementwise ops quantized only between two activations: with a constant operand (a bias or
#: scale Add/Mul) neither runtime has an int8 kernel, so QDQ there only adds rounding.
BINARY_OPS = frozenset({"Add", "Mul"})
#: OpenVINO placement (NNCF's for CPU): a quantizer on the activation inputs of the ops with int8
#: kernels only; activations, bias/scale ops and data movement after them stay inside the fused
#: float post-ops of the producing Conv, so their outputs are never quantized.
OPENVINO_INPUT_OPS = frozenset({*WEIGHTED_OPS, *BINARY_OPS, "AveragePool", "GlobalAveragePool"})
#: Gate activations: a Mul of an activation by one of these is an SE block's channel gate or a
#: SiLU/Swish (``x * sigmoid(x)``), which OpenVINO fuses into one float op; NNCF's SE_BLOCK ignored
#: pattern leaves them (and the SE block's pool) unquantized on OpenVINO.
GATE_OPS = frozenset({"Sigmoid", "HardSigmoid"})
#: How far back from a gate the SE block's global pool is looked for (pool -> Conv -> act -> Conv -> gate).
SE_DEPTH = 8
SHARED_SCALE_OPS = frozenset({"MaxPool", "Flatten", "Reshape", "Transpose", "Squeeze", "Unsqueeze"})
INT8_MIN, INT8_MAX = -128, 127
UINT8_MAX = 255
WEIGHT_MAX = 127  # symmetric weights use [-127, 127] so the range is centered on zero
#: 7-bit weights: u8s8/s8s8 kernels on x86 CPUs without VNNI add pairs of products in int16
#: and saturate with full-range weights; ONNX Runtime's docs advise reduce_range there.
REDUCED_WEIGHT_MAX = 63


@dataclass(frozen=True)
class QParams:
    scale: float | np.ndarray  # an array: one per channel on axis 1
    zero_point: int | np.ndarray
    unsigned: bool = False  # uint8 (asymmetric activations) or int8 (symmetric, weights)

    @property
    def per_channel(self) -> bool:
        return np.ndim(self.scale) == 1


def activation_qparams(lo: float | np.ndarray, hi: float | np.ndarray, symmetric: bool) -> QParams:
    """Scale and zero point covering ``[lo, hi]`` (widened to include 0); arrays of per-channel
    bounds give per-channel scales and zero points.

    Asymmetric activations are uint8 (ONNX Runtime's recommended U8S8 on x86; OpenVINO takes
    either), symmetric ones int8 with zero point 0.
    """
    lo, hi = np.minimum(lo, 0.0), np.maximum(hi, 0.0)
    scale = np.maximum(-lo, hi) / INT8_MAX if symmetric else (hi - lo) / UINT8_MAX
    # A channel (or tensor) that is all zeros gets scale 1; any scale quantizes zero exactly.
    scale = np.where(np.isfinite(scale) & (scale > 0), scale, 1.0)
    zero_point = np.zeros(np.shape(scale), np.int64)
    if not symmetric:
        zero_point = np.clip(np.round(-lo / scale), 0, UINT8_MAX).astype(np.int64)
    scale = scale.astype(np.float32)
    if scale.ndim:
        return QParams(scale, zero_point, not symmetric)
    return QParams(float(scale), int(zero_point), not symmetric)


def quantize_weight(w: np.ndarray, axis: int | None, qmax: int = WEIGHT_MAX) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int8 weights in ``[-qmax, qmax]``: (int8 array, float32 scales per channel along ``axis`` or one)."""
    if axis is None:
        amax = np.array(np.abs(w).max(initial=0.0))
    else:
        amax = np.abs(np.moveaxis(w, axis, 0).reshape(w.shape[axis], -1)).max(axis=1, initial=0.0)
    # A channel of (near) zeros gets scale 1: a denormal scale underflows the int32 bias scale.
    scale = np.where(amax > 1e-30, amax / qmax, 1.0).astype(np.float32)
    shape = [1] * w.ndim
    if axis is not None:
        shape[axis] = -1
    q = np.clip(np.round(w / scale.reshape(shape)), -qmax, qmax).astype(np.int8)
    return q, scale


@dataclass(frozen=True)
class Plan:
    """What to quantize in one model: nodes (by name) and activation tensors."""

    nodes: tuple[str, ...]
    weighted: tuple[str, ...]
    tensors: tuple[str, ...]
    foldable: Mapping[str, float] = field(default_factory=dict)  # Relu/Clip output -> upper bound
    #: The runtime (:data:`autodeploy.inhouse.placement.PLACEMENTS`): with ``qlinear`` every reader of a quantized
    #: tensor reads it dequantized, else only the quantized readers do.
    placement: str = "onnxruntime"
    #: Tensors quantized per channel (axis 1): read only by depthwise convolutions (OpenVINO).
    per_channel: tuple[str, ...] = ()
    #: Nodes that read their inputs float even where the producer is quantized (:func:`float_readers`).
    float_readers: tuple[str, ...] = ()


def name_nodes(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy where every node has a unique name (fallback and reports refer to nodes by name)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    seen: set[str] = set()
    for i, node in enumerate(out.graph.node):
        if not node.name or node.name in seen:
            node.name = f"{node.op_type}_{i}"
        seen.add(node.name)
    return out


def quantized_ops(placement: str) -> frozenset[str]:
    """The ops ``placement`` quantizes: :data:`QUANT_OPS` around which a QLinear kernel is fused, or the inputs of
    :data:`OPENVINO_INPUT_OPS` (NNCF's layout) (:data:`autodeploy.inhouse.placement.PLACEMENTS`)."""
    return QUANT_OPS if PLACEMENTS[placement].qlinear else OPENVINO_INPUT_OPS


def plan(model: onnx.ModelProto, placement: str = "onnxruntime") -> Plan:
    """The candidate nodes and tensors of a model whose nodes are named (see :func:`name_nodes`).

    ``placement`` (a runtime of :data:`autodeploy.inhouse.placement.PLACEMENTS`) follows what it fuses into
    integer kernels:

    * ``qlinear`` (``onnxruntime``: its ``quantize_static`` QDQ layout): inputs *and* outputs of the ops in
      :data:`QUANT_OPS`, so each ``DQ -> op -> Q`` becomes a QLinear kernel;
    * otherwise (``openvino``: NNCF's CPU layout): inputs of :data:`OPENVINO_INPUT_OPS` only; OpenVINO
      fuses the ``FakeQuantize`` into the producer's output as a post-op; ``nncf`` adds NNCF's other rules.
    """
    if placement not in PLACEMENTS:
        raise ValueError(f"placement must be one of {', '.join(PLACEMENTS)}, got {placement!r}")
    graph = model.graph
    consts = constants(graph)
    floats = _float_tensors(model)
    outputs = {o.name for o in graph.output}
    rules = PLACEMENTS[placement]
    ops = quantized_ops(placement)
    gated = _gated(graph, consts) if rules.nncf else set()
    float_in = float_readers(graph)
    fixed = constant_derived(graph, consts)
    nodes = [
        n
        for n in graph.node
        if n.op_type in ops and n.domain in ("", "ai.onnx") and _int8_node(n, fixed)
        and n.name not in gated and n.name not in float_in
    ]  # fmt: skip
    crossed: set[str] = set()
    if rules.nncf:
        pools = _pools_to_cross(graph, nodes, outputs)
        crossed = {p.output[0] for p in pools}
        chosen = {id(n) for n in (*nodes, *pools)}
        nodes = [n for n in graph.node if id(n) in chosen]  # graph order
    tensors: list[str] = []
    for node in nodes:
        quantized_outputs = list(node.output[:1]) if rules.qlinear else []
        for name in _activation_inputs(node, consts) + quantized_outputs:
            if name and name in floats and name not in consts and name not in tensors and name not in crossed:
                tensors.append(name)
    weighted = tuple(n.name for n in nodes if _weight(n, consts) is not None)
    kept = tuple(t for t in tensors if t not in outputs)
    return Plan(
        tuple(n.name for n in nodes),
        weighted,
        kept,
        _foldable(graph, consts, outputs) if rules.qlinear else {},
        placement,
        _depthwise_inputs(nodes, consts, kept) if rules.nncf else (),
        tuple(sorted(float_in)),
    )


def _pools_to_cross(
    graph: onnx.GraphProto, nodes: list[onnx.NodeProto], outputs: Collection[str]
) -> list[onnx.NodeProto]:
    """OpenVINO placement: the MaxPools whose output only quantized nodes read. Their quantizer goes on the
    pool's input instead (NNCF's place for it): the max of int8 values is the int8 max, so the numbers are the
    same, and OpenVINO then runs the pool in u8 and fuses the quantizer into the Conv before it. With the
    quantizer after the pool, ResNet-50's stem Conv wrote its 112x112x64 output in f32 for a f32 MaxPool and a
    FakeQuantize of its own (``benchmarks/int8_profile.py``: ``Convolution u8->f32``, ``Pooling f32``)."""
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    planned = {id(n) for n in nodes}
    return [
        n for n in graph.node
        if n.op_type == "MaxPool" and len(n.output) == 1 and n.output[0] not in outputs and readers.get(n.output[0])
        and all(id(r) in planned for r in readers[n.output[0]])
    ]  # fmt: skip


def _depthwise_inputs(
    nodes: list[onnx.NodeProto], consts: Mapping[str, np.ndarray], tensors: Collection[str]
) -> tuple[str, ...]:
    """Of ``tensors``, those whose every quantized reader is a depthwise Conv (one input channel per
    group): OpenVINO's CPU plugin takes their quantizer per channel (NNCF's ``q8_a_ch``). ONNX
    Runtime's QLinearConv takes one input scale, so its placement never asks for this."""
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in nodes:
        for name in _activation_inputs(node, consts):
            readers.setdefault(name, []).append(node)
    return tuple(t for t in tensors if readers.get(t) and all(is_depthwise(n, consts) for n in readers[t]))


def is_depthwise(node: onnx.NodeProto, consts: Mapping[str, np.ndarray]) -> bool:
    """A Conv with one input channel per group and one output channel per input channel."""
    if node.op_type != "Conv" or node.input[1] not in consts:
        return False
    group = next((a.i for a in node.attribute if a.name == "group"), 1)
    w = consts[node.input[1]]
    return group > 1 and w.ndim >= 2 and w.shape[1] == 1 and w.shape[0] == group


def why_float(model: onnx.ModelProto, placement: str = "onnxruntime") -> dict[str, str]:
    """For a model with nothing to quantize: each op type and why it stays float."""
    consts = constants(model.graph)
    fixed = constant_derived(model.graph, consts)
    floats = _float_tensors(model)
    ops = quantized_ops(placement)
    reasons: dict[str, str] = {}
    for node in model.graph.node:
        if node.op_type == "Constant" or node.op_type in reasons:
            continue
        if node.domain not in ("", "ai.onnx") or node.op_type not in ops:
            reasons[node.op_type] = (
                f"no int8 kernel for {node.domain or 'ai.onnx'}::{node.op_type} on {placement}"
            )
        elif not _int8_node(node, fixed):
            reasons[node.op_type] = "an elementwise op with a constant operand has no int8 kernel"
        elif not any(i in floats for i in [*node.input, *node.output] if i and i not in consts):
            reasons[node.op_type] = "no float32 activation to quantize"
        else:
            reasons[node.op_type] = "its activations are graph outputs, which stay float"
    return reasons


def float_readers(graph: onnx.GraphProto) -> set[str]:
    """Names of the nodes that read their inputs float: each whose output a subgraph reads
    (:func:`read_by_subgraphs`), and the chain of data-movement ops (:data:`SHARED_SCALE_OPS`) before it.

    ONNX Runtime 1.32 aborts (a ``std::vector`` assertion, SIGABRT) building a session where a
    DequantizeLinear feeds a Squeeze, Unsqueeze or Transpose whose output an ``If`` branch reads
    (silero-vad's LSTM state); and a QDQ pair on such an output could not be placed anyway, since
    only the outer graph's readers are rewired, so quantizing these nodes buys nothing.
    """
    outer = read_by_subgraphs(graph)
    producer = {o: n for n in graph.node for o in n.output}
    todo = [producer[t] for t in outer if t in producer]
    out: set[str] = set()
    while todo:
        node = todo.pop()
        if node.name not in out:
            out.add(node.name)
            first = producer.get(node.input[0]) if node.input else None
            if first is not None and first.op_type in SHARED_SCALE_OPS:
                todo.append(first)
    return out


def read_by_subgraphs(graph: onnx.GraphProto) -> set[str]:
    """Tensor names that the subgraphs of ``graph``'s nodes (``If`` branches, ``Loop``/``Scan`` bodies,
    nested ones included) read or return; those of ``graph`` they read from its scope."""
    names: set[str] = set()
    for node in graph.node:
        for attr in node.attribute:
            subgraphs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
            for sub in subgraphs:
                names.update(i for n in sub.node for i in n.input if i)
                names.update(o.name for o in sub.output)
                names |= read_by_subgraphs(sub)
    return names


def _gated(graph: onnx.GraphProto, consts: Mapping[str, np.ndarray]) -> set[str]:
    """Names of the gate Muls (activation x Sigmoid/HardSigmoid) and of the SE blocks' global pools
    that feed their gates: on OpenVINO they stay float, as NNCF leaves them (see :data:`GATE_OPS`)."""
    producer = {o: n for n in graph.node for o in n.output}
    out: set[str] = set()
    for node in graph.node:
        if node.op_type != "Mul" or not _int8_node(node, consts):
            continue
        gates = [producer[i] for i in node.input if i in producer and producer[i].op_type in GATE_OPS]
        if not gates:
            continue
        out.add(node.name)
        current = gates[0]
        for _ in range(SE_DEPTH):  # back along the gate's first activation input to the pool
            ins = [i for i in current.input if i and i not in consts and i in producer]
            if not ins:
                break
            current = producer[ins[0]]
            if current.op_type in ("GlobalAveragePool", "ReduceMean"):
                out.add(current.name)
                break
    return out


def _int8_node(node: onnx.NodeProto, consts: Collection[str]) -> bool:
    """Whether a runtime has an int8 kernel for the node: Add/Mul only between two activations."""
    if node.op_type in BINARY_OPS:
        return sum(1 for i in node.input if i and i not in consts) == 2
    return True


def insert_qdq(
    model: onnx.ModelProto,
    the_plan: Plan,
    ranges: Mapping[str, tuple[float, float]],
    *,
    symmetric: bool,
    per_channel: bool = True,
    reduce_range: bool = False,
    keep_float: Collection[str] = (),
) -> onnx.ModelProto:
    """A QDQ copy of ``model`` (nodes named) quantizing ``the_plan`` except the ``keep_float`` nodes."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    consts = constants(graph)
    active = {n for n in the_plan.nodes if n not in keep_float}
    folded = {} if symmetric else _fold_activations(graph, active, the_plan.foldable, ranges)
    by_name = {n.name: n for n in graph.node}  # after folding: it rebuilds the node list
    qparams = _tensor_qparams(graph, active, the_plan, ranges, folded, symmetric)
    builder = _Builder(graph)
    for name in active & set(the_plan.weighted):
        _quantize_weights(by_name[name], consts, qparams, builder, per_channel, reduce_range)
    readers = _rewire(graph, qparams, {*keep_float, *the_plan.float_readers}, folded,
                      None if PLACEMENTS[the_plan.placement].qlinear else active)  # fmt: skip
    builder.emit(graph, {t: q for t, q in qparams.items() if t in readers}, readers)
    drop_unused_initializers(graph)
    _ensure_opset(out, 13)
    return out


# -- planning helpers -----------------------------------------------------------------------


def constants(graph: onnx.GraphProto) -> dict[str, np.ndarray]:
    """Initializers (not overridable by an input) and Constant outputs, as arrays."""
    inputs = {i.name for i in graph.input}
    consts = {t.name: numpy_helper.to_array(t) for t in graph.initializer if t.name not in inputs}
    for node in graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            consts[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    return consts


def constant_derived(graph: onnx.GraphProto, consts: Mapping[str, np.ndarray]) -> frozenset[str]:
    """``consts`` and every tensor computed from them and from shapes alone (an ``Unsqueeze`` of an
    initializer, a grid ``Range``d over a feature map's ``Shape``): a constant operand for
    :func:`_int8_node`. A detector's anchors, ``Unsqueeze(anchors[2, A])``, added to its box distances
    got QDQ on both operands, and OpenVINO 2026.4's compiler threw in its ``AddTransformation``
    (``index < m_inputs.size()``) at any batch; YOLOv8 (nudenet's ``320n.onnx``) computes its anchors
    from the feature maps' ``Shape`` (dynamic height and width), and threw the same at ``/model.22/Add_10``."""
    fixed = set(consts)
    subgraphs = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
    for node in graph.node:  # topological order
        if any(a.type in subgraphs for a in node.attribute):
            continue  # an If/Loop branch may read activations of the outer graph
        if node.op_type in SHAPE_OF or (any(node.input) and all(i in fixed for i in node.input if i)):
            fixed.update(o for o in node.output if o)
    return frozenset(fixed)


def _float_tensors(model: onnx.ModelProto) -> set[str]:
    inferred = onnx.shape_inference.infer_shapes(model)
    infos = [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]
    return {v.name for v in infos if v.type.tensor_type.elem_type == TensorProto.FLOAT}


def _activation_inputs(node: onnx.NodeProto, consts: Mapping[str, np.ndarray]) -> list[str]:
    if node.op_type in WEIGHTED_OPS:
        return [i for i in node.input[:2] if i and i not in consts]
    if node.op_type in ("Reshape", "Clip", "Squeeze", "Unsqueeze"):
        return list(node.input[:1])
    return [i for i in node.input if i]


def _weight(node: onnx.NodeProto, consts: Mapping[str, np.ndarray]) -> str | None:
    if node.op_type not in WEIGHTED_OPS or len(node.input) < 2:
        return None
    if node.input[0] in consts:
        return None  # a constant left operand (MatMul(W, x)) is left to ORT
    w = node.input[1]
    return w if w in consts and consts[w].dtype == np.float32 and consts[w].ndim >= 2 else None


def _foldable(
    graph: onnx.GraphProto, consts: Mapping[str, np.ndarray], outputs: set[str]
) -> dict[str, float]:
    """Relu / Clip(0, hi) outputs whose input comes from another node used only by them."""
    uses: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            uses[name] = uses.get(name, 0) + 1
    producers = {o: n for n in graph.node for o in n.output}
    foldable = {}
    for node in graph.node:
        if node.op_type not in ("Relu", "Clip") or node.input[0] not in producers:
            continue
        if uses.get(node.input[0], 0) != 1 or node.input[0] in outputs or node.output[0] in outputs:
            continue
        upper = _relu_upper(node, consts)
        if upper is not None:
            foldable[node.output[0]] = upper
    return foldable


def _relu_upper(node: onnx.NodeProto, consts: Mapping[str, np.ndarray]) -> float | None:
    if node.op_type == "Relu":
        return float("inf")
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if attrs:  # opset < 11 Clip
        lo, hi = attrs.get("min", float(np.finfo(np.float32).min)), attrs.get("max", float("inf"))
    else:
        bounds = [consts.get(i) if i else None for i in (list(node.input[1:]) + ["", ""])[:2]]
        if any(i and b is None for i, b in zip(node.input[1:3], bounds, strict=False)):
            return None
        lo = float(bounds[0]) if bounds[0] is not None else float(np.finfo(np.float32).min)
        hi = float(bounds[1]) if bounds[1] is not None else float("inf")
    return hi if lo == 0.0 else None


def _fold_activations(
    graph: onnx.GraphProto,
    active: set[str],
    foldable: Mapping[str, float],
    ranges: Mapping[str, tuple[float, float]],
) -> dict[str, float]:
    """Drop each foldable Relu/Clip whose producer is quantized; return {output: upper bound}."""
    producers = {o: n for n in graph.node for o in n.output}
    folded: dict[str, float] = {}
    keep = []
    for node in graph.node:
        upper = foldable.get(node.output[0]) if node.output else None
        producer = producers.get(node.input[0]) if node.input else None
        if (
            upper is not None
            and node.name in active
            and producer is not None
            and producer.name in active
            and node.output[0] in ranges
        ):
            producer.output[list(producer.output).index(node.input[0])] = node.output[0]
            folded[node.output[0]] = upper
            continue
        keep.append(node)
    del graph.node[:]
    graph.node.extend(keep)
    return folded


def _tensor_qparams(
    graph: onnx.GraphProto,
    active: set[str],
    the_plan: Plan,
    ranges: Mapping[str, tuple[float, float]],
    folded: Mapping[str, float],
    symmetric: bool,
) -> dict[str, QParams]:
    """Quantization parameters of every tensor that gets a QDQ pair, in graph order."""
    wanted = set(the_plan.tensors)
    touching: set[str] = set()
    for node in graph.node:
        if node.name in active:
            touching.update(node.input)
            touching.update(node.output[:1])
    qparams: dict[str, QParams] = {}
    for name in the_plan.tensors:
        if name in touching and name in ranges and name in wanted:
            lo, hi = ranges[name]
            if name in folded:  # the QuantizeLinear is the activation: exact zero, clipped top
                lo, hi = 0.0, min(hi, folded[name])
            qparams[name] = activation_qparams(lo, hi, symmetric)
    for node in graph.node:  # data movement keeps its input's scale
        if node.name in active and node.op_type in SHARED_SCALE_OPS and node.input[0] in qparams:
            if node.output[0] in qparams:
                qparams[node.output[0]] = qparams[node.input[0]]
    return qparams


# -- emitting ---------------------------------------------------------------------------------


class _Builder:
    """Collects new initializers and the nodes to insert after each producer."""

    def __init__(self, graph: onnx.GraphProto) -> None:
        self.taken = {t.name for t in graph.initializer} | {o for n in graph.node for o in n.output}
        self.taken |= {i.name for i in graph.input}
        self.initializers: list[onnx.TensorProto] = []
        self.weight_nodes: dict[str, list[onnx.NodeProto]] = {}  # consumer node -> DQ nodes before it

    def unique(self, base: str) -> str:
        name, i = base, 0
        while name in self.taken:
            i += 1
            name = f"{base}_{i}"
        self.taken.add(name)
        return name

    def constant(self, base: str, array: np.ndarray) -> str:
        name = self.unique(base)
        self.initializers.append(numpy_helper.from_array(array, name))
        return name

    def emit(
        self, graph: onnx.GraphProto, qparams: Mapping[str, QParams], readers: Mapping[str, str]
    ) -> None:
        pairs: dict[str, list[onnx.NodeProto]] = {}
        for tensor, q in qparams.items():
            scale = self.constant(f"{tensor}_scale", np.array(q.scale, np.float32))
            zero = self.constant(
                f"{tensor}_zero_point", np.array(q.zero_point, np.uint8 if q.unsigned else np.int8)
            )
            quantized = self.unique(f"{tensor}_quantized")
            axis = {"axis": 1} if q.per_channel else {}
            pairs[tensor] = [
                helper.make_node(
                    "QuantizeLinear", [tensor, scale, zero], [quantized], self.unique(f"{tensor}_Q"), **axis
                ),
                helper.make_node(
                    "DequantizeLinear",
                    [quantized, scale, zero],
                    [readers[tensor]],
                    self.unique(f"{tensor}_DQ"),
                    **axis,
                ),
            ]
        graph.initializer.extend(self.initializers)
        nodes: list[onnx.NodeProto] = []
        for name in (i.name for i in graph.input):
            nodes.extend(pairs.pop(name, []))
        for node in graph.node:
            nodes.extend(self.weight_nodes.get(node.name, []))
            nodes.append(node)
            for output in node.output:
                nodes.extend(pairs.pop(output, []))
        del graph.node[:]
        graph.node.extend(nodes)


def _rewire(
    graph: onnx.GraphProto,
    qparams: Mapping[str, QParams],
    keep_float: Collection[str],
    folded: Collection[str],
    only: Collection[str] | None = None,
) -> dict[str, str]:
    """Point consumers at the dequantized tensors; return tensor -> dequantized name.

    With ``only``, just those consumers read the dequantized copy (the quantizer sits on their
    input edge). Tensors that no consumer reads dequantized (all of them kept in float) are left out.
    """
    taken = {o for n in graph.node for o in n.output} | {i.name for i in graph.input}
    readers: dict[str, str] = {}
    for node in graph.node:
        # A float node reads the float tensor, unless a folded activation made the float tensor
        # the pre-activation value: then only the dequantized one is correct.
        for i, name in enumerate(node.input):
            reads = node.name not in keep_float if only is None else node.name in only
            if name in qparams and (reads or name in folded):
                if name not in readers:
                    readers[name] = _unique(f"{name}_dequantized", taken)
                node.input[i] = readers[name]
    return readers


def _unique(base: str, taken: set[str]) -> str:
    name, i = base, 0
    while name in taken:
        i += 1
        name = f"{base}_{i}"
    taken.add(name)
    return name


def _quantize_weights(
    node: onnx.NodeProto,
    consts: Mapping[str, np.ndarray],
    qparams: Mapping[str, QParams],
    builder: _Builder,
    per_channel: bool,
    reduce_range: bool,
) -> None:
    w_name = node.input[1]
    w = consts[w_name]
    axis = _channel_axis(node, w) if per_channel else None
    q, scale = quantize_weight(w, axis, REDUCED_WEIGHT_MAX if reduce_range else WEIGHT_MAX)
    nodes = [_dequantize(builder, f"{w_name}_{node.name}", q, scale, axis, np.int8, node, 1)]
    bias = _bias(node, consts)
    x_q = qparams.get(node.input[0])
    if bias is not None and x_q is not None and not x_q.per_channel:
        b_scale = (x_q.scale * scale * np.ones(len(consts[bias]))).astype(np.float32)
        b_q = np.round(consts[bias] / b_scale)
        if np.abs(b_q).max(initial=0) < 2**31 - 1:
            nodes.append(
                _dequantize(
                    builder, f"{bias}_{node.name}", b_q.astype(np.int32), b_scale, 0, np.int32, node, 2
                )
            )
    builder.weight_nodes[node.name] = nodes


def _dequantize(
    builder: _Builder,
    base: str,
    q: np.ndarray,
    scale: np.ndarray,
    axis: int | None,
    dtype: type,
    node: onnx.NodeProto,
    index: int,
) -> onnx.NodeProto:
    q_name = builder.constant(f"{base}_quantized", q)
    s_name = builder.constant(f"{base}_scale", scale.astype(np.float32))
    z_name = builder.constant(f"{base}_zero_point", np.zeros(scale.shape, dtype))
    out = builder.unique(f"{base}_dequantized")
    node.input[index] = out
    attrs = {"axis": axis} if axis is not None and scale.ndim == 1 else {}
    return helper.make_node(
        "DequantizeLinear", [q_name, s_name, z_name], [out], builder.unique(f"{base}_DQ"), **attrs
    )


def _channel_axis(node: onnx.NodeProto, w: np.ndarray) -> int | None:
    if node.op_type == "Conv":
        return 0
    if node.op_type == "ConvTranspose":  # [C_in, C_out / group, kH, kW]: output channels on axis 1
        group = next((a.i for a in node.attribute if a.name == "group"), 1)
        return 1 if group == 1 else None  # grouped: axis 1 is not one output channel per scale
    if node.op_type == "Gemm":
        trans_b = next((a.i for a in node.attribute if a.name == "transB"), 0)
        return 0 if trans_b else 1
    return w.ndim - 1  # MatMul: one scale per output column


def _bias(node: onnx.NodeProto, consts: Mapping[str, np.ndarray]) -> str | None:
    index = WEIGHTED_OPS[node.op_type][1]
    if index is None or len(node.input) <= index or node.input[index] not in consts:
        return None
    bias = consts[node.input[index]]
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if (
        bias.ndim != 1
        or bias.dtype != np.float32
        or attrs.get("alpha", 1.0) != 1.0
        or attrs.get("beta", 1.0) != 1.0
    ):
        return None
    return node.input[index]


def drop_unused_initializers(graph: onnx.GraphProto) -> None:
    used = {i for n in graph.node for i in n.input} | {o.name for o in graph.output}
    used |= {i for n in graph.node for a in n.attribute if a.g.node for m in a.g.node for i in m.input}
    keep = [t for t in graph.initializer if t.name in used]
    del graph.initializer[:]
    graph.initializer.extend(keep)


def _ensure_opset(model: onnx.ModelProto, version: int) -> None:
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx") and imp.version < version:
            raise ValueError(
                f"QDQ per-channel quantization needs opset {version}, the model has {imp.version}"
            )
