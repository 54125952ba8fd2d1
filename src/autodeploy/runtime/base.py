"""What every engine runtime shares: the model's interface and a :class:`Runner` that checks feeds.

Standard library and numpy only. Inside autodeploy the errors are autodeploy's own
(:class:`~autodeploy.errors.ShapeError` for feeds that do not fit, :class:`~autodeploy.errors.EngineError`
for an engine that cannot open or run the artifact); shipped alone in a bundle they are
stand-ins with the same message format.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
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
