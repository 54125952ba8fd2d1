"""The dashboard's entry point: ``autodeploy dashboard`` runs ``streamlit run`` on this file.

It opens the store read-only (``$AUTODEPLOY_DB``), draws the sidebar filters every page
shares, then runs the page chosen in the navigation.
"""

from __future__ import annotations

import streamlit as st

from autodeploy.dashboard import cache
from autodeploy.errors import StoreError

# No Material icons on pages: the current page's icon becomes the tab icon, fetched from
# fonts.gstatic.com, and the app must not reach out of the machine. An emoji favicon is drawn locally.
st.set_page_config(page_title="autodeploy", page_icon="⚡", layout="wide")

try:
    opts = cache.options(cache.db_url())
except StoreError as error:  # shown, not swallowed: the app cannot do anything without its store
    st.title("autodeploy dashboard")
    st.error(f"error: {error}")
    st.stop()
cache.sidebar_filters(opts)

PAGES = [
    st.Page("app_pages/overview.py", title="Overview", default=True),
    st.Page("app_pages/winners.py", title="Winners"),
    st.Page("app_pages/compare.py", title="Compare"),
    st.Page("app_pages/pareto.py", title="Pareto"),
    st.Page("app_pages/trials.py", title="Trials"),
    st.Page("app_pages/devices.py", title="Devices"),
    st.Page("app_pages/regressions.py", title="Regressions"),
    st.Page("app_pages/fleet.py", title="Fleet"),
]
st.navigation(PAGES).run()
