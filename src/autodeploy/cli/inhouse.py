"""``autodeploy inhouse optimize|quantize|passes``: our graph passes, INT8 quantizer and memory plan."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from autodeploy.accuracy.records import DEFAULT_MAX_ACCURACY_DROP
from autodeploy.cli._common import (
    DataOption,
    LayoutOption,
    MeanOption,
    ReverseOption,
    ScaleOption,
    err,
    out,
    preprocess_of,
    resolve_model,
    shown,
    spinner,
)
from autodeploy.errors import UsageError

if TYPE_CHECKING:
    from autodeploy.inhouse.memory import MemoryPlan
    from autodeploy.inhouse.passes import PipelineReport

app = typer.Typer(
    help="The in-house toolchain: graph passes, INT8 quantizer and memory planner (ONNX -> ONNX).",
    no_args_is_help=True,
)


@app.command("passes")
def passes() -> None:
    """List the graph passes, default pipeline first."""
    from autodeploy.inhouse.passes import DEFAULT_PIPELINE, LEFT_OUT, PASSES

    table = Table(title="graph passes (default pipeline in this order)")
    for column in ("pass", "default", "what it does"):
        table.add_column(column)
    for name, graph_pass in PASSES.items():
        default = "yes" if name in DEFAULT_PIPELINE else shown(f"no: {LEFT_OUT.get(name, '')}")
        table.add_row(name, default, shown(graph_pass.purpose))
    out.print(table)


@app.command("optimize")
def optimize(
    model: Annotated[str, typer.Argument(help="An .onnx file, or zoo:NAME.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Where to write the optimized model.")],
    passes: Annotated[
        str | None, typer.Option(help="Comma-separated pass names (default: the default pipeline).")
    ] = None,
    target: Annotated[
        str, typer.Option(help="onnx: standard ops only; onnxruntime: may use ORT's fused contrib ops.")
    ] = "onnx",
    dim: Annotated[
        list[str] | None, typer.Option(help="Symbolic dim for the memory plan, NAME=VALUE (default 1).")
    ] = None,
) -> None:
    """Run the graph passes, write the result, print what each pass did and the memory plan."""
    import onnx

    from autodeploy.inhouse.memory import plan_memory
    from autodeploy.inhouse.passes import optimize as run_passes
    from autodeploy.inhouse.passes import parse_passes

    names = parse_passes([p.strip() for p in passes.split(",") if p.strip()] if passes else None)
    info = resolve_model(model, {}).info
    proto = onnx.load(str(info.path))
    with err.status("running passes"):
        optimized, report = run_passes(proto, names, target=target)  # type: ignore[arg-type]
    _save(optimized, output)
    _print_passes(report)
    dims = _parse_dims(dim or [])
    _print_memory(plan_memory(proto, dims), plan_memory(optimized, dims))
    out.print(f"wrote {shown(str(output))}")


@app.command("quantize")
def quantize(
    model: Annotated[str, typer.Argument(help="An .onnx file, or zoo:NAME.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Where to write the QDQ model.")],
    calibration: Annotated[str, typer.Option(help="minmax, percentile or entropy.")] = "percentile",
    symmetric: Annotated[bool, typer.Option(help="Symmetric int8 activations.")] = False,
    fallback: Annotated[bool, typer.Option(help="Keep sensitive layers in float to meet the budget.")] = True,
    reduce_range: Annotated[
        bool, typer.Option(help="7-bit weights (for ONNX Runtime on x86 CPUs without VNNI).")
    ] = False,
    budget: Annotated[float, typer.Option(help="Accuracy budget per output on calibration data, judged as bench judges each output.")] = DEFAULT_MAX_ACCURACY_DROP,
    bias_correction: Annotated[
        bool, typer.Option(help="Subtract each Conv/Gemm's mean int8 output shift from its bias.")
    ] = True,
    data: DataOption = None,
    layout: LayoutOption = None,
    reverse_input_channels: ReverseOption = False,
    mean_values: MeanOption = None,
    scale_values: ScaleOption = None,
    items: Annotated[
        int, typer.Option(min=1, help="Synthetic calibration items when no data is given.")
    ] = 64,
    timeout: Annotated[
        float,
        typer.Option(help="Seconds before the worker that optimizes and quantizes is killed (as --build-timeout)."),
    ] = 1800.0,
    memory_cap_mb: Annotated[
        int | None, typer.Option(help="Worker memory cap in MB (default: 75% of RAM).")
    ] = None,
) -> None:
    """Optimize, then quantize to QDQ INT8 (runs in ONNX Runtime and OpenVINO) in a worker; print the report."""
    from autodeploy import api

    preprocess = preprocess_of(layout, reverse_input_channels, mean_values, scale_values)
    try:
        with spinner() as show:  # the worker's phases: optimizing, then calibrating and quantizing
            done = api.quantize(model, output, calibration=calibration, symmetric=symmetric, fallback=fallback,
                                reduce_range=reduce_range, budget=budget, bias_correction=bias_correction, data=data,
                                preprocess=preprocess, items=items, timeout_s=timeout, memory_cap_mb=memory_cap_mb,
                                progress=show)  # fmt: skip
    except KeyboardInterrupt:  # the worker's process group is already killed
        err.print("interrupted: the worker was stopped and nothing was written")
        raise typer.Exit(130) from None
    report, quant = done.passes, done.quantization
    _print_passes(report)
    table = Table(title=f"int8 quantization ({calibration}, {'symmetric' if symmetric else 'asymmetric'})")
    table.add_column("")
    table.add_column("value", justify="right")
    table.add_row("calibration items", str(quant.calibration_items))
    table.add_row("quantized nodes / tensors", f"{quant.quantized_nodes} / {quant.quantized_tensors}")
    table.add_row("layers kept in float", shown(", ".join(quant.kept_float)) or "none")
    for key, value in quant.agreement_final.items():
        table.add_row(shown(key), f"{value:.4f}")
    table.add_row("budget met (calibration data)", "yes" if quant.budget_met else "[red]no[/red]")
    out.print(table)
    out.print(f"wrote {shown(str(output))}")


def _save(model: object, path: Path) -> None:
    import onnx

    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))  # type: ignore[arg-type]


def _parse_dims(flags: list[str]) -> dict[str, int]:
    dims = {}
    for flag in flags:
        name, sep, value = flag.partition("=")
        if not sep or not value.isdigit():
            raise UsageError(f"cannot parse --dim {flag!r}", fix="write it as NAME=VALUE, e.g. N=8")
        dims[name] = int(value)
    return dims


def _print_passes(report: PipelineReport) -> None:
    table = Table(
        title=f"passes (target {report.target}): {report.nodes_before} -> {report.nodes_after} nodes"
    )
    for column in ("pass", "rewrites", "detail"):
        table.add_column(column, justify="right" if column == "rewrites" else "left")
    for p in report.passes:
        if p.rolled_back:
            detail = f"[yellow]rolled back[/yellow]: {shown(p.rolled_back)}"
        else:
            detail = ", ".join(f"{shown(k)} x{v}" for k, v in p.detail.items())
            refused = "; ".join(f"{shown(k)} (x{v})" for k, v in p.refused.items())
            detail = "; ".join(x for x in (detail, f"[dim]refused: {refused}[/dim]" if refused else "") if x)
        table.add_row(shown(p.name), str(p.rewrites), detail or "-")
    out.print(table)


def _print_memory(before: MemoryPlan, after: MemoryPlan) -> None:
    dims = ", ".join(f"{k}={v}" for k, v in after.dims.items()) or "static shapes"
    table = Table(title=f"activation memory ({shown(dims)})")
    for column in ("", "before passes", "after passes"):
        table.add_column(column, justify="right" if column else "left")
    rows = (
        ("tensors planned", lambda p: str(len(p.tensors))),
        ("peak without reuse", lambda p: _mb(p.no_reuse)),
        ("peak with reuse (arena)", lambda p: _mb(p.arena)),
        ("lower bound (max live)", lambda p: _mb(p.lower_bound)),
        ("saved by reuse", lambda p: f"{p.saving:.1%}"),
        ("tensors of unknown size", lambda p: str(len(p.unknown))),
    )
    for label, fmt in rows:
        table.add_row(label, fmt(before), fmt(after))
    out.print(table)


def _mb(n: int) -> str:
    return f"{n / 2**20:.2f} MB ({n:,} B)"
