"""Devices: one model across device fingerprints (results compare only under one fingerprint).

Each engine × precision bar is that device's best config that meets its study's constraints (a
bench: the default budget); only where none does is a rejected one shown, hatched, with its reason.
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from autodeploy.dashboard import cache, charts, queries

st.title("Devices")
url, filters = cache.db_url(), cache.filters()
opts = cache.options(url)
devices = cache.devices(url)
st.dataframe(devices, hide_index=True)

models = dict(opts.models)
if not models:
    st.info("No model in the store yet.")
    st.stop()
keys = list(models)
model = st.selectbox("Model", keys, index=keys.index(filters.model) if filters.model in models else 0,
                     key="devices_model", format_func=lambda k: f"{models[k]} ({k[:8]})")  # fmt: skip
metric = queries.LATENCY_METRIC
df = cache.trials(url, queries.Filters(model=model, engines=filters.engines, scenario=filters.scenario),
                  measured_only=True)  # fmt: skip
ok = df[queries.measured(df)]
if ok.empty:
    st.info(f"No successful measurement of {cache.md(models[model])} yet.")
    st.stop()
# Per device, configs ranked as Compare ranks them (the newest study's finalists at their re-measured values,
# winner first); each engine × precision bar is the first of that ranking: the winner's bar is the winner.
finalists = cache.finalists(url, queries.Filters(model=model))
studies = cache.studies(url, queries.Filters(model=model))
ranked = [queries.judged(queries.rank_by_finalists(queries.best_per_config(rows, metric),
                                                   queries.study_finalists(finalists, model, device, metric), metric),
                         studies)
          for device, rows in ok.groupby("device", sort=False)]  # fmt: skip
# The first passing config of each ranking per engine × precision; a rejected one only where none passed.
ranked = [r.assign(_out=r["verdict"] == queries.REJECTED).sort_values("_out", kind="stable") for r in ranked]
best = pd.concat(ranked).drop_duplicates(["device", "engine", "precision"]).drop(columns="_out")
seen = best["device"].nunique()
st.caption(f"{cache.md(models[model])} measured on {seen} device fingerprint{'s' if seen != 1 else ''}.")
st.plotly_chart(charts.across_devices(best, metric), key="devices_bars")
st.dataframe(best[["device", "cpu", "engine", "engine_version", "precision", "config_label", "role", "verdict", "reason",
                   "source", "latency_ms", "latency_ci_low", "latency_ci_high", "throughput", "trial_id"]],
             hide_index=True)  # fmt: skip
