"""What every engine runtime shares: the model's interface and a :class:`Runner` that checks feeds.

Standard library and numpy only. Inside autodeploy the errors are autodeploy's own
(:class:`~autodeploy.errors.ShapeError` for feeds that do not fit, :class:`~autodeploy.errors.EngineError`
for an engine that cannot open or run the artifact); shipped alone in a bundle they are
stand-ins with the same message format.
"""

from __future__ import annotations

import queue
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

try:  # inside autodeploy, runtime errors belong to its one exception tree
    from autodeploy.errors import EngineError as RuntimeFailure
    from autodeploy.errors import ShapeError as FeedError
    from autodeploy.errors import UnsupportedConfigError as Unsupported
except ImportError:  # shipped alone in a bundle

    class _Error(Exception):
        def __init__(self, message: str, *, fix: str | None = None) -> None:
            self.message, self.fix = message, fix
            super().__init__(message if fix is None else f"{message}; fix: {fix}")

    class FeedError(_Error):  # type: ignore[no-redef]
        """Feeds do not match the model's inputs (names, dtypes)."""

    class RuntimeFailure(_Error):  # type: ignore[no-redef]
        """The engine cannot open or run the artifact."""

    class Unsupported(RuntimeFailure):  # type: ignore[no-redef]
        """The artifact cannot run here or take these feeds (a fixed batch, another GPU architecture)."""


@dataclass(frozen=True)
class Tensor:
    """Name, numpy dtype name and shape (ints, symbolic names or ``None``) of one input or output."""

    name: str
    dtype: str
    shape: tuple[Any, ...] = ()


@dataclass(frozen=True)
class IO:
    """A model's inputs and outputs, in the model's order."""

    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]

    @classmethod
    def from_dict(cls, d: Mapping[str, Sequence[Mapping[str, Any]]]) -> IO:
        """From ``{"inputs": [{name, dtype, shape}, ...], "outputs": [...]}`` (a bundle manifest's ``model``)."""

        def tensors(items: Sequence[Mapping[str, Any]]) -> tuple[Tensor, ...]:
            return tuple(Tensor(t["name"], t["dtype"], tuple(t.get("shape") or ())) for t in items)

        return cls(tensors(d["inputs"]), tensors(d["outputs"]))

    @property
    def input_dtypes(self) -> dict[str, np.dtype]:
        return {t.name: np.dtype(t.dtype) for t in self.inputs}

    @property
    def output_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.outputs)

    @property
    def output_dtypes(self) -> dict[str, np.dtype]:
        return {t.name: np.dtype(t.dtype) for t in self.outputs}


class Runner(ABC):
    """A loaded model ready to run; used by the harness worker and the bundle loader alike.

    :meth:`run` checks input names and dtypes, then calls :meth:`_run`, which gets the
    checked feeds and returns one array per model output, in the model's output order.
    """

    def __init__(self, io: IO) -> None:
        self.io = io
        self.input_dtypes = io.input_dtypes
        self.output_names = io.output_names
        self._closed = False
        #: What this open did with the engine's compiled cache (:mod:`.cache`): ``used``, ``made`` or
        #: ``remade: WHY``; ``None`` where no cache was asked for (``settings["compiled_cache"]``).
        self.cache: str | None = None

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run one batch: ``{input name: array}`` -> ``{output name: array}``."""
        if self._closed:
            raise RuntimeError("Runner.run called after close()")
        missing = set(self.input_dtypes) - set(feeds)
        extra = set(feeds) - set(self.input_dtypes)
        if missing or extra:
            raise FeedError(
                f"feeds do not match the model inputs: missing {sorted(missing)}, unexpected {sorted(extra)}",
                fix=f"pass exactly {sorted(self.input_dtypes)}",
            )
        for name, array in feeds.items():
            if array.dtype != self.input_dtypes[name]:
                want = str(self.input_dtypes[name])
                raise FeedError(
                    f"input {name!r} has dtype {array.dtype}, the model wants {want}",
                    fix=f"cast it with .astype({want!r})",
                )
        outputs = self._run(feeds)
        return dict(zip(self.output_names, outputs, strict=True))

    def pool(self, requests: int | None = None) -> Pool:
        """``requests`` calls in flight at once through the engine's own parallel API (``None``: the
        engine's optimal number). Set :attr:`Pool.on_done` before starting requests.

        The feeds given to :meth:`Pool.start` are not checked again: check them once with :meth:`run`.
        """
        if self._closed:
            raise RuntimeError("Runner.pool called after close()")
        if requests is not None and not 1 <= requests <= MAX_REQUESTS:
            raise Unsupported(f"{requests} requests in flight asked for; this runtime allows 1 to {MAX_REQUESTS}",
                              fix=f"set num_requests between 1 and {MAX_REQUESTS}")  # fmt: skip
        return self._pool(requests)

    def describe(self) -> dict[str, Any]:
        """What the engine really set up, read back from it (OpenVINO: the compiled model's streams,
        threads, precision); ``{}`` where there is nothing to read back. Recorded with every measurement."""
        return {}

    def _pool(self, requests: int | None) -> Pool:
        raise Unsupported(f"{type(self).__name__} has no parallel API", fix="use the single-stream scenario")

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._close()

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @abstractmethod
    def _run(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]: ...

    def _close(self) -> None:  # noqa: B027 - optional hook
        pass


#: Called as each request of a :class:`Pool` ends: ``done(tag, None)``, or ``done(tag, error)``.
Done = Callable[[int, "BaseException | None"], None]
#: The most requests in flight any runtime takes (each is a thread or an engine request).
MAX_REQUESTS = 64


def _ignore(tag: int, error: BaseException | None) -> None:
    pass


class Pool(ABC):
    """Several requests in flight at once on one loaded model.

    Contract: :meth:`wait_free` blocks until a request is idle; :meth:`start` then starts it at
    once (it never waits for a request) and returns; :attr:`on_done` is called from an engine
    thread when it ends, ``on_done(tag, None)`` or ``on_done(tag, error)``, and must not raise.
    :meth:`drain` waits for every started request to end; :meth:`close` drains, then frees the
    requests. One thread drives a pool.
    ``info`` says what the engine really set up (requests, streams, threads), read back from it.
    """

    def __init__(self, requests: int) -> None:
        self.requests = requests
        self.on_done: Done = _ignore
        #: True where every call must carry the compiled batch (a partial batch is padded, as
        #: Triton's OpenVINO backend does with ENABLE_BATCH_PADDING).
        self.fixed_batch = False
        self.info: dict[str, Any] = {"requests": requests}

    @abstractmethod
    def wait_free(self) -> None: ...

    @abstractmethod
    def start(self, feeds: Mapping[str, np.ndarray], tag: int) -> None: ...

    @abstractmethod
    def drain(self) -> None: ...

    def close(self) -> None:
        self.drain()


class ThreadPool(Pool):
    """One thread per request, each calling its own ``calls[i]`` (a session, an interpreter, a context).

    Engines whose run call releases the GIL (ONNX Runtime, LiteRT, TensorRT) get true parallelism.
    """

    def __init__(self, calls: Sequence[Callable[[Mapping[str, np.ndarray]], object]]) -> None:
        super().__init__(len(calls))
        self._jobs: queue.SimpleQueue[tuple[Mapping[str, np.ndarray], int] | None] = queue.SimpleQueue()
        self._free = threading.Semaphore(len(calls))
        self._idle = threading.Condition()
        self._busy = 0
        self._threads = [threading.Thread(target=self._serve, args=(call,), name=f"request-{i}", daemon=True)
                         for i, call in enumerate(calls)]  # fmt: skip
        for thread in self._threads:
            thread.start()

    def _serve(self, call: Callable[[Mapping[str, np.ndarray]], object]) -> None:
        while (job := self._jobs.get()) is not None:
            feeds, tag = job
            error: BaseException | None = None
            try:
                call(feeds)
            except BaseException as exc:  # noqa: BLE001 - handed to on_done(), which fails the trial
                error = exc
            try:
                self.on_done(tag, error)
            finally:
                with self._idle:
                    self._busy -= 1
                    self._idle.notify_all()
                self._free.release()

    def wait_free(self) -> None:
        self._free.acquire()
        self._free.release()

    def start(self, feeds: Mapping[str, np.ndarray], tag: int) -> None:
        self._free.acquire()
        with self._idle:
            self._busy += 1
        self._jobs.put((feeds, tag))

    def drain(self) -> None:
        with self._idle:
            self._idle.wait_for(lambda: self._busy == 0)

    def close(self) -> None:
        self.drain()
        for _ in self._threads:
            self._jobs.put(None)
        for thread in self._threads:
            thread.join()
