"""What every page shares: the cached store and queries, the sidebar filters, download helpers.

The store (and so its engine) is opened once per URL and kept (``st.cache_resource``); query
results are kept for :data:`TTL_S` seconds (``st.cache_data``) so that a running study shows
up without a restart, and the sidebar's *Refresh* button drops them at once.
"""

from __future__ import annotations

import os
import re
import shlex
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

import pandas as pd
import streamlit as st

from autodeploy.dashboard import DB_ENV, queries
from autodeploy.dashboard.queries import Filters, Options
from autodeploy.redact import mask_secrets
from autodeploy.results_db.store import Store

TTL_S = 30
#: The fleet's records change while agents run: the Fleet page refreshes itself while a job is live.
FLEET_TTL_S = 5
ALL = "All"


def db_url() -> str | None:
    """The database the app shows: ``$AUTODEPLOY_DB`` (set by ``autodeploy dashboard --db``), else the default."""
    return os.environ.get(DB_ENV) or None


@st.cache_resource(show_spinner=False)
def store(url: str | None) -> Store:
    """The read-only store (its SQLAlchemy engine and pool), opened once per URL for every session."""
    return Store.open(url, readonly=True)


@st.cache_resource(show_spinner=False)
def _optuna_storage(url: str | None) -> Any:
    return queries.optuna_storage(store(url))


@st.cache_data(ttl=TTL_S, show_spinner=False)
def options(url: str | None) -> Options:
    return queries.options(store(url))


@st.cache_data(ttl=TTL_S, show_spinner=False)
def trials(url: str | None, filters: Filters, measured_only: bool = False) -> pd.DataFrame:
    return queries.trials(store(url), filters, measured_only=measured_only)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def groups(url: str | None, filters: Filters, measured_only: bool = False) -> pd.DataFrame:
    return queries.groups(store(url), filters, measured_only=measured_only)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def trial_counts(url: str | None, filters: Filters) -> dict[str, int]:
    return queries.trial_counts(store(url), filters)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def samples(url: str | None, trial_ids: tuple[int, ...]) -> pd.DataFrame:
    return queries.samples(store(url), trial_ids)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def studies(url: str | None, filters: Filters) -> pd.DataFrame:
    return queries.studies(store(url), filters)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def finalists(url: str | None, filters: Filters) -> pd.DataFrame:
    return queries.finalists(store(url), filters)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def winners(url: str | None, filters: Filters) -> pd.DataFrame:
    return queries.winners(store(url), filters)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def study(url: str | None, name: str) -> dict[str, Any] | None:
    return queries.study(store(url), name)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def devices(url: str | None) -> pd.DataFrame:
    return queries.devices(store(url))


@st.cache_data(ttl=TTL_S, show_spinner=False)
def gate_runs(url: str | None, filters: Filters) -> pd.DataFrame | None:
    return queries.gate_runs(store(url), filters)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def optuna_trials(url: str | None, name: str) -> pd.DataFrame | None:
    if not queries.has_optuna(store(url)):
        return None
    return queries.optuna_trials(_optuna_storage(url), name)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def param_importance(url: str | None, name: str) -> tuple[pd.DataFrame | None, str]:
    if not queries.has_optuna(store(url)):
        return None, "this database has no Optuna tables: no study ran here"
    return queries.param_importance(_optuna_storage(url), name)


@st.cache_data(ttl=FLEET_TTL_S, show_spinner=False)
def fleet_status(url: str | None) -> list[dict[str, Any]]:
    """Every fleet job's status record (:func:`autodeploy.fleet.jobs.status`: the agents' states, as
    ``fleet status`` shows them); none in a store that never held a fleet job."""
    from autodeploy.fleet import jobs

    return jobs.status(store(url))


@st.cache_data(ttl=FLEET_TTL_S, show_spinner=False)
def fleet_devices(url: str | None) -> list[dict[str, Any]]:
    """Every fleet device's record (:func:`autodeploy.fleet.jobs.devices`, as ``fleet devices`` shows them): retired
    ones left out; none in a store that never held a fleet agent."""
    from autodeploy.fleet import jobs

    return jobs.devices(store(url))


# -- sidebar ------------------------------------------------------------------------------


def sidebar_filters(opts: Options) -> Filters:
    """Draw the model, device, engine and scenario filters; remember them for the pages."""
    bar = st.sidebar
    bar.header("Filters")
    models = dict(opts.models)
    devices = dict(opts.devices)
    model = bar.selectbox("Model", [ALL, *models], key="f_model",
                          format_func=lambda k: k if k == ALL else f"{models[k]} ({k[:8]})")  # fmt: skip
    device = bar.selectbox("Device", [ALL, *devices], key="f_device",
                           format_func=lambda k: k if k == ALL else f"{devices[k]} ({k[:8]})")  # fmt: skip
    engines = bar.multiselect("Engine", list(opts.engines), key="f_engines", placeholder="All engines")
    scenario = bar.selectbox("Scenario", [ALL, *opts.scenarios], key="f_scenario")
    if bar.button("Refresh", help=f"Read the store again (results are cached for {TTL_S} s)"):
        st.cache_data.clear()
    bar.caption(f"Store (read-only): {store(db_url()).url}")
    filters = Filters(
        model=None if model == ALL else model,
        device=None if device == ALL else device,
        engines=tuple(engines),
        scenario=None if scenario == ALL else scenario,
    )
    st.session_state["filters"] = filters
    return filters


def filters() -> Filters:
    """The sidebar's current filters (no filter before the sidebar ran)."""
    return st.session_state.get("filters", Filters())


def study_picker(names: list[str], *, key: str, label: str = "Study") -> str | None:
    """A study selectbox, newest first; ``None`` (with a note) when there is none."""
    if not names:
        st.info("No study matches the filters. Run one with `autodeploy tune MODEL`.")
        return None
    wanted = st.query_params.get("study")  # a link from another page (Fleet) names the study: ?study=NAME
    return st.selectbox(label, names, index=names.index(wanted) if wanted in names else 0, key=key)


# -- downloads ----------------------------------------------------------------------------


def csv_button(df: pd.DataFrame, file_name: str, *, key: str, label: str = "Download CSV") -> None:
    st.download_button(label, df.to_csv(index=False).encode(), file_name=file_name, mime="text/csv", key=key)


def bundle_exporter() -> ModuleType | None:
    """:mod:`autodeploy.bundle.export` (``study_winner`` + ``write_bundle``), or ``None`` where it cannot be imported
    here (the page then shows the shell command instead)."""
    try:  # imported on first use: the exporter's imports (engines' registry, summaries) wait for the button
        from autodeploy.bundle import export
    except ImportError:
        return None
    return export


_MARKDOWN = re.compile(r"([\\`*_{}\[\]()#+\-.!|<>~$:=^&])")


def md(text: object) -> str:
    """``text`` (a model, study or device name from the store) as literal Markdown: every syntax character escaped.

    Streamlit renders captions, infos and titles as Markdown: a name holding ``[x](javascript:…)``,
    ``**bold**``, ``:red[…]`` or ``$…$`` would otherwise become a link, styling or LaTeX.
    """
    return _MARKDOWN.sub(r"\\\1", str(text)).replace("\n", " ")


def file_stem(name: str) -> str:
    """A name from the store as a safe file-name stem: letters, digits and ``_.-`` only, never a path."""
    stem = re.sub(r"\.{2,}", ".", re.sub(r"[^A-Za-z0-9_.-]+", "-", name)).strip("-.")[:100]
    return stem or "study"


def export_command(study_name: str) -> str:
    """The shell command that writes the winner's bundle, for when the exporter is not installed here."""
    url = db_url()
    return mask_secrets(shlex.join(  # shown in the browser and shipped in the bundle: never the password
        ["autodeploy", "export", study_name, "-o", f"{file_stem(study_name)}-bundle", *(["--db", url] if url else [])]
    ))


def build_bundle(exporter: Any, study_name: str) -> tuple[bytes, str]:
    """The winner's bundle as ``.tar.gz`` bytes and a file name, written to a temporary folder.

    Reads the dashboard's read-only store; raises the exporter's own error (e.g. the winner's
    artifact is not on this machine) for the page to show.
    """
    source = exporter.study_winner(store(db_url()), study_name)
    name = f"{file_stem(study_name)}-bundle.tar.gz"  # a name from the store never becomes a path
    with tempfile.TemporaryDirectory(prefix="autodeploy-bundle-") as tmp:
        path = exporter.write_bundle(source, Path(tmp) / name, tar=True, command=export_command(study_name))
        return Path(path).read_bytes(), name
