"""The process supervisor: every job runs in a fresh worker process that cannot take its caller down.

Each worker gets its own process group, a wall-clock timeout (SIGTERM, then SIGKILL of the whole group) and
a memory cap on the resident set of the group (:func:`run_worker`); it is told its job as JSON and answers
as JSON, never pickle, and it kills its own group when its parent dies (:func:`die_with_parent`). A worker
that dies is classified by how it died: ``timeout`` (with the phase it last wrote), ``oom`` or ``crashed``
with the signal and, from faulthandler's report in its log, the native library's last line. Its output is
kept on disk, capped, and read from the end. What a worker does is the measurement pipeline's
(:mod:`autodeploy.harness.run`, :mod:`autodeploy.harness.worker`); the microbenchmark's child
(:mod:`autodeploy.harness.peaks`) runs under the same supervisor.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import psutil

from autodeploy.child import child_env, module_argv

POLL_S = 0.05
TERM_GRACE_S = 3.0
Progress = Callable[[str], None]


@dataclass(frozen=True)
class WorkerOutcome:
    status: str
    payload: dict[str, Any]
    failure_kind: str | None = None
    failure_message: str | None = None


class Spec(Protocol):
    """What a child is told: written as JSON to the file it reads (a :class:`~autodeploy.harness.spec.WorkerSpec`,
    the peak settings)."""

    def write(self, path: Path) -> None: ...


def run_worker(
    spec: Spec, timeout_s: float, memory_cap_mb: int, progress: Progress | None = None, *,
    module: str = "autodeploy.harness.worker",
) -> WorkerOutcome:
    """Run one job in a fresh process group and classify how it ended: ``python -m module SPEC RESULT``
    (the worker; ``autodeploy.harness.peaks`` for the microbenchmark)."""
    with tempfile.TemporaryDirectory(prefix="autodeploy-worker-") as tmp:
        spec_path, result_path, log_path = (
            Path(tmp, "spec.json"),
            Path(tmp, "result.json"),
            Path(tmp, "stderr.log"),
        )
        spec.write(spec_path)
        proc = subprocess.Popen(
            module_argv(module, str(spec_path), str(result_path)),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=child_env(),
            start_new_session=True,
        )
        log = _CappedLog(proc, log_path)
        log.start()
        try:
            death = _supervise(proc, timeout_s, memory_cap_mb, result_path, progress)
        finally:  # no orphan survives its worker, nor a caller interrupted while waiting (Ctrl-C)
            _kill_group(proc.pid, signal.SIGKILL)
            _reap(proc)
        log.join(LOG_JOIN_S)  # the group is dead, so the pipe is closed (a child that left the group may hold it)
        log_tail = _tail(log_path)
        if death:
            kind, message = death
            return WorkerOutcome(
                "failed", {}, kind, message + (f"; worker log: {log_tail}" if log_tail else "")
            )
        if result_path.exists():
            result = json.loads(result_path.read_text())
            if result["status"] == "ok":
                return WorkerOutcome("ok", result)
            return WorkerOutcome("failed", result, result["failure_kind"], result["failure_message"])
        if proc.returncode < 0:
            name = signal.Signals(-proc.returncode).name
            said = _fatal(log_path) or log_tail
            return WorkerOutcome("failed", {}, "crashed", f"worker killed by {name}; worker log: {said}")
        return WorkerOutcome(
            "failed",
            {},
            "crashed",
            f"worker exited with code {proc.returncode} and no result; worker log: {log_tail}",
        )


def _supervise(
    proc: subprocess.Popen, timeout_s: float, memory_cap_mb: int, result_path: Path, progress: Progress | None
) -> tuple[str, str] | None:
    """Wait for the worker; return (kind, message) if we had to kill it."""
    start = time.monotonic()
    phase_path = Path(f"{result_path}.phase")
    last_phase = ""
    peak_mb = 0.0
    while True:
        try:
            proc.wait(timeout=POLL_S)
            return None
        except subprocess.TimeoutExpired:
            pass
        if progress:
            phase = _phase(phase_path)
            if phase and phase != last_phase:
                last_phase = phase
                progress(phase)
        rss_mb = _group_rss_mb(proc.pid)
        peak_mb = max(peak_mb, rss_mb)
        if rss_mb > memory_cap_mb:
            _stop(proc)
            return "oom", f"worker used {rss_mb:.0f} MB, over the memory cap of {memory_cap_mb} MB"
        if time.monotonic() - start > timeout_s:
            phase = _phase(phase_path) or "start"  # read now: without ``progress`` nothing else read it
            _stop(proc)
            return "timeout", f"worker still running after {timeout_s:g} s (phase: {phase})"


def _phase(path: Path) -> str:
    """The phase the worker last wrote (:meth:`autodeploy.harness.worker._Job.phase`), or ``""``."""
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _group_rss_mb(pid: int) -> float:
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0.0
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total / 2**20


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM the group, give it a moment, then SIGKILL."""
    _kill_group(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=TERM_GRACE_S)
    except subprocess.TimeoutExpired:
        _kill_group(proc.pid, signal.SIGKILL)
        proc.wait()


def _reap(proc: subprocess.Popen) -> None:
    """Collect the killed worker's exit status, so no zombie stays behind a caller that goes on."""
    try:
        proc.wait(timeout=TERM_GRACE_S)
    except subprocess.TimeoutExpired:
        pass


def _kill_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


#: Only the end of a worker's log is read (a quantizer can write megabytes of warnings).
LOG_TAIL_BYTES = 16 * 1024
#: What of a worker's output is kept on disk: its first and last bytes (a metric can print gigabytes).
LOG_HEAD_KEPT = 2 << 20
LOG_TAIL_KEPT = 2 << 20
LOG_JOIN_S = 10.0


class _CappedLog(threading.Thread):
    """Copy a worker's output to ``path``, keeping its first and last bytes and saying how many were cut."""

    def __init__(self, proc: subprocess.Popen, path: Path) -> None:
        super().__init__(name=f"worker-log-{proc.pid}", daemon=True)
        assert proc.stdout is not None
        self.source, self.path = proc.stdout, path

    def run(self) -> None:
        head_left, tail, cut = LOG_HEAD_KEPT, bytearray(), 0
        with self.source, open(self.path, "wb") as out:
            while chunk := self.source.read1(1 << 16):
                if head_left:
                    out.write(chunk[:head_left])
                    chunk, head_left = chunk[head_left:], max(0, head_left - len(chunk))
                tail += chunk
                if len(tail) > LOG_TAIL_KEPT:
                    cut += len(tail) - LOG_TAIL_KEPT
                    del tail[: len(tail) - LOG_TAIL_KEPT]
            if cut:
                out.write(f"\n[autodeploy: {cut} bytes of the worker's output cut here; the first {LOG_HEAD_KEPT} "
                          f"and the last {LOG_TAIL_KEPT} are kept]\n".encode())  # fmt: skip
            out.write(tail)


_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+) in (\S+)')


def _fatal(path: Path) -> str:
    """One line from faulthandler's report of a worker killed by a signal: the last line printed before
    it (a native library's own words, e.g. a failed assertion), the report's first line and the crashed
    thread's innermost Python frame; ``""`` without a report. The log's last lines alone are the
    report's list of extension modules."""
    lines = _read_tail(path)
    fatal = max((i for i, line in enumerate(lines) if line.startswith("Fatal Python error:")), default=None)
    if fatal is None:
        return ""
    before = next((line.strip() for line in reversed(lines[:fatal]) if line.strip()), "")
    rest = lines[fatal + 1 :]  # other threads' stacks come first; the one that crashed is "Current thread"
    current = next((i for i, line in enumerate(rest) if line.startswith("Current thread")), 0)
    frame = next((m for line in rest[current:] if (m := _FRAME.match(line))), None)
    where = f"in {Path(frame[1]).name}:{frame[2]} {frame[3]}" if frame else ""
    return " | ".join(part for part in (before, lines[fatal].strip(), where) if part)


def _read_tail(path: Path) -> list[str]:
    try:
        with open(path, "rb") as log:
            log.seek(max(0, log.seek(0, os.SEEK_END) - LOG_TAIL_BYTES))
            return log.read().decode(errors="replace").splitlines()
    except OSError:
        return []


def _tail(path: Path, lines: int = 3) -> str:
    text = "\n".join(_read_tail(path)).strip().splitlines()
    return " | ".join(line.strip() for line in text[-lines:])


def die_with_parent() -> None:
    """Kill our process group if the parent dies (kill -9 of ``tune``): nobody would enforce our timeout.
    Called first by every supervised child (the worker, the microbenchmark)."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os.killpg(os.getpgrp(), signal.SIGKILL)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()
