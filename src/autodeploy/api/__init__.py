"""The library entry points: :func:`bench`, :func:`tune`, :func:`export`, :func:`gate`, :func:`run_bundle`
and :func:`quantize`, the pipelines the CLI calls.

Each reads top to bottom as named steps (resolve the model, probe the device, prepare the
data, run, store) and returns typed records. Failures of the user's input raise
:class:`~autodeploy.errors.AutodeployError` subclasses (the CLI turns them into one line and
an exit code); a trial that fails to build or run is a *result*, not an exception. Nothing
here prints.

    import autodeploy
    summary = autodeploy.tune("zoo:tiny-cnn", engines=["onnxruntime"], trials=3, db="sqlite:///r.db")
    path = autodeploy.export(summary, "ship", db="sqlite:///r.db")
    outputs = autodeploy.bundle.load(path).run(feeds)

Optuna and SQLAlchemy are imported when a pipeline runs, engines inside their workers.

One module per pipeline; this package is their public face (import from ``autodeploy.api``):

- ``_bench``: :func:`bench`, :func:`bench_shapes`, :class:`BenchRequest` (they return
  :class:`~autodeploy.results_db.records.StoredTrial`, named here too)
- ``_tune``: :func:`tune`, :func:`tune_per_shape`, :func:`default_study_name`
- ``_export``: :func:`export`, :func:`find_source`, :data:`FORMATS`
- ``_gate``: :func:`gate`, :class:`GateRun`
- ``_bundle_run``: :func:`run_bundle`, :class:`BundleRun`
- ``_quantize``: :func:`quantize`, :class:`Quantized`
- ``_common``: the steps they share (the store, the data, the recorded call) and :func:`cache_dir`

The modules are private and not named after their functions: a submodule ``api/tune.py`` would
share the name ``autodeploy.api.tune`` with the function, and ``import autodeploy.api.tune as m``
or a patch target ``"autodeploy.api.tune.run_study"`` would then find the function, not the module.
"""

from __future__ import annotations

from autodeploy.api._bench import BenchRequest, bench, bench_shapes
from autodeploy.api._bundle_run import BundleRun, run_bundle
from autodeploy.api._common import cache_dir
from autodeploy.api._export import FORMATS, export, find_source
from autodeploy.api._gate import GateRun, gate
from autodeploy.api._quantize import Quantized, quantize
from autodeploy.api._tune import default_study_name, tune, tune_per_shape
from autodeploy.results_db.records import StoredTrial

__all__ = [
    "FORMATS",
    "BundleRun",
    "GateRun",
    "Quantized",
    "BenchRequest",
    "StoredTrial",
    "bench",
    "bench_shapes",
    "cache_dir",
    "default_study_name",
    "export",
    "find_source",
    "gate",
    "quantize",
    "run_bundle",
    "tune",
    "tune_per_shape",
]
