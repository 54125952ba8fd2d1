"""What the user names, resolved: a model reference with its own data, ``--data``, and the default-data rule.

Every command that runs a model takes inputs the same way: the user's ``--data``, else the zoo
model's own labelled data, else synthetic inputs (labelled as such). :func:`choose_inputs` is that
rule, once, for bench, tune, gate, bundle run and inhouse quantize. The records of what was named and
fed live here too: :func:`display_name` (``zoo:NAME`` or the file's stem) and :func:`inputs_record`
(what a trial was fed, as stored with it and written into its bundle).

It sits above :mod:`autodeploy.model` (the ONNX file), :mod:`autodeploy.data` (arrays and
``.npz``) and :mod:`autodeploy.images` (image folders), which do not import it: a reference that
brings data and a ``--data`` that may hold images need all three.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autodeploy import images, pytorch, zoo
from autodeploy.data import DEFAULT_SEED, Dataset, load_user_data, synthetic
from autodeploy.errors import DataError
from autodeploy.model import ModelInfo, load_model

if TYPE_CHECKING:
    from autodeploy.images import Preprocess


@dataclass(frozen=True)
class ResolvedModel:
    """A model reference resolved: the loaded model, and a zoo model's own labelled data."""

    info: ModelInfo
    data: Dataset | None = None  # a zoo model's own labelled evaluation data
    calibration: Dataset | None = None
    #: The live ``nn.Module`` the model was exported from, whose own outputs are the reference
    #: (:func:`autodeploy.harness.torch_reference.write_module_reference`).
    module: Any = None


def resolve_model(
    ref: str | Path,
    shapes: Mapping[str, Sequence[int]] | None = None,
    *,
    cache_dir: Path | None = None,
    progress: Callable[[str], None] | None = None,
    module: Any = None,
) -> ResolvedModel:
    """Load a model file or ``zoo:NAME`` (built on first use), with the zoo's dataset if it has one.

    Args:
        ref: an ``.onnx`` path, a ``.tflite`` or an OpenVINO IR ``.xml`` taken as given
            (:mod:`autodeploy.formats`), a PyTorch ``.pt2`` (exported to ONNX: :mod:`autodeploy.pytorch`),
            or ``zoo:NAME``.
        shapes: fixed input shapes, ``{name: (1, 3, 224, 224)}``.
        cache_dir: where zoo models are cached (default ``$AUTODEPLOY_CACHE`` or the user cache folder).
        progress: told when a zoo model is being built (the first use takes a while).
        module: the live ``nn.Module`` a ``.pt2`` was exported from (:func:`autodeploy.pytorch.from_module`):
            the reference.

    Raises:
        ModelError: the file is missing, not ONNX, truncated, invalid or unsafe.
        ShapeError: a fixed shape does not fit.
        UsageError: ``zoo:NAME`` names no zoo model.
    """
    fixed = {k: tuple(v) for k, v in (shapes or {}).items()}
    if pytorch.is_pt2(ref):
        return _from_pytorch(Path(ref), fixed, cache_dir, progress, module)
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


def _from_pytorch(pt2: Path, fixed: Mapping[str, tuple[int, ...]], cache_dir: Path | None,
                  progress: Callable[[str], None] | None, module: Any) -> ResolvedModel:  # fmt: skip
    """A ``.pt2`` exported to ONNX (cached), the exporter recorded and PyTorch the reference."""
    if progress is not None:
        progress(f"exporting {pt2.name} to ONNX ({pytorch.EXPORTER}, first use only)")
    onnx_path, source = pytorch.to_onnx(pt2, cache_dir or zoo.zoo_dir().parent)
    # A live module is named after its class (its .pt2 in the cache is named after its hash)
    info = load_model(onnx_path, fixed, name=pt2.stem if module is None else type(module).__name__)
    if module is not None:
        source = {**source, "reference": "module"}
        if info.fixed_batch() == 1:  # torch.export fixed the batch axis of a batch-1 example to 1: say so
            note = (f"{info.name}'s export takes a batch of 1 only, so no batch is searched: torch.export fixes an "
                    "axis whose example size is 1 (its 0/1 specialization); give example_inputs with a batch of 2 "
                    "or more to search batches")  # fmt: skip
            info = replace(info, notes=(*info.notes, note))
            warnings.warn(f"autodeploy: {note}", stacklevel=2)
            if progress is not None:
                progress(note)
    return ResolvedModel(replace(info, source=source), module=module)


@dataclass(frozen=True)
class Inputs:
    """The inputs a command runs on: evaluation items, and calibration items when they came apart
    (a zoo model's own training split; else the caller splits ``data``)."""

    data: Dataset
    calibration: Dataset | None = None
    synthetic: bool = False  # made up: every result on them says so

    @property
    def for_calibration(self) -> Dataset:
        """What calibrates a quantizer: the separate calibration items, else all of ``data``."""
        return self.calibration if self.calibration is not None else self.data


def choose_inputs(
    model: ModelInfo,
    given: Dataset | None,
    resolved: ResolvedModel | None = None,
    *,
    items: int,
    seed: int = DEFAULT_SEED,
    pins: Mapping[str, float] | None = None,
) -> Inputs:
    """The default-data rule: the user's data, else the zoo model's own (``resolved``), else
    ``items`` synthetic items for ``model`` (``pins`` fix named inputs to a constant).

    ``model`` is the model as it will run (fixed at a shape), which synthetic items must fit;
    ``resolved`` may be ``None`` where no zoo data can exist (a bundle).
    """
    if given is not None:
        return Inputs(given)
    if resolved is not None and resolved.data is not None:
        return Inputs(resolved.data, resolved.calibration)
    return Inputs(synthetic(model, items, seed=seed, pins=dict(pins) if pins else None), synthetic=True)


def load_source(source: str | Path | Dataset | None, model: ModelInfo,
                preprocess: Preprocess | None = None) -> Dataset | None:  # fmt: skip
    """``--data`` as every command takes it (bench, tune, bundle run, inhouse quantize, gate):
    ``None`` without a source (the caller's default inputs, :func:`choose_inputs`), else :func:`load_data`.

    Raises:
        DataError: the data does not fit the model, or image preprocessing was given without images.
    """
    if source is None:
        if preprocess is not None and preprocess != images.Preprocess():
            raise DataError("image preprocessing (layout, channels, mean, scale) was given without image data",
                            fix="add --data FOLDER_OF_IMAGES or --data sample:images")  # fmt: skip
        return None
    return source if isinstance(source, Dataset) else load_data(source, model, preprocess)


def load_data(source: str | Path, model: ModelInfo, preprocess: Preprocess | None = None) -> Dataset:
    """The user's inputs from ``--data``: ``sample:images``, a folder of images (preprocessed as
    :mod:`autodeploy.images` says), a ``.npz`` file, a ``.npy`` file or a folder of ``NAME.npy``."""
    if str(source) == images.SAMPLE_IMAGES:
        return images.sample_images(model, preprocess or images.Preprocess())
    path = Path(source)
    if images.is_image_folder(path):
        return images.load_image_folder(path, model, preprocess or images.Preprocess())
    if preprocess is not None and preprocess != images.Preprocess():
        raise DataError(f"--data {path} holds arrays, and image preprocessing (layout, channels, mean, scale) "
                        "applies to images only", fix="preprocess the arrays yourself, or give a folder of images")  # fmt: skip
    return load_user_data(path, model)


def display_name(ref: str | Path) -> str:
    """The display name :func:`resolve_model` gives ``ref``: ``zoo:NAME``, else the file's stem."""
    name = zoo.parse_ref(str(ref))
    return f"zoo:{name}" if name is not None else Path(ref).stem


def inputs_record(source: str | Path | Dataset | None, preprocess: Preprocess | None,
                  default: Mapping[str, object] | None = None) -> dict[str, object]:  # fmt: skip
    """What a trial was fed, as stored with it and written into its bundle: ``{"data": ..., "preprocess": ...}``.

    ``default`` is the record of the inputs used without ``source`` (a zoo model's own data), else synthetic.
    """
    if source is None:
        return dict(default) if default is not None else {"data": "synthetic", "preprocess": None}
    data = f"<{len(source)} items given in Python>" if isinstance(source, Dataset) else str(source)
    return {"data": data, "preprocess": preprocess.to_dict() if preprocess is not None else None}
