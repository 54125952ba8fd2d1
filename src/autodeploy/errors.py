"""The one exception tree of autodeploy.

Library code raises these; only ``autodeploy.cli`` turns them into a message and an exit code.
Every message says what failed, what was asked versus what is available, and the fix, so
the CLI can print ``str(err)`` as one line.
"""

from __future__ import annotations


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


class ShapeError(UsageError):
    """A shape or dtype does not fit the model's inputs."""


class DataError(AutodeployError):
    """Input data (user .npz/.npy or pinned values) does not fit the model."""


class EngineError(AutodeployError):
    """An engine is unknown or unavailable on this machine."""


class UnknownEngineError(EngineError, UsageError):
    exit_code = 2


class UnsupportedConfigError(EngineError):
    """The engine cannot run this combination here (precision, batch, knob). The search prunes it."""


class BuildError(EngineError):
    """Converting or compiling the model for an engine failed."""


class StoreError(AutodeployError):
    """The results database cannot be opened, read or written."""


class TrialFailed(AutodeployError):
    """A trial did not produce a measurement; ``kind`` is one of :data:`autodeploy.harness.result.FAILURE_KINDS`."""

    def __init__(self, kind: str, message: str) -> None:
        self.kind, self.detail = kind, message
        super().__init__(f"trial failed ({kind}): {message}")
