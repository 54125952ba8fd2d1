"""Images as model inputs: a folder of PNG/JPEG files, or ``sample:images``, preprocessed in
benchmark_app's words.

The steps, in order, for every image (read as RGB, pixel values 0..255):

1. resize to the input's height x width (bilinear, aspect ratio not kept: benchmark_app's resize);
2. ``reverse_input_channels``: RGB -> BGR (``--reverse-input-channels``);
3. ``(pixel - mean_values) / scale_values`` per channel, in the order of the channels the model
   is fed, i.e. after the reversal (``-mean_values [123.675,116.28,103.53]``,
   ``-scale_values [58.395,57.12,57.375]``);
4. the input's layout, ``NCHW`` or ``NHWC`` (read from the model: the axis of size 3 or 1), and dtype.

``sample:images`` are crops of the two photographs that ship inside scikit-learn
(``load_sample_images``: ``china.jpg``, ``flower.jpg``), at random positions, sizes and flips,
deterministic by seed: realistic pixels for any image model, with no download. A folder whose
images sit in subfolders gets one label per subfolder (classes in sorted order).

Pillow (``pip install 'autodeploy[images]'``) and, for ``sample:images``, scikit-learn
(``autodeploy[zoo]``) are imported only here, only when images are read.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from autodeploy.errors import DataError, MissingExtraError

if TYPE_CHECKING:
    from autodeploy.data import Dataset
    from autodeploy.model import ModelInfo

#: Images in a ``--data`` folder at most: every item is held in memory (and saved for each worker), and
#: a few hundred measure accuracy well; 100,000 tiny files took 4 GB in the parent.
MAX_IMAGES = 10_000
#: Pixels of one image at most (64 MP, 8192 x 8192), checked on its header before it is decoded; Pillow's
#: own limit (about 179 MP, as an exception) is global and raises a type no caller expects.
MAX_PIXELS = 8192 * 8192
#: ``--data sample:images``.
SAMPLE_IMAGES = "sample:images"
#: How many sample crops: the harness's 64 calibration + 64 evaluation items.
SAMPLE_ITEMS = 128
#: The suffixes read, each with the one Pillow format it is opened as: a file is never sniffed into another
#: of Pillow's formats (an EPS named .png runs Ghostscript in this process).
FORMATS = {".png": "PNG", ".jpg": "JPEG", ".jpeg": "JPEG", ".bmp": "BMP"}
SUFFIXES = tuple(FORMATS)
LAYOUTS = ("NCHW", "NHWC")


@dataclass(frozen=True)
class Preprocess:
    """How pixels become an input tensor, in benchmark_app's terms (see the module docstring).

    ``layout`` ``None`` reads it from the model; ``mean_values``/``scale_values`` ``None`` leave
    pixels as 0..255 (one value, or one per channel).
    """

    layout: str | None = None
    reverse_input_channels: bool = False
    mean_values: tuple[float, ...] | None = None
    scale_values: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if self.layout is not None and self.layout.upper() not in LAYOUTS:
            raise DataError(f"unknown layout {self.layout!r}", fix=f"choose one of {', '.join(LAYOUTS)}")

    def to_dict(self) -> dict[str, object]:
        return {"layout": self.layout.upper() if self.layout else None, "reverse_input_channels": self.reverse_input_channels,
                "mean_values": list(self.mean_values) if self.mean_values else None,
                "scale_values": list(self.scale_values) if self.scale_values else None}  # fmt: skip

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Preprocess:
        """The inverse of :meth:`to_dict` (a bundle's manifest, a zoo entry)."""
        mean, scale = d.get("mean_values"), d.get("scale_values")
        return cls(d.get("layout"), bool(d.get("reverse_input_channels")), tuple(mean) if mean else None,
                   tuple(scale) if scale else None)  # fmt: skip

    def apply(self, rgb: np.ndarray, layout: str) -> np.ndarray:
        """``[N, H, W, C]`` RGB 0..255 -> float32 in ``layout`` (resizing is done before)."""
        x = rgb.astype(np.float32)
        if self.reverse_input_channels:
            x = x[..., ::-1]
        channels = x.shape[-1]
        if self.mean_values is not None:
            x = x - _per_channel(self.mean_values, channels, "mean")
        if self.scale_values is not None:
            x = x / _per_channel(self.scale_values, channels, "scale")
        return np.ascontiguousarray(x.transpose(0, 3, 1, 2) if layout == "NCHW" else x)


def parse_values(text: str | None, flag: str) -> tuple[float, ...] | None:
    """``"[123.675,116.28,103.53]"`` (brackets optional) -> floats; ``None`` stays ``None``."""
    if text is None:
        return None
    try:
        values = tuple(float(v) for v in text.strip().strip("[]").split(","))
    except ValueError:
        raise DataError(f"cannot parse {flag} {text!r}", fix=f"write it as {flag} [123.675,116.28,103.53]") from None
    if not all(math.isfinite(v) for v in values):
        raise DataError(f"{flag} {text!r} is not finite numbers", fix=f"write it as {flag} [123.675,116.28,103.53]")
    if flag.startswith("--scale") and any(v == 0 for v in values):
        raise DataError(f"{flag} {text!r} has a zero: pixels would be divided by it", fix="give non-zero scales")
    return values


def _per_channel(values: Sequence[float], channels: int, what: str) -> np.ndarray:
    if len(values) not in (1, channels):
        raise DataError(f"{len(values)} {what} values for an input of {channels} channels",
                        fix=f"give one value, or {channels}")  # fmt: skip
    return np.asarray(values, np.float32)


def is_image_folder(path: Path) -> bool:
    """True when ``path`` is a folder holding images (directly or one subfolder down) and no ``.npy``."""
    if not path.is_dir() or any(path.glob("*.npy")):
        return False
    return any(_images_in(path)) or any(any(_images_in(d)) for d in path.iterdir() if d.is_dir())


def _images_in(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in SUFFIXES)


@dataclass(frozen=True)
class ImageInput:
    """The model input that takes the images: its name, layout, channels and height x width."""

    name: str
    layout: str
    channels: int
    height: int
    width: int
    dtype: str


def image_input(model: ModelInfo, layout: str | None = None) -> ImageInput:
    """The one 4-D input images are fed to, with its layout and a concrete height and width.

    Raises:
        DataError: no or several 4-D inputs, an unknown channel axis, or dynamic height/width.
    """
    four_d = [s for s in model.inputs if len(model.shapes.get(s.name, s.shape)) == 4]
    if len(four_d) != 1:
        raise DataError(f"image data needs exactly one 4-D input (N,C,H,W or N,H,W,C); the model has "
                        f"{[s.name + s.shape_str() for s in model.inputs]}",
                        fix="give --data as .npz arrays, one per input")  # fmt: skip
    spec = four_d[0]
    dims = list(model.item_dims(spec.name))  # the item dims as the model and --shape fix them
    if len(dims) != 3:
        raise DataError(f"input {spec.name!r} {spec.shape_str()} has no batch axis to stack images on",
                        fix=f"set it with --batch-axis {spec.name}=0")  # fmt: skip
    if layout is None:
        layout = "NCHW" if dims[0] in (1, 3) else "NHWC" if dims[2] in (1, 3) else None
        if layout is None:
            raise DataError(f"cannot tell the channel axis of input {spec.name!r} {spec.shape_str()}",
                            fix="say it with --layout NCHW or --layout NHWC")  # fmt: skip
    layout = layout.upper()
    channels, height, width = (dims[0], dims[1], dims[2]) if layout == "NCHW" else (dims[2], dims[0], dims[1])
    if not all(isinstance(d, int) for d in (height, width)):
        example = "1x3x224x224" if layout == "NCHW" else "1x224x224x3"
        raise DataError(f"input {spec.name!r} {spec.shape_str()} has a dynamic height or width: images "
                        "need a size to be resized to", fix=f"fix it with --shape {spec.name}={example}")  # fmt: skip
    if channels not in (1, 3):
        raise DataError(f"input {spec.name!r} {spec.shape_str()} has {channels} channels in layout {layout}; "
                        "images have 3 (RGB) or 1 (gray)", fix="check --layout, or give --data as .npz")  # fmt: skip
    return ImageInput(spec.name, layout, int(channels), int(height), int(width), spec.dtype)


def load_image_folder(path: Path, model: ModelInfo, preprocess: Preprocess) -> Dataset:
    """Every image in ``path`` (and, labelled by subfolder, in its subfolders), preprocessed."""
    target = image_input(model, preprocess.layout)
    classes = sorted(d for d in path.iterdir() if d.is_dir() and _images_in(d))
    files = [(f, None) for f in _images_in(path)] + [(f, i) for i, d in enumerate(classes) for f in _images_in(d)]
    if classes and any(label is None for _, label in files):
        raise DataError(f"{path} mixes images at its top level with class subfolders",
                        fix="put every image in a class subfolder, or none")  # fmt: skip
    _check_count(path, len(files), target)
    pil = _pil()
    pixels = []
    for file, _ in files:
        try:
            with _open(pil, file) as image:
                pixels.append(_resized(image, target))
        except (OSError, ValueError) as exc:
            raise DataError(f"cannot read image {file}: {exc}", fix="remove or replace the file") from None
    labels = np.array([label for _, label in files], np.int64) if classes else None
    return _dataset(model, target, np.stack(pixels), preprocess, labels)


def _open(pil: Any, file: Path) -> Any:
    """The image at ``file``, its header read and its size checked against :data:`MAX_PIXELS`, not decoded yet."""
    too_big = DataError(f"image {file} has more than {MAX_PIXELS / 1e6:.0f} million pixels, the most read "
                        "(a decompression bomb?)", fix="resize it, or remove it from the folder")  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", pil.DecompressionBombWarning)  # MAX_PIXELS, below Pillow's, decides
        try:
            image = pil.open(file, formats=[FORMATS[file.suffix.lower()]])
        except pil.UnidentifiedImageError:
            raise DataError(f"image {file} is not a {FORMATS[file.suffix.lower()]} file, as its name says",
                            fix="remove it, or convert it to PNG or JPEG") from None  # fmt: skip
        except pil.DecompressionBombError:  # more than twice Pillow's own limit: refused by Pillow first
            raise too_big from None
    if image.width * image.height > MAX_PIXELS:
        image.close()
        raise too_big
    return image


def _check_count(path: Path, n: int, target: ImageInput) -> None:
    """Refuse, before reading one, more images than :data:`MAX_IMAGES` or than fit in memory as fed."""
    from autodeploy.data import check_fits

    if n > MAX_IMAGES:
        raise DataError(f"{path} holds {n} images; at most {MAX_IMAGES} are read (every one is held in memory)",
                        fix="give a folder with fewer images (a few hundred measure accuracy well)")  # fmt: skip
    itemsize = max(np.dtype(target.dtype).itemsize, 4)  # preprocessed as float32, then cast
    check_fits(f"{n} images at {target.height}x{target.width}", n * target.channels * target.height *
               target.width * itemsize, fix="give a folder with fewer images")  # fmt: skip


def sample_images(model: ModelInfo, preprocess: Preprocess, n: int = SAMPLE_ITEMS, *, seed: int = 0) -> Dataset:
    """``n`` random crops of scikit-learn's sample photographs, preprocessed (``--data sample:images``)."""
    target = image_input(model, preprocess.layout)
    crops = sample_crops(n, target.height, target.width, seed=seed)
    return _dataset(model, target, crops, preprocess, None)


def sample_photos() -> list[np.ndarray]:
    """The photographs inside scikit-learn (``china.jpg``, ``flower.jpg``), ``[H, W, 3]`` uint8 RGB."""
    try:
        from sklearn.datasets import load_sample_images
    except ModuleNotFoundError as exc:
        raise MissingExtraError(f"--data {SAMPLE_IMAGES} reads the photographs inside scikit-learn, which "
                                f"is not installed ({exc.name})", fix="pip install 'autodeploy[zoo]'") from None  # fmt: skip
    _pil()  # scikit-learn reads them with Pillow
    return [np.asarray(image) for image in load_sample_images().images]


def sample_crops(n: int, height: int, width: int, *, seed: int = 0,
                 photos: Sequence[np.ndarray] | None = None) -> np.ndarray:  # fmt: skip
    """``[n, height, width, 3]`` uint8: crops at random places, sizes (a quarter to all of the shorter
    side) and aspect ratios, half of them mirrored, from the photographs taken in turn."""
    photos = list(photos) if photos is not None else sample_photos()
    rng = np.random.default_rng(seed)
    out = np.empty((n, height, width, 3), np.uint8)
    for i in range(n):
        photo = photos[i % len(photos)]
        h, w = photo.shape[:2]
        side = rng.uniform(0.25, 1.0) * min(h, w)
        aspect = np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3))) * width / height
        ch, cw = int(min(h, side / np.sqrt(aspect))), int(min(w, side * np.sqrt(aspect)))
        top, left = int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1))
        crop = photo[top : top + ch, left : left + cw]
        out[i] = resize(crop[:, ::-1] if rng.random() < 0.5 else crop, height, width)
    return out


def resize(rgb: np.ndarray, height: int, width: int) -> np.ndarray:
    """``[h, w, 3]`` uint8 -> ``[height, width, 3]``, bilinear (Pillow)."""
    pil = _pil()
    image = pil.fromarray(np.ascontiguousarray(rgb))
    return np.asarray(image.resize((width, height), pil.Resampling.BILINEAR))


def _resized(image: object, target: ImageInput) -> np.ndarray:
    rgb = image.convert("RGB")  # type: ignore[attr-defined]  # gray, palette, RGBA, CMYK: all as RGB
    return resize(np.asarray(rgb), target.height, target.width)


def _dataset(model: ModelInfo, target: ImageInput, rgb: np.ndarray, preprocess: Preprocess,
             labels: np.ndarray | None) -> Dataset:  # fmt: skip
    """Preprocessed pixels for the image input; other inputs synthetic (pin them with ``--input``)."""
    from autodeploy.data import Dataset, synthetic

    if target.channels == 1:
        gray = rgb.astype(np.float32) @ np.array([0.299, 0.587, 0.114], np.float32)
        rgb = gray[..., None]
    x = preprocess.apply(rgb, target.layout)
    dtype = np.dtype(target.dtype)
    x = np.clip(np.rint(x), np.iinfo(dtype).min, np.iinfo(dtype).max).astype(dtype) if dtype.kind in "iu" else x.astype(dtype)
    inputs = {target.name: x}
    others = [s.name for s in model.inputs if s.name != target.name]
    if others:
        rest = synthetic(model, len(x))
        inputs.update({k: rest.inputs[k] for k in others})
    return Dataset(inputs, labels)


def _pil():  # type: ignore[no-untyped-def]
    try:
        import PIL.Image
    except ModuleNotFoundError:
        raise MissingExtraError("reading images needs Pillow, which is not installed",
                                fix="pip install 'autodeploy[images]'") from None  # fmt: skip
    return PIL.Image


def describe(preprocess: Preprocess, target: ImageInput) -> str:
    """One line saying how images were fed, for notes."""
    steps = [f"resized to {target.height}x{target.width}", target.layout,
             "BGR" if preprocess.reverse_input_channels else "RGB"]  # fmt: skip
    if preprocess.mean_values:
        steps.append(f"mean {list(preprocess.mean_values)}")
    if preprocess.scale_values:
        steps.append(f"scale {list(preprocess.scale_values)}")
    return ", ".join(steps)


__all__ = ["LAYOUTS", "SAMPLE_IMAGES", "ImageInput", "Preprocess", "image_input", "is_image_folder",
           "load_image_folder", "parse_values", "sample_crops", "sample_images"]  # fmt: skip
