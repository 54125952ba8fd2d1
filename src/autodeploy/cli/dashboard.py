"""``autodeploy dashboard``: the Streamlit comparison app over the results store, read-only.

Imports nothing of Streamlit: it checks the store opens read-only, then replaces this process
with ``streamlit run`` on the app (through :mod:`autodeploy.dashboard.serve`, which imports the
pages' heavy modules first), so Ctrl-C and signals reach the server directly.

Streamlit merges a ``.streamlit/config.toml`` from the working folder (and ``~/.streamlit``) and
``STREAMLIT_*`` variables into its options; one that switches CORS, XSRF or the Origin check off
lets any web page drive the dashboard. So the server starts in a fresh private folder, with no
``STREAMLIT_*`` variable but its own random cookie secret, and every guard on its command line,
where a flag beats every file (:func:`server_argv`, :func:`server_env`).
"""

from __future__ import annotations

import importlib.util
import os
import secrets
import sys
import tempfile
from pathlib import Path
from typing import Annotated

import typer

from autodeploy.child import module_argv
from autodeploy.cli._common import err, shown
from autodeploy.errors import UsageError

INSTALL_HINT = "pip install 'autodeploy[dashboard]'"


#: Streamlit's options that guard the server, each pinned on its command line (a flag beats every
#: config file, and replaces a file's list): bound to 127.0.0.1, Host and Origin checked (CORS, no
#: other origin; in development mode Streamlit allows more), XSRF on, no parent frame may script it,
#: no identity taken from headers; no static files, agent API, reruns or file watching; no usage statistics.
GUARDS = (
    ("server.address", "127.0.0.1"), ("browser.serverAddress", "127.0.0.1"), ("server.headless", "true"),
    ("server.allowedHosts", "127.0.0.1"), ("server.allowedHosts", "localhost"), ("server.enableCORS", "true"),
    ("global.developmentMode", "false"), ("server.enableXsrfProtection", "true"),
    ("server.xsrfCookieSameSite", "lax"), ("server.trustedUserHeaders", "{}"), ("server.enableStaticServing", "false"),
    ("server.enableAgentApi", "false"), ("server.enableWebsocketCompression", "false"), ("server.runOnSave", "false"),
    ("server.allowRunOnSave", "false"), ("server.fileWatcherType", "none"), ("browser.gatherUsageStats", "false"),
    ("client.toolbarMode", "minimal"),
)  # fmt: skip


def server_argv(port: int) -> list[str]:
    """The server's command line: ``streamlit run`` on the app with every :data:`GUARDS` option, the port,
    and its own origin as the only one allowed; never importing from the working folder."""
    from autodeploy.dashboard import APP

    own = f"http://127.0.0.1:{port}"
    options = (*GUARDS, ("server.port", str(port)), ("browser.serverPort", str(port)),
               ("server.corsAllowedOrigins", own), ("client.allowedOrigins", own))  # fmt: skip
    flags = [arg for key, value in options for arg in (f"--{key}", value)]
    return module_argv("autodeploy.dashboard.serve", "run", str(APP), *flags)


def server_env(db: str | None) -> dict[str, str]:
    """The server's environment: this one without ``STREAMLIT_*`` variables (Streamlit reads them as
    options), with a fresh random cookie secret (it signs the XSRF cookie; never on the command line,
    which other users can read) and the store's URL made absolute (the server runs elsewhere)."""
    from autodeploy.dashboard import DB_ENV

    env = {name: value for name, value in os.environ.items() if not name.upper().startswith("STREAMLIT_")}
    env["STREAMLIT_SERVER_COOKIE_SECRET"] = secrets.token_hex(32)
    db = db or os.environ.get(DB_ENV)
    if db:
        env[DB_ENV] = absolute_url(db)
    return env


def absolute_url(db: str) -> str:
    """``db`` with a relative SQLite path made absolute (from this working folder); other URLs unchanged."""
    import sqlalchemy as sa

    if "://" not in db:  # a plain file path
        return str(Path(db).absolute())
    url = sa.make_url(db)
    path = url.database or ""
    if url.get_backend_name() != "sqlite" or path in ("", ":memory:") or path.startswith("file:"):
        return db
    if Path(path).is_absolute():
        return db
    return url.set(database=str(Path(path).absolute())).render_as_string(hide_password=False)


def private_folder() -> Path:
    """A fresh folder only this user can open (``mkdtemp``: mode 0700), the server's working folder: no
    ``.streamlit/`` from wherever the command was typed is read."""
    return Path(tempfile.mkdtemp(prefix="autodeploy-dashboard-"))


def dashboard(
    db: Annotated[
        str | None,
        typer.Option(help="Results database URL (default: $AUTODEPLOY_DB or the user SQLite file)."),
    ] = None,
    port: Annotated[int, typer.Option(min=1, max=65535, help="Port on 127.0.0.1.")] = 8501,
) -> None:
    """Open the comparison dashboard (studies, compare, Pareto, trials, devices) in the browser."""
    from autodeploy.results_db.store import Store

    missing = [name for name in ("streamlit", "plotly") if importlib.util.find_spec(name) is None]
    if missing:
        raise UsageError(
            f"the dashboard needs {' and '.join(missing)}, which is not installed", fix=INSTALL_HINT
        )
    with Store.open(db, readonly=True) as store:  # fail here, in one line, rather than in the browser
        url = store.url
    # `streamlit run`, with the pages' heavy imports done before the server listens (dashboard/serve.py).
    argv, env = server_argv(port), server_env(db)
    err.print(
        f"dashboard on [bold]http://127.0.0.1:{port}[/] over {shown(url)} (read-only); Ctrl-C stops it",
        soft_wrap=True,
    )
    sys.stdout.flush()
    sys.stderr.flush()
    os.chdir(private_folder())
    os.execve(sys.executable, argv, env)
