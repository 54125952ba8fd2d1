"""From the verdict's evidence to the layers behind it: which nodes compute a failing output's channel group.

The harness judges a detector's ``[N, 4 + C, anchors]`` output per channel group and names the worst
(``output0, axis 1, channels 4-21: SQNR 8.5 dB``). :func:`feeders` walks the graph back from those channels
to the nodes that compute them, keeping track of which channels of each tensor are needed through the ops
that keep channels apart (Concat and Split on the channel axis, elementwise ops, Transpose, reshapes that
keep the axis, Sigmoid and Softmax over another axis); an op that mixes channels (a Conv, a MatMul) needs
all of its input. :func:`head` is what belongs to the failing channels rather than to the trunk that every
output shares: the nodes only they need, and the nodes where their channels still travel apart from the
others (a Concat of box and class logits, whose one int8 scale serves both). The in-house quantizer keeps
those float first (:func:`autodeploy.inhouse.quantize.mixed.find`), and NNCF's ``ignored_scope`` and
ORT's ``nodes_to_exclude`` are built from the same sets (:func:`.scope.float_scope`).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx

#: Ops that read each input element at the same index as the output's (with broadcasting): a channel of
#: the output needs the same channel of each input.
ELEMENTWISE = frozenset({
    "Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Mean", "Sum", "Where", "Equal", "Less", "Greater",
    "Sigmoid", "HardSigmoid", "Relu", "LeakyRelu", "PRelu", "Elu", "Selu", "Celu", "Clip", "Tanh", "Exp", "Log",
    "Sqrt", "Reciprocal", "Neg", "Abs", "Erf", "Softplus", "Softsign", "HardSwish", "Mish", "Gelu", "Identity",
    "Cast", "Floor", "Ceil", "Round", "Sign", "Not", "And", "Or",
    "QuantizeLinear", "DequantizeLinear",
})  # fmt: skip
#: Ops that keep axis 1 (channels) of an ``[N, C, ...]`` tensor apart: pooling and resizing work per channel.
PER_CHANNEL = frozenset({"MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "Resize", "Upsample",
                         "BatchNormalization", "LpPool", "Pad"})  # fmt: skip
#: Ops that normalize or reduce over one axis (``axis``): another axis's channels stay apart.
ONE_AXIS = frozenset({"Softmax", "LogSoftmax", "Hardmax", "CumSum", "ArgMax", "ArgMin"})
#: Ops that read the shape of their input, not its values.
SHAPE_OF = frozenset({"Shape", "Size"})
#: Ops that only move data: the traced axis maps to an input axis by the shapes (:func:`_reshaped_axis`).
RESHAPES = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze"})


@dataclass(frozen=True)
class Target:
    """Channels of one output the verdict failed: ``channels`` on ``axis``, or the whole output (``axis`` None);
    ``centred``: judged about their mean (the ``regression`` kind's error SNR)."""

    output: str
    axis: int | None = None
    channels: tuple[int, ...] = ()
    centred: bool = False

    def text(self) -> str:
        if self.axis is None:
            return f"output {self.output!r}"
        lo, hi = min(self.channels), max(self.channels)
        if len(self.channels) == 1:
            span = f"channel {lo}"
        elif len(self.channels) == hi - lo + 1:
            span = f"channels {lo}-{hi}"
        else:
            span = f"{len(self.channels)} channels ({', '.join(map(str, self.channels[:5]))}, ...)"
        return f"output {self.output!r}, axis {self.axis}, {span}"


#: A tensor's needed part: (axis, channels), or None for all of it.
_Need = tuple[int, frozenset[int]] | None


def static_shapes(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> dict[str, list[int]]:
    """Every tensor's shape at ``feeds``' shapes (ONNX shape inference; 0 where it cannot tell a dim)."""
    fixed = onnx.ModelProto()
    fixed.CopyFrom(model)
    for value in fixed.graph.input:
        if value.name in feeds and value.type.tensor_type.HasField("shape"):
            for dim, size in zip(value.type.tensor_type.shape.dim, np.shape(feeds[value.name]), strict=False):
                dim.Clear()
                dim.dim_value = int(size)
    try:
        graph = onnx.shape_inference.infer_shapes(fixed, data_prop=True).graph
    except Exception:  # noqa: BLE001 - a model shape inference refuses is traced without shapes
        graph = fixed.graph
    return {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
            for v in (*graph.input, *graph.value_info, *graph.output) if v.type.tensor_type.HasField("shape")}  # fmt: skip


def feeders(
    model: onnx.ModelProto, targets: Iterable[Target], shapes: Mapping[str, Sequence[int]]
) -> dict[str, bool]:
    """The nodes that compute ``targets``: node name -> whether all of its outputs are needed (``True``) or
    only some of their channels (``False``: the targets' channels pass through it beside others)."""
    graph = model.graph
    consts = {t.name for t in graph.initializer} | {n.output[0] for n in graph.node if n.op_type == "Constant"}
    needs: dict[str, _Need] = {}
    for t in targets:
        rank = len(shapes.get(t.output, ()))
        _add(needs, t.output, None if t.axis is None or not rank else (t.axis % rank, frozenset(t.channels)))
    found: dict[str, bool] = {}
    for node in reversed(graph.node):  # topological order: every reader of a tensor comes before it here
        wanted = [(i, needs[o]) for i, o in enumerate(node.output) if o in needs]
        if not wanted:
            continue
        found[node.name] = all(need is None for _, need in wanted) and len(wanted) == len([o for o in node.output if o])
        for name, need in _inputs_needed(node, wanted, shapes, consts):
            _add(needs, name, _whole_if_all(need, shapes.get(name)))
    return found


def head(
    model: onnx.ModelProto, failing: Sequence[Target], shapes: Mapping[str, Sequence[int]]
) -> list[str]:
    """The nodes that belong to the ``failing`` channels, not to the trunk every output shares, in graph
    order: those only they need, and those their channels pass through beside others' (needed in part)."""
    mine = feeders(model, failing, shapes)
    rest = feeders(model, _complement(model, failing, shapes), shapes)
    return [n.name for n in model.graph.node
            if n.name in mine and (n.name not in rest or not mine[n.name] or not rest[n.name])]  # fmt: skip


def _complement(
    model: onnx.ModelProto, failing: Sequence[Target], shapes: Mapping[str, Sequence[int]]
) -> list[Target]:
    """Every other output wholly, and the other channels of each failing output judged per channel group."""
    by_output: dict[str, list[Target]] = {}
    for t in failing:
        by_output.setdefault(t.output, []).append(t)
    out = []
    for o in (o.name for o in model.graph.output):
        ts = by_output.get(o)
        if not ts:
            out.append(Target(o))
            continue
        if any(t.axis is None for t in ts):
            continue
        axis = ts[0].axis
        dims = shapes.get(o, ())
        size = dims[axis] if axis is not None and -len(dims) <= axis < len(dims) else 0
        taken = {c for t in ts if t.axis == axis for c in t.channels}
        others = tuple(c for c in range(size) if c not in taken)
        if others:
            out.append(Target(o, axis, others))
    return out


def _whole_if_all(need: _Need, shape: Sequence[int] | None) -> _Need:
    """``None`` (all of it) where the channels are every channel of the axis."""
    if need is None or not shape or need[0] >= len(shape):
        return need
    return None if len(need[1]) >= shape[need[0]] > 0 else need


def _add(needs: dict[str, _Need], name: str, need: _Need) -> None:
    if not name:
        return
    if name not in needs:
        needs[name] = need
        return
    old = needs[name]
    if old is None or need is None or old[0] != need[0]:
        needs[name] = None
    else:
        needs[name] = (old[0], old[1] | need[1])


def _inputs_needed(
    node: onnx.NodeProto,
    wanted: list[tuple[int, _Need]],
    shapes: Mapping[str, Sequence[int]],
    consts: Collection[str],
) -> list[tuple[str, _Need]]:
    """What each input of ``node`` must supply for the ``wanted`` parts of its outputs."""
    activations = [i for i in node.input if i and i not in consts]
    whole = [(i, None) for i in activations]
    op = node.op_type
    if op in SHAPE_OF:  # reads its input's shape, never its values
        return []
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    if op == "Split":
        return _split(node, wanted, shapes, attrs)
    if any(need is None for _, need in wanted):
        return whole
    out_rank = len(shapes.get(node.output[0], ()))
    if len(wanted) > 1 or wanted[0][0] != 0:  # the other ops' channels are those of their first output
        return whole
    axis, channels = wanted[0][1]
    if op == "Concat":
        return _concat(node, axis, channels, shapes, consts, attrs)
    if op in ELEMENTWISE:
        return [(i, _broadcast(axis, channels, shapes.get(i), shapes.get(node.output[0]))) for i in activations]
    if op in PER_CHANNEL:
        return [(node.input[0], (axis, channels) if axis == 1 else None)] + [(i, None) for i in activations[1:]]
    if op in ONE_AXIS:
        along = attrs.get("axis", -1 if op not in ("ArgMax", "ArgMin") else 0) % max(out_rank, 1)
        return [(node.input[0], None if along == axis else (axis, channels))]
    if op == "Transpose":
        perm = attrs.get("perm") or list(reversed(range(out_rank)))
        return [(node.input[0], (perm[axis], channels))]
    if op in RESHAPES:
        moved = _reshaped_axis(shapes.get(node.input[0]), shapes.get(node.output[0]), axis)
        return [(node.input[0], None if moved is None else (moved, channels))] + [(i, None) for i in activations[1:]]
    return whole


def _split(node, wanted, shapes, attrs) -> list[tuple[str, _Need]]:
    """A Split's input part: the wanted outputs' channels, offset by the outputs before them on the split
    axis (a whole output: all of its channels there); the same channels where another axis is traced."""
    rank = len(shapes.get(node.input[0], ()))
    sizes = [(shapes.get(o) or [0] * rank)[attrs.get("axis", 0) % rank] if rank else 0 for o in node.output]
    if not rank or not all(sizes):
        return [(node.input[0], None)]
    along = attrs.get("axis", 0) % rank
    axes = {need[0] for _, need in wanted if need is not None}
    if axes and axes != {along}:  # another axis: the same channels of the input, from every output
        if len(axes) > 1 or any(need is None for _, need in wanted):
            return [(node.input[0], None)]
        return [(node.input[0], (axes.pop(), frozenset(c for _, need in wanted for c in need[1])))]
    channels: set[int] = set()
    for index, need in wanted:
        chosen = range(sizes[index]) if need is None else need[1]
        channels.update(sum(sizes[:index]) + c for c in chosen)
    return [(node.input[0], (along, frozenset(channels)))]


def _concat(node, axis, channels, shapes, consts, attrs) -> list[tuple[str, _Need]]:
    rank = len(shapes.get(node.output[0], ()))
    along = attrs.get("axis", 0) % max(rank, 1)
    inputs = [i for i in node.input if i]
    if along != axis:
        return [(i, (axis, channels)) for i in inputs if i not in consts]
    out, start = [], 0
    for i in inputs:
        size = (shapes.get(i) or [0] * rank)[axis] if rank else 0
        if not size:
            return [(j, None) for j in inputs if j not in consts]
        mine = frozenset(c - start for c in channels if start <= c < start + size)
        if mine and i not in consts:
            out.append((i, (axis, mine)))
        start += size
    return out


def _broadcast(axis: int, channels: frozenset[int], shape: Sequence[int] | None,
               out: Sequence[int] | None) -> _Need:  # fmt: skip
    """An elementwise input's part: the same channels where it has the axis at full size, else all of it."""
    if not shape or not out:
        return None
    moved = axis - (len(out) - len(shape))
    if moved < 0 or shape[moved] != out[axis] or shape[moved] <= 1:
        return None
    return (moved, channels)


def _reshaped_axis(before: Sequence[int] | None, after: Sequence[int] | None, axis: int) -> int | None:
    """The input axis that ``axis`` of a reshaped output is: same size, the same number of elements before it."""
    if not before or not after or axis >= len(after) or 0 in before or 0 in after:
        return None
    lead = int(np.prod(after[:axis], dtype=np.int64))
    for b in range(len(before)):
        if int(np.prod(before[:b], dtype=np.int64)) == lead and before[b] == after[axis]:
            return b
    return None
