"""A folder made too small for a 2 MB write, without touching the real disk: a 1 MiB tmpfs (a real ENOSPC; root
only, else the test skips), or ``RLIMIT_FSIZE`` in the child alone (EFBIG). Shared by the disk-full tests."""

from __future__ import annotations

import resource
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

LIMIT = 1 << 20  # the files the tests write are about 2 MB: they cannot fit


def limited() -> None:  # in the child, before exec: SIGXFSZ ignored, so a write past the limit fails with EFBIG
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT, LIMIT))


@contextmanager
def small_disk(kind: str, folder: Path) -> Iterator[object]:
    """``folder`` (made here) unable to take 2 MB; yields the child's preexec function (``None`` for a tmpfs)."""
    folder.mkdir(parents=True)
    if kind == "fsize":
        yield limited
        return
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={LIMIT}", "tmpfs", str(folder)],
                             capture_output=True, text=True)  # fmt: skip
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.strip() or 'not root'}); the fsize case covers it")
    try:
        yield None
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)
