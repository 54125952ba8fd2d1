"""``autodeploy export``: ship a study's winner (or one trial) as a bundle or a Triton model repository."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from autodeploy import api
from autodeploy.cli._common import command_line, err, fmt_ms, out, shown
from autodeploy.errors import UsageError

if TYPE_CHECKING:
    from autodeploy.bundle.export import Source


def export(
    study: Annotated[str | None, typer.Argument(help="The study whose winner to ship (see `autodeploy tune`).")] = None,
    output: Annotated[Path | None, typer.Option("-o", "--output", help="Destination folder (or .tar.gz with --tar); must not exist.")] = None,
    trial: Annotated[int | None, typer.Option(help="Ship this stored trial instead (e.g. from `autodeploy bench`).")] = None,
    tar: Annotated[bool, typer.Option("--tar", help="Write one .tar.gz instead of a folder.")] = False,
    format: Annotated[str, typer.Option("--format", help="bundle (folder with manifest and loader) or triton (model repository).")] = "bundle",
    model_name: Annotated[str | None, typer.Option(help="Triton model name (default: from the model name).")] = None,
    db: Annotated[str | None, typer.Option(help="Results database URL (default: $AUTODEPLOY_DB or the user SQLite file).")] = None,
    sign: Annotated[Path | None, typer.Option("--sign", help="Sign the bundle with this PEM elliptic-curve private key (OpenSSF model-signing); check it with `bundle verify --trust PUBKEY`.")] = None,
) -> None:  # fmt: skip
    """Write the winner's artifact exactly as benchmarked, with a verified manifest, atomically."""
    if (study is None) == (trial is None):
        raise UsageError(
            "give a study name or --trial ID (one of them)", fix="autodeploy export STUDY -o DIR"
        )
    if output is None:
        raise UsageError("no destination given", fix="add -o DIR (or -o FILE.tar.gz with --tar)")
    if format not in api.FORMATS:
        raise UsageError(f"unknown --format {format!r}", fix=f"choose one of {', '.join(api.FORMATS)}")
    if sign is not None and format != "bundle":
        raise UsageError("--sign signs bundles only", fix="drop --sign, or export without --format triton")
    source = api.find_source(study, trial=trial, db=db)
    path = api.export(output=output, source=source, tar=tar, format=format, model_name=model_name, db=db,
                      command=command_line(), sign_key=sign)  # fmt: skip
    t = source.trial
    size = (
        sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
        if path.is_dir()
        else path.stat().st_size
    )
    out.print(f"exported {shown(source.what)} of {shown(t.model_name)} to [bold]{shown(str(path))}[/] "
              f"({format}{', tar.gz' if tar else ''}, {size / 2**20:.2f} MB)")  # fmt: skip
    out.print(f"measured on {shown(t.device_cpu)} (fingerprint {t.device_fingerprint}); accuracy "
              f"{t.accuracy.constraint if t.accuracy else '-'}")  # fmt: skip
    _print_numbers(source)
    if format == "triton" and not tar:
        from autodeploy.bundle.triton import notes_of

        for note in notes_of(path):  # also in the repository's README.md
            err.print(f"[yellow]not carried to Triton[/]: {shown(note)}", soft_wrap=True)
    if format == "bundle":
        trust = " --trust PUBLIC_KEY" if sign else ""
        out.print(f"check it with: autodeploy bundle verify {shown(str(path))}{trust}")


def _print_numbers(source: Source) -> None:
    """The bundle's numbers, each with the shape, the calls and the machine it was measured at (one run per
    shape), then the study's winner line and what it rests on: the two differ in statistic, shape or load."""
    from autodeploy.bundle.export import basis_text, numbers_of, numbers_text

    t = source.trial
    for trial in source.by_shape or (t,):
        numbers = numbers_of(trial)
        shipped = " (shipped)" if trial.id == t.id and source.by_shape else ""
        out.print(f"  {shown(numbers_text(numbers))}: one run, trial {trial.id}{shipped}; median "
                  f"{fmt_ms(numbers.get('median_ms'))}, {numbers.get('throughput') or 0:.1f} items/s", soft_wrap=True)  # fmt: skip
    summary = source.study.summary if source.study is not None else None
    if summary and summary.get("winner"):
        from autodeploy.search.summary import headline

        selection = {"statistic": summary.get("statistic"), "rounds": summary.get("rounds"),
                     "shapes": summary.get("shapes") or [{"shape": k} for k in (summary["winner"].get("per_shape") or {})]}  # fmt: skip
        basis = basis_text(selection)
        out.print(f"  tune's winner line{f' ({basis})' if basis else ''}: {headline(summary)}", soft_wrap=True)
