"""autodeploy: find the fastest engine, precision, batch and threads for a model on each device, then ship it.

    import autodeploy
    summary = autodeploy.tune("zoo:tiny-cnn", engines=["onnxruntime"], trials=3)
    path = autodeploy.export(summary, "ship")
    predictor = autodeploy.bundle.load(path)

Importing this package imports no inference engine, Optuna or SQLAlchemy: ``bench``, ``tune``
and ``export`` (:mod:`autodeploy.api`) and ``bundle`` load on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from autodeploy.runtime import machine

if TYPE_CHECKING:
    from autodeploy import bundle
    from autodeploy.api import bench, bench_shapes, export, tune, tune_per_shape

#: One source of truth: pyproject.toml's version, as installed; "0+unknown" in a source tree never installed.
__version__ = machine.version("autodeploy") or "0+unknown"
__all__ = ["__version__", "bench", "bench_shapes", "bundle", "export", "tune", "tune_per_shape"]

_API = ("bench", "bench_shapes", "tune", "tune_per_shape", "export")


def __getattr__(name: str) -> Any:
    """``autodeploy.bench/tune/export`` and ``autodeploy.bundle``, imported on first use."""
    if name in _API:
        return getattr(importlib.import_module("autodeploy.api"), name)
    if name == "bundle":
        return importlib.import_module("autodeploy.bundle")
    raise AttributeError(f"module 'autodeploy' has no attribute {name!r}")
