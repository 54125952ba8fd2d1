"""Models built in code for tests, demos and benchmarks: no downloads, deterministic, cached.

``get("tiny-cnn")`` builds the model on first use and returns the path of the cached ``.onnx``
file; later calls return the same file. ``dataset(name)`` gives the labelled evaluation and
calibration data of the models fitted to real data (digits, resnet50, mobilenetv2). A model reference on the command line is ``zoo:NAME``.

Builders live in submodules and are imported only when a model is built, so importing this
package pulls in neither onnx nor scikit-learn nor onnxruntime.
"""

from __future__ import annotations

import importlib
import os
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autodeploy.errors import UsageError, WriteError

if TYPE_CHECKING:
    import numpy as np

REF_PREFIX = "zoo:"
#: ImageNet preprocessing (torchvision's) in benchmark_app's words: the photo classifiers' data
#: (``autodeploy.zoo.photos.IMAGENET``), as :meth:`autodeploy.images.Preprocess.to_dict` writes it.
IMAGENET = {"layout": "NCHW", "reverse_input_channels": False, "mean_values": [123.675, 116.28, 103.53],
            "scale_values": [58.395, 57.12, 57.375]}  # fmt: skip

#: The classifiers' ``logits`` output: class logits (:attr:`ZooEntry.accuracy`).
CLASS_LOGITS = "logits=top1"


@dataclass(frozen=True)
class ZooEntry:
    """One buildable model.

    Attributes:
        name: The zoo name (``zoo:NAME``).
        description: One line for listings.
        builder: ``"module:function"`` (imported lazily) or a function; returns an ``onnx.ModelProto``.
        version: Short builder version, part of the cached file name; bump it when the builder
            changes so stale files are not reused.
        has_dataset: Whether ``dataset_builder`` gives real labelled data for this model.
        dataset_builder: Like ``builder``; returns flat arrays ``inputs/<name>``, ``labels``,
            ``calibration/<name>``.
        preprocess: How the dataset's images were made into inputs
            (:meth:`autodeploy.images.Preprocess.to_dict`): what its bundles feed images with.
        accuracy: How its outputs are judged, in ``--accuracy``'s words, written into the model's
            metadata (:data:`autodeploy.accuracy.kinds.DECLARED_KEY`): the classifiers' ``logits`` are class
            logits, which a Gemm alone does not prove (it would be judged as a regression).
    """

    name: str
    description: str
    builder: str | Callable[[], Any]
    version: str = "1"
    has_dataset: bool = False
    dataset_builder: str | Callable[[], dict[str, np.ndarray]] | None = None
    preprocess: Mapping[str, Any] | None = None
    accuracy: str = ""

    def __post_init__(self) -> None:
        if self.has_dataset != (self.dataset_builder is not None):
            raise ValueError(f"zoo entry {self.name!r}: has_dataset needs a dataset_builder and vice versa")


ZOO: dict[str, ZooEntry] = {
    "tiny-cnn": ZooEntry(
        "tiny-cnn",
        "[N,3,32,32] Conv-BN-Relu, residual Add, pooling, Gemm -> 10",
        "autodeploy.zoo.cnn:tiny_cnn",
        version="2",
        accuracy=CLASS_LOGITS,
    ),
    "mlp": ZooEntry("mlp", "[N,256] Gemm / MatMul+Add with Relu -> 10", "autodeploy.zoo.dense:mlp", version="2",
                    accuracy=CLASS_LOGITS),
    "resnet50": ZooEntry(
        "resnet50",
        "ResNet-50 v1.5, [N,3,224,224] -> 1000, fitted to sklearn's sample photos (needs scikit-learn, Pillow)",
        "autodeploy.zoo.cnn:resnet50",
        version="3",
        accuracy=CLASS_LOGITS,
        has_dataset=True,
        dataset_builder="autodeploy.zoo.photos:dataset_arrays",
        preprocess=IMAGENET,
    ),
    "mobilenetv2": ZooEntry(
        "mobilenetv2",
        "MobileNetV2 1.0, [N,3,224,224] -> 1000, fitted to sklearn's sample photos (needs scikit-learn, Pillow)",
        "autodeploy.zoo.cnn:mobilenetv2",
        version="4",
        accuracy=CLASS_LOGITS,
        has_dataset=True,
        dataset_builder="autodeploy.zoo.photos:dataset_arrays",
        preprocess=IMAGENET,
    ),
    "bert-small": ZooEntry(
        "bert-small",
        "BERT-shaped encoder, seq 128, hidden 256, 4 layers",
        "autodeploy.zoo.transformer:bert_small",
    ),
    "digits": ZooEntry(
        "digits",
        "MLP trained on sklearn digits, [N,64] -> 10 (needs scikit-learn)",
        "autodeploy.zoo.digits:build",
        version="2",
        accuracy=CLASS_LOGITS,
        has_dataset=True,
        dataset_builder="autodeploy.zoo.digits:dataset_arrays",
    ),
}


def names() -> tuple[str, ...]:
    """The zoo's model names, in listing order."""
    return tuple(ZOO)


def parse_ref(text: str) -> str | None:
    """Returns NAME for ``"zoo:NAME"``, else None (the text is then a path, not a zoo reference)."""
    if text.startswith(REF_PREFIX) and len(text) > len(REF_PREFIX):
        return text[len(REF_PREFIX) :]
    return None


def entry(name: str) -> ZooEntry:
    """The entry for ``name``; raises UsageError naming the available models."""
    try:
        return ZOO[name]
    except KeyError:
        raise UsageError(f"unknown zoo model {name!r}", fix=f"choose one of {', '.join(ZOO)}") from None


def get(name: str, cache_dir: Path | None = None) -> Path:
    """Path of the cached ``.onnx`` file for ``name``, building it on first use.

    Args:
        name: A zoo name (see ``names()``).
        cache_dir: Cache root; files go in its ``zoo/`` subfolder. Default: ``$AUTODEPLOY_CACHE``
            or the platform's user cache folder for autodeploy.

    Raises:
        UsageError: ``name`` is not in the zoo.
    """
    item = entry(name)
    path = zoo_dir(cache_dir) / f"{name}-v{item.version}.onnx"
    if not path.exists():
        model = _resolve(item.builder)()
        if item.accuracy:
            from autodeploy.accuracy.kinds import DECLARED_KEY

            model.metadata_props.add(key=DECLARED_KEY, value=item.accuracy)
        _write_atomic(path, lambda f: f.write(model.SerializeToString()))
    return path


def dataset(name: str, cache_dir: Path | None = None) -> dict[str, Any] | None:
    """Labelled data for models fitted to real data (digits, resnet50, mobilenetv2); None for the others.

    Returns:
        ``{"inputs": {input: float32 [N, ...]}, "labels": int64 [N], "calibration": {input: array}}``:
        inputs/labels are the evaluation (test) split, calibration comes from the training split.
    """
    import numpy as np

    item = entry(name)
    if item.dataset_builder is None:
        return None
    path = zoo_dir(cache_dir) / f"{name}-v{item.version}.data.npz"
    if not path.exists():
        arrays = _resolve(item.dataset_builder)()
        _write_atomic(path, lambda f: np.savez(f, **arrays))
    with np.load(path, allow_pickle=False) as npz:
        flat = {key: npz[key] for key in npz.files}
    return _nest(flat)


def own_inputs(ref: str) -> dict[str, Any] | None:
    """What a zoo model's own data is, as stored with a trial: ``{"data": ..., "preprocess": ...}``;
    ``None`` when ``ref`` is not a zoo model with a dataset."""
    name = parse_ref(ref)
    if name is None or name not in ZOO or not ZOO[name].has_dataset:
        return None
    preprocess = ZOO[name].preprocess
    return {"data": f"zoo:{name} (its own data)", "preprocess": dict(preprocess) if preprocess else None}


def zoo_dir(cache_dir: Path | None = None) -> Path:
    """The folder the zoo caches into: ``<cache root>/zoo``."""
    if cache_dir is None:
        env = os.environ.get("AUTODEPLOY_CACHE")
        if env:
            cache_dir = Path(env)
        else:
            import platformdirs

            cache_dir = Path(platformdirs.user_cache_dir("autodeploy"))
    return Path(cache_dir) / "zoo"


def _nest(flat: dict[str, np.ndarray]) -> dict[str, Any]:
    """``{"inputs/x": a, "labels": b}`` -> ``{"inputs": {"x": a}, "labels": b}``."""
    nested: dict[str, Any] = {}
    for key, value in flat.items():
        group, _, leaf = key.partition("/")
        if leaf:
            nested.setdefault(group, {})[leaf] = value
        else:
            nested[group] = value
    return nested


def _resolve(builder: str | Callable[[], Any]) -> Callable[[], Any]:
    if callable(builder):
        return builder
    module, _, function = builder.partition(":")
    return getattr(importlib.import_module(module), function)


def _write_atomic(path: Path, write: Callable[[Any], object]) -> None:
    """Writes through a temp file in the same folder, then renames: readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError) and (err := WriteError.of(exc, path.name, path.parent,
                                                               instead="set AUTODEPLOY_CACHE to a folder on another disk")):
            raise err from None  # a full disk is one line, not a traceback
        raise
