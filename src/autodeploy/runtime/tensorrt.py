"""NVIDIA TensorRT 10: a serialized engine plan run through one execution context.

``settings``: ``model_file`` (the plan), ``tensorrt`` (the version that built it),
``compute_capability`` (the GPU architecture it was built for) and ``profile`` (per input the
optimization profile's ``min``/``opt``/``max`` shape; a feed outside it is refused with the
range in the message, before TensorRT sees it). A plan only runs under both version and architecture,
so :func:`open` checks them before deserializing and turns a crash or an opaque error into a
message saying what to rebuild. Device memory and copies go through ``cuda-python``'s runtime
bindings; tensors are bound by name (``set_tensor_address``) and run with ``execute_async_v3``. Several requests in flight
(:meth:`Runner.pool`) get one execution context and one CUDA stream each, on one engine.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from . import cache
from .base import IO, FeedError, Pool, Runner, RuntimeFailure, ThreadPool, Unsupported

PACKAGES = ("tensorrt", "tensorrt-cu12", "tensorrt-cu13")
#: What a fresh process imports to run this engine (a cold start times it apart from the load).
IMPORTS = ("tensorrt",)
#: The artifact is TensorRT's compiled form already: every start deserializes the plan. What TensorRT caches
#: besides, the timing cache, speeds up builds (``adapters/tensorrt.py`` keeps one per version and GPU).
CACHE = cache.Declared(None, "the artifact is TensorRT's serialized engine, deserialized by every start; its "
                             "timing cache speeds up builds, not starts")  # fmt: skip
#: A plan runs only under the TensorRT version that built it (see :func:`check_plan_compatible`).
VERSION_LOCKED = True
MODEL_FILE = "model.plan"


def open(model_dir: Path, settings: Mapping[str, Any], io: IO) -> Runner:  # noqa: A001 - the runtime interface
    import tensorrt as trt

    check_plan_compatible(settings, trt.__version__, device_capability())
    plan = (Path(model_dir) / settings.get("model_file", MODEL_FILE)).read_bytes()
    engine = trt.Runtime(trt.Logger(trt.Logger.ERROR)).deserialize_cuda_engine(plan)
    if engine is None:
        raise RuntimeFailure("TensorRT could not deserialize the plan", fix="rebuild the artifact")
    return _TrtRunner(engine, io, settings.get("profile") or {})


def shape_in_profile(shape: Sequence[int], low: Sequence[int], high: Sequence[int]) -> bool:
    """True when ``shape`` lies inside the profile ``low`` .. ``high`` (same rank, every dim within)."""
    return len(shape) == len(low) == len(high) and all(lo <= d <= hi for d, lo, hi in zip(shape, low, high, strict=True))


def check_profile(profile: Mapping[str, Mapping[str, Sequence[int]]], shapes: Mapping[str, Sequence[int]]) -> None:
    """Refuse a feed shape outside the plan's optimization profile (``{input: {min, opt, max}}``)."""
    for name, shape in shapes.items():
        bounds = profile.get(name)
        if bounds is None or shape_in_profile(tuple(shape), bounds["min"], bounds["max"]):
            continue
        dims = "x".join(map(str, shape))
        low, high = ("x".join(map(str, bounds[k])) for k in ("min", "max"))
        raise FeedError(f"input {name!r} of shape {dims} is outside the TensorRT plan's optimization profile "
                        f"({low} .. {high})",
                        fix="feed a shape inside the profile, or bench/tune with this shape too (--shape) and export again")  # fmt: skip


def check_plan_compatible(settings: Mapping[str, Any], trt_version: str, capability: str) -> None:
    """Refuse a plan built by another TensorRT version or for another GPU architecture."""
    built_version, built_cc = settings.get("tensorrt"), settings.get("compute_capability")
    if built_version is None or built_cc is None:
        raise Unsupported(
            "the TensorRT artifact does not record the TensorRT version and compute capability it was built for",
            fix="rebuild the artifact on this machine",
        )
    if built_version != trt_version:
        raise Unsupported(
            f"the TensorRT plan was built with TensorRT {built_version}, this machine has {trt_version}",
            fix=f"rebuild it here, or install tensorrt=={built_version}",
        )
    if str(built_cc) != str(capability):
        raise Unsupported(
            f"the TensorRT plan was built for compute capability {built_cc}, this GPU is {capability}",
            fix="rebuild it on a GPU of this architecture (or select one with CUDA_VISIBLE_DEVICES)",
        )


def cudart() -> Any:
    """cuda-python's runtime bindings (the module moved in cuda-python 12.6)."""
    try:
        from cuda.bindings import runtime  # cuda-python >= 12.6
    except ImportError:
        from cuda import cudart as runtime  # older cuda-python
    return runtime


def check(result: Any) -> Any:
    """cuda-python returns ``(error, *values)``; raise on an error, return the values."""
    err, *values = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        raise RuntimeFailure(f"CUDA call failed: {err}")
    return values[0] if len(values) == 1 else values


def device_capability() -> str:
    """Compute capability (``"9.0"``) of the current CUDA device."""
    rt = cudart()
    props = check(rt.cudaGetDeviceProperties(check(rt.cudaGetDevice())))
    return f"{props.major}.{props.minor}"


class _TrtRunner(Runner):
    """One execution context on its own CUDA stream; a pool adds a context and a stream per request."""

    def __init__(self, engine: Any, io: IO, profile: Mapping[str, Mapping[str, Sequence[int]]]) -> None:
        super().__init__(io)
        self._engine = engine
        self._main = _Context(engine, self.output_names, profile)
        self._extra: list[_Context] = []

    def _run(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        return self._main.run(feeds)

    def _pool(self, requests: int | None) -> Pool:
        # TensorRT 10: any number of contexts share one engine's weights; each needs its own
        # stream and buffers, and a context runs one enqueue at a time.
        n = requests or 2
        self._extra.extend(_Context(self._engine, self.output_names, self._main.profile) for _ in range(n - 1 - len(self._extra)))
        pool = ThreadPool([c.run for c in [self._main, *self._extra[: n - 1]]])
        pool.info.update(execution_contexts=n, cuda_streams=n)
        return pool

    def _close(self) -> None:
        for context in (self._main, *self._extra):
            context.close()
        del self._engine


class _Context:
    """An execution context, its CUDA stream and its device buffers, bound by tensor name."""

    def __init__(self, engine: Any, output_names: tuple[str, ...],
                 profile: Mapping[str, Mapping[str, Sequence[int]]]) -> None:  # fmt: skip
        import tensorrt as trt

        self._trt, self._cudart, self._engine, self._outputs = trt, cudart(), engine, output_names
        self._context = engine.create_execution_context()
        if self._context is None:
            raise RuntimeFailure("TensorRT could not create an execution context (out of GPU memory?)",
                                 fix="ask for fewer requests in flight (num_requests)")  # fmt: skip
        self._stream = check(self._cudart.cudaStreamCreate())
        self._buffers: dict[str, tuple[int, int]] = {}  # name -> (device pointer, bytes)
        self.profile = profile

    def _device(self, name: str, nbytes: int) -> int:
        pointer, size = self._buffers.get(name, (0, 0))
        if size < nbytes:
            if pointer:
                check(self._cudart.cudaFree(pointer))
            pointer = int(check(self._cudart.cudaMalloc(max(nbytes, 1))))
            self._buffers[name] = (pointer, nbytes)
            self._context.set_tensor_address(name, pointer)
        return pointer

    def _dtype(self, name: str) -> np.dtype:
        return np.dtype(self._trt.nptype(self._engine.get_tensor_dtype(name)))

    def run(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        rt, kind = self._cudart, self._cudart.cudaMemcpyKind
        check_profile(self.profile, {name: value.shape for name, value in feeds.items()})
        for name, value in feeds.items():
            host = np.ascontiguousarray(value, dtype=self._dtype(name))
            self._context.set_input_shape(name, host.shape)
            pointer = self._device(name, host.nbytes)
            check(rt.cudaMemcpyAsync(pointer, host.ctypes.data, host.nbytes, kind.cudaMemcpyHostToDevice,
                                     self._stream))  # fmt: skip
        outputs = []
        for name in self._outputs:
            host = np.empty(tuple(self._context.get_tensor_shape(name)), dtype=self._dtype(name))
            self._device(name, host.nbytes)
            outputs.append(host)
        if not self._context.execute_async_v3(self._stream):
            raise RuntimeFailure("TensorRT execute_async_v3 failed")
        for name, host in zip(self._outputs, outputs, strict=True):
            check(rt.cudaMemcpyAsync(host.ctypes.data, self._buffers[name][0], host.nbytes,
                                     kind.cudaMemcpyDeviceToHost, self._stream))  # fmt: skip
        check(rt.cudaStreamSynchronize(self._stream))
        return outputs

    def close(self) -> None:
        for pointer, _ in self._buffers.values():
            self._cudart.cudaFree(pointer)
        self._buffers.clear()
        self._cudart.cudaStreamDestroy(self._stream)
        del self._context
