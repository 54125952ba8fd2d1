"""How far a result is from this machine's limit: the operations a model does, counted from its graph, and
the records of what a measurement achieved against what each precision can reach here.

:func:`count_ops` reads the multiply-accumulates (MACs) of the ops that carry a network's arithmetic,
Conv, ConvTranspose, MatMul, Gemm, attention (ONNX's ``Attention``, ONNX Runtime's ``Attention`` and
``MultiHeadAttention``), Einsum and the recurrent cells, and their integer forms (``QLinearConv``,
``MatMulInteger``, ...), from onnx shape inference at the measured input shapes. Operations are
``2 x MACs`` (a multiply and an add), the unit every GOP/s here is in. Elementwise ops, pooling and
normalization are not counted: they are memory-bound, and the peak they would be measured against is
the compute peak of a MatMul or a Conv.

:class:`Peaks` is what the microbenchmark measured on one device (``harness/peaks.py``: a MatMul and a
Conv per engine and precision); :class:`Roofline` one measurement's achieved GOP/s and its share of its
precision's peak (``Measurement.roofline``). The records live here, below the harness, the store, the
search and the CLI that all read them; this module imports only the standard library, the scenarios' table
(:mod:`autodeploy.objectives`, itself standard library only) and, inside its functions, onnx.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autodeploy.objectives import scenario_of

if TYPE_CHECKING:
    import onnx

#: The precisions the microbenchmark measures, in the order they are shown.
PRECISIONS = ("fp32", "bf16", "fp16", "int8")
#: An initializer with more elements than this is given to shape inference as a typed input, without its
#: values: only its shape matters, and a model's weights (up to gigabytes) are not copied. Small ones keep
#: their values, which shape inference reads (a Reshape's target shape, a Slice's bounds).
_VALUES_KEPT = 1024
#: Ops with a subgraph: what runs inside is not counted (how often a Loop's body runs is a value, not a shape).
_SUBGRAPH_OPS = frozenset({"If", "Loop", "Scan"})
#: The ops whose MACs are counted, by domain ("" is ONNX's default domain).
_DEFAULT, _MS = "", "com.microsoft"


def peak_precision(precision: str) -> str:
    """The precision whose peak a config's precision is held to: ``int8-dynamic`` (LiteRT's dynamic-range
    int8, whose kernels multiply in int8) is ``int8``; the others are themselves."""
    return precision.split("-", 1)[0]


@dataclass(frozen=True)
class OpCount:
    """The MACs one call of a model does at one set of input shapes.

    Attributes:
        macs: multiply-accumulates of every op counted.
        by_op: MACs by op type (``{"Conv": ..., "Gemm": ...}``).
        uncounted: the ops that do arithmetic but could not be counted, each ``"Type name"`` (a shape shape
            inference left open, a Loop's body): the count is then a floor, and says so.
    """

    macs: int
    by_op: Mapping[str, int] = field(default_factory=dict)
    uncounted: tuple[str, ...] = ()

    @property
    def ops(self) -> int:
        """Operations: 2 x MACs (a multiply and an add each)."""
        return 2 * self.macs

    @property
    def gop(self) -> float:
        """Operations in billions (GOP): what one call costs, the numerator of every GOP/s."""
        return self.ops / 1e9


def count_ops(model: onnx.ModelProto | str | Path, shapes: Mapping[str, Sequence[int]] | None = None) -> OpCount:
    """The MACs of one call of ``model`` with its inputs at ``shapes`` (``{input: dims}``; inputs not named keep
    the dims the model declares).

    Shapes come from onnx shape inference (``data_prop``: a Reshape's computed target counts), run on a
    copy whose large weights are typed inputs without values, so the model's weights are neither copied
    nor needed (external data is never read). An op whose shapes stay open is listed in ``uncounted``.
    """
    import onnx

    proto = model if isinstance(model, onnx.ModelProto) else onnx.load(str(model), load_external_data=False)
    inferred = _inferred(proto, shapes or {})
    known = _shapes(inferred.graph)
    counted: dict[str, int] = {}
    uncounted: list[str] = []
    for node in inferred.graph.node:
        rule = _RULES.get(_key(node))
        if rule is None:
            if node.op_type in _SUBGRAPH_OPS and _has_arithmetic(node):
                uncounted.append(f"{node.op_type} {node.name or node.output[0]}")
            continue
        try:
            macs = rule(node, known)
        except _Open:
            uncounted.append(f"{node.op_type} {node.name or node.output[0]}")
            continue
        counted[node.op_type] = counted.get(node.op_type, 0) + macs
    return OpCount(sum(counted.values()), counted, tuple(uncounted))


class _Open(Exception):
    """A shape an op's count needs is not known."""


def _inferred(proto: onnx.ModelProto, shapes: Mapping[str, Sequence[int]]) -> onnx.ModelProto:
    """A copy of ``proto`` with its inputs at ``shapes``, its large initializers typed inputs without values,
    its shapes inferred."""
    import onnx
    from onnx import helper

    graph = _light_copy(proto.graph)
    for value in graph.input:
        if value.name in shapes and value.type.HasField("tensor_type"):
            dims = value.type.tensor_type.shape
            dims.ClearField("dim")
            for d in shapes[value.name]:
                dims.dim.add().dim_value = int(d)
    light = helper.make_model(graph, opset_imports=list(proto.opset_import), ir_version=proto.ir_version)
    light.functions.extend(proto.functions)
    return onnx.shape_inference.infer_shapes(light, strict_mode=False, data_prop=True)


def _light_copy(source: onnx.GraphProto) -> onnx.GraphProto:
    """A copy of ``source`` whose initializers of more than :data:`_VALUES_KEPT` elements (or stored outside
    the file) are typed graph inputs."""
    import onnx
    from onnx import helper

    graph = onnx.GraphProto()
    heavy = {t.name: t for t in source.initializer
             if math.prod(t.dims) > _VALUES_KEPT or t.data_location == 1}  # 1: EXTERNAL  # fmt: skip
    graph.name = source.name
    graph.node.extend(source.node)
    graph.input.extend(v for v in source.input if v.name not in heavy)
    graph.input.extend(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in heavy.values())
    graph.output.extend(source.output)
    graph.value_info.extend(source.value_info)
    graph.initializer.extend(t for t in source.initializer if t.name not in heavy)
    graph.sparse_initializer.extend(source.sparse_initializer)
    return graph


def _shapes(graph: onnx.GraphProto) -> dict[str, tuple[int, ...] | None]:
    """Every value's shape where all its dims are numbers, else ``None``."""
    found: dict[str, tuple[int, ...] | None] = {}
    for value in (*graph.input, *graph.value_info, *graph.output):
        t = value.type.tensor_type
        if not t.HasField("shape"):
            found.setdefault(value.name, None)
            continue
        dims = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in t.shape.dim)
        found[value.name] = None if any(d < 0 for d in dims) else dims
    for init in graph.initializer:
        found[init.name] = tuple(init.dims)
    return found


def _key(node: onnx.NodeProto) -> tuple[str, str]:
    """``(domain, op type)``, ONNX's default domain written ``""`` however the model spells it."""
    return (_DEFAULT if node.domain in ("", "ai.onnx") else node.domain), node.op_type


def _has_arithmetic(node: onnx.NodeProto) -> bool:
    """Whether a subgraph of ``node`` holds an op this module counts."""
    for attr in node.attribute:
        for sub in (*([attr.g] if attr.HasField("g") else []), *attr.graphs):
            if any(_key(n) in _RULES or _has_arithmetic(n) for n in sub.node):
                return True
    return False


def _shape(known: Mapping[str, tuple[int, ...] | None], node: onnx.NodeProto, index: int, *,
           output: bool = False) -> tuple[int, ...]:  # fmt: skip
    names = node.output if output else node.input
    name = names[index] if index < len(names) else ""
    shape = known.get(name) if name else None
    if shape is None:
        raise _Open(name)
    return shape


def _optional(known: Mapping[str, tuple[int, ...] | None], node: onnx.NodeProto, index: int) -> tuple[int, ...] | None:
    present = index < len(node.input) and node.input[index]
    return _shape(known, node, index) if present else None


def _attr(node: onnx.NodeProto, name: str, default: Any) -> Any:
    from onnx import helper

    return next((helper.get_attribute_value(a) for a in node.attribute if a.name == name), default)


def _conv(w: int):
    """Conv and its integer forms: every output element sums ``C/group x kernel`` products (``W`` is
    ``[M, C/group, k...]``), so grouped and depthwise convolutions count what they compute."""
    def rule(node: onnx.NodeProto, known: Mapping[str, tuple[int, ...] | None]) -> int:
        return math.prod(_shape(known, node, 0, output=True)) * math.prod(_shape(known, node, w)[1:])
    return rule


def _conv_transpose(node: onnx.NodeProto, known: Mapping[str, tuple[int, ...] | None]) -> int:
    """Every input element is scattered into ``M/group x kernel`` outputs (``W`` is ``[C, M/group, k...]``)."""
    return math.prod(_shape(known, node, 0)) * math.prod(_shape(known, node, 1)[1:])


def _matmul(a: int, transposed: str | None = None):
    """MatMul and its forms: each output element is a dot product over ``A``'s last axis (broadcast batch
    dims and 1-D operands included, since the output's shape holds them)."""
    def rule(node: onnx.NodeProto, known: Mapping[str, tuple[int, ...] | None]) -> int:
        shape = _shape(known, node, a)
        k = shape[-2] if transposed and _attr(node, transposed, 0) and len(shape) > 1 else shape[-1]
        return math.prod(_shape(known, node, 0, output=True)) * k
    return rule


def _gemm(node: onnx.NodeProto, known: Mapping[str, tuple[int, ...] | None]) -> int:
    a = _shape(known, node, 0)
    k = a[0] if _attr(node, "transA", 0) else a[1]
    return math.prod(_shape(known, node, 0, output=True)) * k


def _kv_length(key: tuple[int, ...] | None, past: tuple[int, ...] | None, fallback: int) -> int:
    """The attended length: a 4-D key is ``[B, H, S, D]``, a 3-D one ``[B, S, H*D]``; a past key adds its ``S``."""
    length = fallback if key is None else (key[2] if len(key) == 4 else key[1])
    return length + (past[2] if past is not None and len(past) == 4 else 0)


def _attention(node: onnx.NodeProto, known: Mapping[str, tuple[int, ...] | None]) -> int:
    """ONNX ``Attention`` (opset 23): ``Q Kᵀ`` costs ``|Q| x S_kv``, ``softmax(.) V`` ``|Y| x S_kv``."""
    q, y = _shape(known, node, 0), _shape(known, node, 0, output=True)
    s_kv = _kv_length(_shape(known, node, 1), _optional(known, node, 4), 0)
    return (math.prod(q) + math.prod(y)) * s_kv


def _multi_head_attention(node: onnx.NodeProto, known: Mapping[str, tuple[int, ...] | None]) -> int:
    """ONNX Runtime's ``MultiHeadAttention`` (its shapes are not onnx's to infer, so read from its inputs): a query
    ``[B, S, D]`` (or Q, K and V packed ``[B, S, H, 3, d]``) over keys ``[B, S_kv, D]`` or ``[B, H, S_kv, d]``;
    the values' width ``D_v`` per query position: ``|Q| x S_kv + B x S x D_v x S_kv``."""
    q = _shape(known, node, 0)
    key, value = _optional(known, node, 1), _optional(known, node, 2)
    packed = len(q) == 5
    b, s = q[0], q[1]
    width = q[2] * q[4] if packed else q[2]
    if value is None or key is None or len(key) == 5:  # packed: the values are as wide as the queries
        width_v, s_kv = width, s if key is None else key[1]
    else:
        width_v = value[1] * value[3] if len(value) == 4 else value[2]
        s_kv = _kv_length(key, None, s)
    s_kv += _optional(known, node, 6)[2] if _optional(known, node, 6) is not None else 0  # past_key [B, H, S, d]
    return b * s * (width + width_v) * s_kv


def _ms_attention(node: onnx.NodeProto, known: Mapping[str, tuple[int, ...] | None]) -> int:
    """ONNX Runtime's ``Attention``: the QKV projection ``[B, S, In] x [In, Q+K+V]``, then attention over
    ``S`` (plus a past); the query's width is ``qkv_hidden_sizes[0]``, else a third of the projection's."""
    x, w = _shape(known, node, 0), _shape(known, node, 1)
    sizes = list(_attr(node, "qkv_hidden_sizes", [])) or [w[1] // 3] * 3
    b, s = x[0], x[1]
    s_kv = s + (_shape(known, node, 4)[3] if _optional(known, node, 4) is not None else 0)  # past [2, B, H, S, D]
    return b * s * x[2] * w[1] + b * s * (sizes[0] + sizes[2]) * s_kv


def _recurrent(node: onnx.NodeProto, known: Mapping[str, tuple[int, ...] | None]) -> int:
    """LSTM, GRU, RNN: per step, item and direction ``gates x H x (input + H)``; ``W`` is ``[directions,
    gates x H, input]`` (4 gates for LSTM, 3 for GRU, 1 for RNN), ``R`` ``[directions, gates x H, H]``."""
    x, w, r = _shape(known, node, 0), _shape(known, node, 1), _shape(known, node, 2)
    steps, batch = (x[1], x[0]) if _attr(node, "layout", 0) else (x[0], x[1])
    return steps * batch * w[0] * w[1] * (w[2] + r[2])


def _einsum(node: onnx.NodeProto, known: Mapping[str, tuple[int, ...] | None]) -> int:
    """Two operands without an ellipsis: one MAC per point of the loop over every index."""
    equation = _attr(node, "equation", b"")
    equation = (equation.decode() if isinstance(equation, bytes) else str(equation)).replace(" ", "")
    terms = equation.split("->")[0].split(",")
    if len(terms) != 2 or "..." in equation:
        raise _Open(node.output[0])
    sizes: dict[str, int] = {}
    for i, term in enumerate(terms):
        for letter, dim in zip(term, _shape(known, node, i), strict=False):
            sizes[letter] = dim
    return math.prod(sizes.values())


_RULES = {
    (_DEFAULT, "Conv"): _conv(1),
    (_DEFAULT, "ConvInteger"): _conv(1),
    (_DEFAULT, "QLinearConv"): _conv(3),
    (_MS, "FusedConv"): _conv(1),
    (_MS, "NhwcConv"): _conv(1),
    (_DEFAULT, "ConvTranspose"): _conv_transpose,
    (_DEFAULT, "MatMul"): _matmul(0),
    (_DEFAULT, "MatMulInteger"): _matmul(0),
    (_DEFAULT, "QLinearMatMul"): _matmul(0),
    (_MS, "MatMulIntegerToFloat"): _matmul(0),
    (_MS, "FusedMatMul"): _matmul(0, "transA"),
    (_MS, "MatMulNBits"): _matmul(0),
    (_DEFAULT, "Gemm"): _gemm,
    (_DEFAULT, "Attention"): _attention,
    (_MS, "MultiHeadAttention"): _multi_head_attention,
    (_MS, "Attention"): _ms_attention,
    (_DEFAULT, "LSTM"): _recurrent,
    (_DEFAULT, "GRU"): _recurrent,
    (_DEFAULT, "RNN"): _recurrent,
    (_DEFAULT, "Einsum"): _einsum,
}


@dataclass(frozen=True)
class Kernel:
    """One microbenchmark: ``engine`` ran ``op`` (``"MatMul 1024x1024x1024"``) at ``precision`` at ``gops``
    GOP/s (from the median call), on ``threads`` threads; ``under_load`` when other processes kept the
    machine busy meanwhile (``harness/load.py``): its number is then low."""

    engine: str
    precision: str
    op: str
    gops: float
    threads: int = 0
    under_load: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"engine": self.engine, "precision": self.precision, "op": self.op, "gops": self.gops,
                "threads": self.threads, "under_load": self.under_load}  # fmt: skip

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Kernel:
        return cls(str(d["engine"]), str(d["precision"]), str(d["op"]), float(d["gops"]), int(d.get("threads", 0)),
                   bool(d.get("under_load", False)))  # fmt: skip


@dataclass(frozen=True)
class Peaks:
    """What each precision reaches on one device: the microbenchmark's kernels, per engine.

    A precision's peak is its fastest kernel on any engine (:meth:`peak`): the limit a config of that
    precision could reach here. ``failures`` says, per ``engine/precision``, why it was not measured;
    ``versions`` the engine versions it ran (a new version is measured again); ``settings`` its size
    and time per kernel (other settings are measured again).
    """

    fingerprint: str
    kernels: tuple[Kernel, ...]
    failures: Mapping[str, str] = field(default_factory=dict)
    versions: Mapping[str, str] = field(default_factory=dict)
    settings: Mapping[str, Any] = field(default_factory=dict)
    measured_at: str = ""
    wall_s: float = 0.0

    def best(self, precision: str) -> Kernel | None:
        """The fastest kernel of ``precision`` (a config's precision: ``int8-dynamic`` is int8), or ``None``."""
        found = [k for k in self.kernels if k.precision == peak_precision(precision) and k.gops > 0]
        return max(found, key=lambda k: k.gops, default=None)

    def peak(self, precision: str) -> float | None:
        """GOP/s of the fastest kernel of ``precision`` here, ``None`` where it was not measured."""
        best = self.best(precision)
        return None if best is None else best.gops

    def precisions(self) -> tuple[str, ...]:
        """The precisions measured, in :data:`PRECISIONS` order."""
        measured = {k.precision for k in self.kernels}
        return tuple(p for p in (*PRECISIONS, *sorted(measured - set(PRECISIONS))) if p in measured)

    @property
    def under_load(self) -> bool:
        return any(k.under_load for k in self.kernels)

    def to_dict(self) -> dict[str, Any]:
        return {"fingerprint": self.fingerprint, "kernels": [k.to_dict() for k in self.kernels],
                "failures": dict(self.failures), "versions": dict(self.versions), "settings": dict(self.settings),
                "measured_at": self.measured_at, "wall_s": self.wall_s}  # fmt: skip

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Peaks:
        return cls(str(d["fingerprint"]), tuple(Kernel.from_dict(k) for k in d.get("kernels", ())),
                   dict(d.get("failures") or {}), dict(d.get("versions") or {}), dict(d.get("settings") or {}),
                   str(d.get("measured_at", "")), float(d.get("wall_s", 0.0)))  # fmt: skip


@dataclass(frozen=True)
class Roofline:
    """One measurement against this device's limit.

    Attributes:
        precision: the config's precision (its peak is :func:`peak_precision`'s).
        gop: operations of one call at the measured shape, in billions (:class:`OpCount` ``gop``).
        gops: achieved GOP/s: ``gop`` over the median call (single-stream), or per item times items/s
            (offline, multi-stream, server).
        peak_gops: that precision's peak on this device (:class:`Peaks`), ``None`` where it has none
            (a GPU engine, a precision not measured).
        peak_kernel: the kernel the peak is (``"openvino MatMul 1024x1024x1024"``).
        uncounted: ops that could not be counted (:class:`OpCount`): ``gop`` is then a floor.
    """

    precision: str
    gop: float
    gops: float
    peak_gops: float | None = None
    peak_kernel: str | None = None
    uncounted: tuple[str, ...] = ()

    @property
    def share(self) -> float | None:
        """``gops`` as a fraction of the peak (1.0: at the microbenchmark's speed), ``None`` without a peak."""
        if not self.peak_gops or self.peak_gops <= 0:
            return None
        return self.gops / self.peak_gops

    def ms_at(self, share: float, peak_gops: float) -> float:
        """How long one call would take at ``share`` of a peak of ``peak_gops`` GOP/s, in ms."""
        return self.gop / (share * peak_gops) * 1e3

    def to_dict(self) -> dict[str, Any]:
        """JSON form; ``share`` is written too (derived, for queries that read the stored JSON)."""
        return {"precision": self.precision, "gop": self.gop, "gops": self.gops, "peak_gops": self.peak_gops,
                "share": self.share, "peak_kernel": self.peak_kernel, "uncounted": list(self.uncounted)}  # fmt: skip

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Roofline:
        return cls(str(d["precision"]), float(d["gop"]), float(d["gops"]),
                   None if d.get("peak_gops") is None else float(d["peak_gops"]), d.get("peak_kernel"),
                   tuple(d.get("uncounted") or ()))  # fmt: skip


def roofline(count: OpCount, *, precision: str, batch: int, scenario: str, median_ms: float,
             throughput: float | None, peaks: Peaks | None, gpu: bool = False) -> Roofline | None:  # fmt: skip
    """The roofline of one measurement: ``count`` (one call at its batch) over the time it took, against
    ``peaks``; ``None`` where the model counts no operation or the time is not positive. ``gpu``: it ran on a
    GPU (``Engine.gpu``), which this device's CPU peaks say nothing about: GOP/s and no share."""
    if count.macs <= 0:
        return None
    if not scenario_of(scenario).in_flight or not throughput:  # one call at a time: its median call
        gops = count.gop / (median_ms / 1e3) if median_ms and median_ms > 0 else 0.0
    else:  # items in flight: the rate the machine sustained, per item's operations
        gops = count.gop / max(batch, 1) * throughput
    if not (gops > 0 and math.isfinite(gops)):
        return None
    best = None if peaks is None or gpu else peaks.best(precision)
    return Roofline(precision, count.gop, gops, None if best is None else best.gops,
                    None if best is None else f"{best.engine} {best.op}", count.uncounted)  # fmt: skip


def gops_text(gops: float, unit: bool = True) -> str:
    """``392 GOP/s``, ``12.5 GOP/s``, ``0.84 GOP/s`` (``unit=False``: the number alone)."""
    number = f"{gops:.0f}" if gops >= 100 else f"{gops:.3g}"
    return f"{number} GOP/s" if unit else number


def ops_text(line: Roofline) -> str:
    """``8.21 GOP a call (2 x MACs)``, with the ops left out where the count is a floor."""
    floor = f"; at least: {len(line.uncounted)} op(s) not counted, e.g. {line.uncounted[0]}" if line.uncounted else ""
    return f"{line.gop:.3g} GOP a call (2 x MACs{floor})"


def share_text(line: Roofline, gpu: bool = False) -> str:
    """``345 GOP/s, 88% of this device's bf16 peak (392 GOP/s: openvino MatMul 1024x1024x1024)``; without a peak,
    the GOP/s and why there is no share (``gpu``: it ran on a GPU, ``Engine.gpu``)."""
    precision = peak_precision(line.precision)
    text = gops_text(line.gops)
    if line.share is None:
        why = ("a GPU engine: this device's peaks are its CPU's" if gpu
               else f"no {precision} peak was measured on this device (autodeploy engines --refresh)")  # fmt: skip
        return f"{text} ({why})"
    if line.share > 1:
        return f"{text}, {above_peak(precision, line.peak_gops or 0)}"
    return f"{text}, {line.share:.0%} of this device's {precision} peak ({gops_text(line.peak_gops or 0)}: {line.peak_kernel})"


def above_peak(precision: str, peak_gops: float) -> str:
    """Words for a config faster than its precision's peak: the microbenchmark read low (it ran under load, or the
    host took a core away meanwhile), so no share is claimed."""
    return (f"above this device's measured {precision} peak ({gops_text(peak_gops)}), which therefore read low: "
            "autodeploy engines --refresh measures it again")


def distance(lines: Sequence[Roofline], peaks: Peaks | None, *, label: str, engine: str, batch: int) -> dict[str, Any]:
    """How far a study's winner is from the limit, from the rooflines of its measurements (their median GOP/s):
    its share of its precision's peak and what a call would take at int8's peak at the same share (``what_if``);
    for an int8 winner, at its own peak. ``{}`` without a roofline."""
    if not lines:
        return {}
    last = lines[-1]
    line = Roofline(last.precision, last.gop, statistics.median(x.gops for x in lines), last.peak_gops,
                    last.peak_kernel, last.uncounted)  # fmt: skip
    out: dict[str, Any] = {"label": label, "engine": engine, "batch": batch, **line.to_dict()}
    own = peak_precision(line.precision)
    target = own if own == "int8" else "int8"
    # A GPU engine's lines carry no share (:func:`roofline` with ``gpu``), so no what-if rests on the CPU's peaks.
    target_peak = None if peaks is None else peaks.peak(target)
    share = line.share
    if share and share <= 1 and target_peak:  # above 1 the peak read low: no what-if rests on it
        at = share if target != own else 1.0
        ms = line.ms_at(at, target_peak)
        out["what_if"] = {"precision": target, "peak_gops": target_peak, "share": at, "ms": ms,
                          "items_per_s": max(batch, 1) / (ms / 1e3)}  # fmt: skip
    return out


def distance_text(d: Mapping[str, Any], *, items_per_s: bool = False, gpu: bool = False) -> str:
    """:func:`distance`'s dict in words: ``openvino/bf16 runs at 88% of this device's bf16 peak (345 of 392 GOP/s);
    a passing int8 at the same share would take about 12.3 ms a call``; ``items_per_s``: the what-if as a rate;
    ``gpu``: its engine runs on a GPU (``Engine.gpu``), so no share is said."""
    from autodeploy.units import fmt_ms

    if not d:
        return ""
    who = f"{d['engine']}/{d['precision']}"
    precision, share = peak_precision(str(d["precision"])), d.get("share")
    if share is None:
        why = ("a GPU engine: this device's peaks are its CPU's" if gpu
               else f"no {precision} peak measured on this device")  # fmt: skip
        return f"{who} runs at {gops_text(d['gops'])} ({why})"
    if share > 1:
        return f"{who} runs at {gops_text(d['gops'])}, {above_peak(precision, d['peak_gops'])}"
    text = (f"{who} runs at {share:.0%} of this device's {precision} peak "
            f"({gops_text(d['gops'], unit=False)} of {gops_text(d['peak_gops'])})")  # fmt: skip
    if d.get("uncounted"):
        text += f" (operations a floor: {len(d['uncounted'])} op(s) not counted)"
    what = d.get("what_if")
    if what:
        then = f"do about {what['items_per_s']:.0f} items/s" if items_per_s else f"take about {fmt_ms(what['ms'])} a call"
        if what["precision"] == precision:
            text += f"; at that peak it would {then}"
        else:
            text += f"; a passing {what['precision']} at the same share would {then}"
    return text
