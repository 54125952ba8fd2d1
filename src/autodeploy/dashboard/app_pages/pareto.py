"""Pareto: latency vs accuracy drop vs memory, one point per config; the winner, the front, the constraints,
and every rejected config with its reason."""

from __future__ import annotations

from dataclasses import replace

import pandas as pd
import streamlit as st

from autodeploy.dashboard import cache, charts, queries
from autodeploy.verdict import Limits

st.title("Pareto")
url, filters = cache.db_url(), cache.filters()
studies = cache.studies(url, filters)
name = cache.study_picker(list(studies["name"]), key="pareto_study")
if name is None:
    st.stop()
info = cache.study(url, name) or {}
constraints = (info.get("settings") or {}).get("constraints") or {}
winner = ((info.get("summary") or {}).get("winner") or {}).get("label")
objective = info.get("objective")
trials = cache.trials(url, replace(filters, study=name))
# One point per config, finalists at their re-measured p90 (as tune printed it): the winner is plotted once.
per_config = queries.rank_by_finalists(queries.one_per_config(trials), cache.finalists(url, queries.Filters(study=name)),
                                       queries.LATENCY_METRIC)  # fmt: skip
df = queries.verdicts(per_config, constraints, winner, objective)

budget = Limits.of(constraints)
st.caption(f"Constraints of {cache.md(name)}: {queries.limits_text(constraints, objective)}. "
           f"Winner: {cache.md(winner or 'none')}.")  # fmt: skip

if df["latency_ms"].notna().any():
    st.plotly_chart(charts.pareto(df, budget, objective), key="pareto_scatter")
    if df["latency_ms"].notna().sum() < 5:
        st.caption(f"⚠ Only {df['latency_ms'].notna().sum()} configs were measured: the front is drawn from few points.")
else:
    st.info("No trial of this study has a measurement yet.")

percent = {"accuracy_drop": st.column_config.NumberColumn("accuracy drop", format="%.2f%%")}
st.subheader("Configs on the front")
front = df[df["verdict"].isin(["winner", "pareto"])].assign(accuracy_drop=lambda f: f["accuracy_drop"] * 100)
st.dataframe(front[["verdict", "config_label", "source", "latency_ms", "accuracy_drop", "peak_rss_mb", "trial_id"]],
             hide_index=True, column_config=percent)  # fmt: skip

st.subheader("Rejected configs")
rejected = df[df["verdict"] == "rejected"][["config_label", "phase", "reason", "trial_id"]]
history = cache.optuna_trials(url, name)
if history is not None:  # configs the search pruned never reached the store: Optuna holds their reason
    pruned = history[history["state"] == "pruned"]
    pruned = pruned.drop_duplicates(["config", "reason"])  # a sampler may propose a pruned config again
    rejected = pd.concat([rejected, pd.DataFrame({"config_label": pruned["config"], "phase": "screening",
                                                  "reason": "pruned: " + pruned["reason"], "trial_id": None})])  # fmt: skip
if rejected.empty:
    st.success("No config was rejected: every trial met the constraints.")
else:
    st.dataframe(rejected, hide_index=True)
cache.csv_button(df, f"{name}-verdicts.csv", key="pareto_csv")
