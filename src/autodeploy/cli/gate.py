"""``autodeploy gate``: a CI regression gate, baseline vs candidate, with a statistical verdict.

Exit codes (documented in ``--help`` and the README): 0 pass, 1 fail, 2 inconclusive,
64 bad input (flags, a missing or invalid model or bundle), 70 an error that stopped the gate
(engine unavailable, reference failed, results database). A CI job that only wants "no proven
regression" can treat 2 as success; one that wants a proven non-regression treats it as failure.
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from typer.core import TyperCommand

from autodeploy.adapters.base import TrialConfig
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
    cache_dir,
    command_line,
    data_of,
    emit,
    err,
    out,
    plain,
    resolve_model,
    shown,
)
from autodeploy.errors import AutodeployError, DataError, ModelError, UnsupportedConfigError, UsageError
from autodeploy.gate.core import DEFAULT_METRICS, EXIT_ERROR, EXIT_USAGE, LATENCY_METRICS
from autodeploy.verdict import DEFAULT_MAX_ACCURACY_DROP

#: Library errors that mean the user's input is wrong (exit 64); any other stops the gate (exit 70).
BAD_INPUT = (UsageError, ModelError, DataError, UnsupportedConfigError, BundleError)


#: Click's usage error, as Typer raises it: Typer >= 0.20 vendors its own click, older Typer uses the
#: click package; either way it is a base of ``typer.BadParameter``.
_CLICK_USAGE = tuple(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")


@dataclass(frozen=True)
class GateOptions:
    """The gate's command-line options as given (fractions still text), validated by :func:`_run`."""

    baseline: str
    candidate: str
    max_regression: str
    max_accuracy_drop: str
    rounds: int
    min_samples: int
    alpha: float
    metric: tuple[str, ...]
    against_db: bool
    engine: str
    precision: str
    batch: int
    threads: int
    shape: tuple[str, ...]
    data: str | None
    preprocess: tuple[str | None, bool, str | None, str | None]  # --layout, --reverse-input-channels, --mean/--scale-values
    reference_model: Path | None
    calls: int
    duration: float
    timeout: float
    store: bool
    db: str | None
    seed: int


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
    min_samples: Annotated[int, typer.Option(min=1, help="Fewer runs per side than this: inconclusive.")] = 5,
    alpha: Annotated[float, typer.Option(min=1e-9, max=0.5, help="Significance level for the whole family of metrics.")] = 0.01,
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
    options = GateOptions(
        baseline=baseline, candidate=candidate, max_regression=max_regression, max_accuracy_drop=max_accuracy_drop,
        rounds=rounds, min_samples=min_samples, alpha=alpha, metric=tuple(metric or ()), against_db=against_db,
        engine=engine, precision=precision, batch=batch, threads=threads, shape=tuple(shape or ()), data=data,
        preprocess=(layout, reverse_input_channels, mean_values, scale_values),
        reference_model=reference_model, calls=calls, duration=duration, timeout=timeout, store=store, db=db,
        seed=seed,
    )  # fmt: skip
    try:
        result = _run(options)
    except BAD_INPUT as error:
        _die(error, EXIT_USAGE)
    except AutodeployError as error:
        _die(error, EXIT_ERROR)
    _report(result, markdown, junit, format)
    raise typer.Exit(result.exit_code)


def _run(o: GateOptions) -> Any:
    from autodeploy.device import probe_device
    from autodeploy.gate.core import GateSettings, run_gate
    from autodeploy.gate.stats import Criteria
    from autodeploy.harness.run import HarnessSettings
    from autodeploy.harness.timing import TimingPolicy
    from autodeploy.results_db.store import DeviceRecord, Store

    metrics = o.metric or DEFAULT_METRICS
    unknown = [m for m in metrics if m not in LATENCY_METRICS]
    if unknown:
        raise UsageError(
            f"unknown --metric {', '.join(unknown)}", fix=f"choose from {', '.join(LATENCY_METRICS)}"
        )
    if o.min_samples < 2:
        raise UsageError(
            "--min-samples must be >= 2: a rank test needs two runs per side", fix="--min-samples 2"
        )
    criteria = Criteria(max_regression=parse_fraction(o.max_regression, "--max-regression"),
                        max_accuracy_drop=parse_fraction(o.max_accuracy_drop, "--max-accuracy-drop"),
                        alpha=o.alpha, min_rounds=o.min_samples, seed=o.seed)  # fmt: skip
    settings = GateSettings(rounds=o.rounds, metrics=metrics, criteria=criteria, against_db=o.against_db)
    policy = TimingPolicy(warmup_min_calls=10, warmup_max_s=2.0, min_samples=o.calls,
                          min_duration_s=o.duration, max_duration_s=max(30.0, 4 * o.duration))  # fmt: skip
    harness = HarnessSettings(workdir=cache_dir() / "work", policy=policy, timeout_s=o.timeout, seed=o.seed)
    config = TrialConfig(engine=o.engine, precision=o.precision, batch=o.batch, threads=o.threads)
    device = probe_device()
    with ExitStack() as stack:
        db = stack.enter_context(Store.open(o.db)) if o.store or o.against_db else None
        arms = _arms(config, o, stack)
        for arm in arms:
            if arm.kind == "model":
                from autodeploy.adapters import registry

                registry.get(arm.config.engine).check(device, arm.model, arm.config)
                arm.model.input_shape(arm.model.inputs[0].name, arm.config.batch)
        with err.status("gate: starting") as status:
            result = run_gate(*arms, settings, harness, device=device, store=db,
                              progress=lambda phase: status.update(f"gate: {shown(phase)}"))  # fmt: skip
        if db is not None and o.store:
            gate_id = db.add_gate_run(
                result.to_record(), device=DeviceRecord.of(device), command=command_line()
            )
            err.print(f"stored as gate run {gate_id} in {shown(db.url)}")
    return result


def _arms(config: TrialConfig, o: GateOptions, stack: ExitStack) -> list[Any]:
    """The baseline and candidate arms. Model arms first: a bundle arm's accuracy reference is the
    other arm's model when that is the bundle's source model (``--baseline model.onnx --candidate BUNDLE``)."""
    from autodeploy.gate.measure import bundle_arm, model_arm
    from autodeploy.model import load_model, parse_shape_flags

    shapes = parse_shape_flags(list(o.shape))
    refs = (("baseline", o.baseline), ("candidate", o.candidate))
    models = {}
    for role, ref in refs:
        if not (Path(ref).is_dir() or ref.endswith((".tar.gz", ".tgz"))):
            resolved = resolve_model(ref, shapes)
            user = data_of(o.data, resolved.info, *o.preprocess)
            models[role] = model_arm(role, ref, resolved.info, config, data=user or resolved.data,
                                     calibration=None if user else resolved.calibration)  # fmt: skip
    arms = []
    for role, ref in refs:
        if role in models:
            arms.append(models[role])
            continue
        from autodeploy import bundle

        root = stack.enter_context(bundle.opened(Path(ref)))
        reference = load_model(o.reference_model, shapes) if o.reference_model else None
        arms.append(bundle_arm(role, ref, root, reference_model=reference,
                               others=[arm.model for arm in models.values()]))  # fmt: skip
    return arms


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
