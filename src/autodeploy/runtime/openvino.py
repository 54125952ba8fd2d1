"""OpenVINO (CPU plugin).

``settings``: ``model_file`` (the IR's ``.xml``), ``properties`` (``compile_model`` properties in
OpenVINO's own words: ``INFERENCE_PRECISION_HINT``, ``PERFORMANCE_HINT``, ``NUM_STREAMS``,
``INFERENCE_NUM_THREADS``, ``ENABLE_CPU_PINNING``) and ``shapes`` (input name -> static shape; the model is compiled
at these shapes when opened, as benchmark_app measures it, so the plugin plans memory once).
Feeds of another shape (e.g. a last, smaller batch) get their own compiled model on first use.
Several requests in flight (:meth:`Runner.pool`) go through OpenVINO's ``AsyncInferQueue`` on the
model compiled at ``shapes``, with ``num_requests`` infer requests (default: the compiled model's
``OPTIMAL_NUMBER_OF_INFER_REQUESTS``), as benchmark_app runs them. ``compiled_cache`` (given at open time,
:mod:`.cache`): OpenVINO's model cache (``CACHE_DIR``), the compiled blob imported instead of compiling again.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from . import cache, machine
from .base import IO, Pool, Runner, RuntimeFailure, Unsupported

PACKAGES = ("openvino",)
#: What a fresh process imports to run this engine (a cold start times it apart from the load).
IMPORTS = ("openvino",)
MODEL_FILE = "model.xml"
#: OpenVINO's own compiled cache: the plugin's blob of the compiled model, imported instead of compiled.
CACHE = cache.Declared("model cache (CACHE_DIR): the CPU plugin's compiled blob, imported instead of compiled")
DEVICE = "CPU"

_core_instance: Any = None
#: What a compiled model is read back for: what the plugin really set up, not what was asked.
READ_BACK = ("PERFORMANCE_HINT", "NUM_STREAMS", "INFERENCE_NUM_THREADS", "INFERENCE_PRECISION_HINT",
             "OPTIMAL_NUMBER_OF_INFER_REQUESTS", "ENABLE_CPU_PINNING")  # fmt: skip


def core() -> Any:
    """One ``ov.Core`` per process (it is thread-safe and loading the CPU plugin takes a while)."""
    global _core_instance
    if _core_instance is None:
        import openvino as ov

        _core_instance = ov.Core()
    return _core_instance


def open(model_dir: Path, settings: Mapping[str, Any], io: IO) -> Runner:  # noqa: A001 - the runtime interface
    ov_model = read(Path(model_dir) / settings.get("model_file", MODEL_FILE))
    shapes = {name: tuple(shape) for name, shape in (settings.get("shapes") or {}).items()}
    properties = dict(settings.get("properties") or {})
    asked = cache.settings_of(settings)
    if asked is None:
        return _OvRunner(ov_model, properties, shapes, io)
    folder, key = asked
    version = machine.installed_version(PACKAGES)
    state = cache.begin(folder, "openvino", version, key)
    runner = _OvRunner(ov_model, {**properties, "CACHE_DIR": str(folder)}, shapes, io)
    if state == cache.USED and runner.compiled_model is not None and not loaded_from_cache(runner.compiled_model):
        state = f"{cache.REMADE}: OpenVINO compiled the model again instead of importing its cached blob"
    if state != cache.USED:
        cache.seal(folder, "openvino", version, key)
    runner.cache = state
    return runner


def loaded_from_cache(compiled: Any) -> bool:
    """Whether OpenVINO imported ``compiled`` from its model cache (``LOADED_FROM_CACHE``; ``True`` where this
    OpenVINO does not say)."""
    if "LOADED_FROM_CACHE" not in set(compiled.get_property("SUPPORTED_PROPERTIES")):
        return True
    return bool(compiled.get_property("LOADED_FROM_CACHE"))


def read(model: str | Path | bytes) -> Any:
    """An ``ov.Model`` from an IR's ``.xml`` or an ONNX file, or from a serialized ONNX ModelProto."""
    return core().read_model(model, b"") if isinstance(model, bytes) else core().read_model(str(model))


def capabilities() -> tuple[str, ...]:
    """The CPU plugin's ``OPTIMIZATION_CAPABILITIES`` (``BF16``, ``FP16``, ``INT8``, ...): the precisions OpenVINO
    says it runs natively on this CPU; ``()`` when openvino is not installed."""
    try:
        return tuple(core().get_property(DEVICE, "OPTIMIZATION_CAPABILITIES"))
    except ImportError:
        return ()


def describe(path: Path) -> dict[str, Any]:
    """An OpenVINO IR's inputs and outputs as OpenVINO reads them, each ``{"name", "dtype", "shape"}`` with
    ``None`` for a dynamic dim: what :func:`autodeploy.formats.describe` asks of this engine, in a child.

    Raises:
        ValueError: an input or output has no tensor name (autodeploy feeds and reads tensors by name).
    """
    model = read(Path(path))

    def spec(port: Any) -> dict[str, Any]:
        if not port.get_names():
            raise ValueError(
                f"a {'n input' if port in model.inputs else 'n output'} of the IR has no tensor name"
            )
        shape = [d.get_length() if d.is_static else None for d in port.get_partial_shape()]
        return {"name": port.get_any_name(), "dtype": port.get_element_type().to_dtype().name, "shape": shape}

    return {"inputs": [spec(p) for p in model.inputs], "outputs": [spec(p) for p in model.outputs]}


def compile_at(ov_model: Any, shapes: Mapping[str, tuple[int, ...]], properties: Mapping[str, Any]) -> Any:
    """``ov_model`` compiled for the CPU plugin at static input ``shapes`` (a reshaped copy where they differ)
    with ``compile_model`` ``properties``.

    The one place autodeploy compiles an OpenVINO model: the runners here, and the in-house quantizer's
    judge, which must see the kernels a measured artifact runs.
    """
    if ov_model.is_dynamic() or any(
        list(ov_model.input(name).get_shape()) != list(shape) for name, shape in shapes.items()
    ):
        ov_model = ov_model.clone()
        ov_model.reshape({name: list(shape) for name, shape in shapes.items()})
    return core().compile_model(ov_model, DEVICE, dict(properties))


class _OvRunner(Runner):
    """One compiled model and one sync infer request per feed signature."""

    def __init__(self, ov_model: Any, properties: dict[str, Any], shapes: Mapping[str, tuple[int, ...]],
                 io: IO) -> None:  # fmt: skip
        super().__init__(io)
        self._model = ov_model
        self.properties = properties
        self._requests: dict[tuple[Any, ...], tuple[Any, list[Any]]] = {}
        self.compiled_model = None
        if shapes:
            self.compiled_model = self._compile(shapes)
            self._requests[_signature(shapes)] = self._request(self.compiled_model)

    def _compile(self, shapes: Mapping[str, tuple[int, ...]]) -> Any:
        return compile_at(self._model, shapes, self.properties)

    def _request(self, compiled: Any) -> tuple[Any, list[Any]]:
        """An infer request and the output ports in the ONNX model's output order (by name)."""
        names = {name for port in compiled.outputs for name in port.get_names()}
        missing = [name for name in self.output_names if name not in names]
        if missing:
            raise RuntimeFailure(
                f"the OpenVINO model lost output names {missing} in conversion; it has {sorted(names)}",
                fix="convert the model again with this OpenVINO, or use another engine",
            )
        return compiled.create_infer_request(), [compiled.output(name) for name in self.output_names]

    def _run(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        key = _signature({name: array.shape for name, array in feeds.items()})
        if key not in self._requests:
            compiled = self._compile({name: array.shape for name, array in feeds.items()})
            self.compiled_model = self.compiled_model or compiled
            self._requests[key] = self._request(compiled)
        request, ports = self._requests[key]
        # share_inputs: the sync call reads the caller's arrays in place, like benchmark_app's
        # preset tensors; outputs are copied because the next call overwrites them.
        results = request.infer(dict(feeds), share_inputs=True, share_outputs=False)
        return [results[port] for port in ports]

    def describe(self) -> dict[str, Any]:
        return {} if self.compiled_model is None else compiled_properties(self.compiled_model)

    def _pool(self, requests: int | None) -> Pool:
        if self.compiled_model is None:
            raise Unsupported("an OpenVINO runner opened without static shapes has no compiled model to queue on",
                              fix="open it with settings['shapes']")  # fmt: skip
        return _OvPool(self.compiled_model, requests)

    def _close(self) -> None:
        self._requests.clear()
        self.compiled_model = None
        del self._model


def compiled_properties(compiled: Any) -> dict[str, Any]:
    """:data:`READ_BACK` properties of a compiled model, as plain JSON values (``NUM_STREAMS`` as an int)."""
    out: dict[str, Any] = {}
    supported = set(compiled.get_property("SUPPORTED_PROPERTIES"))  # ENABLE_CPU_PINNING: OpenVINO 2023.3 on
    for name in (n for n in READ_BACK if n in supported):
        value = compiled.get_property(name)
        if isinstance(value, bool):
            out[name] = value
            continue
        text = str(getattr(value, "name", value))
        out[name] = int(text) if text.lstrip("-").isdigit() else text
    out["INFERENCE_PRECISION_HINT"] = str(compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name())
    return out


class _OvPool(Pool):
    """OpenVINO's ``AsyncInferQueue``: ``start_async`` on an idle request, a callback as each ends."""

    def __init__(self, compiled: Any, requests: int | None) -> None:
        import openvino as ov

        properties = compiled_properties(compiled)
        n = requests or int(properties["OPTIMAL_NUMBER_OF_INFER_REQUESTS"])
        super().__init__(n)
        self.info.update(properties)
        self.fixed_batch = True  # compiled at the config's shapes
        self._queue = ov.AsyncInferQueue(compiled, n)
        self._queue.set_callback(self._callback)
        self._preset: list[Any] = [None] * n  # the feeds each request's input tensors wrap now
        self._ov = ov

    def _callback(self, request: Any, tag: int) -> None:
        try:  # an exception raised here would surface in a later, unrelated start_async
            self.on_done(tag, None)
        except BaseException:  # noqa: BLE001 - on_done() records its own failures; nothing to add here
            pass

    def wait_free(self) -> None:
        self._queue.get_idle_request_id()

    def start(self, feeds: Mapping[str, np.ndarray], tag: int) -> None:
        # As benchmark_app does: each request's input tensors wrap the feeds in place, set once per
        # request while the same feeds come back; start_async then only starts it.
        slot = self._queue.get_idle_request_id()  # the request start_async takes next (one driver thread)
        if self._preset[slot] is not feeds:
            request = self._queue[slot]
            for name, array in feeds.items():
                request.set_tensor(name, self._ov.Tensor(np.ascontiguousarray(array), shared_memory=True))
            self._preset[slot] = feeds
        self._queue.start_async(None, tag)

    def drain(self) -> None:
        self._queue.wait_all()


def _signature(shapes: Mapping[str, tuple[int, ...]]) -> tuple[tuple[str, tuple[int, ...]], ...]:
    return tuple(sorted((name, tuple(shape)) for name, shape in shapes.items()))
