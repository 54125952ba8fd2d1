"""One cold start, in a fresh process: import the engine, open the artifact, run the first call.

Run as ``python -m autodeploy.harness.cold_child SPEC.json`` by :mod:`autodeploy.harness.cold_start`, once per
start. It imports what a deployed model imports (the standard library, numpy, the runtime module and its engine:
nothing else of autodeploy's), so its times are a bundle's. The spec names the runtime module, the artifact
folder, the runtime's settings (with ``compiled_cache`` where the start may use one), the model's interface and
an ``.npz`` of the first call's feeds. It prints one JSON line (:func:`autodeploy.child.child_main`): the
seconds spent importing the engine, opening the artifact (read and compile or deserialize: the runtime's
``open``) and running the first call, the wall-clock time the first result was ready (the parent subtracts
the time it started the process) and what the open did with the cache.
"""

from __future__ import annotations

import importlib
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from autodeploy.child import child_main
from autodeploy.runtime.base import IO


def start(spec_path: str) -> dict[str, Any]:
    """One start as the spec at ``spec_path`` says; the times in ms (see the module docstring)."""
    spec = json.loads(Path(spec_path).read_text())
    with np.load(spec["feeds"], allow_pickle=False) as saved:
        feeds = {name: saved[name] for name in saved.files}
    began = time.perf_counter()
    runtime = importlib.import_module(spec["module"])
    for name in getattr(runtime, "IMPORTS", ()):  # the engine itself, imported lazily by open()
        importlib.import_module(name)
    imported = time.perf_counter()
    runner = runtime.open(Path(spec["model_dir"]), spec["settings"], IO.from_dict(spec["io"]))
    loaded = time.perf_counter()
    runner.run(feeds)
    done, ready_at = time.perf_counter(), time.time()
    said = runner.cache
    runner.close()
    return {"import_ms": (imported - began) * 1e3, "load_ms": (loaded - imported) * 1e3,
            "first_ms": (done - loaded) * 1e3, "ready_at": ready_at, "cache": said}  # fmt: skip


if __name__ == "__main__":
    sys.exit(child_main(lambda: start(sys.argv[1]), reason=lambda exc: f"{type(exc).__name__}: {exc}"))
