"""Inputs for a trial: the user's data or synthetic data, split into calibration and evaluation.

A :class:`Dataset` holds one array per model input with a leading *item* axis:
``inputs[name].shape == (n_items, *item_shape)``, where the item shape is the input shape
without its batch axis (:meth:`ModelInfo.item_shape`). Batches are cut from it by the
harness: :func:`feeds` puts the items back on each input's own batch axis.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

from autodeploy.errors import DataError
from autodeploy.model import ModelInfo

DEFAULT_SEED = 0
#: Synthetic integer inputs are drawn from [0, INT_HIGH): a range every embedding table of a
#: real model covers. Pin a value with ``--input name=value`` when that is wrong.
INT_HIGH = 100


@dataclass(frozen=True)
class Dataset:
    """Arrays with a leading item axis, one per model input, plus optional labels."""

    inputs: Mapping[str, np.ndarray]
    labels: np.ndarray | None = None

    def __post_init__(self) -> None:
        sizes = {len(a) for a in self.inputs.values()}
        if len(sizes) > 1:
            raise DataError(
                f"inputs have different item counts: { {k: len(v) for k, v in self.inputs.items()} }"
            )
        if self.labels is not None and sizes and len(self.labels) != sizes.pop():
            raise DataError(f"{len(self.labels)} labels for {len(self)} items")

    def __len__(self) -> int:
        return len(next(iter(self.inputs.values()))) if self.inputs else 0

    def take(self, index: slice | np.ndarray) -> Dataset:
        labels = None if self.labels is None else self.labels[index]
        return Dataset({k: v[index] for k, v in self.inputs.items()}, labels)

    def batches(self, batch: int, axes: Mapping[str, int | None] | None = None) -> list[dict[str, np.ndarray]]:
        """Consecutive batches of ``batch`` items; the last one is padded by repeating its first item.

        ``axes`` is each input's batch axis (:meth:`ModelInfo.batch_axis`; default 0). Padding
        keeps every batch the same shape, which engines compiled for a fixed batch need.
        Callers trim outputs to ``len(self)``.
        """
        return [feeds(self.inputs, start, batch, axes) for start in range(0, len(self), batch)]

    def sha256(self) -> str:
        digest = hashlib.sha256()
        for name in sorted(self.inputs):
            array = np.ascontiguousarray(self.inputs[name])
            digest.update(f"{name}:{array.dtype}:{array.shape}".encode())
            digest.update(array.tobytes())
        if self.labels is not None:
            digest.update(np.ascontiguousarray(self.labels).tobytes())
        return digest.hexdigest()

    def save(self, path: Path) -> None:
        arrays = {f"input:{k}": v for k, v in self.inputs.items()}
        if self.labels is not None:
            arrays["labels"] = self.labels
        np.savez(path, **arrays)

    @classmethod
    def load(cls, path: Path) -> Dataset:
        with np.load(path, allow_pickle=False) as npz:
            inputs = {k.removeprefix("input:"): npz[k] for k in npz.files if k.startswith("input:")}
            labels = npz["labels"] if "labels" in npz.files else None
        return cls(inputs, labels)


def feeds(
    arrays: Mapping[str, np.ndarray], start: int, batch: int, axes: Mapping[str, int | None] | None = None
) -> dict[str, np.ndarray]:
    """One batch of model feeds from item-leading arrays: items ``start .. start + batch``
    (padded by repeating the first) moved to each input's batch axis; an input without a
    batch axis (a scalar, a table, state without batch) is fed its first item, unbatched."""
    out = {}
    for name, array in arrays.items():
        axis = 0 if axes is None else axes.get(name, 0)
        chunk = array[start : start + batch]
        if axis is None:
            out[name] = np.array(chunk[0], order="C")  # ascontiguousarray would make a scalar 1-d
            continue
        if len(chunk) < batch:
            chunk = np.concatenate([chunk, np.repeat(chunk[:1], batch - len(chunk), axis=0)])
        out[name] = np.ascontiguousarray(np.moveaxis(chunk, 0, axis))
    return out


def parse_input_pins(flags: Sequence[str]) -> dict[str, float]:
    """Parse ``--input name=value`` flags (a constant for every item, e.g. a sample rate)."""
    pins: dict[str, float] = {}
    for flag in flags:
        name, sep, value = flag.partition("=")
        try:
            if not sep or not name:
                raise ValueError
            pins[name] = float(value)
        except ValueError:
            raise DataError(
                f"cannot parse --input {flag!r}", fix="write it as NAME=NUMBER, e.g. sample_rate=16000"
            ) from None
    return pins


def synthetic(
    model: ModelInfo, n: int, *, seed: int = DEFAULT_SEED, pins: Mapping[str, float] | None = None
) -> Dataset:
    """Random inputs that respect each input's dtype and shape.

    Floats are standard normal; integer inputs whose name says *mask* are ones, *type* ids
    are zeros, other integers are uniform in ``[0, INT_HIGH)``; booleans are True. A pinned
    input is that constant everywhere.
    """
    pins = dict(pins or {})
    for name in pins:
        model.input(name)  # raises with the list of inputs when the name is wrong
    rng = np.random.default_rng(seed)
    arrays = {}
    for spec in model.inputs:
        shape = (n, *model.item_shape(spec.name))
        dtype = np.dtype(spec.dtype)
        _check_size(spec.name, shape, dtype)
        lowered = spec.name.lower()
        if spec.name in pins:
            array = np.full(shape, pins[spec.name], dtype=dtype)
        elif dtype.kind == "f":
            array = rng.standard_normal(shape, dtype=np.float32).astype(dtype)
        elif dtype.kind == "b":
            array = np.ones(shape, dtype=dtype)
        elif dtype.kind in "iu" and "mask" in lowered:
            array = np.ones(shape, dtype=dtype)
        elif dtype.kind in "iu" and "type" in lowered:
            array = np.zeros(shape, dtype=dtype)
        elif dtype.kind in "iu":
            array = rng.integers(0, INT_HIGH, size=shape).astype(dtype)
        else:
            raise DataError(
                f"cannot synthesize input {spec.name!r} of dtype {dtype}", fix="give data with --data"
            )
        arrays[spec.name] = array
    return Dataset(arrays)


def _check_size(name: str, shape: tuple[int, ...], dtype: np.dtype) -> None:
    """Refuse synthetic inputs that cannot fit in memory (a model may declare absurd static dims)."""
    import psutil

    need = math.prod(shape) * dtype.itemsize  # Python ints: no overflow for dims like 2**62
    limit = psutil.virtual_memory().total // 2
    if need > limit:
        raise DataError(
            f"synthetic input {name!r} of shape {'x'.join(map(str, shape))} would take {need / 2**30:.3g} GiB, "
            f"more than half of this machine's memory ({limit / 2**30:.3g} GiB)",
            fix="fix smaller dims with --shape, or give --data",
        )


def memory_limit() -> int:
    """Bytes of user data read into memory at most: a quarter of this machine's memory (the data is
    split, saved and loaded again by every worker, so it is held several times over)."""
    import psutil

    return psutil.virtual_memory().total // 4


def check_fits(what: str, need: int, fix: str) -> None:
    """Refuse, before reading it, data that would take more than :func:`memory_limit`."""
    limit = memory_limit()
    if need > limit:
        raise DataError(f"{what} would take {_gib(need)} in memory, more than a quarter of this "
                        f"machine's memory ({_gib(limit)})", fix=fix)  # fmt: skip


def _gib(n: int) -> str:
    return f"{n / 2**30:.3g} GiB" if n < 2**40 else f"{n / 2**40:,.0f} TiB"


def _check_declared(path: Path, need: int) -> None:
    check_fits(f"input data {path}", need, fix="give fewer items (a few hundred measure accuracy well)")


def _declared_bytes(source: Path | IO[bytes]) -> int:
    """The size an ``.npy`` array declares in its header, read without reading the array: a header can
    declare 64 TiB in a file of 128 bytes."""
    from numpy.lib import format as npy

    if isinstance(source, Path):
        with source.open("rb") as fp:
            return _declared_bytes(fp)
    version = npy.read_magic(source)
    read = npy.read_array_header_1_0 if version == (1, 0) else npy.read_array_header_2_0  # 3.0 is 2.0 in UTF-8
    shape, _, dtype = read(source)
    return math.prod(shape) * dtype.itemsize  # Python ints: no overflow


def _npz_declared_bytes(npz: Any) -> int:
    """What every array of an ``.npz`` declares; a member that is not an array (numpy would read it
    whole, as bytes) is refused."""
    total = 0
    for member in npz.zip.namelist():
        if not member.endswith(".npy"):
            raise ValueError(f"{member!r} is not a numpy array")
        with npz.zip.open(member) as fp:
            total += _declared_bytes(fp)
    return total


#: Every form ``--data`` takes, for the line that refuses another.
DATA_FORMS = ("give a .npz (one array per input, named after it, plus an optional 'labels'), a .npy (a model with one "
              "input), a folder of NAME.npy files, a folder of images (resized to the input; subfolders name classes), "
              "or sample:images")
#: Files a user may give as data that autodeploy does not decode, by what they are.
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff")
AUDIO_SUFFIXES = (".wav", ".flac", ".mp3", ".ogg", ".m4a", ".opus")


def _what_it_is(path: Path, model: ModelInfo) -> str:
    """Why a file is not data autodeploy reads, in the words of what it is."""
    suffix = path.suffix.lower()
    if suffix in IMAGE_SUFFIXES:
        return "one image file; images are read from a folder of them (put it in a folder and give the folder)"
    if suffix in AUDIO_SUFFIXES:
        return ("an audio file, which autodeploy does not decode: make the model's inputs from it as your code does "
                "(windows, features) and save them with numpy.savez")  # fmt: skip
    if suffix == ".npy":
        return f"a bare .npy feeds a model with one input, and this one has {len(model.inputs)}"
    return "not a form autodeploy reads"


def load_user_data(path: str | Path, model: ModelInfo) -> Dataset:
    """Read user inputs from a ``.npz`` file or a folder of ``NAME.npy`` files and check them.

    Arrays carry a leading item axis: ``(n_items, *item_shape)``. An array named ``labels``
    (int, one per item) turns on task accuracy.
    """
    path = Path(path)
    arrays: dict[str, np.ndarray] = {}
    try:
        if path.is_dir():
            files = sorted(path.glob("*.npy"))
            _check_declared(path, sum(_declared_bytes(file) for file in files))
            for file in files:
                arrays[file.stem] = np.load(file, allow_pickle=False)
        elif path.suffix == ".npz":
            with np.load(path, allow_pickle=False) as npz:
                _check_declared(path, _npz_declared_bytes(npz))
                arrays = {k: npz[k] for k in npz.files}
        elif path.suffix == ".npy" and len(model.inputs) == 1:
            _check_declared(path, _declared_bytes(path))
            arrays = {model.inputs[0].name: np.load(path, allow_pickle=False)}
        else:
            raise DataError(f"cannot read input data {path}: {_what_it_is(path, model)}", fix=DATA_FORMS)
    except (OSError, ValueError) as exc:
        raise DataError(f"cannot read input data {path}: {exc}", fix="save it with numpy.savez") from None
    labels = arrays.pop("labels", None)
    missing = [n for n in model.input_names if n not in arrays]
    unknown = [n for n in arrays if n not in model.input_names]
    if missing or unknown:
        raise DataError(
            f"input data {path} has arrays {sorted(arrays)}, the model wants {list(model.input_names)}",
            fix="name each array after a model input (plus an optional 'labels')",
        )
    def has_items(name: str, array: np.ndarray) -> bool:  # False: an unbatched input given as one value
        return model.batch_axis(name) is not None or array.ndim > len(model.input(name).shape)

    n = max((len(a) for k, a in arrays.items() if has_items(k, a)), default=1)
    for name, array in list(arrays.items()):
        if not has_items(name, array):
            arrays[name] = np.broadcast_to(array, (n, *array.shape))  # one value for every item
        _check_array(model, name, arrays[name])
    if labels is not None:
        labels = _labels(np.asarray(labels), n, path)
    return Dataset(arrays, labels)


def _labels(labels: np.ndarray, n: int, path: Path) -> np.ndarray:
    """Labels as given, one entry per item (class ids, boxes, token sequences: any shape after the item
    axis); whole-number floats in one dimension are class ids."""
    if labels.ndim == 0 or len(labels) != n:
        raise DataError(f"input data {path}: 'labels' has {labels.shape[0] if labels.ndim else 'no'} entries "
                        f"for {n} items", fix="give one label entry per item, along the first axis")  # fmt: skip
    if labels.ndim == 1 and np.issubdtype(labels.dtype, np.floating) and np.all(labels == np.round(labels)):
        return labels.astype(np.int64)
    return labels


def _check_array(model: ModelInfo, name: str, array: np.ndarray) -> None:
    spec = model.input(name)
    if array.dtype != np.dtype(spec.dtype):
        raise DataError(
            f"input data {name!r} has dtype {array.dtype}, the model wants {spec.dtype}",
            fix=f"convert it with array.astype(numpy.{spec.dtype})",
        )
    want = model.item_dims(name)
    got = tuple(array.shape[1:])
    if len(got) != len(want) or any(isinstance(w, int) and w != g for w, g in zip(want, got, strict=False)):
        shown = tuple(d if isinstance(d, int) else "?" for d in want)
        raise DataError(
            f"input data {name!r} has items of shape {got}, the model wants {shown}".replace("'?'", "?"),
            fix="arrays are (n_items, *item_shape), the item without its batch axis; fix the data or --shape",
        )


def shapes_from_data(model: ModelInfo, data: Dataset) -> dict[str, tuple[int, ...]]:
    """Input shapes the data fixes: for each input with dynamic non-batch dims that ``--shape``
    left open, its items' shape with the batch axis put back (at batch 1, or the model's fixed batch)."""
    shapes = {}
    for spec in model.inputs:
        if spec.name in model.shapes or spec.name not in data.inputs:
            continue
        axis = model.batch_axis(spec.name)
        open_dims = [i for i, d in enumerate(spec.shape) if not isinstance(d, int) and i != axis]
        if not open_dims:
            continue
        item = list(data.inputs[spec.name].shape[1:])
        if axis is not None:
            declared = spec.shape[axis]
            item.insert(axis, declared if isinstance(declared, int) else 1)
        shapes[spec.name] = tuple(int(d) for d in item)
    return shapes


def split(data: Dataset, calibration: int, *, seed: int = DEFAULT_SEED) -> tuple[Dataset, Dataset]:
    """Split into (calibration, evaluation) by a seeded shuffle; the two never share an item.

    With too few items for both, calibration and evaluation overlap entirely and a real
    dataset should be given; the harness reports the counts.
    """
    n = len(data)
    if n < 2:
        return data, data
    order = np.random.default_rng(seed).permutation(n)
    k = min(calibration, n // 2)
    return data.take(np.sort(order[:k])), data.take(np.sort(order[k:]))
