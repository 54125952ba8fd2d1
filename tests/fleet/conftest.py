"""Fleet tests: a real PostgreSQL (the suite's throwaway cluster) and real agent processes.

Each agent is ``python -m autodeploy agent --once`` in its own session (so a test can kill it with -9 as a
power loss would), with a short lease so a killed agent's run comes back within seconds. Jobs tune
zoo:tiny-cnn on ONNX Runtime fp32 with 3 short screening trials and no finalists.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import fresh_database

#: Seconds a killed agent's run stays leased (``agent --lease``).
LEASE_S = "3"
#: The study config of every test job: small and quick (a study of about 5 s here).
JOB_CONFIG = Path(__file__).with_name("job.yaml")
JOB = ["--config", str(JOB_CONFIG)]
AGENT_TIMEOUT_S = 120


def database(server: str) -> AbstractContextManager[str]:
    """A fresh database on the test server (the ``postgres_url`` fixture's, for any scope), dropped after."""
    return fresh_database(server, prefix="autodeploy_fleet")


class Agents:
    """Starts agent processes and ends whatever is left of them when the test ends."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []

    def start(self, url: str, name: str, *extra: str, env: dict[str, str] | None = None,
              once: bool = True) -> subprocess.Popen:  # fmt: skip
        """An agent; with ``once`` it exits when nothing is left for its device, else it waits for work."""
        cmd = [sys.executable, "-m", "autodeploy", "agent", "--db", url, "--name", name, *["--once"] * once,
               "--lease", LEASE_S, *extra]  # fmt: skip
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                                env={**os.environ, **(env or {})})  # fmt: skip
        self.procs.append(proc)
        return proc

    def run(self, url: str, name: str, *extra: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
        return finish(self.start(url, name, *extra, env=env))

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)  # the session this helper started: the agent and its workers
                proc.wait(timeout=10)


def finish(proc: subprocess.Popen, timeout: float = AGENT_TIMEOUT_S) -> tuple[int, str, str]:
    """Wait for an agent; (exit code, stdout, stderr)."""
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


@pytest.fixture
def agents() -> Iterator[Agents]:
    started = Agents()
    try:
        yield started
    finally:
        started.close()


def wait_for(what: str, check: Callable[[], Any], timeout: float = 60.0) -> Any:
    """Poll ``check`` until it returns something true; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.2)
    pytest.fail(f"waited {timeout:.0f} s for {what}")


def query(url: str, sql: str, **params: Any) -> list[tuple]:
    """Rows of one SQL query on the test database (bound parameters)."""
    import sqlalchemy as sa

    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            return [tuple(r) for r in conn.execute(sa.text(sql), params)]
    finally:
        engine.dispose()


def screening_trials(url: str, study: str) -> list[tuple[str, str]]:
    """(uid, config key) of every screening trial the study stored, in order."""
    return query(url, "SELECT uid, config_key FROM ad_trials WHERE study = :s AND phase = 'screening' ORDER BY id",
                 s=study)  # fmt: skip
