"""Model intake: load and validate an ONNX file before any engine sees it.

``load_model`` is the only way a model enters autodeploy. It refuses anything unsafe or
malformed with a :class:`~autodeploy.errors.ModelError` that says what and how to fix it:
a missing file, a file that is not ONNX, a truncated model, a checker failure, or external
data whose location leaves the model's folder (``..``, an absolute path, a symlink).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from autodeploy.errors import ModelError, ShapeError

if TYPE_CHECKING:
    from autodeploy.data import Dataset

Dim = int | str | None  # a static size, a named dynamic dim, or an unnamed dynamic dim


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


@dataclass(frozen=True)
class ModelInfo:
    """A validated ONNX model: where it is, its identity and its interface.

    ``shapes`` holds the user's fixed input shapes (``--shape``), already checked to fit.
    """

    path: Path
    name: str
    sha256: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    opset: int
    external_files: tuple[str, ...] = ()
    shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)

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

    def batchable(self) -> bool:
        """True when every input's first dim is dynamic, so any batch size can be fed."""
        return all(s.shape and not isinstance(s.shape[0], int) for s in self.inputs)

    def item_shape(self, name: str) -> tuple[int, ...]:
        """Concrete shape of one item (the input shape without its batch axis)."""
        return self.input_shape(name, batch=1)[1:]

    def input_shape(self, name: str, batch: int) -> tuple[int, ...]:
        """Concrete input shape at ``batch``: the first dim is the batch axis.

        A user-fixed shape wins (its first dim is replaced by ``batch`` when the model's
        first dim is dynamic). Any other dynamic dim must have been fixed with ``--shape``.
        """
        spec = self.input(name)
        if name in self.shapes:
            fixed = self.shapes[name]
            if spec.shape and not isinstance(spec.shape[0], int):
                return (batch, *fixed[1:])
            return fixed
        if not spec.shape:
            return ()
        dims = list(spec.shape)
        if not isinstance(dims[0], int):
            dims[0] = batch
        elif dims[0] != batch:
            raise ShapeError(
                f"input {name!r} has a static batch dim {dims[0]}, cannot run batch {batch}",
                fix=f"use --batch {dims[0]} or export the model with a dynamic first dim",
            )
        for axis, d in enumerate(dims):
            if not isinstance(d, int):
                raise ShapeError(
                    f"input {name!r} has dynamic dim {d or '?'} at axis {axis} (shape {spec.shape_str()})",
                    fix=f"fix it with --shape {name}="
                    + "x".join(str(x) if isinstance(x, int) else "N" for x in dims),
                )
        return tuple(dims)  # type: ignore[arg-type]

    def shape_overrides_key(self) -> str:
        return json.dumps({k: list(v) for k, v in sorted(self.shapes.items())})

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
        )


def parse_shape_flags(flags: Sequence[str]) -> dict[str, tuple[int, ...]]:
    """Parse ``--shape name=1x3x224x224`` flags into ``{name: (1, 3, 224, 224)}``."""
    shapes: dict[str, tuple[int, ...]] = {}
    for flag in flags:
        name, sep, dims = flag.partition("=")
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


def load_model(
    path: str | Path, shapes: Mapping[str, tuple[int, ...]] | None = None, name: str | None = None
) -> ModelInfo:
    """Load, validate and describe an ONNX model.

    Args:
        path: the ``.onnx`` file.
        shapes: user-fixed input shapes; each must have the input's rank and agree with its static dims.
        name: display name (defaults to the file stem).

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
    if not str(path).isascii() and not _utf8(str(path)):  # ONNX's C++ checker takes UTF-8 paths only
        raise ModelError(f"model path {path} is not valid UTF-8", fix="rename the file (or its folder)")
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
    try:
        # The path form lets the checker handle models with external data and > 2 GB.
        onnx.checker.check_model(str(path))
    except Exception as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelError(
            f"{path} fails the ONNX checker: {first_line}", fix="fix or re-export the model"
        ) from None
    inputs, outputs = _specs(proto)
    if not inputs or not outputs:
        what = "inputs (every graph input is an initializer)" if not inputs else "outputs"
        raise ModelError(f"{path} has no {what}; there is nothing to benchmark", fix="re-export the model")
    opset = max((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), default=0)
    info = ModelInfo(
        path=path.resolve(),
        name=name or path.stem,
        sha256=_sha256([path.resolve(), *(path.parent / f for f in external)]),
        inputs=inputs,
        outputs=outputs,
        opset=opset,
        external_files=external,
    )
    return _with_shapes(info, shapes or {})


@dataclass(frozen=True)
class ResolvedModel:
    """A model reference resolved: the loaded model, and a zoo model's own labelled data."""

    info: ModelInfo
    data: Dataset | None = None  # a zoo model's own labelled evaluation data
    calibration: Dataset | None = None


def display_name(ref: str | Path) -> str:
    """The display name :func:`resolve_model` gives ``ref``: ``zoo:NAME``, else the file's stem."""
    from autodeploy import zoo

    name = zoo.parse_ref(str(ref))
    return f"zoo:{name}" if name is not None else Path(ref).stem


def resolve_model(
    ref: str | Path,
    shapes: Mapping[str, Sequence[int]] | None = None,
    *,
    cache_dir: Path | None = None,
    progress: Callable[[str], None] | None = None,
) -> ResolvedModel:
    """Load ``PATH.onnx`` or ``zoo:NAME`` (built on first use), with the zoo's dataset if it has one.

    Args:
        ref: an ``.onnx`` path or ``zoo:NAME``.
        shapes: fixed input shapes, ``{name: (1, 3, 224, 224)}``.
        cache_dir: where zoo models are cached (default ``$AUTODEPLOY_CACHE`` or the user cache folder).
        progress: told when a zoo model is being built (the first use takes a while).

    Raises:
        ModelError: the file is missing, not ONNX, truncated, invalid or unsafe.
        ShapeError: a fixed shape does not fit.
        UsageError: ``zoo:NAME`` names no zoo model.
    """
    from autodeploy import zoo
    from autodeploy.data import Dataset

    fixed = {k: tuple(v) for k, v in (shapes or {}).items()}
    name = zoo.parse_ref(str(ref))
    if name is None:
        return ResolvedModel(load_model(ref, fixed))
    if progress is not None:
        progress(f"building zoo:{name} (first use only)")
    path = zoo.get(name, cache_dir)
    dataset = zoo.dataset(name, cache_dir)
    info = load_model(path, fixed, name=f"zoo:{name}")
    if dataset is None:
        return ResolvedModel(info)
    calibration = dataset.get("calibration")
    return ResolvedModel(
        info,
        Dataset(dataset["inputs"], dataset.get("labels")),
        Dataset(calibration) if calibration is not None else None,
    )


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


def _specs(proto: Any) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
    from onnx import helper

    initializers = {t.name for t in proto.graph.initializer}

    def spec(value: Any) -> TensorSpec:
        ttype = value.type.tensor_type
        if not value.type.HasField("tensor_type"):
            raise ModelError(f"input/output {value.name!r} is not a tensor; only tensor inputs are supported")
        try:
            dtype = np.dtype(helper.tensor_dtype_to_np_dtype(ttype.elem_type)).name
        except (KeyError, TypeError):  # elem_type 0 (UNDEFINED) or a number ONNX does not define
            raise ModelError(
                f"input/output {value.name!r} has element type {ttype.elem_type}, not an ONNX tensor type",
                fix="re-export the model",
            ) from None
        dims: list[Dim] = []
        for d in ttype.shape.dim:
            if d.HasField("dim_value"):
                if d.dim_value < 0:
                    raise ModelError(
                        f"input/output {value.name!r} declares a negative dim {d.dim_value}",
                        fix="re-export the model",
                    )
                dims.append(int(d.dim_value))
            else:
                dims.append(d.dim_param or None)
        return TensorSpec(value.name, dtype, tuple(dims))

    inputs = tuple(spec(v) for v in proto.graph.input if v.name not in initializers)
    outputs = tuple(spec(v) for v in proto.graph.output)
    return inputs, outputs


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


def _sha256(files: Sequence[Path], copy_to: Sequence[Path] | None = None) -> str:
    """SHA-256 over ``files`` in order, read without following a final symlink; optionally copied as read.

    The model file itself is passed resolved (a link to a model is fine); its external data is
    read as the plain files that intake checked, never through a link swapped in later.
    """
    digest = hashlib.sha256()
    for i, file in enumerate(files):
        try:
            fd = os.open(file, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except OSError as exc:
            raise ModelError(f"cannot read {file}: {exc.strerror or exc}",
                             fix="keep the model and its external data as plain files, not links") from None  # fmt: skip
        with os.fdopen(fd, "rb") as fh, (open(copy_to[i], "wb") if copy_to else contextlib.nullcontext()) as out:
            for chunk in iter(lambda: fh.read(1 << 20), b""):  # noqa: B023 - fh is this iteration's
                digest.update(chunk)
                if out is not None:
                    out.write(chunk)
    return digest.hexdigest()


def copy_unchanged(model: ModelInfo, folder: Path, name: str) -> None:
    """Copy the model (as ``name``) and its external data into ``folder``, exactly as taken in at intake.

    Files are read once, without following links, and hashed as they are copied; a model that
    changed since intake (a file replaced, a link swapped in) is refused, so an artifact never
    holds bytes other than the ones the reference was computed from.
    """
    sources = [model.path.resolve(), *(model.path.parent / f for f in model.external_files)]
    targets = [folder / name, *(folder / f for f in model.external_files)]
    if _sha256(sources, copy_to=targets) != model.sha256:
        raise ModelError(f"{model.path} or its external data changed since it was taken in",
                         fix="run the command again, and keep the model unchanged while it runs")  # fmt: skip
