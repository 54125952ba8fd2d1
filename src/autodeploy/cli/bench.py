"""``autodeploy bench``: measure one config of one model on this device and store it."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from autodeploy.adapters import registry
from autodeploy.adapters.base import TrialConfig
from autodeploy.cli._common import cache_dir, command_line, err, fmt_ms, out, resolve_model
from autodeploy.data import load_user_data, parse_input_pins, shapes_from_data
from autodeploy.device import probe_device
from autodeploy.errors import UsageError
from autodeploy.harness.result import TrialResult
from autodeploy.harness.run import HarnessSettings, prepare_data, run_trial
from autodeploy.harness.timing import TimingPolicy
from autodeploy.model import parse_batch_axis_flags, parse_shape_flags


def bench(
    model: Annotated[
        str,
        typer.Argument(help="An .onnx file, or zoo:NAME for a built-in model (see `autodeploy zoo list`)."),
    ],
    engine: Annotated[str, typer.Option(help="Engine name (see `autodeploy engines`).")] = "onnxruntime",
    precision: Annotated[str, typer.Option(help="fp32, fp16, bf16 or int8, as the engine offers.")] = "fp32",
    batch: Annotated[int, typer.Option(min=1, help="Items per call.")] = 1,
    threads: Annotated[
        int | None, typer.Option(min=1, help="Engine threads (default: the engine's own).")
    ] = None,
    knob: Annotated[
        list[str] | None, typer.Option(help="Engine knob NAME=VALUE in the engine's own words; repeatable.")
    ] = None,
    shape: Annotated[
        list[str] | None, typer.Option(help="Fix an input shape, NAME=1x3x224x224; repeatable.")
    ] = None,
    batch_axis: Annotated[
        list[str] | None,
        typer.Option(help="An input's batch axis, INPUT=AXIS (or INPUT=none: never batched); repeatable."),
    ] = None,
    data: Annotated[
        Path | None, typer.Option(help="Input data: .npz or a folder of NAME.npy (plus optional 'labels').")
    ] = None,
    input: Annotated[
        list[str] | None, typer.Option("--input", help="Pin a synthetic input to a constant, NAME=VALUE.")
    ] = None,
    min_samples: Annotated[int, typer.Option(min=2, help="Timed calls at least (662 for a p99 claim).")] = 64,
    min_duration: Annotated[float, typer.Option(help="Timed seconds at least.")] = 2.0,
    max_duration: Annotated[float, typer.Option(help="Timed seconds at most.")] = 60.0,
    timeout: Annotated[float, typer.Option(help="Seconds before the worker is killed.")] = 600.0,
    memory_cap_mb: Annotated[
        int | None, typer.Option(help="Worker memory cap in MB (default: 75% of RAM).")
    ] = None,
    db: Annotated[
        str | None,
        typer.Option(
            help="Results database URL (default: $AUTODEPLOY_DB or a SQLite file in the user data folder)."
        ),
    ] = None,
) -> None:
    """Measure one engine/precision/batch/threads config in an isolated worker and store the result."""
    from autodeploy.results_db.store import DeviceRecord, ModelRecord, Store

    resolved = resolve_model(model, parse_shape_flags(shape or []))
    info = resolved.info
    if batch_axis:
        info = info.with_batch_axes(parse_batch_axis_flags(batch_axis))
    config = TrialConfig(
        engine=engine, precision=precision, batch=batch, threads=threads, knobs=_parse_knobs(knob or [])
    )
    device = probe_device()
    registry.get(engine).check(device, info, config)  # unknown engine/precision/knob: fail before any work
    user_data = load_user_data(data, info) if data else resolved.data
    if data:  # arrays of a concrete shape fix the dims --shape left open
        info = info.with_shapes(shapes_from_data(info, user_data))
    for name in info.input_names:  # dynamic dims left unfixed: fail with the --shape fix now
        info.input_shape(name, batch)
    for note in info.notes:  # after the checks: bad input still gets one line
        err.print(f"note: {escape(note)}")
    policy = TimingPolicy(min_samples=min_samples, min_duration_s=min_duration, max_duration_s=max_duration)
    settings = HarnessSettings(
        workdir=cache_dir() / "work",
        policy=policy,
        timeout_s=timeout,
        **({"memory_cap_mb": memory_cap_mb} if memory_cap_mb else {}),
    )
    store = Store.open(db)  # open before measuring: a bad database path fails in a second, not after a run
    prepared = prepare_data(
        info,
        settings,
        data=user_data,
        calibration=resolved.calibration if not data else None,
        pins=parse_input_pins(input or []),
    )
    with err.status(f"{config.label()}: starting worker") as status:
        result = run_trial(
            info,
            config,
            prepared,
            settings,
            progress=lambda phase: status.update(f"{config.label()}: {phase}"),
        )
    with store:
        trial_id = store.add_trial(
            result,
            model=ModelRecord.of(info),
            device=DeviceRecord.of(device),
            command=command_line(),
        )
    _print_result(result, trial_id, info.name)
    if not result.ok:
        raise typer.Exit(1)


def _parse_knobs(flags: list[str]) -> dict[str, object]:
    knobs: dict[str, object] = {}
    for flag in flags:
        name, sep, value = flag.partition("=")
        if not sep or not name:
            raise UsageError(
                f"cannot parse --knob {flag!r}",
                fix="write it as NAME=VALUE, e.g. execution_mode=ORT_PARALLEL",
            )
        knobs[name] = _knob_value(value)
    return knobs


def _knob_value(text: str) -> object:
    """Knob values as the engines expect them: integers, booleans (true/false), else the text."""
    if text.lstrip("-").isdigit():
        return int(text)
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    return text


def _print_result(result: TrialResult, trial_id: int, model_name: str) -> None:
    config = TrialConfig.from_dict(result.config)
    title = f"{model_name}  {config.label()}  (trial {trial_id})"
    if result.latency is None:
        err.print(
            f"[red]{escape(title)}: failed ({result.failure_kind})[/red]: {escape(result.failure_message or '')}"
        )
        return
    lat = result.latency
    table = Table(title=title)
    for column in ("statistic", "value (ms)", "95% CI (ms)"):
        table.add_column(column, justify="right" if column != "statistic" else "left")

    def ci(bounds: tuple[float, float] | None) -> str:
        return "-" if bounds is None else f"[{bounds[0]:.3f}, {bounds[1]:.3f}]"

    table.add_row("median", fmt_ms(lat.median), ci(lat.median_ci))
    for label, value, bounds, need in (("p90", lat.p90, lat.p90_ci, 64), ("p99", lat.p99, lat.p99_ci, 662)):
        shown = fmt_ms(value) if value is not None else f"n/a (needs >= {need} samples)"
        table.add_row(label, shown, ci(bounds))
    table.add_row("mean ± stdev", f"{lat.mean:.3f} ± {lat.stdev:.3f}", "")
    table.add_row("CV", f"{lat.cv:.1%}" + (" [yellow](unstable)[/]" if lat.unstable else ""), "")
    table.add_row("samples", f"{lat.n} in {result.duration_s:.1f} s (+{result.warmup_calls} warm-up)", "")
    table.add_row("throughput", f"{result.throughput:.1f} items/s", "")
    table.add_row("peak RSS over baseline", f"{result.peak_rss_mb:.1f} MB", "")
    table.add_row("artifact size", f"{result.artifact_mb:.2f} MB", "")
    out.print(table)
    if result.accuracy is not None:
        acc = Table(
            title=f"accuracy vs ONNX Runtime FP32 on {result.accuracy.n_samples} items "
            f"({result.accuracy.constraint}: {'pass' if result.accuracy.passed else 'FAIL'})"
        )
        columns = ("output", "max abs", "mean rel", "cosine", "top-1 agreement", "exact agreement", "task accuracy (ref)")
        for column in columns:
            acc.add_column(column, justify="right" if column != "output" else "left")
        for o in result.accuracy.outputs:
            task = (
                "-" if o.task_accuracy is None else f"{o.task_accuracy:.2%} ({o.reference_task_accuracy:.2%})"
            )
            top1 = "-" if o.top1_agreement is None else f"{o.top1_agreement:.2%}"
            exact = "-" if o.exact_agreement is None else f"{o.exact_agreement:.2%}"
            acc.add_row(
                escape(o.name), f"{o.max_abs:.3g}", f"{o.mean_rel:.3g}", f"{o.cosine:.6f}", top1, exact, task
            )
        out.print(acc)
    if result.extra.get("inputs"):
        err.print(f"[yellow]note[/yellow]: {escape(result.extra['inputs'])}")
    if not result.ok:
        err.print(f"[red]failed ({result.failure_kind})[/red]: {escape(result.failure_message or '')}")
