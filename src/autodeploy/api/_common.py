"""What the pipelines share: the cache folder, the results store, the data steps and the call they record.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autodeploy.data import Dataset, shapes_from_data
from autodeploy.errors import DataError, UsageError
from autodeploy.harness.run import HarnessSettings, PreparedData, prepare_data
from autodeploy.images import Preprocess
from autodeploy.intake import ResolvedModel, choose_inputs, load_source
from autodeploy.model import ModelInfo
from autodeploy.redact import mask_secrets
from autodeploy.shapes import ShapeCase, ShapeSet

if TYPE_CHECKING:
    from autodeploy.results_db.store import Store
    from autodeploy.roofline import Peaks
    from autodeploy.runtime.device import DeviceInfo


Progress = Callable[[str], None]
Shapes = Mapping[str, Sequence[int]]


def cache_dir() -> Path:
    """Where zoo models, data, artifacts and references are cached: ``$AUTODEPLOY_CACHE`` or the user cache folder."""
    from platformdirs import user_cache_dir

    return Path(os.environ.get("AUTODEPLOY_CACHE") or user_cache_dir("autodeploy"))


def peaks_of(device: DeviceInfo, cache: Path, progress: Progress | None = None) -> Peaks:
    """This device's peak GOP/s per precision, measured on first use (a few seconds, in a child) and cached
    (:func:`autodeploy.harness.peaks.device_peaks`): what every measurement's share of peak is read against."""
    from autodeploy.harness.peaks import device_peaks, peaks_folder

    return device_peaks(device, peaks_folder(cache), progress=progress)


@contextmanager
def open_store(db: str | Store | None, *, readonly: bool = False) -> Iterator[Store]:
    """The caller's open store (left open), or the one at URL ``db`` (closed afterwards)."""
    from autodeploy.results_db.store import Store

    if isinstance(db, Store):
        yield db
        return
    with Store.open(db, readonly=readonly) as store:
        yield store


def with_data(resolved: ResolvedModel, batch_axes: Mapping[str, int | None] | None,
              data: str | Path | Dataset | None, case: ShapeCase | None = None,
              shape_set: ShapeSet | None = None, preprocess: Preprocess | None = None,
              ) -> tuple[ModelInfo, Dataset | None]:  # fmt: skip
    """The model with the user's batch axes, fixed at ``case``'s shapes (its set's ranges kept
    when it has several) and the dims the user's data fixes, and that data (loaded, images
    preprocessed as ``preprocess`` says)."""
    info = resolved.info.with_batch_axes(batch_axes) if batch_axes else resolved.info
    if case is not None:
        info = info.at_shapes(case.shapes, shape_set.ranges() if shape_set and shape_set.several else None)
    try:
        dataset = load_source(data, info, preprocess)
    except DataError as exc:
        if data is None or case is None or shape_set is None or not shape_set.several:
            raise
        raise DataError(f"shape {case.key()} has no matching data: {exc.message}",
                        fix="give arrays of each shape (bench: one --data per --shape, in the same order), "
                            "or a folder of images or sample:images, resized to each shape") from None  # fmt: skip
    if dataset is None:
        return info, None
    return info.with_shapes(shapes_from_data(info, dataset)), dataset  # arrays of a concrete shape fix open dims


def check_metric(metric: str | None, max_metric_drop: float | None) -> None:
    """Import the user's metric now, so a wrong path is one line before any work (the worker imports it again)."""
    if metric is None:
        if max_metric_drop is not None:
            raise UsageError("--max-metric-drop was given without --metric", fix="add --metric MODULE:FUNCTION")
        return
    from autodeploy.harness.metric import load_metric

    load_metric(metric)


def prepare_inputs(resolved: ResolvedModel, info: ModelInfo, settings: HarnessSettings, data: Dataset | None,
                   pins: Mapping[str, float] | None = None) -> PreparedData:  # fmt: skip
    """Save the inputs for the workers: the user's data, else the zoo model's own, else synthetic."""
    items = settings.calibration_items + settings.evaluation_items
    inputs = choose_inputs(info, data, resolved, items=items, seed=settings.seed, pins=pins)
    prepared = prepare_data(info, settings, data=inputs.data, calibration=inputs.calibration,
                            made=inputs.synthetic)  # fmt: skip
    if resolved.module is not None:  # the nn.Module's own outputs are the reference, computed where it lives
        from autodeploy.harness.torch_reference import write_module_reference

        write_module_reference(resolved.module, info, prepared, settings)
    return prepared


def pytorch_model(model: Any, example_inputs: Any, dynamic_shapes: Any, batch_dim: int | None,
                  cache: Path) -> tuple[Any, Any]:  # fmt: skip
    """``(ref, module)``: an ``nn.Module`` exported to a ``.pt2`` in ``cache`` (:func:`autodeploy.pytorch.from_module`),
    with the module (the reference); any other model as given, with ``None``.

    Raises:
        UsageError: ``example_inputs`` or ``dynamic_shapes`` given for a model that is no ``nn.Module``.
    """
    from autodeploy import pytorch

    if pytorch.is_module(model):
        return pytorch.from_module(model, example_inputs, cache, dynamic_shapes=dynamic_shapes,
                                   batch_dim=batch_dim), model  # fmt: skip
    if example_inputs is not None or dynamic_shapes is not None:
        raise UsageError(f"example_inputs/dynamic_shapes apply to a torch.nn.Module; the model given is {model!r}",
                         fix="pass the nn.Module itself, or drop example_inputs and dynamic_shapes")  # fmt: skip
    return model, None


def silent(_: str) -> None:
    pass


def python_call(function: str, *args: Any, **kwargs: Any) -> str:
    """How a call reads in Python, recorded as the command that reproduces it (the CLI records its argv)."""

    def show(value: Any) -> str:
        if isinstance(value, Path):
            return repr(str(value))
        if isinstance(value, Dataset):
            return f"<Dataset of {len(value)} items>"
        if isinstance(value, list | tuple) and value and not isinstance(value[0], int | float):
            return f"[{', '.join(show(v) for v in value)}]"  # several data sources, one per shape
        if hasattr(value, "forward") and hasattr(value, "parameters"):  # a torch.nn.Module
            return f"<{type(value).__name__} nn.Module>"
        if hasattr(value, "name") and hasattr(value, "winner"):  # a StudySummary
            return repr(value.name)
        return repr(value)

    parts = [show(a) for a in args if a is not None]
    given = {k: v for k, v in kwargs.items() if v is not None and v is not False and v != {} and v != []}
    parts += [f"{k}={show(v)}" for k, v in given.items()]
    return mask_secrets(f"autodeploy.{function}({', '.join(parts)})")
