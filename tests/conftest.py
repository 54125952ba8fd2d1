"""Shared pytest fixtures, one section per external resource.

Keep this file to fixtures (and their private helpers). Each section says what it starts,
how to point it at an existing service instead, and when its tests skip.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

# ---------------------------------------------------------------------------------------------
# PostgreSQL
#
# ``postgres_server`` (session): a throwaway cluster on 127.0.0.1 and a free port, trust auth,
# its unix socket inside its own temp dir, stopped and deleted at session end. Set
# AUTODEPLOY_TEST_PG_URL (a postgresql+psycopg:// URL whose user may CREATE DATABASE) to use an
# existing server instead. Without either, PostgreSQL tests skip with the reason.
# ``postgres_url`` (function): a fresh, empty database on that server, dropped after the test.
# ---------------------------------------------------------------------------------------------

PG_BIN = Path(os.environ.get("AUTODEPLOY_TEST_PG_BIN", "/usr/lib/postgresql/15/bin"))
PG_ENV_URL = "AUTODEPLOY_TEST_PG_URL"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _as_cluster_owner() -> list[str]:
    """initdb and postgres refuse to run as root: run them as the ``postgres`` user then."""
    if os.geteuid() != 0:
        return []
    runuser = shutil.which("runuser")
    if runuser is None:
        pytest.skip("PostgreSQL tests: running as root and `runuser` is missing to drop to user postgres")
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        pytest.skip("PostgreSQL tests: running as root and there is no `postgres` user for initdb")
    return [runuser, "-u", "postgres", "--"]


def _start_cluster(root: Path, port: int, prefix: list[str]) -> None:
    def run(*args: str) -> None:
        proc = subprocess.run([*prefix, *args], capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            log = root / "server.log"
            tail = log.read_text()[-2000:] if log.exists() else ""
            raise RuntimeError(f"{args[0]} failed ({proc.returncode}): {proc.stderr or proc.stdout}\n{tail}")

    data = root / "data"
    run(str(PG_BIN / "initdb"), "-D", str(data), "-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C",
        "--no-sync")  # fmt: skip
    # Durability is pointless for a throwaway cluster; turning it off makes each test database cheap.
    options = f"-c listen_addresses=127.0.0.1 -p {port} -k {root} -c fsync=off -c full_page_writes=off"
    log = str(root / "server.log")
    run(str(PG_BIN / "pg_ctl"), "-D", str(data), "-l", log, "-o", options, "-w", "-t", "60", "start")


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """URL of a PostgreSQL server's maintenance database (``postgres``), as the superuser."""
    pytest.importorskip("psycopg", reason="PostgreSQL tests need psycopg: pip install 'autodeploy[postgres]'")
    if url := os.environ.get(PG_ENV_URL):
        yield url
        return
    if not (PG_BIN / "initdb").is_file():
        pytest.skip(f"PostgreSQL tests: no server binaries in {PG_BIN} and {PG_ENV_URL} is not set")
    prefix = _as_cluster_owner()
    root = Path(tempfile.mkdtemp(prefix="autodeploy-pg-"))
    if prefix:
        shutil.chown(root, user="postgres", group="postgres")
    port = _free_port()
    try:
        _start_cluster(root, port, prefix)
        yield f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run([*prefix, str(PG_BIN / "pg_ctl"), "-D", str(root / "data"), "-m", "immediate", "-w",
                        "stop"], capture_output=True, timeout=60)  # fmt: skip
        shutil.rmtree(root, ignore_errors=True)


@contextmanager
def fresh_database(postgres_server: str, prefix: str = "autodeploy_test") -> Iterator[str]:
    """A fresh, empty database on the test server, dropped (connections and all) afterwards; for any scope."""
    import psycopg
    import sqlalchemy as sa
    from psycopg import sql

    server = sa.make_url(postgres_server)
    conninfo = server.set(drivername="postgresql").render_as_string(hide_password=False)
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield server.set(database=name).render_as_string(hide_password=False)
    finally:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture
def postgres_url(postgres_server: str) -> Iterator[str]:
    """A fresh, empty database on the test server, dropped (connections and all) afterwards."""
    with fresh_database(postgres_server) as url:
        yield url


# ---------------------------------------------------------------------------------------------
# Peak throughput (autodeploy.harness.peaks)
#
# ``_shared_peaks`` (session, autouse): every bench and tune of the session reads one peak file, in a folder of
# the session's own (AUTODEPLOY_PEAKS_DIR), measured once by a tiny microbenchmark (AUTODEPLOY_PEAK_SIZE,
# AUTODEPLOY_PEAK_SECONDS): not once per test's cache folder, which would add seconds to every bench test.
# Tests of the cache itself pass their own folder and settings.
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="session", autouse=True)
def _shared_peaks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    patch = pytest.MonkeyPatch()
    patch.setenv("AUTODEPLOY_PEAKS_DIR", str(tmp_path_factory.mktemp("peaks")))
    patch.setenv("AUTODEPLOY_PEAK_SIZE", "32")
    patch.setenv("AUTODEPLOY_PEAK_SECONDS", "0.01")
    yield
    patch.undo()


@pytest.fixture(autouse=True)
def _restore_main_module():
    """Streamlit's AppTest (the dashboard's and the fleet's page tests) leaves ``__main__`` pointing at the app
    script; multiprocessing's spawn would then run the dashboard in every child process of later tests (the
    fleet's page test broke tests/hardening/test_concurrency.py so). Put it back after every test."""
    main = sys.modules.get("__main__")
    had_file = hasattr(main, "__file__")
    file = getattr(main, "__file__", None)
    yield
    if main is not None:
        sys.modules["__main__"] = main
        if had_file:
            main.__file__ = file
        elif hasattr(main, "__file__"):
            del main.__file__


@pytest.fixture(scope="session", autouse=True)
def _ctrl_c_reaches_children() -> None:
    """A runner that starts pytest with SIGINT ignored (a background job of a shell without job control, as
    ``nohup ... &`` is) passes that on to every process a test starts, and the tests that press Ctrl-C on a CLI
    (tests/hardening/test_quantize_timeout.py, test_round4_study.py) would see it ignored: the CLI then runs on.
    Python's own handler in the test process gives its children the default disposition again."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
