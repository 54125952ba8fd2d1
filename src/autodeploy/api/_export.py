""":func:`export` and :func:`find_source`: ship a study's winner (or one stored trial) as a bundle or a Triton repository.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from autodeploy.api._common import open_store, python_call
from autodeploy.errors import UsageError

if TYPE_CHECKING:
    from autodeploy.bundle.export import Source
    from autodeploy.results_db.store import Store
    from autodeploy.search.study import StudySummary


#: What :func:`export` writes: a bundle folder (manifest, loader) or a Triton model repository.
FORMATS = ("bundle", "triton")


def export(
    study: str | StudySummary | None = None,
    output: str | Path | None = None,
    *,
    trial: int | None = None,
    source: Source | None = None,
    tar: bool = False,
    format: str = "bundle",
    model_name: str | None = None,
    db: str | Store | None = None,
    command: str | None = None,
    sign_key: str | Path | None = None,
) -> Path:
    """Ship a study's winner (or one stored trial) as a bundle or a Triton model repository, atomically.

    Args:
        study: the study (its name, or the summary :func:`tune` returned) whose winner to ship.
        output: the destination folder (or ``.tar.gz`` with ``tar``); it must not exist.
        trial: ship this stored trial instead (e.g. ``bench(...).id``).
        source: ship what :func:`find_source` found instead.
        tar: write one ``.tar.gz`` (the suffix is added when missing).
        format: ``bundle`` (load it with ``autodeploy.bundle.load``) or ``triton``.
        model_name: the Triton model name (default: from the model name).
        db: a results database URL or an open store (default ``$AUTODEPLOY_DB`` or the user SQLite file).
        command: what to record as the command that made the export (default: this call).
        sign_key: a PEM elliptic-curve private key: sign the bundle (OpenSSF model-signing) so that
            ``autodeploy.bundle.load(path, trust=PUBLIC_KEY)`` can check who made it.

    Returns:
        The path written: the bundle folder, the repository folder or the ``.tar.gz``.

    Raises:
        UsageError: no or several things to ship, no output, an unknown format or study.
        BundleError: the study has no winner, or the trial cannot be shipped (it failed).
    """
    from autodeploy.bundle import export as exporter
    from autodeploy.bundle import triton

    if sum(x is not None for x in (study, trial, source)) != 1:
        raise UsageError("give a study, a trial id or a source (one of them)",
                         fix="autodeploy.export('STUDY', 'ship') or autodeploy.export(trial=ID, output='ship')")  # fmt: skip
    if output is None:
        raise UsageError("no destination given", fix="pass output, a folder (or FILE.tar.gz with tar=True)")
    if format not in FORMATS:
        raise UsageError(f"unknown format {format!r}", fix=f"choose one of {', '.join(FORMATS)}")
    if sign_key is not None and format != "bundle":
        raise UsageError("only bundles are signed", fix="drop sign_key, or export format='bundle'")
    command = command or python_call("export", study, output=output, trial=trial, tar=tar,
                                     format=None if format == "bundle" else format, model_name=model_name)  # fmt: skip
    # 1. what to ship: the study's winner or one stored trial, as stored
    source = source or find_source(study, trial=trial, db=db)
    # 2. where: a tar.gz keeps its suffix
    output = Path(output)
    if tar and not output.name.endswith((".tar.gz", ".tgz")):
        output = output.with_name(output.name + ".tar.gz")
    # 3. write it, atomically
    if format == "triton":
        path = triton.write_repository(source, output, tar=tar, model_name=model_name, command=command)
    else:
        path = exporter.write_bundle(source, output, tar=tar, command=command, sign_key=sign_key)
    # 4. remember it: `autodeploy bundle verify --db` can then name the trial a bundle came from
    with open_store(db) as store:
        store.add_export(source.trial.id, manifest_sha256=exporter.manifest_digest(path), format=format,
                         destination=str(path.resolve()), signed=sign_key is not None, command=command)  # fmt: skip
    return path


def find_source(
    study: str | StudySummary | None = None, *, trial: int | None = None, db: str | Store | None = None
) -> Source:
    """What :func:`export` ships: the winning trial of ``study``, or the stored ``trial``.

    Raises:
        UsageError: neither or both given, or no such study or trial.
        BundleError: the study has no winner, or the trial cannot be shipped (it failed).
    """
    from autodeploy.bundle import export as exporter

    if (study is None) == (trial is None):
        raise UsageError(
            "give a study or a trial id (one of them)", fix="find_source('STUDY') or find_source(trial=ID)"
        )
    with open_store(db, readonly=True) as store:
        if trial is not None:
            return exporter.stored_trial(store, trial)
        return exporter.study_winner(store, study if isinstance(study, str) else study.name)
