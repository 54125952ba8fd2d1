"""Ship the winner: export, manifest, verify, loader, Triton export (docs/architecture.md, "Layers").

* :func:`load` opens a bundle folder or ``.tar.gz`` (verified, checked against this machine)
  and returns a :class:`~autodeploy.bundle.loader.Predictor` with ``run(feeds)``.
* :mod:`autodeploy.bundle.loader` is the part a bundle ships (stdlib + numpy only).
* :mod:`autodeploy.bundle.export` writes bundles; :mod:`autodeploy.bundle.triton` model
  repositories; :mod:`autodeploy.bundle.archive` reads archives safely.

Importing this package imports no engine, SQLAlchemy, Optuna or Streamlit.
"""

from __future__ import annotations

import shutil
import tempfile
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from autodeploy.bundle.archive import MAX_BYTES, MAX_MEMBERS, UnsafeArchiveError, is_archive, safe_extract
from autodeploy.bundle.loader import BundleError, Predictor, check_compatible, read_manifest, verify
from autodeploy.bundle.loader import load as _load_folder

__all__ = ["BundleError", "BundleNotFoundError", "Predictor", "UnsafeArchiveError", "check_compatible", "load", "opened",
           "read_manifest", "safe_extract", "verify"]  # fmt: skip


def load(path: str | Path, *, allow_other_version: bool = False, trust: str | Path | None = None,
         max_bytes: int = MAX_BYTES, max_members: int = MAX_MEMBERS) -> Predictor:  # fmt: skip
    """Open the bundle at ``path`` (a folder, or a ``.tar.gz`` extracted safely to a temporary folder).

    Every file is checked against the manifest (and, with ``trust``, a PEM public key, the
    bundle's signature), and the engine version and this machine's CPU/GPU against what the
    bundle needs, before the engine loads anything. Nothing from the bundle is imported: the
    engine runs on :mod:`autodeploy.runtime`, the code the harness measured with.

    Raises:
        BundleError: the bundle is damaged, unsafe or cannot run here; the message names why.
    """
    if not is_archive(path):
        return _load_folder(path, allow_other_version=allow_other_version, trust=trust)
    scratch = Path(tempfile.mkdtemp(prefix="autodeploy-bundle-"))
    try:
        root = safe_extract(path, scratch / "bundle", max_bytes=max_bytes, max_members=max_members)
        predictor = _load_folder(root, allow_other_version=allow_other_version, trust=trust)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    weakref.finalize(
        predictor, shutil.rmtree, scratch, True
    )  # the extracted files live as long as the predictor
    return predictor


class BundleNotFoundError(BundleError):
    """Nothing at the path given: bad input (exit 2), unlike a bundle that fails its checks (exit 1)."""

    exit_code = 2


@contextmanager
def opened(path: str | Path, *, max_bytes: int = MAX_BYTES, max_members: int = MAX_MEMBERS) -> Iterator[Path]:
    """The bundle folder at ``path``; an archive is extracted safely for the ``with`` block."""
    path = Path(path)
    if not path.exists():
        raise BundleNotFoundError(f"no bundle at {path}", fix="pass a folder or .tar.gz made by `autodeploy export`")
    if not is_archive(path):
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="autodeploy-bundle-") as scratch:
        yield safe_extract(path, Path(scratch) / "bundle", max_bytes=max_bytes, max_members=max_members)
