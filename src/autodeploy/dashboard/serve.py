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


def main() -> None:
    preload()
    from streamlit.web.cli import main as streamlit

    sys.argv = ["streamlit", *sys.argv[1:]]
    streamlit(prog_name="streamlit")


if __name__ == "__main__":
    main()
