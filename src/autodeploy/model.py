"""Model intake: load and validate an ONNX file before any engine sees it.

``load_model`` is the only way a model enters autodeploy. A TFLite flatbuffer or an OpenVINO IR
is taken as given too, described by the engine that runs it (:mod:`autodeploy.formats`). It refuses anything unsafe or
malformed with a :class:`~autodeploy.errors.ModelError` that says what and how to fix it:
a missing file, a file that is not ONNX, a truncated model, a checker failure, external
data whose location leaves the model's folder (``..``, an absolute path, a symlink), or a model
larger than :data:`MAX_MODEL_BYTES` with its weights. A model given through a link is the file
it points to: its external data (an IR's ``.bin``) is read beside that file, at intake and copy alike.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from autodeploy import formats
from autodeploy.child import ChildFailed, first_line, run_code
from autodeploy.errors import ModelError, ShapeError, WriteError

Dim = int | str | None  # a static size, a named dynamic dim, or an unnamed dynamic dim

#: The most bytes a model file and its weights (ONNX external data, an IR's ``.bin``) may take
#: together, checked before any of it is read: every byte is hashed at intake and copied into each
#: artifact, and a bundle carries no more (``bundle.archive.MAX_BYTES``). A sparse 4 GiB ``.bin``
#: took 86 s to hash and became a dense 4.3 GB copy in the cache.
MAX_MODEL_BYTES = 4 * 2**30


@dataclass(frozen=True)
class TensorSpec:
    """Name, numpy dtype name and shape of one model input or output."""

    name: str
    dtype: str
    shape: tuple[Dim, ...]

    @property
    def is_dynamic(self) -> bool:
        return any(not isinstance(d, int) for d in self.shape)

    def shape_str(self) -> str:
        return "x".join(str(d) if d is not None else "?" for d in self.shape)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}


#: Ops that carry int8 arithmetic: ONNX's QDQ and QOperator forms, ORT's dynamic and contrib forms,
#: OpenVINO's FakeQuantize/FakeConvert. An "int8" artifact with none of them is the fp32 graph; a model file with
#: some is int8 already (:attr:`ModelInfo.int8_ops`).
INT8_OPS = ("QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "MatMulInteger", "ConvInteger",
            "QLinearConv", "QLinearMatMul", "QLinearAdd", "QLinearMul", "QGemm", "QAttention",
            "DynamicQuantizeMatMul", "DynamicQuantizeLSTM", "QLinearSigmoid", "QLinearGlobalAveragePool",
            "QLinearConcat", "QLinearLeakyRelu", "QLinearSoftmax", "QLinearAveragePool", "FakeQuantize",
            "FakeConvert")  # fmt: skip
#: The int8 ops that compute their activations' scale from the tensor they get, at every call (ONNX Runtime's
#: ``quantize_dynamic``): over every item of a batch at once, so an item's outputs depend on the batch it runs in.
PER_CALL_SCALE_OPS = ("DynamicQuantizeLinear", "DynamicQuantizeMatMul", "DynamicQuantizeLSTM")


@dataclass(frozen=True)
class ModelInfo:
    """A validated ONNX model: where it is, its identity and its interface.

    ``shapes`` holds the user's fixed input shapes (``--shape``), already checked to fit.
    ``batch_axes`` holds the user's batch axes (``--batch-axis``; ``None``: never batched);
    every other tensor's batch axis comes from the model (:meth:`batch_axis`). ``notes`` are
    what intake read leniently, said once (e.g. a ``-1`` dim read as dynamic).
    """

    path: Path
    name: str
    sha256: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    opset: int
    external_files: tuple[str, ...] = ()
    shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    batch_axes: Mapping[str, int | None] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    #: Per input, the smallest and largest shape of every case the bench or study covers
    #: (:meth:`ShapeSet.ranges`), when it covers several: what a TensorRT profile must span.
    shape_ranges: Mapping[str, tuple[tuple[int, ...], tuple[int, ...]]] = field(default_factory=dict)
    #: ``onnx``, or a format run as given by the one engine that reads it (:data:`autodeploy.formats.FORMATS`).
    format: str = "onnx"
    #: Where this ONNX came from when autodeploy exported it (:mod:`autodeploy.pytorch`): the framework,
    #: the exporter and its version, the source file and its SHA-256, and which PyTorch model is the
    #: accuracy reference (``reference``: ``program`` or ``module``). Empty for a model taken as given.
    source: Mapping[str, Any] = field(default_factory=dict)
    #: The int8 ops (:data:`INT8_OPS`) the model file already holds, op type -> count: its fp32 config runs them as
    #: they are, and no engine's int8 has anything left to quantize (:meth:`already_int8`). Empty for most models.
    int8_ops: Mapping[str, int] = field(default_factory=dict)

    def already_int8(self) -> str | None:
        """Why an engine's int8 has nothing to do here: the model is int8 already (its ops named), else ``None``."""
        if not self.int8_ops:
            return None
        kinds = sorted(self.int8_ops, key=lambda op: -self.int8_ops[op])
        more = len(kinds) - 3
        shown = ", ".join(f"{op} x{self.int8_ops[op]}" for op in kinds[:3]) + (f" and {more} more kind{'s' * (more > 1)}"
                                                                                  if more > 0 else "")  # fmt: skip
        how = "ONNX Runtime dynamic quantization" if self.scales_per_call() else "int8 ops"
        return f"the model is int8 already ({how}: {shown}); its fp32 config runs them as they are"

    def scales_per_call(self) -> bool:
        """Whether the model computes its activations' int8 scales at every call (:data:`PER_CALL_SCALE_OPS`)."""
        return any(op in self.int8_ops for op in PER_CALL_SCALE_OPS)

    def input(self, name: str) -> TensorSpec:
        for spec in self.inputs:
            if spec.name == name:
                return spec
        raise ShapeError(f"model has no input {name!r}", fix=f"inputs are {', '.join(self.input_names)}")

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.inputs)

    @property
    def output_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.outputs)

    def batch_axis(self, name: str) -> int | None:
        """The batch axis of input or output ``name``, or ``None`` when it is never batched.

        The user's ``--batch-axis`` wins; otherwise the model says it (:func:`batch_axes`).
        """
        return batch_axes(self.inputs, self.outputs, self.batch_axes).get(name)

    def batched_inputs(self) -> tuple[TensorSpec, ...]:
        return tuple(s for s in self.inputs if self.batch_axis(s.name) is not None)

    def fixed_batch(self) -> int | None:
        """The batch size the model fixes (e.g. 1 in ``[1, 3, 64, W]``), or ``None`` when it is dynamic."""
        for spec in self.batched_inputs():
            dim = spec.shape[self.batch_axis(spec.name)]  # type: ignore[index]
            if isinstance(dim, int):
                return dim
        return None

    def batchable(self) -> bool:
        """True when some input has a batch axis and its size is dynamic, so any batch size can be fed."""
        return bool(self.batched_inputs()) and self.fixed_batch() is None

    def item_shape(self, name: str) -> tuple[int, ...]:
        """Concrete shape of one item: the input shape without its batch axis (all of it if unbatched)."""
        shape = self.input_shape(name, batch=self.fixed_batch() or 1)
        axis = self.batch_axis(name)
        return shape if axis is None else shape[:axis] + shape[axis + 1 :]

    def item_dims(self, name: str) -> tuple[Dim, ...]:
        """One item's dims as far as the model and ``--shape`` fix them (dynamic ones left open)."""
        dims = tuple(self.shapes.get(name, self.input(name).shape))
        axis = self.batch_axis(name)
        return dims if axis is None else dims[:axis] + dims[axis + 1 :]

    def input_shape(self, name: str, batch: int) -> tuple[int, ...]:
        """Concrete input shape at ``batch``, set on the input's batch axis only.

        A user-fixed shape wins as given; only its batch axis, when the model leaves that
        dynamic, is the trial's batch. Inputs without a batch axis keep their shape at any batch.
        Any other dynamic dim must have been fixed with ``--shape`` (or by ``--data``).
        """
        spec = self.input(name)
        axis = self.batch_axis(name)
        dims: list[Dim] = list(self.shapes.get(name, spec.shape))
        if axis is not None:
            declared = spec.shape[axis]
            if not isinstance(declared, int):
                dims[axis] = batch
            elif declared != batch:
                raise ShapeError(
                    f"input {name!r} has a static batch dim {declared} (axis {axis} of {spec.shape_str()}), "
                    f"cannot run batch {batch}",
                    fix=f"use --batch {declared}, or export the model with a dynamic batch dim",
                )
        for i, d in enumerate(dims):
            if not isinstance(d, int):
                example = "x".join(str(x) if isinstance(x, int) else "N" for x in dims)
                raise ShapeError(
                    f"input {name!r} has dynamic dim {d or '?'} at axis {i} (shape {spec.shape_str()})",
                    fix=f"fix it with --shape {name}={example}, or give --data with arrays of that shape",
                )
        return tuple(dims)  # type: ignore[arg-type]

    def check_batch(self, batch: int) -> None:
        """Refuse a ``--shape`` that fixes an input's dynamic batch axis at a size other than 1 or ``batch``: the
        trial would be stored under that shape but fed ``batch`` items (the batch axis is always the trial's).

        Raises:
            ShapeError: naming the input, the shape given, the batch, and the shape to give instead.
        """
        for name, dims in self.shapes.items():
            axis = self.batch_axis(name)
            if axis is None or axis >= len(dims) or isinstance(self.input(name).shape[axis], int):
                continue  # never batched, or a static batch dim (input_shape refuses another batch)
            if dims[axis] in (1, batch):
                continue
            given, fixed = ("x".join(map(str, d)) for d in (dims, (*dims[:axis], 1, *dims[axis + 1 :])))
            raise ShapeError(f"--shape {name}={given} sets the batch dim (axis {axis}) to {dims[axis]}, but the batch "
                             f"is {batch}: it would be stored under {given} and fed {batch} item(s)",
                             fix=f"give --shape {name}={fixed} and the batch with --batch {dims[axis]}")  # fmt: skip

    def with_batch_axes(self, axes: Mapping[str, int | None]) -> ModelInfo:
        """This model with the user's batch axes (``--batch-axis``), checked to fit, over the model's own."""
        return _with_batch_axes(self, {**self.batch_axes, **axes})

    def with_shapes(self, shapes: Mapping[str, tuple[int, ...]]) -> ModelInfo:
        """This model with more fixed input shapes (checked to fit); the ones already fixed win."""
        return _with_shapes(self, {**shapes, **self.shapes})

    def at_shapes(self, shapes: Mapping[str, tuple[int, ...]],
                  ranges: Mapping[str, tuple[tuple[int, ...], tuple[int, ...]]] | None = None) -> ModelInfo:  # fmt: skip
        """This model fixed at exactly ``shapes`` (one case of a shape set; checked to fit), the
        shapes fixed before replaced; ``ranges`` are the whole set's (:attr:`shape_ranges`)."""
        fixed = _with_shapes(self, shapes)
        return ModelInfo(**{**fixed.__dict__, "shape_ranges": dict(ranges or {})})

    def measured_shapes(self, batch: int) -> dict[str, list[int]] | None:
        """Every input's concrete shape at ``batch`` (what a trial fed), or ``None`` where a dim is left open."""
        try:
            return {name: list(self.input_shape(name, batch)) for name in self.input_names}
        except ShapeError:
            return None

    def shape_overrides_key(self) -> str:
        shapes = {k: list(v) for k, v in sorted(self.shapes.items())}
        if not self.batch_axes:  # the key of every artifact built before --batch-axis existed
            return json.dumps(shapes)
        return json.dumps({"shapes": shapes, "batch_axes": dict(sorted(self.batch_axes.items()))})

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "name": self.name,
            "sha256": self.sha256,
            "inputs": [s.to_dict() for s in self.inputs],
            "outputs": [s.to_dict() for s in self.outputs],
            "opset": self.opset,
            "external_files": list(self.external_files),
            "shapes": {k: list(v) for k, v in self.shapes.items()},
            "batch_axes": dict(self.batch_axes),
            "notes": list(self.notes),
            "shape_ranges": {k: [list(lo), list(hi)] for k, (lo, hi) in self.shape_ranges.items()},
            "format": self.format,
            **({"source": dict(self.source)} if self.source else {}),
            **({"int8_ops": dict(self.int8_ops)} if self.int8_ops else {}),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ModelInfo:
        def specs(items: Sequence[Mapping[str, Any]]) -> tuple[TensorSpec, ...]:
            return tuple(TensorSpec(i["name"], i["dtype"], tuple(i["shape"])) for i in items)

        return cls(
            path=Path(d["path"]),
            name=d["name"],
            sha256=d["sha256"],
            inputs=specs(d["inputs"]),
            outputs=specs(d["outputs"]),
            opset=d["opset"],
            external_files=tuple(d.get("external_files", ())),
            shapes={k: tuple(v) for k, v in d.get("shapes", {}).items()},
            batch_axes=dict(d.get("batch_axes", {})),
            notes=tuple(d.get("notes", ())),
            shape_ranges={k: (tuple(lo), tuple(hi)) for k, (lo, hi) in d.get("shape_ranges", {}).items()},
            format=d.get("format", "onnx"),
            source=dict(d.get("source", {})),
            int8_ops=dict(d.get("int8_ops", {})),
        )


def parse_shape_flags(flags: Sequence[str]) -> dict[str, tuple[int, ...]]:
    """Parse ``--shape name=1x3x224x224`` flags into ``{name: (1, 3, 224, 224)}``: one shape per input
    (``bench`` and ``tune`` take several, :func:`autodeploy.shapes.parse_flags`)."""
    shapes: dict[str, tuple[int, ...]] = {}
    for flag in flags:
        name, sep, dims = flag.partition("=")
        if name in shapes:
            raise ShapeError(f"--shape {name} is given twice; this command runs one shape per input",
                             fix="give one --shape per input (bench and tune measure several, one trial per shape)")  # fmt: skip
        try:
            if not sep or not name:
                raise ValueError
            shape = tuple(int(d) for d in dims.lower().split("x"))
            if any(d < 1 for d in shape):
                raise ValueError
        except ValueError:
            raise ShapeError(
                f"cannot parse --shape {flag!r}", fix="write it as NAME=DIMxDIMx..., e.g. input=1x3x224x224"
            ) from None
        shapes[name] = shape
    return shapes


def parse_batch_axis_flags(flags: Sequence[str]) -> dict[str, int | None]:
    """Parse ``--batch-axis name=1`` (or ``name=none``: never batched) into ``{name: 1}``."""
    axes: dict[str, int | None] = {}
    for flag in flags:
        name, sep, axis = flag.partition("=")
        if not sep or not name or not (axis.isdigit() or axis.lower() == "none"):
            raise ShapeError(
                f"cannot parse --batch-axis {flag!r}",
                fix="write it as INPUT=AXIS (0-based), or INPUT=none for an input that is never batched",
            )
        axes[name] = None if axis.lower() == "none" else int(axis)
    return axes


def load_model(
    path: str | Path,
    shapes: Mapping[str, tuple[int, ...]] | None = None,
    name: str | None = None,
    batch_axes: Mapping[str, int | None] | None = None,
) -> ModelInfo:
    """Load, validate and describe a model: an ONNX file, or a TFLite flatbuffer or an OpenVINO IR
    taken as given (:mod:`autodeploy.formats`).

    Args:
        path: the ``.onnx`` file (or ``.tflite``, or an IR's ``.xml`` with its ``.bin`` beside it).
        shapes: user-fixed input shapes; each must have the input's rank and agree with its static dims.
        name: display name (defaults to the file stem).
        batch_axes: the user's batch axis per input (``None``: never batched), over the model's own.

    Raises:
        ModelError: the file is missing, not ONNX, truncated, invalid or unsafe.
        ShapeError: a fixed shape does not fit.
    """
    import onnx

    path = Path(path)
    if not path.exists():
        raise ModelError(
            f"model file not found: {path}", fix="check the path, or use zoo:NAME for a built-in model"
        )
    if not path.is_file():
        raise ModelError(f"model path is not a file: {path}", fix="point to the .onnx file itself")
    # A link to a model is the model: its weights are the ones beside the file itself, where the
    # engines, the reference and the copy into an artifact read them (never beside the link).
    name, path = name or path.stem, path.resolve()
    if not str(path).isascii() and not _utf8(str(path)):  # ONNX's C++ checker takes UTF-8 paths only
        raise ModelError(f"model path {path} is not valid UTF-8", fix="rename the file (or its folder)")
    kind = formats.detect(path)
    if kind != formats.ONNX:
        return _with_shapes(_with_batch_axes(_load_other(path, kind, name), batch_axes or {}), shapes or {})
    try:
        proto = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # protobuf raises DecodeError, RuntimeWarning or others on garbage
        raise ModelError(
            f"{path} is not a readable ONNX model ({type(exc).__name__}); the file may be truncated or not ONNX",
            fix="re-export the model with onnx.save or torch.onnx.export",
        ) from None
    if not proto.graph.node and not proto.graph.output:
        raise ModelError(f"{path} holds no ONNX graph (empty or not an ONNX file)", fix="re-export the model")
    external = _check_external_data(proto, path)
    _check_size([path, *(path.parent / f for f in external)], path)
    checker_note = _check(path)
    inputs, outputs, notes = _specs(proto)
    notes = (*notes, checker_note) if checker_note else notes
    int8_ops: dict[str, int] = {}
    for node in proto.graph.node:
        if node.op_type in INT8_OPS:
            int8_ops[node.op_type] = int8_ops.get(node.op_type, 0) + 1
    if not inputs or not outputs:
        what = "inputs (every graph input is an initializer)" if not inputs else "outputs"
        raise ModelError(f"{path} has no {what}; there is nothing to benchmark", fix="re-export the model")
    opset = max((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), default=0)
    info = ModelInfo(
        path=path,
        name=name,
        sha256=_sha256(path, path.parent, external),
        inputs=inputs,
        outputs=outputs,
        opset=opset,
        external_files=external,
        notes=notes,
        int8_ops=int8_ops,
    )
    if info.already_int8():  # said once: why int8 is not offered, and why batching changes its outputs
        per_call = ("; it computes its activations' int8 scales at every call, over every item of the batch, so an "
                    "item's outputs depend on the batch it runs in: its reference runs one item a call, and a batch "
                    "above 1 is judged against each item alone") if info.scales_per_call() else ""  # fmt: skip
        info = replace(info, notes=(*info.notes, f"{info.already_int8()}, and no engine's int8 is offered{per_call}"))
    return _with_shapes(_with_batch_axes(info, batch_axes or {}), shapes or {})


def _check(path: Path) -> str | None:
    """Run the ONNX checker; where it objects, ONNX Runtime decides, as it will run the model.

    Returns a note when the checker objects and ONNX Runtime loads the model anyway.

    Raises:
        ModelError: both refuse it; the message gives the checker's and ONNX Runtime's reasons.
    """
    import onnx

    try:
        # The path form lets the checker handle models with external data and > 2 GB.
        onnx.checker.check_model(str(path))
        return None
    except Exception as exc:
        checker = first_line(exc)
    refused = _ort_refuses(path)
    if refused is None:
        return f"the ONNX checker objects ({checker}), but ONNX Runtime loads the model: accepted"
    raise ModelError(
        f"{path} fails the ONNX checker: {checker}; ONNX Runtime refuses it too: {refused}",
        fix="fix or re-export the model",
    )


#: Loading a model in ONNX Runtime takes its own process: a hostile file may crash or hang it. Its reason is the
#: first line of ONNX Runtime's error.
_ORT_LOAD = (
    "import sys\nfrom autodeploy.child import child_main, first_line\n"
    "from autodeploy.runtime.onnxruntime import session\n"
    "def load():\n    session(sys.argv[1])\n"
    "sys.exit(child_main(load, reason=first_line))\n"
)
_ORT_LOAD_TIMEOUT_S = 120.0


def _ort_refuses(path: Path) -> str | None:
    """ONNX Runtime's one-line reason for refusing ``path``, or ``None`` when it loads it."""
    try:
        run_code(_ORT_LOAD, str(path), timeout_s=_ORT_LOAD_TIMEOUT_S)
    except ChildFailed as failed:
        if failed.timed_out:
            return f"it did not load within {_ORT_LOAD_TIMEOUT_S:g} s"
        return re.sub(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ", "", failed.reason)
    return None


def _load_other(path: Path, kind: str, name: str) -> ModelInfo:
    """A TFLite flatbuffer or an OpenVINO IR, described by the engine that runs it; an IR's ``.bin``
    (beside the ``.xml``, a plain file) is one of its files, hashed with it and copied with it."""
    external = formats.files_beside(path, kind)
    _check_size([path, *(path.parent / f for f in external)], path)  # before the engine maps the weights
    described = formats.describe(path, kind)

    def specs(items: Sequence[Mapping[str, Any]]) -> tuple[TensorSpec, ...]:
        return tuple(TensorSpec(i["name"], i["dtype"], tuple(i["shape"])) for i in items)

    inputs, outputs = specs(described["inputs"]), specs(described["outputs"])
    if not inputs or not outputs:
        raise ModelError(f"{path} has no {'inputs' if not inputs else 'outputs'}; there is nothing to benchmark",
                         fix=formats.FORMATS[kind].export)  # fmt: skip
    fmt = formats.FORMATS[kind]
    note = f"{fmt.what}, run as given on {fmt.engine}; the fp32 reference and the baseline are {fmt.baseline}, not ORT"
    return ModelInfo(path=path, name=name, sha256=_sha256(path, path.parent, external), inputs=inputs,
                     outputs=outputs, opset=0, external_files=external, notes=(note,), format=kind)  # fmt: skip


def _size(n: float) -> str:
    """``n`` bytes in the largest binary unit (up to TiB) that keeps the number above 1: ``4 GiB``."""
    unit = "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            break
        n /= 1024
    return f"{n:.3g} {unit}"


def _too_big(model: Path, total: int) -> ModelError:
    cap = _size(MAX_MODEL_BYTES)
    return ModelError(f"{model} takes {_size(total)} with its weights, more than the {cap} a model may take "
                      "(autodeploy.model.MAX_MODEL_BYTES; a bundle carries no more)",
                      fix="export a smaller model (fp16 or int8 weights), or check that the weights file "
                      "is the one saved with it")  # fmt: skip


def _check_size(files: Sequence[Path], model: Path) -> None:
    """Refuse a model whose files together exceed :data:`MAX_MODEL_BYTES` (sizes only: nothing is read)."""
    total = sum(f.stat().st_size for f in files)
    if total > MAX_MODEL_BYTES:
        raise _too_big(model, total)


def _check_external_data(proto: Any, path: Path) -> tuple[str, ...]:
    """Refuse external data that leaves the model's folder; return the files it uses."""
    from onnx.external_data_helper import _get_all_tensors, uses_external_data

    folder = path.parent.resolve()
    files: set[str] = set()
    for tensor in _get_all_tensors(proto):
        if not uses_external_data(tensor):
            continue
        location = next((e.value for e in tensor.external_data if e.key == "location"), "")
        target = folder / location
        unsafe = (
            not location
            or Path(location).is_absolute()
            or ".." in Path(location).parts
            or target.is_symlink()
            or not target.resolve().is_relative_to(folder)
        )
        if unsafe:
            raise ModelError(
                f"tensor {tensor.name!r} of {path} has external data at {location!r}, outside the model's folder",
                fix="keep external data files next to the model, referenced by plain relative names",
            )
        if not target.is_file():
            raise ModelError(
                f"external data file {location!r} of {path} is missing", fix="copy it next to the model"
            )
        files.add(location)
    return tuple(sorted(files))


def _specs(proto: Any) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...], tuple[str, ...]]:
    """Inputs (those with an initializer default are optional and left out), outputs, and notes.

    Dims are read as ONNX Runtime reads them: a negative value (``-1`` from Paddle2ONNX and
    older converters), an empty or ``?`` name and a missing dim are all dynamic.
    """
    from onnx import helper

    initializers = {t.name for t in proto.graph.initializer}
    negative: dict[str, list[int]] = {}  # tensor -> axes written as a negative size

    def spec(value: Any, role: str = "input") -> TensorSpec:
        ttype = value.type.tensor_type
        if not value.type.HasField("tensor_type"):
            held = _class_probabilities(proto, value, role)
            if held is None:
                raise _not_a_tensor(value, role)
            notes.append(f"output {value.name!r} is a sequence of maps (ZipMap: class -> probability): its "
                         f"accuracy is judged as a {held.dtype} [N, {held.shape[1] or '?'}] class-probability "
                         "tensor; it is timed as the model returns it")  # fmt: skip
            return held
        try:
            dtype = np.dtype(helper.tensor_dtype_to_np_dtype(ttype.elem_type)).name
        except (KeyError, TypeError):  # elem_type 0 (UNDEFINED) or a number ONNX does not define
            raise ModelError(
                f"input/output {value.name!r} has element type {ttype.elem_type}, not an ONNX tensor type",
                fix="re-export the model",
            ) from None
        dims: list[Dim] = []
        for axis, d in enumerate(ttype.shape.dim):
            if d.HasField("dim_value") and d.dim_value >= 0:
                dims.append(int(d.dim_value))
                continue
            if d.HasField("dim_value"):
                negative.setdefault(value.name, []).append(axis)
            dims.append(d.dim_param if d.dim_param and d.dim_param != "?" else None)
        return TensorSpec(value.name, dtype, tuple(dims))

    notes: list[str] = []
    inputs = tuple(spec(v) for v in proto.graph.input if v.name not in initializers)
    outputs = tuple(spec(v, "output") for v in proto.graph.output)
    if negative:
        where = "; ".join(f"{k!r} axis {', '.join(map(str, v))}" for k, v in negative.items())
        notes.append(f"negative dims (-1, as Paddle2ONNX writes them) read as dynamic, as ONNX Runtime does: {where}")
    optional = [v.name for v in proto.graph.input if v.name in initializers]
    if optional:
        notes.append(f"input(s) {', '.join(map(repr, optional))} have an initializer default: optional, not fed")
    return inputs, outputs, tuple(notes)


def _class_probabilities(proto: Any, value: Any, role: str) -> TensorSpec | None:
    """A ZipMap output (``seq(map(int64|string, float))``: one ``{class: probability}`` per item, as
    skl2onnx writes a classifier by default) read as the ``[N, classes]`` tensor it holds, or ``None``
    for any other type. N is the first input's leading dim (ZipMap keeps one map per row of its
    input); the class count is ZipMap's own label list."""
    from onnx import TensorProto, helper

    held = value.type.sequence_type.elem_type.map_type
    if role != "output" or held.key_type not in (TensorProto.INT64, TensorProto.STRING):
        return None
    if held.value_type.tensor_type.elem_type not in (TensorProto.FLOAT, TensorProto.DOUBLE):
        return None
    dtype = np.dtype(helper.tensor_dtype_to_np_dtype(held.value_type.tensor_type.elem_type)).name
    made_by = [n for n in proto.graph.node if n.op_type == "ZipMap" and value.name in n.output]
    labels = [a for n in made_by for a in n.attribute if a.name.startswith("classlabels_")]
    classes = len(labels[0].ints or labels[0].strings) if labels else None
    dims = [i.type.tensor_type.shape.dim for i in proto.graph.input if i.type.tensor_type.shape.dim]
    lead = dims[0][0] if dims else None
    batch: Dim = None
    if lead is not None:
        batch = int(lead.dim_value) if lead.dim_value > 0 else (lead.dim_param or None)
    return TensorSpec(value.name, dtype, (batch, classes))


def _not_a_tensor(value: Any, role: str) -> ModelError:
    """The error of an input or output whose type is not a tensor (a sequence, a map, an optional, ...)."""
    kind = value.type.WhichOneof("value") or "untyped"
    what = {"sequence_type": "a sequence", "map_type": "a map", "optional_type": "an optional",
            "sparse_tensor_type": "a sparse tensor", "opaque_type": "an opaque value"}.get(kind, "untyped")  # fmt: skip
    if role == "input":
        return ModelError(f"input {value.name!r} is {what}, not a tensor; autodeploy feeds tensors only",
                          fix="re-export the model with tensor inputs")  # fmt: skip
    return ModelError(f"output {value.name!r} is {what}, not a tensor or a ZipMap of class probabilities; "
                      "autodeploy reads tensors and ZipMap's sequence of maps only",
                      fix="re-export the model so that this output is a tensor")  # fmt: skip


_BATCH_NAME = re.compile(r"(?i).*batch.*|n|b|bs|bsz|num_?items")


def batch_axes(
    inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec], overrides: Mapping[str, int | None]
) -> dict[str, int | None]:
    """Batch axis of every input and output (``None``: not batched).

    The batch is the symbolic dim that inputs and outputs share (``batch`` in
    ``state[2, batch, 128]``), preferring a batch-like name, then the dim most tensors have,
    then the one nearest axis 0. A shared name must be batch-like or lead some input, so a
    fixed-batch model's shared ``seq`` is not taken for the batch. Without one (Paddle
    exports name every dim apart, or write ``-1``): axis 0 of each tensor whose first dim is
    dynamic; and when no input has one, axis 0 of every input of rank >= 1: a fixed batch.
    """
    name = _shared_batch_dim(inputs, outputs, overrides)
    axes: dict[str, int | None] = {}
    dynamic_lead = any(s.shape and not isinstance(s.shape[0], int) for s in inputs)
    for spec in (*inputs, *outputs):
        if name is not None:
            axes[spec.name] = spec.shape.index(name) if name in spec.shape else None
        elif spec.shape and (not isinstance(spec.shape[0], int) or not dynamic_lead):
            axes[spec.name] = 0
        else:
            axes[spec.name] = None
    axes.update(overrides)
    return axes


def proto_batch_axes(proto: Any) -> dict[str, int | None]:
    """:func:`batch_axes` of a loaded ONNX model's own inputs and outputs (no user overrides); ``{}`` when
    its interface cannot be read (:class:`ModelError`): then no tensor is known to be batched."""
    try:
        inputs, outputs, _ = _specs(proto)
    except ModelError:
        return {}
    return batch_axes(inputs, outputs, {})


def _shared_batch_dim(
    inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec], overrides: Mapping[str, int | None]
) -> str | None:
    for input_name, axis in overrides.items():  # the user's axis names the dim outputs share
        dims = next((s.shape for s in inputs if s.name == input_name), ())
        if axis is not None and axis < len(dims) and isinstance(dims[axis], str):
            return dims[axis]  # type: ignore[return-value]
    names_in = {d for s in inputs for d in s.shape if isinstance(d, str)}
    names_out = {d for s in outputs for d in s.shape if isinstance(d, str)}
    leading = {s.shape[0] for s in inputs if s.shape}

    def rank(name: str) -> tuple[bool, int, int]:
        having = [s for s in (*inputs, *outputs) if name in s.shape]
        return bool(_BATCH_NAME.fullmatch(name)), len(having), -sum(s.shape.index(name) for s in having)

    shared = [n for n in names_in & names_out if _BATCH_NAME.fullmatch(n) or n in leading]
    return max(sorted(shared), key=rank) if shared else None


def _with_batch_axes(info: ModelInfo, axes: Mapping[str, int | None]) -> ModelInfo:
    """Check the user's batch axes against the model and attach them."""
    for name, axis in axes.items():
        spec = info.input(name)
        if axis is not None and axis >= len(spec.shape):
            raise ShapeError(
                f"--batch-axis {name}={axis} is past the last axis of input {name!r} ({spec.shape_str() or 'a scalar'})",
                fix=f"give an axis in 0..{len(spec.shape) - 1}, or {name}=none" if spec.shape else f"use {name}=none",
            )
    return ModelInfo(**{**info.__dict__, "batch_axes": dict(axes)})


def _with_shapes(info: ModelInfo, shapes: Mapping[str, tuple[int, ...]]) -> ModelInfo:
    """Check user-fixed shapes against the model and attach them."""
    for name, shape in shapes.items():
        spec = info.input(name)
        if len(shape) != len(spec.shape):
            raise ShapeError(
                f"--shape {name}={'x'.join(map(str, shape))} has rank {len(shape)}, "
                f"input {name!r} has rank {len(spec.shape)} ({spec.shape_str()})"
            )
        for axis, (want, got) in enumerate(zip(spec.shape, shape, strict=True)):
            if isinstance(want, int) and want != got:
                raise ShapeError(
                    f"--shape {name}={'x'.join(map(str, shape))} does not fit input {name!r} "
                    f"({spec.shape_str()}): axis {axis} is fixed at {want}"
                )
    return ModelInfo(**{**info.__dict__, "shapes": dict(shapes)})


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # undecodable bytes of a file name, kept as surrogates
        return False
    return True


def _sha256(model: Path, folder: Path, external: Sequence[str], copy_to: Sequence[Path] | None = None) -> str:
    """SHA-256 over ``model`` and its ``external`` data files in order; optionally copied as read.

    The model file itself is opened resolved (a link to a model is fine). Its external data is
    opened one path component at a time from a descriptor of ``folder``, following no link at
    any level (``O_NOFOLLOW`` guards only the last component of a path, so a folder swapped for
    a link on the way would otherwise be followed): only plain files and folders inside it are read.
    """
    digest, total = hashlib.sha256(), 0
    targets = copy_to or [None] * (1 + len(external))
    for i, (fd, target) in enumerate(zip(_open_all(model, folder, external), targets, strict=True)):
        total += os.fstat(fd).st_size  # the file as opened: one grown since it was sized is caught here
        if total > MAX_MODEL_BYTES:
            os.close(fd)
            raise _too_big(model, total)
        if target is not None and i:
            target.parent.mkdir(parents=True, exist_ok=True)  # external data may live in a subfolder (d/w.bin)
        with os.fdopen(fd, "rb") as fh, (open(target, "wb") if target else contextlib.nullcontext()) as out:
            for chunk in iter(lambda: fh.read(1 << 20), b""):  # noqa: B023 - fh is this iteration's
                digest.update(chunk)
                if out is not None:
                    out.write(chunk)
    return digest.hexdigest()


_NO_LINKS = "keep the model and its external data as plain files and folders inside the model's folder, not links"


def _open_all(model: Path, folder: Path, external: Sequence[str]) -> Iterator[int]:
    """A read descriptor of ``model``, then of each external data file, opened lazily in order."""
    try:
        yield os.open(model, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError as exc:
        raise ModelError(f"cannot read {model}: {exc.strerror or exc}", fix=_NO_LINKS) from None
    for rel in external:
        yield _open_below(folder, rel)


def _open_below(folder: Path, rel: str) -> int:
    """``folder / rel`` opened for reading, each component relative to its parent's descriptor, no link followed."""
    nofollow = getattr(os, "O_NOFOLLOW", 0)
    if not (nofollow and os.open in os.supports_dir_fd):  # not POSIX: the last component is the one checked
        try:
            return os.open(folder / rel, os.O_RDONLY | nofollow)
        except OSError as exc:
            raise ModelError(f"cannot read {folder / rel}: {exc.strerror or exc}", fix=_NO_LINKS) from None
    *dirs, name = Path(rel).parts
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for i, part in enumerate([*dirs, name]):
            flags = os.O_RDONLY | nofollow | (os.O_DIRECTORY if i < len(dirs) else 0)
            try:
                child = os.open(part, flags, dir_fd=fd)
            except OSError as exc:
                where = "/".join([*dirs, name][: i + 1])
                why = "is a link" if os.path.islink(folder / where) else (exc.strerror or str(exc))
                raise ModelError(f"cannot read external data {rel!r} of the model in {folder}: {where} {why}",
                                 fix=_NO_LINKS) from None  # fmt: skip
            os.close(fd)
            fd = child
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ModelError(f"external data {rel!r} of the model in {folder} is not a plain file", fix=_NO_LINKS)
        return fd
    except BaseException:
        os.close(fd)
        raise


def copy_unchanged(model: ModelInfo, folder: Path, name: str) -> None:
    """Copy the model (as ``name``) and its external data into ``folder``, exactly as taken in at intake.

    Files are read once, without following links, and hashed as they are copied; a model that
    changed since intake (a file replaced, a link swapped in) is refused, so an artifact never
    holds bytes other than the ones the reference was computed from.
    """
    sources = [model.path, *(model.path.parent / f for f in model.external_files)]
    _check_size(sources, model.path)
    _check_room(folder, sum(f.stat().st_size for f in sources), model.path.name)
    targets = [folder / name, *(folder / f for f in model.external_files)]
    if _sha256(model.path.resolve(), model.path.parent, model.external_files, copy_to=targets) != model.sha256:
        raise ModelError(f"{model.path} or its external data changed since it was taken in",
                         fix="run the command again, and keep the model unchanged while it runs")  # fmt: skip


def _check_room(folder: Path, need: int, what: str) -> None:
    """Refuse to start a copy of ``need`` bytes that the disk of ``folder`` cannot take (a sparse
    weights file is copied dense): nothing is written, rather than a disk filled halfway."""
    free = shutil.disk_usage(next(p for p in (folder, *folder.parents) if p.exists())).free
    if need > free:
        # the worker's private copies go to TMPDIR; everything else to the cache
        setting = "TMPDIR" if folder.is_relative_to(tempfile.gettempdir()) else "AUTODEPLOY_CACHE"
        raise WriteError(f"cannot copy {what} and its weights ({_size(need)}) into {folder}: "
                         f"{_size(free)} free; nothing was written", fix=f"free space on the disk of {folder}, "
                         f"or set {setting} to a folder on a disk with room")  # fmt: skip
