"""``python -m autodeploy.dashboard.serve run APP [options]``: ``streamlit run``, with the app's heavy imports done first.

Streamlit imports an app's modules when the first page is opened; here pandas, pyarrow, Plotly,
SQLAlchemy and Alembic (seconds on a small, busy machine: ``benchmarks/dashboard_load.py``) are
imported before the server listens, so the first page pays only for its queries. Only plain
modules are preloaded: ``cache.py`` and the pages, which call Streamlit, run in the server's
script runner as usual. The arguments are ``streamlit``'s own; ``autodeploy dashboard`` execs this.
"""

from __future__ import annotations

import importlib
import sys

#: What every page imports, heaviest first; absent optional ones (the bundle exporter) are skipped.
PRELOAD = ("pandas", "pyarrow", "plotly.express", "plotly.graph_objects", "plotly.subplots",
           "autodeploy.dashboard.queries", "autodeploy.dashboard.charts", "autodeploy.bundle.export")  # fmt: skip


def preload() -> None:
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:  # a page that needs it says so itself (e.g. the exporter's install hint)
            continue


#: The Host a request to the dashboard may name: anything else is a DNS-rebinding page reaching 127.0.0.1.
ALLOWED_HOSTS = ("127.0.0.1", "localhost")


def guard_hosts() -> None:
    """Put Starlette's ``TrustedHostMiddleware`` first in Streamlit's server: HTTP and websocket
    requests whose ``Host`` is not :data:`ALLOWED_HOSTS` get 400 / a closed socket (Streamlit's CORS and
    XSRF options check the Origin, never the Host)."""
    try:
        from starlette.middleware import Middleware
        from starlette.middleware.trustedhost import TrustedHostMiddleware
        from streamlit.web.server.starlette import starlette_app
    except ImportError:
        raise SystemExit(
            "autodeploy dashboard: this Streamlit has no Starlette server to guard against DNS rebinding; "
            "fix: pip install --upgrade 'streamlit>=1.67'"
        ) from None
    make = starlette_app.create_streamlit_middleware

    def create_streamlit_middleware() -> list[Middleware]:
        return [Middleware(TrustedHostMiddleware, allowed_hosts=list(ALLOWED_HOSTS)), *make()]

    starlette_app.create_streamlit_middleware = create_streamlit_middleware


def main() -> None:
    guard_hosts()
    preload()
    from streamlit.web.cli import main as streamlit

    sys.argv = ["streamlit", *sys.argv[1:]]
    streamlit(prog_name="streamlit")


if __name__ == "__main__":
    main()
