"""A full disk (issue 28): ``export`` printed a 40-line ``ENOSPC`` traceback and extraction blamed
a "damaged" archive. Both now say in one line what could not be written, where, and the fix, and
leave nothing behind.

The disk is filled without touching the real one: ``RLIMIT_FSIZE`` (writes past it fail with
``EFBIG``; portable, no privileges) and, where this process may mount one, a 1 MiB tmpfs (a real
``ENOSPC``). Each command runs in a subprocess, the limit applied to it alone.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import autodeploy.api
from autodeploy.bundle import export
from autodeploy.results_db import Store
from tests.bundle.conftest import FAST
from tests.hardening.disk import LIMIT, small_disk
from tests.models import mlp


@pytest.fixture(scope="module")
def big(tmp_path_factory) -> tuple[str, int, Path]:
    """A measured trial whose artifact is about 2 MB (db URL, trial id), and its bundle as a .tar.gz."""
    root = tmp_path_factory.mktemp("big")
    db = f"sqlite:///{root / 'r.db'}"
    stored = autodeploy.api.bench(mlp(root / "m.onnx", in_features=32_768), engine="onnxruntime", threads=1,
                                  timing=FAST, db=db, cache=root / "cache")  # fmt: skip
    assert stored.result.ok, stored.result.failure_message
    with Store.open(db, readonly=True) as store:
        archive = export.write_bundle(export.stored_trial(store, stored.id), root / "b.tar.gz", tar=True)
    assert archive.stat().st_size > LIMIT + (1 << 19)
    return db, stored.id, archive


def _cli(*args: str, preexec: object, tmpdir: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p), "TMPDIR": str(tmpdir),
           "PYTHONDONTWRITEBYTECODE": "1", "COLUMNS": "300"}  # fmt: skip
    return subprocess.run([sys.executable, "-m", "autodeploy", *args], capture_output=True, text=True, timeout=120,
                          env=env, preexec_fn=preexec)  # type: ignore[arg-type]  # fmt: skip


def _one_line(proc: subprocess.CompletedProcess[str], *expected: str) -> None:
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert all(e in lines[0] for e in expected), lines[0]


@pytest.mark.parametrize("kind", ["fsize", "tmpfs"])
@pytest.mark.parametrize("tar", [False, True], ids=["folder", "tar"])
def test_export_to_a_full_disk_is_one_line_and_leaves_nothing(big, tmp_path, kind, tar):
    db, trial, _ = big
    folder = tmp_path / "full"
    with small_disk(kind, folder) as preexec:
        dest = folder / ("b.tar.gz" if tar else "b")
        proc = _cli("export", "--trial", str(trial), "--db", db, "-o", str(dest), *(["--tar"] if tar else []),
                    preexec=preexec, tmpdir=tempfile.gettempdir())  # fmt: skip
        _one_line(proc, f"cannot write {dest}: ", f"free space on the disk of {folder}", "choose another --output")
        assert list(folder.iterdir()) == []


@pytest.mark.parametrize("kind", ["fsize", "tmpfs"])
def test_extracting_to_a_full_disk_blames_the_disk_not_the_archive(big, tmp_path, kind):
    _, _, archive = big
    folder = tmp_path / "full"
    with small_disk(kind, folder) as preexec:
        proc = _cli("bundle", "verify", str(archive), preexec=preexec, tmpdir=folder)
        _one_line(proc, "cannot write the files of b.tar.gz: ", "free space on the disk of ", "TMPDIR")
        assert "damaged" not in proc.stderr
        assert list(folder.rglob("*")) in ([], [folder / "lost+found"])
