"""``autodeploy engines``: which engines can run on this device, and why not; what each precision reaches here."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from autodeploy.adapters.base import Availability
from autodeploy.adapters.registry import all_engines
from autodeploy.cli._common import Format, FormatOption, cache_dir, emit, err, out, shown, spinner
from autodeploy.device import probe_device
from autodeploy.report import SCHEMA_VERSION
from autodeploy.roofline import Peaks, gops_text
from autodeploy.runtime.device import DeviceInfo


def engines(format: FormatOption = Format.table,
            refresh: Annotated[bool, typer.Option("--refresh", help="Measure this device's peak throughput per "
                                                  "precision again (a few seconds; on first use it is measured "
                                                  "and cached).")] = False) -> None:  # fmt: skip
    """List every engine with its availability on this device and, when unavailable or limited (tflite
    without its ONNX converter), the reason and fix; then the peak GOP/s each precision reaches here
    (a MatMul and a Conv per engine, measured once per device), which every result's share of peak is read against."""
    device = probe_device()
    peaks = _peaks(device, refresh)
    if format is not Format.table:
        emit(format, [{"schema": "autodeploy.engine", "schema_version": SCHEMA_VERSION, "engine": e.name,
                       **_availability(e.probe(device)), "device": {"fingerprint": device.fingerprint,
                                                                    "cpu": device.cpu_model},
                       "peaks": [k.to_dict() for k in peaks.kernels if k.engine == e.name]}
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
    _print_peaks(peaks, device)


def _peaks(device: DeviceInfo, refresh: bool) -> Peaks:
    from autodeploy.harness.peaks import device_peaks, peaks_folder

    with spinner() as show:
        return device_peaks(device, peaks_folder(cache_dir()), refresh=refresh, progress=show)


def _print_peaks(peaks: Peaks, device: DeviceInfo) -> None:
    """One row per precision: its peak (the fastest kernel on any engine) and every kernel measured."""
    when = f", measured {peaks.measured_at}" if peaks.measured_at else ""
    table = Table(title=f"Peak throughput per precision on this device (fingerprint {device.fingerprint}{when})")
    for column in ("precision", "peak", "kernels (GOP/s, engine's default threads)"):
        table.add_column(column, justify="right" if column == "peak" else "left")
    for precision in peaks.precisions():
        best = peaks.best(precision)
        kernels = "; ".join(f"{k.engine} {k.op}: {k.gops:.0f}" for k in peaks.kernels if k.precision == precision)
        table.add_row(precision, gops_text(best.gops) if best else "-", shown(kernels))
    out.print(table)
    for what, why in peaks.failures.items():
        err.print(f"note: peak not measured for {shown(what)}: {shown(why)}", soft_wrap=True)
    if peaks.under_load:
        err.print("[yellow]under load[/]: other processes kept the machine busy while the peaks were measured, so "
                  "they read low and shares of peak read high; measure again when it is quiet: "
                  "autodeploy engines --refresh", soft_wrap=True)  # fmt: skip


def _availability(a: Availability) -> dict[str, object]:
    return {"available": a.available, "version": a.version, "reason": a.reason or None, "fix": a.fix or None}


def _status(a: Availability) -> str:
    """Available, unavailable, or available but limited: the reason then says what it lacks (tflite's converter)."""
    if not a.available:
        return "[red]unavailable[/]"
    return "[yellow]available, limited[/]" if a.reason else "[green]available[/]"
