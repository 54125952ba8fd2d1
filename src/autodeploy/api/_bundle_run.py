""":func:`run_bundle`: a shipped bundle loaded and timed on this machine, beside what its manifest recorded.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from autodeploy.api._common import Progress, silent
from autodeploy.data import Dataset
from autodeploy.device import probe_device
from autodeploy.harness.timing import TimingPolicy
from autodeploy.images import Preprocess
from autodeploy.intake import choose_inputs, load_source
from autodeploy.model import ModelInfo
from autodeploy.runtime.device import DeviceInfo

if TYPE_CHECKING:
    from autodeploy.harness.load import Load
    from autodeploy.harness.result import LatencyStats


@dataclass(frozen=True)
class BundleRun:
    """A bundle timed on this machine (:func:`run_bundle`), beside what its manifest recorded."""

    manifest: dict[str, Any]
    device: DeviceInfo  # this machine
    stats: LatencyStats  # per call, here
    warmup_calls: int
    throughput: float  # items/s, here
    load: Load | None  # how busy this machine was while it was timed
    warnings: tuple[str, ...]  # the loader's (another engine version, another device)
    #: Every input's shape as fed here (the bundle's own, or the ``shapes`` asked for).
    fed: dict[str, list[int]] = field(default_factory=dict)
    #: What the open did with the bundle's compiled cache (``used``, ``remade: WHY``); ``None``: it ships none.
    cache: str | None = None

    @property
    def same_device(self) -> bool:
        return self.device.fingerprint == self.manifest["device"]["fingerprint"]

    @property
    def shape(self) -> str:
        """The shape fed here, as the manifest names shapes: ``x=1x3x320x320`` (inputs by name)."""
        return ";".join(f"{k}={'x'.join(map(str, v))}" for k, v in sorted(self.fed.items()))

    def recorded(self) -> dict[str, Any] | None:
        """The manifest's numbers at the shape fed here: the shipped trial's, or another shape's of its study
        (``by_shape``); ``None`` where the bundle was never measured at it."""
        from autodeploy.bundle.export import shipped_numbers

        m = self.manifest
        shipped = shipped_numbers(m)
        for numbers in (shipped, *(m.get("by_shape") or ())):
            if numbers.get("fed") and _same(numbers["fed"], self.fed):
                return numbers
        if not shipped["fed"] and not m.get("by_shape"):  # a bundle exported before shapes were recorded
            return shipped
        return None


def _same(a: Mapping[str, Sequence[int]], b: Mapping[str, Sequence[int]]) -> bool:
    return {k: list(v) for k, v in a.items()} == {k: list(v) for k, v in b.items()}


def run_bundle(
    path: str | Path,
    *,
    data: str | Path | Dataset | None = None,
    preprocess: Preprocess | None = None,
    timing: TimingPolicy | None = None,
    shapes: Mapping[str, Sequence[int]] | None = None,
    allow_other_version: bool = False,
    trust: str | Path | None = None,
    quiet: Callable[[], AbstractContextManager[None]] = nullcontext,
    progress: Progress | None = None,
) -> BundleRun:
    """Load the bundle at ``path`` (a folder or ``.tar.gz``; verified first), time it here, in this process.

    Args:
        data: inputs as for :func:`bench` (default synthetic); images are preprocessed as the bundle was
            measured (its manifest's ``inputs``) unless ``preprocess`` is given.
        timing: warm-up and sample counts (default: 64 samples and 2 s at least, 60 s at most).
        shapes: measure at these input shapes (``{"x": (1, 3, 160, 160)}``, as ``bench`` and ``tune`` take one
            case) instead of the bundle's own; the manifest's numbers at that shape, where its study measured it,
            are :meth:`BundleRun.recorded`.
        allow_other_version: run under another engine version than benchmarked (the result warns).
        trust: a PEM public key: the bundle's signature must verify with it.
        quiet: wraps loading the engine and its first call (the CLI hides the engines' native log lines).
        progress: told each phase.

    Raises:
        BundleError: a file is missing or changed, the signature does not verify, or it cannot run here.
        DataError: the data does not fit the bundle's model.
        ShapeError: a shape does not fit the bundle's model.
    """
    from autodeploy.bundle import loader, opened
    from autodeploy.harness.stats import summarize
    from autodeploy.harness.timing import time_calls

    report = progress or silent
    with opened(path) as root:
        # 1. verify and open it
        with quiet():
            predictor = loader.load(root, allow_other_version=allow_other_version, trust=trust)
        with predictor:
            # 2. one batch of inputs, as it was measured
            manifest = predictor.manifest
            feeds = _bundle_feeds(manifest, root, data, preprocess, shapes)
            with quiet():  # some engines (LiteRT) create their delegates on the first call
                predictor.run(feeds)
            # 3. time it
            report(f"timing {path} ({len(next(iter(feeds.values())))} items per call)")
            timed = time_calls(lambda: predictor.run(feeds), timing or TimingPolicy())
    batch = manifest["settings"]["batch"]
    throughput = batch * len(timed.samples_ns) / (timed.samples_ns.sum() / 1e9)
    fed = {name: list(np.shape(value)) for name, value in feeds.items()}
    return BundleRun(manifest, probe_device(), summarize(timed.samples_ns), timed.warmup_calls, throughput,
                     timed.load, tuple(predictor.warnings), fed, predictor.cache)  # fmt: skip


def _bundle_feeds(manifest: dict[str, Any], root: Path, data: str | Path | Dataset | None,
                  preprocess: Preprocess | None, shapes: Mapping[str, Sequence[int]] | None = None) -> dict[str, Any]:  # fmt: skip
    """One batch at the bundle's batch size and shapes (or ``shapes``, over the bundle's): the user's first items
    (images preprocessed by ``preprocess``, else as the bundle was measured), or synthetic ones."""
    from autodeploy import images

    model, recorded = manifest["model"], manifest.get("shapes") or {}
    info = ModelInfo.from_dict({**model, "path": str(root), "opset": 0, "external_files": [],
                                "batch_axes": recorded.get("batch_axes") or {}})  # fmt: skip
    if shapes:  # checked against the bundle's interface (rank, static dims), over the shapes it was fixed at
        info = info.at_shapes({**info.shapes, **{k: tuple(int(d) for d in v) for k, v in shapes.items()}})
    measured = (manifest.get("inputs") or {}).get("preprocess")
    if preprocess is None and measured and data is not None and not isinstance(data, Dataset):
        is_images = str(data) == images.SAMPLE_IMAGES or images.is_image_folder(Path(data))
        preprocess = Preprocess.from_dict(measured) if is_images else None
    batch = manifest["settings"]["batch"]
    inputs = choose_inputs(info, load_source(data, info, preprocess), items=batch)
    return inputs.data.batches(batch, {s.name: info.batch_axis(s.name) for s in info.inputs})[0]
