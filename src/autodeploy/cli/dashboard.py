"""``autodeploy dashboard``: the Streamlit comparison app over the results store, read-only.

Imports nothing of Streamlit: it checks the store opens read-only, then replaces this process
with ``streamlit run`` on the app (through :mod:`autodeploy.dashboard.serve`, which imports the
pages' heavy modules first; bound to 127.0.0.1, usage statistics off), so Ctrl-C and signals
reach the server directly.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from typing import Annotated

import typer

from autodeploy.child import module_argv
from autodeploy.cli._common import err, shown
from autodeploy.errors import UsageError

INSTALL_HINT = "pip install 'autodeploy[dashboard]'"


def server_argv(port: int) -> list[str]:
    """The server's command line: ``streamlit run`` on the app, never importing from the working folder."""
    from autodeploy.dashboard import APP

    return module_argv("autodeploy.dashboard.serve", "run", str(APP), "--server.address", "127.0.0.1",
                       "--server.port", str(port), "--server.headless", "true", "--browser.gatherUsageStats",
                       "false", "--client.toolbarMode", "minimal")  # fmt: skip


def dashboard(
    db: Annotated[
        str | None,
        typer.Option(help="Results database URL (default: $AUTODEPLOY_DB or the user SQLite file)."),
    ] = None,
    port: Annotated[int, typer.Option(min=1, max=65535, help="Port on 127.0.0.1.")] = 8501,
) -> None:
    """Open the comparison dashboard (studies, compare, Pareto, trials, devices) in the browser."""
    from autodeploy.dashboard import DB_ENV
    from autodeploy.results_db.store import Store

    missing = [name for name in ("streamlit", "plotly") if importlib.util.find_spec(name) is None]
    if missing:
        raise UsageError(
            f"the dashboard needs {' and '.join(missing)}, which is not installed", fix=INSTALL_HINT
        )
    with Store.open(db, readonly=True) as store:  # fail here, in one line, rather than in the browser
        url = store.url
    # `streamlit run`, with the pages' heavy imports done before the server listens (dashboard/serve.py).
    argv = server_argv(port)
    env = {**os.environ, **({DB_ENV: db} if db else {})}
    err.print(
        f"dashboard on [bold]http://127.0.0.1:{port}[/] over {shown(url)} (read-only); Ctrl-C stops it",
        soft_wrap=True,
    )
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, argv, env)
