"""A study's time budget (``--time-budget 10m``): what is left, and what each worker may take of it."""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass, field, replace

from autodeploy.errors import UsageError
from autodeploy.harness.run import HarnessSettings

_PART = re.compile(r"(\d+(?:\.\d+)?)\s*(min|d|h|m|s)?", re.IGNORECASE)
_SECONDS = {"d": 86400.0, "h": 3600.0, "m": 60.0, "min": 60.0, "s": 1.0, None: 1.0}
#: What a slow conversion (onnx2tf) is assumed to take before the study has timed one here.
SLOW_BUILD_GUESS_S = 120.0


def parse_duration(text: str | float | int, flag: str = "--time-budget") -> float:
    """Seconds in ``600``, ``90s``, ``10m``, ``1.5h``, ``1h30m`` or ``7d`` (``flag`` names it in the error).

    Raises:
        UsageError: not a positive duration.
    """
    if isinstance(text, (int, float)):
        seconds = float(text)
    else:
        spaced = text.strip()
        parts = list(_PART.finditer(spaced))
        if not parts or "".join(p.group(0) for p in parts).replace(" ", "") != spaced.replace(" ", ""):
            raise UsageError(f"{flag} {text!r} is not a duration", fix="write it as 600, 90s, 10m, 1h30m or 7d")
        seconds = sum(float(p.group(1)) * _SECONDS[(p.group(2) or "").lower() or None] for p in parts)
    if not math.isfinite(seconds) or seconds <= 0:
        raise UsageError(f"{flag} must be more than 0 seconds, got {text!r}", fix=f"e.g. {flag} 10m")
    return seconds


def duration_text(seconds: float) -> str:
    """``45 s``, ``3.2 min``, ``1.5 h``."""
    if seconds < 90:
        return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.1f} s"
    if seconds < 5400:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


@dataclass
class Budget:
    """The wall time one study run may take, counted from its start; ``seconds=None``: no limit."""

    seconds: float | None
    started: float = field(default_factory=time.monotonic)
    told: set[str] = field(default_factory=set)  # branches whose skip the user was told about

    def left(self) -> float:
        if self.seconds is None:
            return math.inf
        return self.seconds - (time.monotonic() - self.started)

    def capped(self, settings: HarnessSettings) -> HarnessSettings:
        """``settings`` whose workers are stopped (``timeout``) when the budget runs out under them."""
        if self.seconds is None:
            return settings
        left = max(self.left(), 0.5)
        return replace(settings, build_timeout_s=min(settings.build_timeout_s, left),
                       timeout_s=min(settings.timeout_s, left))  # fmt: skip
