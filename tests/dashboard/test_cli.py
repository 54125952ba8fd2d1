"""``autodeploy dashboard``: checks the store, then runs Streamlit bound to 127.0.0.1 with usage stats off."""

from __future__ import annotations

import os
import tempfile

import pytest

from autodeploy.child import module_argv
from autodeploy.cli.app import main
from autodeploy.dashboard import APP, DB_ENV
from autodeploy.results_db import Store


def test_dashboard_execs_streamlit_on_localhost_without_usage_stats(tmp_path, monkeypatch):
    pytest.importorskip("streamlit", reason="pip install 'autodeploy[dashboard]'")
    pytest.importorskip("plotly", reason="pip install 'autodeploy[dashboard]'")
    url = f"sqlite:///{tmp_path / 'r.db'}"
    Store.open(url).close()
    calls = []
    monkeypatch.chdir(tmp_path)  # the command moves to a private folder before it execs: restored after
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where that folder is made
    monkeypatch.setattr(os, "execve", lambda path, argv, env: calls.append((path, argv, env)))
    with pytest.raises(SystemExit) as exc:  # Typer's exit after the command returns (here: execve did not)
        main(["dashboard", "--db", url, "--port", "8765"])
    assert exc.value.code == 0
    ((_, argv, env),) = calls
    # streamlit run, imports preloaded, the working folder off sys.path
    start = module_argv("autodeploy.dashboard.serve", "run", str(APP))
    assert argv[: len(start)] == start
    flags = list(zip(argv[len(start) :: 2], argv[len(start) + 1 :: 2], strict=True))
    for flag in [("--server.address", "127.0.0.1"), ("--server.port", "8765"), ("--server.headless", "true"),
                 ("--server.enableCORS", "true"), ("--server.enableXsrfProtection", "true"),
                 ("--browser.gatherUsageStats", "false"), ("--client.toolbarMode", "minimal")]:  # fmt: skip
        assert flag in flags
    assert env[DB_ENV] == url


def test_dashboard_on_a_missing_database_fails_before_starting(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(os, "execve", lambda *a: pytest.fail("must not start streamlit"))
    with pytest.raises(SystemExit) as exc:
        main(["dashboard", "--db", f"sqlite:///{tmp_path / 'none.db'}"])
    # 2: a database that does not exist is bad input (README exit codes), not a failure of the dashboard
    assert exc.value.code == 2 and "the file does not exist" in capsys.readouterr().err
