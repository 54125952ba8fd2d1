"""``autodeploy engines``: which engines can run on this device, and why not."""

from __future__ import annotations

from rich.table import Table

from autodeploy.adapters.base import Availability
from autodeploy.adapters.registry import all_engines
from autodeploy.cli._common import Format, FormatOption, emit, out, shown
from autodeploy.device import probe_device
from autodeploy.report import SCHEMA_VERSION


def engines(format: FormatOption = Format.table) -> None:
    """List every engine with its availability on this device and, when unavailable or limited (tflite
    without its ONNX converter), the reason and fix."""
    device = probe_device()
    if format is not Format.table:
        emit(format, [{"schema": "autodeploy.engine", "schema_version": SCHEMA_VERSION, "engine": e.name,
                       **_availability(e.probe(device)), "device": {"fingerprint": device.fingerprint,
                                                                    "cpu": device.cpu_model}}
                      for e in all_engines()])  # fmt: skip
        return
    table = Table(title=f"Engines on {shown(device.cpu_model)} ({device.logical_cores} logical cores)")
    for column in ("engine", "status", "version", "reason / fix"):
        table.add_column(column)
    for engine in all_engines():
        availability = engine.probe(device)
        status = _status(availability)
        note = availability.reason + (f"; fix: {availability.fix}" if availability.fix else "")
        table.add_row(engine.name, status, availability.version or "-", shown(note))
    out.print(table)


def _availability(a: Availability) -> dict[str, object]:
    return {"available": a.available, "version": a.version, "reason": a.reason or None, "fix": a.fix or None}


def _status(a: Availability) -> str:
    """Available, unavailable, or available but limited: the reason then says what it lacks (tflite's converter)."""
    if not a.available:
        return "[red]unavailable[/]"
    return "[yellow]available, limited[/]" if a.reason else "[green]available[/]"
