"""``autodeploy bundle verify|info|run``: check, describe and measure an exported bundle (folder or .tar.gz)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from autodeploy.cli._common import (
    DataOption,
    Format,
    FormatOption,
    LayoutOption,
    MeanOption,
    ReverseOption,
    ScaleOption,
    emit,
    engine_noise,
    err,
    fmt_ms,
    out,
    preprocess_of,
    shown,
    spinner,
    timing_flags,
)
from autodeploy.errors import UsageError
from autodeploy.harness.load import UNDER_LOAD_CORES, Load
from autodeploy.redact import mask_secrets
from autodeploy.runtime.cache import USED

app = typer.Typer(
    help="Check, describe and measure an exported bundle (folder or .tar.gz).", no_args_is_help=True
)

BundlePath = Annotated[Path, typer.Argument(help="A bundle folder or .tar.gz made by `autodeploy export`.")]
TrustOption = Annotated[Path | None, typer.Option(
    "--trust", help="PEM public key of the publisher: the bundle's signature (export --sign) must verify with it.")]  # fmt: skip


@app.command()
def verify(
    path: BundlePath,
    trust: TrustOption = None,
    db: Annotated[str | None, typer.Option(help="Results database to look the bundle up in: which trial it was exported from.")] = None,
    format: FormatOption = Format.table,
) -> None:  # fmt: skip
    """Check every file against the manifest's SHA-256 and size (and the signature with --trust), and
    whether this machine can run it."""
    from autodeploy.bundle import BundleError, check_compatible, opened
    from autodeploy.bundle import verify as verify_files
    from autodeploy.bundle.export import manifest_digest
    from autodeploy.bundle.loader import REQUIREMENTS, SIGNATURE, install_command

    with opened(path) as root:
        manifest = verify_files(root, trust=trust)
        digest = manifest_digest(root)
        install = install_command(root)  # the pins on the command line: pip reads no file from the bundle
        signature = "verified" if trust is not None else "unchecked" if (root / SIGNATURE).is_file() else "absent"
    exported = None if db is None else _export_of(db, digest)  # in every format: not found is an error
    files = manifest["files"]
    size = sum(f["size"] for f in files.values())
    if format is not Format.table:
        record = _verified(path, manifest, digest, signed=trust is not None)
        record.update(signature=signature, install=install)
        if exported is not None:
            record["exported_from"] = {"trial_id": exported.trial_id, "study": exported.study,
                                       "created_at": exported.created_at.isoformat(), "signed": exported.signed}  # fmt: skip
        emit(format, record)
        return
    out.print(f"[green]ok[/]: {shown(str(path))}: {len(files)} files match the manifest ({size / 2**20:.2f} MB; "
              "manifest.json checked against manifest.sha256)")  # fmt: skip
    if trust is None:
        out.print("integrity only: the files are the ones the manifest lists, but anyone can write a manifest; "
                  "pass --trust PUBKEY to check who made it")  # fmt: skip
    if signature == "unchecked":
        err.print(f"[yellow]warning[/]: {SIGNATURE} is present and unchecked; "
                  "pass --trust PUBKEY (the publisher's public key) to check it")  # fmt: skip
    elif signature == "verified":
        out.print(f"signed: the signature over every file verifies with {shown(str(trust))}")
    if exported is not None:
        study = f" of study {shown(exported.study)}" if exported.study else ""
        out.print(f"provenance: exported from trial {exported.trial_id}{study} on {exported.created_at:%Y-%m-%d %H:%M} "
                  f"UTC (manifest sha256 {digest[:16]}…{', signed' if exported.signed else ''})")  # fmt: skip
    out.print(f"install its runtime with (not -r {REQUIREMENTS}): {shown(install)}", soft_wrap=True)
    try:
        warnings = check_compatible(manifest)
    except BundleError as error:
        err.print(f"[yellow]cannot run on this machine[/]: {shown(str(error))}")
        return
    out.print("runs on this machine" + ("" if warnings else " as benchmarked"))
    for warning in warnings:
        err.print(f"[yellow]warning[/]: {shown(warning)}")


@app.command()
def info(path: BundlePath, format: FormatOption = Format.table) -> None:
    """What the bundle holds: model, engine, tuned settings, the measurements that chose it, its files."""
    from autodeploy.bundle import BundleError, check_compatible, opened, read_manifest
    from autodeploy.bundle.export import inputs_text, numbers_text, shipped_numbers
    from autodeploy.device import probe_device

    with opened(path) as root:
        m = read_manifest(root)
    if format is not Format.table:
        from autodeploy.report import SCHEMA_VERSION

        emit(format, {"schema": "autodeploy.bundle", "schema_version": SCHEMA_VERSION, "path": str(path), "manifest": m})
        return
    s, meas, src = m["settings"], shipped_numbers(m), m["source"]
    table = Table(title=f"bundle {shown(str(path))}", show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value")
    rows = [
        ("model", f"{m['model']['name']} (sha256 {m['model']['sha256'][:16]}…)"),
        ("inputs", ", ".join(_spec(i) for i in m["model"]["inputs"])),
        ("outputs", ", ".join(_spec(o) for o in m["model"]["outputs"])),
        ("engine", f"{m['engine']['name']} {m['engine']['version']}"),
        (
            "settings",
            f"precision {s['precision']}, batch {s['batch']}, threads {s['threads'] or 'default'}, "
            f"knobs {s['knobs'] or '{}'}",
        ),  # fmt: skip
        ("runtime", ", ".join(f"{k}={v}" for k, v in m["runtime"].items())),
        ("measured on", f"{m['device']['cpu']} (fingerprint {m['device']['fingerprint']})"),
        (
            "latency",
            f"{numbers_text(meas)}; median {fmt_ms(meas['median_ms'])}, p99 {fmt_ms(meas['p99_ms'])} "
            f"({meas['n_samples']} samples, {meas['scenario']})",
        ),  # fmt: skip
        *((f"at {o['shape']}", f"{numbers_text(o)}; median {fmt_ms(o['median_ms'])}, p99 {fmt_ms(o['p99_ms'])} "
           f"({o['n_samples']} samples, trial {o['trial_id']})")
          for o in m.get("by_shape") or () if o.get("trial_id") != meas.get("trial_id")),  # fmt: skip
        ("throughput", f"{meas['throughput'] or 0:.1f} items/s; peak RSS {meas['peak_rss_mb'] or 0:.1f} MB"),
        ("accuracy", _accuracy(m["accuracy"])),
        ("measured on inputs", inputs_text(m.get("inputs"))),
        (
            "constraints",
            ", ".join(f"{k}: {'pass' if v['passed'] else 'FAIL'}" for k, v in m["constraints"].items()),
        ),
        ("chosen by", _selection(m.get("selection"), src)),
        ("reproduce", mask_secrets(src["reproduce"]) or "-"),  # a bundle made before passwords were masked
        (
            "files",
            f"{len(m['files'])} + manifest.json and manifest.sha256, {sum(f['size'] for f in m['files'].values()) / 2**20:.2f} MB",
        ),
    ]
    for field, value in rows:
        table.add_row(field, shown(str(value)))
    out.print(table)
    here = probe_device().fingerprint
    if here != m["device"]["fingerprint"]:
        err.print(f"[yellow]warning[/]: this machine's fingerprint is {here}, not the one measured "
                  f"({shown(m['device']['fingerprint'])}): expect other numbers")  # fmt: skip
    try:
        for warning in check_compatible(m):
            err.print(f"[yellow]warning[/]: {shown(warning)}")
    except BundleError as error:
        err.print(f"[yellow]cannot run on this machine[/]: {shown(str(error))}")


@app.command()
def run(
    path: BundlePath,
    data: DataOption = None,
    layout: LayoutOption = None,
    reverse_input_channels: ReverseOption = False,
    mean_values: MeanOption = None,
    scale_values: ScaleOption = None,
    min_samples: Annotated[int, typer.Option(min=2, help="Timed calls at least.")] = 64,
    min_duration: Annotated[float, typer.Option(help="Timed seconds at least.")] = 2.0,
    max_duration: Annotated[float, typer.Option(help="Timed seconds at most.")] = 60.0,
    shape: Annotated[list[str] | None, typer.Option(help="Measure at this input shape instead of the bundle's, "
                     "NAME=1x3x224x224 (as bench and tune take it); one per input.")] = None,
    allow_other_version: Annotated[bool, typer.Option("--allow-other-version",
                                   help="Run under another engine version than benchmarked (warns).")] = False,
    trust: TrustOption = None,
) -> None:  # fmt: skip
    """Load the bundle (verified), time it here, and show this machine's latency next to the manifest's.

    Without --data the inputs are synthetic. Images (--data FOLDER or sample:images) are preprocessed
    as the bundle was measured (its manifest's ``inputs``) unless a preprocessing flag is given. --shape
    measures another input shape; the manifest's column then holds its numbers at that shape, where its
    study measured it.
    """
    from autodeploy import api
    from autodeploy.shapes import parse_flags

    policy = timing_flags(min_samples, min_duration, max_duration)
    cases = parse_flags(shape or []).cases
    if len(cases) > 1:
        raise UsageError(f"bundle run measures one shape at a time; --shape gave {len(cases)}",
                         fix="give each input one --shape NAME=DIMS, and run it again for another shape")  # fmt: skip
    with spinner() as show:
        run = api.run_bundle(path, data=data, timing=policy, shapes=dict(cases[0].shapes),
                             allow_other_version=allow_other_version, trust=trust,
                             preprocess=preprocess_of(layout, reverse_input_channels, mean_values, scale_values),
                             quiet=engine_noise, progress=show)  # fmt: skip
    for warning in run.warnings:
        err.print(f"[yellow]warning[/]: {shown(warning)}")
    if run.cache == USED:  # else the loader's warning above said why it was not
        out.print("started from the bundle's compiled cache (made where it was measured; same engine version and device)")
    m, stats, here = run.manifest, run.stats, run.device
    meas = run.recorded() or {}
    batch = m["settings"]["batch"]
    table = Table(title=shown(f"{m['model']['name']}  {m['engine']['name']}/{m['settings']['precision']}/b{batch}"
                              f"  at {run.shape}"))  # fmt: skip
    table.add_column("statistic")
    table.add_column(f"manifest ({shown(m['device']['fingerprint'][:8])})", justify="right")
    table.add_column(f"this machine ({here.fingerprint[:8]})", justify="right")
    table.add_column("this machine vs manifest", justify="right")
    for label, theirs, ours in (("median", meas.get("median_ms"), stats.median), ("p90", meas.get("p90_ms"), stats.p90),
                                ("p99", meas.get("p99_ms"), stats.p99)):  # fmt: skip
        table.add_row(label, fmt_ms(theirs), fmt_ms(ours), _compared(ours, theirs, lower_is_faster=True))
    rate = meas.get("throughput")
    table.add_row("throughput", "-" if not meas else f"{rate or 0:.1f} items/s", f"{run.throughput:.1f} items/s",
                  _compared(run.throughput, rate, lower_is_faster=False))  # fmt: skip
    table.add_row("samples", shown(meas.get("n_samples", "-")), f"{stats.n} (+{run.warmup_calls} warm-up)", "")
    theirs = Load.from_dict(meas["load"]) if meas.get("load") else None  # bundles exported before it was read: none
    table.add_row("other processes' CPU", _cores(theirs), _cores(run.load), "")
    out.print(table)
    if meas:
        trial = f", trial {meas['trial_id']}" if meas.get("trial_id") is not None else ""
        out.print(f"manifest: {shown(_numbers_text(meas))} (one run{trial})", soft_wrap=True)
    else:
        measured = [o["shape"] for o in m.get("by_shape") or ()] or [(m.get("shapes") or {}).get("shipped") or "its own shape"]
        err.print(f"[yellow]note[/]: the bundle was never measured at {shown(run.shape)}: its manifest has numbers at "
                  f"{shown(', '.join(measured))}; this machine's column stands alone", soft_wrap=True)  # fmt: skip
    busy = [f"{who} ({load.text()})" for who, load in (("this machine", run.load), ("the manifest's run", theirs))
            if load is not None and load.under_load]  # fmt: skip
    if busy:
        err.print(f"[yellow]under load[/]: {' and '.join(busy)}: other processes kept more than {UNDER_LOAD_CORES} "
                  "of a core busy while it was timed, so the comparison above says more about the load than about the "
                  "bundle; run it again on a quiet machine", soft_wrap=True)  # fmt: skip
    if not run.same_device:
        err.print(f"[yellow]note[/]: measured on another device ({shown(m['device']['cpu'])}); "
                  f"this is {shown(here.cpu_model)}")  # fmt: skip


def _verified(path: Path, manifest: dict[str, Any], digest: str, *, signed: bool) -> dict[str, Any]:
    """What ``bundle verify`` found, as a record: the files checked, and whether this machine can run it."""
    from autodeploy.bundle import BundleError, check_compatible
    from autodeploy.report import SCHEMA_VERSION

    try:
        warnings, runs = check_compatible(manifest), None
    except BundleError as error:
        warnings, runs = [], str(error)
    files = manifest["files"]
    return {"schema": "autodeploy.bundle_verify", "schema_version": SCHEMA_VERSION, "path": str(path), "ok": True,
            "files": len(files), "size_bytes": sum(f["size"] for f in files.values()), "manifest_sha256": digest,
            "signed": signed, "runs_here": runs is None, "cannot_run_because": runs, "warnings": list(warnings)}  # fmt: skip


def _cores(load: Load | None) -> str:
    """``0.05 of 2 cores`` (``, under load`` above the threshold), or ``-`` where the load was not read."""
    if load is None:
        return "-"
    return f"{load.other_cores:.2f} of {load.cpus} cores" + (" [yellow](under load)[/]" if load.under_load else "")


def _compared(ours: float | None, theirs: float | None, *, lower_is_faster: bool) -> str:
    """``1.25x slower`` / ``1.25x faster`` / ``same``: which way this machine differs from the manifest."""
    if not ours or not theirs:
        return "-"
    ratio = ours / theirs
    if abs(ratio - 1) < 0.005:
        return "same"
    faster = ratio < 1 if lower_is_faster else ratio > 1
    return f"{max(ratio, 1 / ratio):.2f}x {'faster' if faster else 'slower'}"


def _export_of(db: str, digest: str) -> Any:
    """The latest recorded export of the bundle with this manifest digest (an ``ExportRow``).

    Raises:
        UsageError: the store holds no export with this digest (exit 2): a script must not read it as a yes.
    """
    from autodeploy.results_db.store import Store

    with Store.open(db, readonly=True) as store:
        exports = store.exports_of(digest)
    if not exports:
        raise UsageError(f"no export with this manifest (sha256 {digest[:16]}…) in {db}: it was exported "
                         "elsewhere, or changed and re-sealed after export",
                         fix="pass the --db it was exported from, or verify without --db")  # fmt: skip
    return exports[-1]


def _spec(s: dict[str, Any]) -> str:
    return f"{s['name']} {s['dtype']}[{'x'.join('?' if d is None else str(d) for d in s['shape'])}]"


def _accuracy(acc: dict[str, Any] | None) -> str:
    """The verdict and the worst output by the verdict's own rule (``accuracy.rules.worst``: furthest below its
    limit, judged by what it is), not by cosine, which ranks a classifier's flipped top-1 as fine."""
    from autodeploy.accuracy.records import Accuracy
    from autodeploy.accuracy.rules import worst

    if not acc:
        return "-"
    accuracy = Accuracy.from_dict(acc)
    return (f"{acc['constraint']}: {'pass' if acc['passed'] else 'FAIL'} (worst {worst(accuracy.outputs)}, "
            f"{acc['n_samples']} items)")  # fmt: skip


def _selection(selection: dict[str, Any] | None, source: dict[str, Any]) -> str:
    if not selection or not selection.get("winner"):
        return f"single trial {source['trial_id']} (not a study)"
    w = selection["winner"]
    ci = "" if not w.get("ci") else f" [{w['ci'][0]:.4g}, {w['ci'][1]:.4g}]"
    speedup = selection.get("speedup_vs_baseline")
    if selection.get("headline"):  # names its statistic (a bundle exported since issue 26)
        from autodeploy.bundle.export import basis_text

        basis = basis_text(selection)  # what the winner line's number is (a bundle exported since issue 39)
        return f"study {source['study']!r} ({selection['objective']}): {selection['headline']}" + (f" ({basis})" if basis else "")
    from autodeploy import objectives
    from autodeploy.objectives import ITEMS_PER_S

    known = objectives.stored(selection["objective"])  # a time's statistic (p90), else a rate: pooled calls, as stored then
    word = (known and known.latency_statistic) or ITEMS_PER_S.name
    return (f"study {source['study']!r} ({selection['objective']}): {w['statistic']:.4g}{ci} over {w['n_samples']} samples"
            + (f", {speedup:.2f}x vs {_baseline_name(selection)} by {word} (pooled calls)" if speedup else ""))  # fmt: skip


def _baseline_name(selection: dict[str, Any]) -> str:
    """What the study's baseline is called: as the manifest says, else from its baseline finalist's engine
    (LiteRT fp32 for a .tflite study; the ORT fp32 default for an ONNX one)."""
    from autodeploy.search.summary import baseline_name

    base = selection.get("baseline")
    return baseline_name({"baseline_name": selection.get("baseline_name"), "finalists": [base] if base else []})


def _numbers_text(numbers: dict[str, Any]) -> str:
    from autodeploy.bundle.export import numbers_text

    return numbers_text(numbers)
