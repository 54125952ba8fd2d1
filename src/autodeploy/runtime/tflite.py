"""TensorFlow Lite (LiteRT) through ``ai-edge-litert``'s Interpreter.

``settings``: ``model_file``, ``layout_file`` (per ONNX input and output: the TFLite tensor name
and the axis permutation between the ONNX layout and onnx2tf's channels-last one), ``num_threads``
(``None``: TFLite's default) and ``xnnpack`` (True: the ``AUTO`` op resolver with the default
XNNPACK delegate; False: TFLite's own builtin kernels). Callers feed and get the ONNX layout.
Several requests in flight (:meth:`Runner.pool`) run on N interpreters, one per thread (an
interpreter is not thread-safe; ``invoke`` releases the GIL).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from . import cache
from .base import IO, Pool, Runner, ThreadPool, Unsupported

PACKAGES = ("ai-edge-litert",)
#: What a fresh process imports to run this engine (a cold start times it apart from the load).
IMPORTS = ("ai_edge_litert.interpreter",)
#: XNNPACK can keep its packed weights in a file (``TfLiteXNNPackDelegateOptions.weight_cache_file_path``), but
#: ai-edge-litert's Python ``Interpreter`` (2.1) takes no path for it, nor an XNNPACK delegate with options.
CACHE = cache.Declared(None, "this LiteRT's Python Interpreter takes no XNNPACK weight cache path "
                             "(weight_cache_file_path is a C++ delegate option)")  # fmt: skip
MODEL_FILE = "model.tflite"
LAYOUT_FILE = "layout.json"


def open(model_dir: Path, settings: Mapping[str, Any], io: IO) -> Runner:  # noqa: A001 - the runtime interface
    model_dir = Path(model_dir)
    layout = json.loads((model_dir / settings.get("layout_file", LAYOUT_FILE)).read_text())
    return _TfliteRunner(lambda: interpreter(model_dir, settings), layout, io, settings.get("num_threads"))


def interpreter(model_dir: Path, settings: Mapping[str, Any]) -> Any:
    """A LiteRT ``Interpreter`` on ``model_dir``'s ``model_file`` (not allocated): the one place autodeploy
    opens one (the runners here, and the TFLite adapter's layout probe)."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    resolver = (
        OpResolverType.AUTO
        if settings.get("xnnpack", True)
        else OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES
    )
    return Interpreter(
        model_path=str(model_dir / settings.get("model_file", MODEL_FILE)),
        num_threads=settings.get("num_threads"),
        experimental_op_resolver_type=resolver,
    )


def describe(path: Path) -> dict[str, Any]:
    """A ``.tflite`` file's inputs and outputs as LiteRT reads them, each ``{"name", "dtype", "shape"}`` with
    ``None`` for a dynamic dim: what :func:`autodeploy.formats.describe` asks of this engine, in a child."""
    path = Path(path)
    it = interpreter(path.parent, {"model_file": path.name})

    def spec(detail: dict[str, Any]) -> dict[str, Any]:
        dims = [int(d) for d in detail["shape_signature"]]
        return {"name": detail["name"], "dtype": np.dtype(detail["dtype"]).name,
                "shape": [d if d >= 0 else None for d in dims]}  # fmt: skip

    return {"inputs": [spec(d) for d in it.get_input_details()],
            "outputs": [spec(d) for d in it.get_output_details()]}  # fmt: skip


class _TfliteRunner(Runner):
    """Feeds ONNX-layout inputs, returns ONNX-layout outputs; resizes when the batch changes."""

    def __init__(self, make: Any, layout: Mapping[str, Any], io: IO, threads: int | None = None) -> None:
        super().__init__(io)
        self._make, self._layout, self._threads = make, layout, threads
        interpreter = make()
        self._it = interpreter
        by_name = {d["name"]: d for d in interpreter.get_input_details()}
        out_by_name = {d["name"]: d for d in interpreter.get_output_details()}
        self._inputs = [(e["name"], by_name[e["tflite"]], e["perm"]) for e in layout["inputs"]]
        outputs = {e["name"]: e for e in layout["outputs"]}
        dtypes = io.output_dtypes
        self._outputs = [
            (out_by_name[outputs[name]["tflite"]]["index"], outputs[name]["perm"], dtypes[name])
            for name in self.output_names
        ]
        self._shapes: dict[int, tuple[int, ...]] = {}

    def _run(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        arrays = [
            (detail, np.ascontiguousarray(permute(feeds[name], perm), dtype=detail["dtype"]))
            for name, detail, perm in self._inputs
        ]
        if any(self._shapes.get(d["index"]) != a.shape for d, a in arrays):
            self._resize(arrays)
        for detail, array in arrays:
            self._it.set_tensor(detail["index"], array)
        self._it.invoke()
        return [
            np.ascontiguousarray(permute(self._it.get_tensor(index), perm)).astype(dtype, copy=False)
            for index, perm, dtype in self._outputs
        ]

    def _resize(self, arrays: Sequence[tuple[Mapping[str, Any], np.ndarray]]) -> None:
        for detail, array in arrays:
            signature = tuple(int(d) for d in detail["shape_signature"])
            fits = len(signature) == array.ndim and all(
                s in (-1, a) for s, a in zip(signature, array.shape, strict=True)
            )
            if not fits:
                raise Unsupported(
                    f"TFLite input {detail['name']!r} is fixed at {list(signature)}, got {list(array.shape)}",
                    fix="use the batch the model was exported with, or export it with a dynamic batch",
                )
            self._it.resize_tensor_input(detail["index"], list(array.shape))
            self._shapes[detail["index"]] = array.shape
        self._it.allocate_tensors()

    def _pool(self, requests: int | None) -> Pool:
        n = requests or max(1, (os.cpu_count() or 1) // (self._threads or 1))
        runners = [self] + [_TfliteRunner(self._make, self._layout, self.io, self._threads) for _ in range(n - 1)]
        pool = ThreadPool([r._run for r in runners])
        pool.info.update(interpreters=n, num_threads=self._threads)
        return pool

    def _close(self) -> None:
        del self._it


def permute(array: np.ndarray, perm: Sequence[int] | None) -> np.ndarray:
    """``array`` with its axes in the order ``perm`` (``None``: unchanged)."""
    return array if perm is None else array.transpose(perm)
