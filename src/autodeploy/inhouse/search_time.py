"""The clock of an int8 build's float-layer search (:func:`autodeploy.inhouse.quantize.mixed.find`, which the
in-house quantizer and the engines' own, NNCF and ONNX Runtime's, share), beside its count of builds.

The count (:data:`~autodeploy.inhouse.quantize.mixed.MAX_TRIAL_BUILDS`) keeps the float set the same on every
machine, but a build of a heavy model is judged in about a minute: one in-house int8 ``bench`` of a pose model
searched for 13 minutes before it ended inaccurate, 22 of a study's 36. A search run inside :func:`time_limit`
asks for no build once its time is up and keeps the best passing config it found; the artifact's record says
so (:data:`STOPPED_KEY`). The build worker sets the limit (``HarnessSettings.search_s``: a share of the build's
time limit, which a study's time budget caps), so the float set depends on the machine's speed only where the
clock cut the search, and the trial says where it did.

Standard library only: the worker imports it whatever it runs.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

#: The field of an artifact's record (``artifact.json``'s meta, every engine's) holding the time limit that
#: stopped its float-layer search; the harness passes it on with the trial's result and ``bench`` says it.
STOPPED_KEY = "float_search_stopped_s"

_until: ContextVar[tuple[float, float] | None] = ContextVar("float_search_until", default=None)


@contextmanager
def time_limit(seconds: float | None) -> Iterator[None]:
    """Float-layer searches run inside ask for no build after ``seconds`` from now (``None``: no limit)."""
    token = _until.set(None if seconds is None else (time.monotonic() + seconds, seconds))
    try:
        yield
    finally:
        _until.reset(token)


def out_of_time() -> float | None:
    """The time limit in seconds once it has passed; ``None`` while time is left or where there is no limit."""
    until = _until.get()
    return until[1] if until is not None and time.monotonic() >= until[0] else None


def stopped_note(record: Mapping[str, Any]) -> str | None:
    """What a trial says where the clock stopped its build's float-layer search (``record``: the artifact's meta or
    the trial's ``extra``, which carries it on); ``None`` where it did not."""
    limit = record.get(STOPPED_KEY)
    if limit is None:
        return None
    builds = record.get("float_builds")
    judged = f" after {builds} builds judged" if builds else ""
    return (f"the int8 float-layer search stopped at its time limit ({limit:g} s, its share of the build's time "
            f"limit){judged}; the artifact is the best config it had found by then")  # fmt: skip
