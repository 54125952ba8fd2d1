"""The one exception tree of autodeploy.

Library code raises these; only ``autodeploy.cli`` turns them into a message and an exit code.
Every message says what failed, what was asked versus what is available, and the fix, so
the CLI can print ``str(err)`` as one line.

Exit codes (the README's table): 0 success; 1 something ran and failed (a trial, the search, a
bundle check, the results database); 2 bad input or setup, nothing was run (flags, model, data,
shapes, unknown engine or precision, a missing optional extra); 130 interrupted. ``gate`` has its
own (0 pass, 1 fail, 2 inconclusive, 64 bad input, 70 could not run).
"""

from __future__ import annotations

import errno
import re
from collections.abc import Mapping
from pathlib import Path


def excerpt(text: object, limit: int = 200, *, quote: bool = False) -> str:
    """``text`` taken from input (a file name, an archive member, a model field) cut to ``limit``
    characters, saying how long it was: an error that echoes input stays one short line.
    With ``quote``, the kept part is shown as ``repr`` (control characters visible)."""
    text = str(text)
    kept = text[:limit]
    shown = repr(kept) if quote else kept
    return shown if len(text) <= limit else f"{shown}... [{len(text):,} characters]"


#: C0 and C1 control characters and the bidirectional marks, embeddings, overrides and isolates: what would
#: drive a terminal (an ANSI escape) or reorder the text it shows (U+202E).
CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def one_line(text: object, limit: int = 300) -> str:
    """``text`` from a child process, a file or a cache (a converter's reason) as one line safe to show: each
    run of whitespace (line breaks included) one space, control characters written as escapes (``\\x1b``),
    cut to ``limit`` characters as :func:`excerpt` does."""
    line = CONTROL.sub(lambda m: repr(m.group())[1:-1], " ".join(str(text).split()))
    return excerpt(line, limit)


class AutodeployError(Exception):
    """Base of every error autodeploy raises on purpose (bad input, unavailable engine, ...).

    Anything else that escapes is a bug and keeps its traceback.
    """

    exit_code = 1

    def __init__(self, message: str, *, fix: str | None = None) -> None:
        self.message = message
        self.fix = fix
        super().__init__(message if fix is None else f"{message}; fix: {fix}")


class UsageError(AutodeployError):
    """The user asked for something malformed (unknown name, bad flag value)."""

    exit_code = 2


class ModelError(AutodeployError):
    """The model file is missing, unreadable, not ONNX, invalid or unsafe."""

    exit_code = 2


class ShapeError(UsageError):
    """A shape or dtype does not fit the model's inputs."""


class DataError(AutodeployError):
    """Input data (user .npz/.npy or pinned values) does not fit the model."""

    exit_code = 2


class EngineError(AutodeployError):
    """An engine is unknown or unavailable on this machine."""


class UnknownEngineError(EngineError, UsageError):
    exit_code = 2


class EngineUnavailableError(EngineError):
    """The engine asked for cannot run on this machine (no GPU, its runtime missing): a setup problem, nothing was
    run or stored. A study skips such an engine in one line instead."""

    exit_code = 2


class UnsupportedConfigError(EngineError):
    """The engine cannot run this combination here (precision, batch, knob). The search prunes it."""

    exit_code = 2


class BuildError(EngineError):
    """Converting or compiling the model for an engine failed."""


class ConversionError(BuildError):
    """The engine's conversion of the model, which all its precisions share, failed: a study prunes every
    precision of that engine at once (``search/screening.py``)."""


#: Top-level module -> the extra that installs it (pyproject.toml's optional dependencies), for the
#: extras that are not an engine's: an engine declares its own (``Engine.extra`` and ``Engine.modules``).
EXTRAS = {"sklearn": "zoo", "PIL": "images", "streamlit": "dashboard", "plotly": "dashboard", "psycopg": "postgres",
          "pgqueuer": "fleet", "model_signing": "sign", "OpenSSL": "sign"}  # fmt: skip


class MissingExtraError(UsageError):
    """An optional dependency is not installed; the fix names the extra that brings it."""

    @classmethod
    def of(cls, error: ModuleNotFoundError, extras: Mapping[str, str] = EXTRAS) -> MissingExtraError | None:
        """The install hint for ``error``, or ``None`` when the module is not part of an extra (a bug).

        ``extras`` maps top-level modules to their extra; the engines' own are added by
        :func:`autodeploy.adapters.registry.missing_extra`, which the CLI calls.
        """
        module = (error.name or "").split(".")[0]
        extra = extras.get(module)
        if extra is None:
            return None
        return cls(f"{module} is not installed (it comes with the '{extra}' extra)",
                   fix=f"pip install 'autodeploy[{extra}]'")  # fmt: skip


#: ``errno`` values that mean the destination cannot take the bytes (full disk, quota, file size
#: limit, read-only or forbidden), never that the input is damaged.
WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM})


class WriteError(AutodeployError):
    """A file could not be written where asked (no space, quota, read-only); nothing was left behind."""

    @classmethod
    def of(cls, error: OSError, what: str | Path, where: str | Path, *, instead: str) -> WriteError | None:
        """The one-line error for ``error`` raised while writing ``what`` under the folder ``where``,
        or ``None`` when ``error`` is not about the destination (a read failed: that is another error)."""
        named = [Path(f) for f in (error.filename, error.filename2) if isinstance(f, (str, Path))]
        if error.errno not in WRITE_ERRNOS or (named and not any(f.is_relative_to(where) for f in named)):
            return None  # a read elsewhere failed (a cache file, the input itself): not the destination's fault
        space = error.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
        fix = f"free space on the disk of {where}" if space else f"make {where} writable"
        return cls(f"cannot write {what}: {error.strerror or error} (under {where}); nothing was left behind",
                   fix=f"{fix}, or {instead}")  # fmt: skip


class StoreError(AutodeployError):
    """The results database cannot be opened, read or written."""


class StoreLocationError(StoreError):
    """The database named (``--db``, ``$AUTODEPLOY_DB``) does not exist or cannot be one: bad input, exit 2."""

    exit_code = 2


class TrialFailed(AutodeployError):
    """A trial did not produce a measurement; ``kind`` is one of :data:`autodeploy.harness.result.FAILURE_KINDS`."""

    def __init__(self, kind: str, message: str) -> None:
        self.kind, self.detail = kind, message
        super().__init__(f"trial failed ({kind}): {message}")
