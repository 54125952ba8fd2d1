"""The comparison dashboard: a Streamlit app over the results store, opened read-only.

``app.py`` is the entry point (``st.navigation`` over ``app_pages/``), ``queries.py`` holds
every database query (SQLAlchemy Core, bound parameters only), ``cache.py`` caches the engine
(``st.cache_resource``) and the queries (``st.cache_data``), ``charts.py`` builds the Plotly
figures. Start it with ``autodeploy dashboard [--db URL]``.

This package's ``__init__`` imports nothing heavy: the CLI needs only :data:`APP` and
:data:`DB_ENV`; Streamlit, Plotly and pandas are imported by the modules the app runs.
"""

from __future__ import annotations

from pathlib import Path

#: The Streamlit entry point, run with ``python -m autodeploy.dashboard.serve run`` (``streamlit run``, imports preloaded).
APP = Path(__file__).with_name("app.py")
#: The results database URL the app opens; the CLI sets it from ``--db`` (the store's own variable).
DB_ENV = "AUTODEPLOY_DB"
