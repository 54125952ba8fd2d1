"""Numbers people can read: times scaled to µs/ms/s, accuracy in %. Shared by the CLI and the dashboard."""

from __future__ import annotations

__all__ = ["fmt_mj", "fmt_ms", "fmt_ms_ci", "fmt_ms_range", "fmt_pct", "time_unit"]


def fmt_ms(value: float | None) -> str:
    """A time given in ms, in the unit that keeps 3-4 significant digits: 4.2 µs, 12.35 ms, 1.204 s."""
    if value is None:
        return "-"
    scale, unit = time_unit(abs(value))
    return f"{_sig(value * scale)} {unit}"


def fmt_ms_ci(value: float | None, ci: tuple[float, float] | None) -> str:
    """A time with its 95% CI in one unit (the value's): ``12.3 ms [12.1, 12.6]``."""
    if value is None:
        return "-"
    scale, unit = time_unit(abs(value))
    bounds = "" if ci is None else f" [{_sig(ci[0] * scale)}, {_sig(ci[1] * scale)}]"
    return f"{_sig(value * scale)}{bounds} {unit}"


def fmt_ms_range(low: float, high: float) -> str:
    """A range of times in ms in one unit (the higher one's): ``4.900–8.700 ms``."""
    scale, unit = time_unit(abs(high))
    return f"{_sig(low * scale)}–{_sig(high * scale)} {unit}"


def fmt_mj(value: float | None) -> str:
    """An energy given in mJ, in the unit that keeps 3-4 significant digits: 850.0 µJ, 4.500 mJ, 1.204 J."""
    if value is None:
        return "-"
    scale, unit = (1000.0, "µJ") if abs(value) < 1.0 else (1.0, "mJ") if abs(value) < 1000.0 else (0.001, "J")
    return f"{_sig(value * scale)} {unit}"


def time_unit(ms: float) -> tuple[float, str]:
    """The factor from ms and the unit name that read best for a time of ``ms`` milliseconds."""
    if ms < 1.0:
        return 1000.0, "µs"
    if ms < 1000.0:
        return 1.0, "ms"
    return 0.001, "s"


def _sig(x: float) -> str:
    """3 decimals under 10, 2 under 100, else 1: the digits a timing supports."""
    return f"{x:.3f}" if abs(x) < 10 else f"{x:.2f}" if abs(x) < 100 else f"{x:.1f}"


def fmt_pct(fraction: float | None) -> str:
    """A fraction as a percentage with two decimals: 0.0123 -> ``1.23%``."""
    return "-" if fraction is None else f"{fraction:.2%}"
