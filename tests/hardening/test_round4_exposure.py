"""The dashboard's guards hold whatever the working folder says (issue 37, broke 6).

Streamlit merges ``.streamlit/config.toml`` from the working folder and ``STREAMLIT_*`` variables into
its options: a cloned repository that ships one switching CORS, XSRF and the Origin check off let any
web page open the websocket, read every study and press "Build the winner's bundle". Here such a file
is planted where the command is typed (and the variable set), the dashboard is started the way the CLI
starts it, and the guards still hold.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("streamlit", reason="pip install 'autodeploy[dashboard]'")
pytest.importorskip("plotly", reason="pip install 'autodeploy[dashboard]'")

from autodeploy.cli.app import main  # noqa: E402
from autodeploy.dashboard import DB_ENV  # noqa: E402
from autodeploy.results_db import Store  # noqa: E402
from tests.hardening.test_dashboard_exposure import _get  # noqa: E402

EVIL = "http://evil.example"
PLANTED = f"""
[server]
enableCORS = false
enableXsrfProtection = false
corsAllowedOrigins = ["{EVIL}"]
allowedHosts = ["*"]
enableStaticServing = true
cookieSecret = "known"
[client]
allowedOrigins = ["{EVIL}"]
"""


@pytest.fixture
def planted(tmp_path, monkeypatch):
    """A working folder whose ``.streamlit/config.toml`` turns every guard off, the variable too, and a store."""
    (tmp_path / ".streamlit").mkdir()
    (tmp_path / ".streamlit" / "config.toml").write_text(PLANTED)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("STREAMLIT_SERVER_ENABLE_CORS", "false")
    monkeypatch.setenv("STREAMLIT_SERVER_ENABLE_XSRF_PROTECTION", "false")
    Store.open(f"sqlite:///{tmp_path / 'r.db'}").close()
    return tmp_path


def _launch(request, monkeypatch, port: int = 8765) -> tuple[list[str], dict[str, str], Path]:
    """What ``autodeploy dashboard --db sqlite:///r.db`` (a relative path) would exec, and where."""
    calls: list[tuple[list[str], dict[str, str], Path]] = []
    folder: list[Path] = []
    monkeypatch.setattr(os, "chdir", lambda path: folder.append(Path(path)))
    monkeypatch.setattr(
        os, "execve", lambda _path, argv, env: calls.append((argv, env, (folder or [Path.cwd()])[-1]))
    )
    with pytest.raises(SystemExit) as exc:
        main(["dashboard", "--db", "sqlite:///r.db", "--port", str(port)])
    assert exc.value.code == 0
    ((argv, env, cwd),) = calls
    if cwd != Path.cwd():
        request.addfinalizer(lambda: shutil.rmtree(cwd, ignore_errors=True))
    return argv, env, cwd


def _options(argv: list[str], env: dict[str, str], cwd: Path) -> dict:
    """The options Streamlit resolves from the server's flags, in ``cwd`` with ``env``: ``streamlit config show``."""
    tomllib = pytest.importorskip("tomllib", reason="Python 3.11 reads TOML")
    flags = argv[argv.index("run") + 2 :]
    done = subprocess.run([sys.executable, "-m", "streamlit", "config", "show", *flags], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return tomllib.loads(done.stdout[done.stdout.index("\n[") :])  # after its prose header


def test_the_dashboard_starts_in_a_private_folder_without_streamlit_variables(request, planted, monkeypatch):
    argv, env, cwd = _launch(request, monkeypatch)
    assert cwd != planted and not list(cwd.iterdir()), "the server must start in a fresh, empty folder"
    assert stat.S_IMODE(cwd.stat().st_mode) == 0o700
    assert sorted(k for k in env if k.upper().startswith("STREAMLIT_")) == ["STREAMLIT_SERVER_COOKIE_SECRET"]
    assert (
        len(env["STREAMLIT_SERVER_COOKIE_SECRET"]) >= 32 and env["STREAMLIT_SERVER_COOKIE_SECRET"] not in argv
    )
    assert env[DB_ENV] == f"sqlite:///{planted / 'r.db'}", (
        "a relative store path must survive the folder change"
    )
    assert (
        _launch(request, monkeypatch)[1]["STREAMLIT_SERVER_COOKIE_SECRET"]
        != env["STREAMLIT_SERVER_COOKIE_SECRET"]
    )


def test_the_flags_beat_a_planted_config_and_variables(request, planted, monkeypatch):
    """Even run in the planted folder, with the planted variables, Streamlit resolves every guard on."""
    argv, env, _ = _launch(request, monkeypatch)
    options = _options(argv, {**os.environ, **env}, planted)
    server = options["server"]
    assert server["enableCORS"] is True and server["enableXsrfProtection"] is True
    assert server["corsAllowedOrigins"] == ["http://127.0.0.1:8765"]
    assert sorted(server["allowedHosts"]) == ["127.0.0.1", "localhost"]
    assert server["address"] == "127.0.0.1" and server["enableStaticServing"] is False
    assert options["browser"]["gatherUsageStats"] is False


@pytest.mark.slow
def test_the_served_dashboard_refuses_a_foreign_origin_despite_a_planted_config(
    request, planted, monkeypatch
):
    """The real server, started as the CLI starts it from the planted folder: a page on another site
    cannot open the websocket, and no other site may script it from a parent frame."""
    import json
    import signal
    import socket
    import time
    import urllib.request

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    argv, env, cwd = _launch(request, monkeypatch, port)
    proc = subprocess.Popen(argv, env=env, cwd=cwd, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    ours = f"127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:  # bounded wait for the server to listen
            assert proc.poll() is None and time.monotonic() < deadline, "the dashboard did not start"
            try:
                if _get(port, "/_stcore/health", ours) == 200:
                    break
            except OSError:
                time.sleep(0.5)
        upgrade = (("Upgrade", "websocket"), ("Connection", "Upgrade"),
                   ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="), ("Sec-WebSocket-Version", "13"))  # fmt: skip
        assert _get(port, "/_stcore/stream", ours, (("Origin", f"http://{ours}"), *upgrade)) == 101
        # A page on evil.example, in the user's browser, opening the dashboard's websocket.
        assert _get(port, "/_stcore/stream", ours, (("Origin", EVIL), *upgrade)) != 101
        with urllib.request.urlopen(f"http://{ours}/_stcore/host-config", timeout=10) as response:
            assert json.load(response)["allowedOrigins"] == [f"http://{ours}"]
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
