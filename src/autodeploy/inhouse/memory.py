"""Memory planning: lifetimes of activation tensors and a buffer-reuse plan.

Activations are the outputs of the graph's nodes (graph outputs included, ``Constant`` outputs
excluded: those are weights). A tensor lives from the node that makes it to the last node that
reads it (graph outputs: to the end; a tensor read inside an ``If``/``Loop`` body counts as
read by that node). Each step runs one node, whose inputs and outputs are live together.

Reported, in bytes:

* ``no_reuse``: every activation in its own buffer (the sum of all sizes);
* ``lower_bound``: the largest total of tensors live at one step (no plan can do better);
* ``arena``: the size of one arena with every tensor at an offset, tensors whose lifetimes
  overlap never sharing bytes - the greedy-by-size plan of TFLite's arena planner.

Shapes come from ONNX shape inference with symbolic dims fixed by ``dims`` (default 1) or the
inputs' full ``shapes``; a tensor whose size is still unknown is listed and left out of the totals.

:func:`estimate` turns the plan into a peak-memory prediction per batch size (weights plus the
arena), and :func:`cannot_fit` is the search's hook: it prunes a config whose *floor* (weights
plus the activations live at one step, at the precision's element size) is already over
``--max-memory-mb``, before anything is built. The floor never counts what a runtime adds
(its code, prepacked weights, thread pools), so it never prunes a config that could fit.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx
from onnx import helper

from autodeploy.verdict import mb_text

if TYPE_CHECKING:
    from autodeploy.model import ModelInfo

ALIGNMENT = 64
MB = 1024 * 1024
#: Bytes per element of weights and activations at a precision (int8 keeps float activations at
#: worst, but the floor must never over-count: an int8 runtime may keep them in 8 bits).
ELEMENT_FRACTION = {"int8": 0.25, "fp16": 0.5, "bf16": 0.5}


@dataclass(frozen=True)
class TensorLife:
    name: str
    nbytes: int
    first: int  # index of the producing node
    last: int  # index of the last reading node (len(nodes) for graph outputs)
    offset: int  # byte offset in the arena


@dataclass(frozen=True)
class MemoryPlan:
    tensors: tuple[TensorLife, ...]
    no_reuse: int
    lower_bound: int
    arena: int
    unknown: tuple[str, ...]
    dims: Mapping[str, int]

    @property
    def saving(self) -> float:
        """Fraction of the no-reuse memory that the plan saves."""
        return 1 - self.arena / self.no_reuse if self.no_reuse else 0.0

    def to_dict(self, tensors: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {
            "no_reuse_bytes": self.no_reuse,
            "lower_bound_bytes": self.lower_bound,
            "arena_bytes": self.arena,
            "saving": round(self.saving, 4),
            "tensors_planned": len(self.tensors),
            "unknown_size": list(self.unknown),
            "dims": dict(self.dims),
        }
        if tensors:
            out["tensors"] = [t.__dict__ for t in self.tensors]
        return out


@dataclass(frozen=True)
class MemoryEstimate:
    """Predicted memory of one model at one batch size, in bytes (fp32 weights and activations)."""

    batch: int
    weights: int
    arena: int
    lower_bound: int
    unknown: int  # activations whose size shape inference could not tell

    @property
    def predicted_mb(self) -> float:
        """Weights plus the planned arena: what a runtime with a reusing allocator needs at least."""
        return (self.weights + self.arena) / MB

    def floor_mb(self, precision: str = "fp32") -> float:
        """No runtime can run the model in less: weights and the live activations, at the precision's size."""
        return (self.weights + self.lower_bound) * ELEMENT_FRACTION.get(precision, 1.0) / MB


def estimate(model: onnx.ModelProto, shapes: Mapping[str, Sequence[int]], batch: int) -> MemoryEstimate:
    """The memory plan of ``model`` with its inputs at ``shapes`` (the trial's shapes at ``batch``)."""
    plan = plan_memory(model, shapes=shapes)
    weights = sum(_nbytes(t) for t in model.graph.initializer)
    weights += sum(
        _nbytes(a.t)
        for n in model.graph.node
        if n.op_type == "Constant"
        for a in n.attribute
        if a.name == "value"
    )
    return MemoryEstimate(batch, weights, plan.arena, plan.lower_bound, len(plan.unknown))


def cannot_fit(model: ModelInfo, batch: int, precision: str, max_memory_mb: float | None) -> str | None:
    """Why a config of ``model`` at ``batch`` cannot fit in ``max_memory_mb`` (the study prunes it), or None."""
    if max_memory_mb is None:
        return None
    floor = floor_mb(model, batch, precision)
    if floor is None or floor <= max_memory_mb:
        return None
    return (f"the memory plan needs at least {mb_text(floor)} MB at batch {batch} in {precision} "
            f"(weights + activations live at once), over --max-memory-mb {max_memory_mb:g}")  # fmt: skip


def floor_mb(model: ModelInfo, batch: int, precision: str) -> float | None:
    """The memory plan's floor (weights + live activations, MB) of ``model`` at ``batch``; None where
    the model cannot take that batch (the search space's reason, not ours)."""
    try:
        shapes = {spec.name: model.input_shape(spec.name, batch) for spec in model.inputs}
    except Exception:  # a shape the model cannot take is the search space's reason, not ours
        return None
    return _estimate_cached(str(model.path), model.sha256, json.dumps(sorted(shapes.items())), batch).floor_mb(precision)


@functools.lru_cache(maxsize=64)
def _estimate_cached(path: str, sha256: str, shapes: str, batch: int) -> MemoryEstimate:
    return estimate(onnx.load(path), dict(json.loads(shapes)), batch)


def _nbytes(tensor: onnx.TensorProto) -> int:
    try:
        itemsize = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.data_type)).itemsize
    except (KeyError, TypeError):
        return 0
    return int(np.prod(tensor.dims, dtype=np.int64)) * itemsize


def plan_memory(
    model: onnx.ModelProto,
    dims: Mapping[str, int] | None = None,
    shapes: Mapping[str, Sequence[int]] | None = None,
) -> MemoryPlan:
    """Lifetimes, sizes and arena offsets of ``model``'s activations; see the module docstring."""
    dims = dict(dims or {})
    fixed, used_dims = _fix_dims(model, dims, shapes or {})
    sizes = _sizes(fixed)
    graph = fixed.graph
    nodes = list(graph.node)
    outputs = {o.name for o in graph.output}
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for i, node in enumerate(nodes):
        for name in _reads(node):
            if name in first:
                last[name] = max(last[name], i)
        if node.op_type == "Constant":
            continue
        for name in node.output:
            if name:
                first[name] = i
                last[name] = len(nodes) if name in outputs else i
    unknown = tuple(n for n in first if n not in sizes)
    lives = [(n, sizes[n], first[n], last[n]) for n in first if n in sizes]
    placed = _assign_offsets(lives)
    return MemoryPlan(
        tensors=tuple(sorted(placed, key=lambda t: (t.first, t.name))),
        no_reuse=sum(t.nbytes for t in placed),
        lower_bound=_lower_bound(placed, len(nodes)),
        arena=max((t.offset + t.nbytes for t in placed), default=0),
        unknown=unknown,
        dims=used_dims,
    )


def _fix_dims(
    model: onnx.ModelProto, dims: Mapping[str, int], shapes: Mapping[str, Sequence[int]]
) -> tuple[onnx.ModelProto, dict[str, int]]:
    """A copy whose graph inputs have static shapes (``shapes``, else symbolic dims from ``dims``, else 1), shapes inferred."""
    fixed = onnx.ModelProto()
    fixed.CopyFrom(model)
    del fixed.graph.value_info[:]
    used: dict[str, int] = {}
    for value in fixed.graph.input:
        for axis, dim in enumerate(value.type.tensor_type.shape.dim):
            if value.name in shapes and axis < len(shapes[value.name]):
                if not dim.HasField("dim_value") and dim.dim_param:
                    used[dim.dim_param] = int(shapes[value.name][axis])
                dim.dim_value = int(shapes[value.name][axis])
            elif not dim.HasField("dim_value"):
                key = dim.dim_param or "?"
                used[key] = int(dims.get(key, 1))
                dim.dim_value = used[key]
    try:
        fixed = onnx.shape_inference.infer_shapes(fixed, data_prop=True)
    except Exception:  # shapes are best effort: unknown sizes are reported, not guessed
        pass
    return fixed, used


def _sizes(model: onnx.ModelProto) -> dict[str, int]:
    sizes = {}
    for value in [*model.graph.value_info, *model.graph.output]:
        ttype = value.type.tensor_type
        if not value.type.HasField("tensor_type") or not ttype.HasField("shape"):
            continue
        shape = [d.dim_value if d.HasField("dim_value") else None for d in ttype.shape.dim]
        if any(d is None for d in shape) or ttype.elem_type == onnx.TensorProto.UNDEFINED:
            continue
        try:
            itemsize = np.dtype(helper.tensor_dtype_to_np_dtype(ttype.elem_type)).itemsize
        except (KeyError, TypeError):
            continue
        sizes[value.name] = int(np.prod(shape, dtype=np.int64)) * itemsize
    return sizes


def _reads(node: onnx.NodeProto) -> set[str]:
    """Names a node reads, including outer-scope names read inside its subgraphs."""
    names = {i for i in node.input if i}
    for attr in node.attribute:
        for sub in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs):
            for inner in sub.node:
                names |= _reads(inner)
    return names


def _assign_offsets(lives: list[tuple[str, int, int, int]]) -> list[TensorLife]:
    """Greedy by size: biggest first, each at the lowest offset free for its whole lifetime."""
    placed: list[TensorLife] = []
    for name, nbytes, first, last in sorted(lives, key=lambda t: (-t[1], t[2], t[0])):
        busy = sorted((t.offset, t.offset + t.nbytes) for t in placed if t.first <= last and first <= t.last)
        offset = 0
        for start, end in busy:
            if offset + nbytes <= start:
                break
            offset = max(offset, _align(end))
        placed.append(TensorLife(name, nbytes, first, last, offset))
    return placed


def _lower_bound(placed: list[TensorLife], steps: int) -> int:
    live = np.zeros(steps + 2, dtype=np.int64)
    for t in placed:
        live[t.first] += t.nbytes
        live[t.last + 1] -= t.nbytes
    return int(np.cumsum(live).max(initial=0))


def _align(n: int) -> int:
    return -(-n // ALIGNMENT) * ALIGNMENT
