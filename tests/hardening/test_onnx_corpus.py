"""Every malformed or hostile ONNX input gets one line starting with ``error:`` and a non-zero exit.

Never a traceback, never a hang, never a stored pass. Cases refused at intake run in-process
(fast); the few that reach a worker, and the path that is not UTF-8 (which only a real
process's stderr encodes the way a user sees it), run ``autodeploy`` as a subprocess.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest

from autodeploy.cli import _common
from autodeploy.cli.app import main
from autodeploy.results_db import TrialFilter
from autodeploy.results_db.store import Store
from tests.hardening.corpus import REACHES_HARNESS, build

INTAKE_LIMIT_S = 20.0  # generous: the CI machine is shared
HARNESS_LIMIT_S = 120.0
SUBPROCESS = (*REACHES_HARNESS, "path-non-utf8", "path-non-utf8-valid-model")


def _names() -> list[str]:
    with tempfile.TemporaryDirectory() as tmp:
        return list(build(Path(tmp)))


NAMES = _names()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return build(tmp_path_factory.mktemp("corpus"))


@pytest.fixture
def env(tmp_path, monkeypatch):
    db = f"sqlite:///{tmp_path / 'results.db'}"
    monkeypatch.setenv("AUTODEPLOY_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("AUTODEPLOY_DB", db)
    monkeypatch.setattr(_common.err, "width", 10_000)  # the one line must not be wrapped by Rich
    return tmp_path, db


@contextmanager
def _deadline(seconds: float):
    def expired(*_):
        raise TimeoutError(f"still running after {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _in_process(capsys, path: Path) -> tuple[int, str, str]:
    with _deadline(INTAKE_LIMIT_S):
        try:
            main(["bench", str(path), "--min-duration", "0.1"])
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _subprocess(path: Path, tmp_path: Path, db: str) -> tuple[int, str, str]:
    env = {**os.environ, "AUTODEPLOY_CACHE": str(tmp_path / "cache"), "AUTODEPLOY_DB": db, "COLUMNS": "10000",
           "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-m", "autodeploy", "bench", os.fsencode(path), "--min-duration", "0.1"],
        capture_output=True,
        timeout=HARNESS_LIMIT_S,
        env=env,
    )
    # What a user's terminal shows: stderr as Python writes it (UTF-8, backslash-escaped surrogates).
    return proc.returncode, proc.stdout.decode(errors="replace"), proc.stderr.decode(errors="replace")


def _workers() -> list[psutil.Process]:
    found = []
    for child in psutil.Process().children(recursive=True):
        try:
            if "autodeploy.harness.worker" in " ".join(child.cmdline()):
                found.append(child)
        except psutil.Error:
            pass
    return found


@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=pytest.mark.slow) if n in SUBPROCESS else n for n in NAMES],
)
def test_bad_model_gives_one_error_line(corpus, env, capsys, name):
    tmp_path, db = env
    case = corpus[name]
    start = time.monotonic()
    if name in SUBPROCESS:
        code, out, err = _subprocess(case.path, tmp_path, db)
    else:
        code, out, err = _in_process(capsys, case.path)
    elapsed = time.monotonic() - start
    lines = [line for line in err.splitlines() if line.strip()]
    assert code != 0, (out, err)
    assert "Traceback" not in out + err, err
    assert len(lines) == 1 and lines[0].startswith("error:"), err
    assert re.search(case.expected, lines[0]), lines[0]
    assert elapsed < (HARNESS_LIMIT_S if name in SUBPROCESS else INTAKE_LIMIT_S)
    assert _workers() == []
    if Path(db.removeprefix("sqlite:///")).exists():  # a model that runs but gives NaN is never a pass
        with Store.open(db, readonly=True) as store:
            assert store.trials(TrialFilter(status="ok")) == []


def test_corpus_is_large_and_varied(corpus):
    assert len(corpus) >= 50
    families = {name.split("-")[0] for name in corpus}
    assert {"truncated", "magic", "random", "pb", "opset", "shape", "ext", "path", "nan", "cycle"} <= families
