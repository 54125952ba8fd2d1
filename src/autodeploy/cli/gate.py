"""``autodeploy gate``: a CI regression gate, baseline vs candidate, with a statistical verdict.

Exit codes (documented in ``--help`` and the README): 0 pass, 1 fail, 2 inconclusive,
64 bad input (flags, a missing or invalid model or bundle), 70 an error that stopped the gate
(engine unavailable, reference failed, results database). A CI job that only wants "no proven
regression" can treat 2 as success; one that wants a proven non-regression treats it as failure.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from typer.core import TyperCommand

from autodeploy import api
from autodeploy.accuracy.records import DEFAULT_MAX_ACCURACY_DROP
from autodeploy.adapters.registry import BASELINE_ENGINE
from autodeploy.bundle.loader import BundleError
from autodeploy.cli._common import (
    DataOption,
    Format,
    FormatOption,
    LayoutOption,
    MeanOption,
    ReverseOption,
    ScaleOption,
    at_least,
    command_line,
    emit,
    err,
    out,
    plain,
    preprocess_of,
    shown,
    spinner,
)
from autodeploy.errors import AutodeployError, DataError, ModelError, UnsupportedConfigError, UsageError
from autodeploy.gate.core import EXIT_ERROR, EXIT_USAGE, LATENCY_METRICS
from autodeploy.gate.stats import ALPHA, MIN_ROUNDS
from autodeploy.model import parse_shape_flags

#: Library errors that mean the user's input is wrong (exit 64); any other stops the gate (exit 70).
BAD_INPUT = (UsageError, ModelError, DataError, UnsupportedConfigError, BundleError)


#: Click's usage error, as Typer raises it: Typer >= 0.20 vendors its own click, older Typer uses the
#: click package; either way it is a base of ``typer.BadParameter``.
_CLICK_USAGE = tuple(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")


class GateCommand(TyperCommand):
    """Click's own usage errors, and ours from checking flags (a non-finite number), exit 2, which is
    *inconclusive* here: make them 64 (EX_USAGE)."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except (*_CLICK_USAGE, UsageError) as exc:
            exc.exit_code = EXIT_USAGE
            raise


def gate(
    baseline: Annotated[str, typer.Option(help="Baseline: an .onnx file, zoo:NAME, or a bundle folder/.tar.gz.")],
    candidate: Annotated[str, typer.Option(help="Candidate: an .onnx file, zoo:NAME, or a bundle folder/.tar.gz.")],
    max_regression: Annotated[str, typer.Option(help="Largest tolerated latency increase, e.g. 5% or 0.05.")] = "5%",
    max_accuracy_drop: Annotated[str, typer.Option(help="Largest tolerated accuracy drop, e.g. 1% or 0.01.")] = f"{DEFAULT_MAX_ACCURACY_DROP:.0%}",
    rounds: Annotated[int, typer.Option(min=1, help="Worker runs per side, interleaved A B, B A, ...")] = 16,
    min_samples: Annotated[int, typer.Option(min=1, help="Fewer runs per side than this: inconclusive.")] = MIN_ROUNDS,
    alpha: Annotated[float, typer.Option(min=1e-9, max=0.5, help="Significance level for the whole family of metrics.")] = ALPHA,
    metric: Annotated[list[str] | None, typer.Option(help=f"Latency metric per run: {', '.join(LATENCY_METRICS)}; repeatable (default: p10, median).")] = None,
    against_db: Annotated[bool, typer.Option("--against-db", help="Weaker: compare the candidate with the stored trials of the baseline's model and config on this device; the baseline is not run.")] = False,
    engine: Annotated[str, typer.Option(help="Engine for model arms (bundles use their own).")] = BASELINE_ENGINE,
    precision: Annotated[str, typer.Option(help="Precision for model arms.")] = "fp32",
    batch: Annotated[int, typer.Option(min=1, help="Items per call for model arms.")] = 1,
    threads: Annotated[int, typer.Option(min=1, help="Engine threads for model arms (one thread is the least noisy).")] = 1,
    shape: Annotated[list[str] | None, typer.Option(help="Fix an input shape, NAME=1x3x224x224; repeatable.")] = None,
    data: DataOption = None,
    layout: LayoutOption = None,
    reverse_input_channels: ReverseOption = False,
    mean_values: MeanOption = None,
    scale_values: ScaleOption = None,
    reference_model: Annotated[Path | None, typer.Option(help="Source ONNX model for a bundle's accuracy reference.")] = None,
    calls: Annotated[int, typer.Option(min=2, help="Timed calls per run at least.")] = 100,
    duration: Annotated[float, typer.Option(callback=at_least(0.0), help="Timed seconds per run at least (more runs beat longer runs).")] = 0.1,
    timeout: Annotated[float, typer.Option(help="Seconds before a worker is killed.")] = 300.0,
    markdown: Annotated[Path | None, typer.Option(help="Also write the markdown summary to this file.")] = None,
    junit: Annotated[Path | None, typer.Option(help="Write JUnit XML here: one testcase per metric.")] = None,
    store: Annotated[bool, typer.Option("--store/--no-store", help="Store the gate run for the dashboard.")] = True,
    db: Annotated[str | None, typer.Option(help="Results database URL (default: $AUTODEPLOY_DB or the user SQLite file).")] = None,
    seed: Annotated[int, typer.Option(help="Seed of synthetic inputs and of the bootstrap.")] = 0,
    format: FormatOption = Format.table,
) -> None:  # fmt: skip
    """Gate a candidate against a baseline: interleaved A/B runs on this machine, a statistical verdict.

    Fail needs a significant slowdown (one-sided Mann-Whitney U over per-run values,
    Holm-corrected over the metrics) AND a change beyond --max-regression, or an accuracy
    drop beyond --max-accuracy-drop. Pass needs the upper 95% bound of every latency change within
    --max-regression; too few or too noisy runs for that are inconclusive. 0 pass, 1 fail, 2 inconclusive, 64 bad input, 70 the gate could not run.
    """
    try:
        with spinner() as show:
            run = api.gate(
                baseline, candidate, max_regression=parse_fraction(max_regression, "--max-regression"),
                max_accuracy_drop=parse_fraction(max_accuracy_drop, "--max-accuracy-drop"), rounds=rounds,
                min_samples=min_samples, alpha=alpha, metrics=tuple(metric or ()), against_db=against_db,
                engine=engine, precision=precision, batch=batch, threads=threads,
                shapes=parse_shape_flags(shape or []), data=data,
                preprocess=preprocess_of(layout, reverse_input_channels, mean_values, scale_values),
                reference_model=reference_model, calls=calls, duration_s=duration, timeout_s=timeout, store=store,
                db=db, seed=seed, progress=lambda phase: show(f"gate: {phase}"), command=command_line(),
            )  # fmt: skip
    except BAD_INPUT as error:
        _die(error, EXIT_USAGE)
    except AutodeployError as error:
        _die(error, EXIT_ERROR)
    if run.id is not None:
        err.print(f"stored as gate run {run.id} in {shown(run.db)}")
    _report(run.result, markdown, junit, format)
    raise typer.Exit(run.exit_code)


def parse_fraction(text: str, flag: str) -> float:
    """``5%`` or ``0.05`` -> 0.05; a bare number of 1 or more is refused (ambiguous)."""
    raw = text.strip()
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        raise UsageError(
            f"cannot parse {flag} {text!r}", fix=f"write it as a percentage or fraction, e.g. {flag} 5%"
        ) from None
    if not raw.endswith("%") and value >= 1:
        raise UsageError(
            f"{flag} {text!r} is ambiguous (a fraction of {value:g}?)",
            fix=f"write {flag} {raw}% or {flag} {value / 100:g}",
        )
    if not 0 <= value < 10:
        raise UsageError(f"{flag} {text!r} is out of range", fix="give a value between 0% and 1000%")
    return value


def _report(result: Any, markdown: Path | None, junit: Path | None, fmt: Format = Format.table) -> None:
    from autodeploy.gate import report

    text = report.markdown(result)
    if fmt is Format.table:
        out.print(plain(text, keep="\n"), markup=False, highlight=False, soft_wrap=True)
    else:
        emit(fmt, _gate_record(result) if fmt is Format.json else _gate_rows(result))
    try:
        if markdown is not None:
            markdown.write_text(text)
        if junit is not None:
            junit.write_text(report.junit_xml(result))
    except OSError as exc:
        err.print(f"[red]error:[/red] cannot write a report: {shown(str(exc))}")
        raise typer.Exit(EXIT_ERROR) from None


def _gate_record(result: Any) -> dict[str, Any]:
    """The stored gate record (what the dashboard reads), with its exit code: ``--format json``."""
    from dataclasses import asdict

    from autodeploy.report import SCHEMA_VERSION

    return {"schema": "autodeploy.gate", "schema_version": SCHEMA_VERSION, "exit_code": result.exit_code,
            **asdict(result.to_record())}  # fmt: skip


def _gate_rows(result: Any) -> list[dict[str, Any]]:
    """One CSV row per metric (its own ``verdict``), each with the gate's: ``--format csv``."""
    record = _gate_record(result)
    return [{"gate_verdict": record["verdict"], "gate_mode": record["mode"], "exit_code": record["exit_code"],
             **metric} for metric in record["metrics"]]  # fmt: skip


def _die(error: AutodeployError, code: int) -> None:
    err.print(f"[red]error:[/red] {shown(str(error))}", soft_wrap=True)
    raise typer.Exit(code)
