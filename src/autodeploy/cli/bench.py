"""``autodeploy bench``: measure one config of one model on this device and store it."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from autodeploy import api
from autodeploy.accuracy.records import DEFAULT_MAX_ACCURACY_DROP
from autodeploy.adapters import registry
from autodeploy.adapters.base import knob_value
from autodeploy.adapters.registry import BASELINE_ENGINE
from autodeploy.cli._common import (
    ACCURACY_DROP_HELP,
    AccuracyOption,
    Format,
    FormatOption,
    LayoutOption,
    MeanOption,
    MetricDropOption,
    MetricOption,
    ReverseOption,
    ScaleOption,
    at_least,
    command_line,
    emit,
    err,
    fmt_ms,
    fmt_ms_ci,
    fmt_pct,
    judged_by,
    load_text,
    out,
    preprocess_of,
    print_converter_logs,
    shown,
    spinner,
    timing_flags,
)
from autodeploy.data import parse_input_pins
from autodeploy.errors import TrialFailed, UsageError
from autodeploy.harness.cold_start import text as cold_start_text
from autodeploy.harness.load import UNDER_LOAD_CORES
from autodeploy.harness.result import TrialResult, headline
from autodeploy.inhouse.search_time import stopped_note
from autodeploy.model import ModelInfo, parse_batch_axis_flags
from autodeploy.objectives import DEFAULT_SCENARIO, SCENARIOS
from autodeploy.roofline import ops_text, share_text
from autodeploy.shapes import ShapeCase, ShapeSet, parse_flags, parse_key

#: ``--scenario``'s help: the scenarios it takes (the table's), in LoadGen's order.
SCENARIO_HELP = f"MLPerf LoadGen scenario: {', '.join(list(SCENARIOS)[:-1])} or {list(SCENARIOS)[-1]}."


def bench(
    model: Annotated[
        str,
        typer.Argument(help="An .onnx file, or zoo:NAME for a built-in model (see `autodeploy zoo list`); "
                       "a .tflite or an OpenVINO IR .xml (its .bin beside it) runs as given on its engine; a "
                       "PyTorch .pt2 (torch.export.save) is exported to ONNX. A torch.save checkpoint (.pt, .pth) "
                       "holds no program: save a .pt2, or pass the nn.Module in Python."),
    ],
    engine: Annotated[str | None, typer.Option(help=f"Engine name (see `autodeploy engines`; default {BASELINE_ENGINE}, "
                                               "or the engine that reads a .tflite or an IR).")] = None,
    precision: Annotated[str, typer.Option(help="fp32, fp16, bf16 or int8, as the engine offers.")] = "fp32",
    batch: Annotated[int, typer.Option(min=1, help="Items per call.")] = 1,
    threads: Annotated[
        int | None, typer.Option(min=1, help="Engine threads (default: the engine's own).")
    ] = None,
    knob: Annotated[
        list[str] | None, typer.Option(help="Engine knob NAME=VALUE in the engine's own words; repeatable.")
    ] = None,
    shape: Annotated[
        list[str] | None,
        typer.Option(help="Fix an input shape, NAME=1x3x224x224; repeat an input to measure each shape (one trial per shape)."),
    ] = None,
    batch_axis: Annotated[
        list[str] | None,
        typer.Option(help="An input's batch axis, INPUT=AXIS (or INPUT=none: never batched); repeatable."),
    ] = None,
    data: Annotated[
        list[str] | None, typer.Option(help="Input data: .npz, a .npy (a model with one input), a folder of NAME.npy (plus optional 'labels'), a folder "
                                       "of images (subfolders: classes), or sample:images (crops of real photos). "
                                       "Images are resized to each --shape; for arrays of several shapes repeat "
                                       "--data, one per --shape in the same order (without --shape: one shape per --data).")
    ] = None,
    layout: LayoutOption = None,
    reverse_input_channels: ReverseOption = False,
    mean_values: MeanOption = None,
    scale_values: ScaleOption = None,
    metric: MetricOption = None,
    max_metric_drop: MetricDropOption = None,
    max_accuracy_drop: Annotated[float, typer.Option(callback=at_least(0.0), help=ACCURACY_DROP_HELP)] = DEFAULT_MAX_ACCURACY_DROP,
    accuracy: AccuracyOption = None,
    input: Annotated[
        list[str] | None, typer.Option("--input", help="Pin a synthetic input to a constant, NAME=VALUE.")
    ] = None,
    min_samples: Annotated[int, typer.Option(min=2, help="Timed calls at least (662 for a p99 claim).")] = 64,
    min_duration: Annotated[float, typer.Option(help="Timed seconds at least.")] = 2.0,
    max_duration: Annotated[float, typer.Option(help="Timed seconds at most.")] = 60.0,
    timeout: Annotated[float, typer.Option(help="Seconds before a worker running the model (reference, measurement) is killed.")] = 600.0,
    build_timeout: Annotated[float, typer.Option(help="Seconds before the worker building the artifact is killed.")] = 1800.0,
    memory_cap_mb: Annotated[
        int | None, typer.Option(help="Worker memory cap in MB (default: 75% of RAM).")
    ] = None,
    db: Annotated[
        str | None,
        typer.Option(
            help="Results database URL (default: $AUTODEPLOY_DB or a SQLite file in the user data folder)."
        ),
    ] = None,
    scenario: Annotated[str, typer.Option(help=SCENARIO_HELP)] = DEFAULT_SCENARIO.name,
    sla_ms: Annotated[float | None, typer.Option(help="p99 bound in ms of the server scenario (required there).")] = None,
    cold_start: Annotated[bool, typer.Option(help="Also time the start in fresh processes (5 of each kind): load and "
                                             "first inference, without the engine's compiled cache and from it.")] = False,
    retry_conversion: Annotated[bool, typer.Option(help="Convert again although this engine's conversion of the model failed in a stored trial here (by default: fail at once, naming it).")] = False,
    format: FormatOption = Format.table,
) -> None:
    """Measure one engine/precision/batch/threads config in an isolated worker and store the result."""
    timing = timing_flags(min_samples, min_duration, max_duration)
    shape_set = parse_flags(shape or [])
    request = api.BenchRequest(
        engine=engine, precision=precision, batch=batch, threads=threads, knobs=_parse_knobs(knob or []),
        shapes=shape_set, batch_axes=parse_batch_axis_flags(batch_axis) if batch_axis else None, data=data or None,
        preprocess=preprocess_of(layout, reverse_input_channels, mean_values, scale_values),
        pins=parse_input_pins(input or []), metric=metric, max_metric_drop=max_metric_drop,
        max_accuracy_drop=max_accuracy_drop, accuracy=tuple(accuracy or ()), timing=timing, timeout_s=timeout,
        build_timeout_s=build_timeout, memory_cap_mb=memory_cap_mb, scenario=scenario, sla_ms=sla_ms,
        cold_start=cold_start, retry_conversion=retry_conversion, db=db, command=command_line(),
    )  # fmt: skip
    with spinner() as show:
        records = api.bench_shapes(model, request=request, progress=show)
    if len(records) > len(shape_set.cases):  # the shapes came from several --data
        shape_set = ShapeSet(tuple(ShapeCase(parse_key(r.shape_key)) for r in records))
    for record in records:
        result = record.result
        if result.extra.get("reference_failed"):  # nothing was measured: the model itself cannot run here
            at = f" at {record.shape_key}" if shape_set.several else ""
            raise TrialFailed(result.failure_kind or "crashed",
                              f"{headline(result.failure_message)}{at} (stored as failed trial {record.id})")  # fmt: skip
    for note in records[0].model.notes:  # intake notes (dynamic -1 dims, optional inputs), after the checks
        err.print(f"note: {shown(note)}", soft_wrap=True)
    for reason in registry.unreadable(records[0].model).values():  # a .tflite or an IR: the engines left out
        err.print(f"note: not run: {shown(reason)}", soft_wrap=True)
    converted = records[0].result.extra.get("source") or {}
    if converted.get("converter") and not records[0].model.source:  # a .tflite through tf2onnx: said once
        err.print(f"note: {shown(records[0].config.engine)} ran the ONNX that {shown(converted['converter'])} "
                  f"{shown(converted.get('tf2onnx', ''))} made of {shown(converted.get('file', 'the file'))} "
                  f"(opset {converted.get('opset')}); accuracy is judged against "
                  f"{shown(registry.baseline_name(records[0].model.format))}", soft_wrap=True)  # fmt: skip
    if format is Format.table:
        for i, record in enumerate(records):
            _print_result(record.result, record.id, record.model.name, record.shape_key if shape_set.several else "",
                          note=i == len(records) - 1, reference=_reference_name(record.model))  # the synthetic-inputs note once, at the end  # fmt: skip
        if shape_set.several:
            _print_per_shape(records, shape_set)
    else:
        from autodeploy.report import trial_record

        emit(format, trial_record(records[0].row) if len(records) == 1 else [trial_record(r.row) for r in records])
    if not all(r.ok for r in records):
        raise typer.Exit(1)


def _print_per_shape(records: list[api.StoredTrial], shape_set: ShapeSet) -> None:
    """One row per shape: the trial, its median and p90, its share of the mix and the accuracy verdict."""
    table = Table(title=f"{shown(records[0].model.name)}  {shown(records[0].config.label())}  per shape")
    for column in ("shape", "weight", "trial", "median", "p90", "accuracy"):
        table.add_column(column, justify="left" if column == "shape" else "right")
    for case, record in zip(shape_set.cases, records, strict=True):
        r = record.result
        verdict = "-" if r.accuracy is None else ("pass" if r.accuracy.passed else "FAIL")
        table.add_row(shown(case.key()), f"{shape_set.share(case):.0%}", str(record.id),
                      fmt_ms(r.median_ms) if r.latency else f"failed ({shown(r.failure_kind)})",
                      fmt_ms(r.p90_ms), verdict)  # fmt: skip
    results = [r.result for r in records]
    if all(r.latency is not None for r in results):  # the mix's expected latency, as `tune` weighs it
        def mix(values: list[float | None]) -> float | None:
            if any(v is None for v in values):
                return None
            return sum(shape_set.share(c) * v for c, v in zip(shape_set.cases, values, strict=True))  # type: ignore[operator]

        passed = all(r.accuracy is not None and r.accuracy.passed for r in results)
        table.add_row("mix (weighted)", "100%", "-", fmt_ms(mix([r.median_ms for r in results])),
                      fmt_ms(mix([r.p90_ms for r in results])), "pass" if passed else "FAIL")  # fmt: skip
    out.print(table)


#: Below this many evaluation items an accuracy verdict is said to rest on few (one item is over 3%).
FEW_ITEMS = 32


def _reference_name(model: ModelInfo) -> str:
    """What accuracy is judged against: ONNX Runtime FP32, or the engine that runs a model file as given
    (``LiteRT fp32, the file as given``)."""
    if model.source:  # exported from PyTorch: its own outputs
        from autodeploy.pytorch import reference_name

        return reference_name(model.source)
    return registry.reference_name(model.format)


def _parse_knobs(flags: list[str]) -> dict[str, object]:
    knobs: dict[str, object] = {}
    for flag in flags:
        name, sep, value = flag.partition("=")
        if not sep or not name:
            raise UsageError(
                f"cannot parse --knob {flag!r}",
                fix="write it as NAME=VALUE, e.g. execution_mode=ORT_PARALLEL",
            )
        knobs[name] = knob_value(value)
    return knobs


def _roofline_rows(table: Table, result: TrialResult) -> None:
    """The operations one call does and the GOP/s achieved, with their share of this device's peak for the
    precision (:mod:`autodeploy.roofline`); why not, where the graph's operations were not counted."""
    line = result.measurement.roofline if result.measurement is not None else None
    if line is None:
        if result.extra.get("roofline"):
            table.add_row("operations", shown(result.extra["roofline"]))
        return
    table.add_row("operations", shown(ops_text(line)))
    table.add_row("achieved", shown(share_text(line, registry.runs_on_gpu(result.config.engine))))


def _print_result(result: TrialResult, trial_id: int, model_name: str, shape: str = "", *, note: bool = True,
                  reference: str = registry.REFERENCE_NAME) -> None:
    config = result.config
    title = shown(f"{model_name}  {config.label()}{f'  at {shape}' if shape else ''}  (trial {trial_id})")
    if result.latency is None:
        err.print(
            f"[red]{title}: failed ({shown(result.failure_kind)})[/red]: {shown(headline(result.failure_message))}"
            + (f" [dim](the whole reason: autodeploy results show {trial_id})[/dim]"
               if "\n" in (result.failure_message or "") else "")  # fmt: skip
        )
        print_converter_logs(result.failure_message)  # -v: the converter's own log
        return
    lat = result.latency
    table = Table(title=title)
    for column in ("statistic", "value [95% CI]"):
        table.add_column(column, justify="right" if column != "statistic" else "left")
    table.add_row("median", fmt_ms_ci(lat.median, lat.median_ci))
    for label, value, bounds, need in (("p90", lat.p90, lat.p90_ci, 64), ("p99", lat.p99, lat.p99_ci, 662)):
        text = fmt_ms_ci(value, bounds) if value is not None else f"n/a (needs >= {need} samples)"
        table.add_row(label, text)
    table.add_row("mean ± stdev", f"{fmt_ms(lat.mean)} ± {fmt_ms(lat.stdev)}")
    table.add_row("CV", f"{lat.cv:.1%}" + (" [yellow](unstable)[/]" if lat.unstable else ""))
    table.add_row("samples", f"{lat.n} in {result.duration_s:.1f} s (+{result.warmup_calls} warm-up)")
    table.add_row("throughput", f"{result.throughput:.1f} items/s")
    _roofline_rows(table, result)
    concurrency = result.extra.get("concurrency")
    if concurrency:
        table.add_row("requests in flight", shown(", ".join(f"{k}={v}" for k, v in concurrency.items())))
    server = result.extra.get("server")
    if server:
        table.add_row("server: max rate under SLA", f"{server['max_rate_qps']:.1f} q/s")
        split = server.get("split") or {}
        if "queue_ms" in split:
            table.add_row("server: queued / computing p99",
                          f"{fmt_ms(split['queue_ms']['p99'])} / {fmt_ms(split['compute_ms']['p99'])} "
                          f"(mean batch {split['mean_batch']:.2f})")
    table.add_row("peak RSS over baseline", f"{result.peak_rss_mb:.1f} MB")
    table.add_row("artifact size", f"{result.artifact_mb:.2f} MB")
    cost = result.measurement.cost if result.measurement is not None else None
    if cost is not None:  # energy where a meter is, else CPU time and why no energy (harness/energy.py)
        table.add_row("cost per inference", shown(cost.text()))
    load = result.measurement.load if result.measurement is not None else None
    if load is not None:
        table.add_row("machine load while timed", load_text(load))
    out.print(table)
    cold = result.measurement.cold_start if result.measurement is not None else None
    for line in cold_start_text(cold) if cold is not None else ():  # harness/cold_start.py: load, first inference
        out.print(shown(line), soft_wrap=True)
    if load is not None and load.under_load:
        err.print(f"[yellow]under load[/]: other processes kept {load.other_cores:.2f} of {load.cpus} cores busy while "
                  f"this was timed (more than {UNDER_LOAD_CORES}): its times are likely slower and noisier than on a "
                  "quiet machine; measure again when it is quiet", soft_wrap=True)  # fmt: skip
    if lat.unstable:
        err.print(f"[yellow]unstable[/]: the calls vary by {lat.cv:.0%} (CV > 10%), so small differences mean "
                  "little; try a longer run (--min-duration 10), fewer threads (--threads 1) or a quieter "
                  "machine (close other programs, plug in the laptop)", soft_wrap=True)  # fmt: skip
    if result.accuracy is not None:
        acc = Table(title=f"accuracy on {result.accuracy.n_samples} items vs {reference}: "
                          f"{'pass' if result.accuracy.passed else 'FAIL'}")  # fmt: skip
        columns = ("output", "judged by", "max abs", "mean rel", "cosine", "top-1 agreement", "exact agreement",
                   "task accuracy (ref)")
        for column in columns:
            acc.add_column(column, justify="right" if column != "output" else "left")
        for o in result.accuracy.outputs:
            task = "-" if o.task_accuracy is None else f"{fmt_pct(o.task_accuracy)} ({fmt_pct(o.reference_task_accuracy)})"
            # An argmax of coordinates is no class: the column shows it for one class vector per item only.
            top1 = fmt_pct(o.top1_agreement) if o.measure is None or o.measure.per_item else "-"
            exact = fmt_pct(o.exact_agreement)
            acc.add_row(shown(o.name), shown(judged_by(o)), f"{o.max_abs:.3g}", f"{o.mean_rel:.3g}", f"{o.cosine:.6f}",
                        top1, exact, task)  # fmt: skip
        out.print(acc)
        out.print(f"accuracy constraint: {shown(result.accuracy.constraint)}", soft_wrap=True)
        a = result.accuracy
        if a.n_samples < FEW_ITEMS:
            err.print(f"[yellow]note[/]: the verdict rests on {a.n_samples} items, fewer than {FEW_ITEMS}: one item "
                      f"is {1 / max(a.n_samples, 1):.0%} of an agreement; give more --data for a firmer verdict",
                      soft_wrap=True)  # fmt: skip
        if a.metric is not None and a.metric_value is not None:
            out.print(f"metric {shown(a.metric)}: {a.metric_value:.6g} ({reference}: "
                      f"{a.reference_metric_value:.6g}, drop {a.reference_metric_value - a.metric_value:.4g})")  # type: ignore[operator]
    if note and result.extra.get("inputs"):
        err.print(f"[yellow]note[/yellow]: {shown(result.extra['inputs'])}")
    stopped = stopped_note(result.extra)  # what an int8 build's float-layer search spent, where its clock cut it
    if stopped:
        err.print(f"[yellow]note[/yellow]: {stopped}", soft_wrap=True)
    if not result.ok:
        err.print(f"[red]failed ({shown(result.failure_kind)})[/red]: {shown(headline(result.failure_message))}")
