"""Helpers shared by commands: consoles, a spinner, model references, the command line."""

from __future__ import annotations

import re
import shlex
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.markup import escape
from rich.status import Status

from autodeploy import model
from autodeploy.api import cache_dir
from autodeploy.model import ResolvedModel

__all__ = ["ResolvedModel", "cache_dir", "command_line", "err", "fmt_ms", "out", "resolve_model", "shown", "spinner"]

out = Console(highlight=False)
err = Console(stderr=True, highlight=False)
#: C0 and C1 control characters: an ANSI escape in a model's input name must not drive the terminal.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def shown(value: object) -> str:
    """Text from models, files and users, safe to print: control characters made visible, markup escaped."""
    return escape(_CONTROL.sub(lambda m: repr(m.group())[1:-1], str(value)))


def resolve_model(ref: str, shapes: dict[str, tuple[int, ...]]) -> ResolvedModel:
    """:func:`autodeploy.model.resolve_model`, with a spinner while a zoo model is built."""
    with spinner() as show:
        return model.resolve_model(ref, shapes, progress=show)


@contextmanager
def spinner() -> Iterator[Callable[[str], None]]:
    """A spinner on stderr that appears on the first message and is gone at the end."""
    status: Status | None = None

    def show(text: str) -> None:
        nonlocal status
        if status is None:
            status = err.status(escape(text))
            status.start()
        else:
            status.update(escape(text))

    try:
        yield show
    finally:
        if status is not None:
            status.stop()


def command_line() -> str:
    """The command as typed, for the store (so a result can be reproduced)."""
    return shlex.join(["autodeploy", *sys.argv[1:]])


def fmt_ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"
