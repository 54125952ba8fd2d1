"""Trials: the Optuna history of a study, parameter importance, and every trial as stored."""

from __future__ import annotations

from dataclasses import replace

import streamlit as st

from autodeploy import objectives
from autodeploy.dashboard import cache, charts, queries
from autodeploy.harness.load import UNDER_LOAD_CORES

st.title("Trials")
url, filters = cache.db_url(), cache.filters()
studies = cache.studies(url, filters)
name = cache.study_picker(list(studies["name"]), key="trials_study")
if name is None:
    st.stop()
objective = studies.loc[studies["name"] == name, "objective"].iloc[0]

history = cache.optuna_trials(url, name)
if history is None:
    st.warning(f"Optuna has no study {name!r} in this database (it may use another --storage).")
else:
    states = history["state"].value_counts().to_dict()
    st.caption(", ".join(f"{v} {k}" for k, v in sorted(states.items())))
    known = objectives.stored(objective)  # a study stored by another version may name one this one lacks
    value_label = known.label.split(",")[0] if known else "value"
    finalists = cache.finalists(url, queries.Filters(study=name))
    winner = finalists.loc[finalists["role"] == "winner", "label"]
    baseline = finalists.loc[finalists["baseline"] & (finalists["n_samples"] > 0), "value"]
    st.plotly_chart(charts.history(history, value_label, winner.iloc[0] if len(winner) else None,
                                   float(baseline.iloc[0]) if len(baseline) else None, charts.baseline_name(finalists)),
                    key="trials_history")  # fmt: skip
    st.dataframe(history, hide_index=True)

st.subheader("Parameter importance")
importance, reason = cache.param_importance(url, name)
if importance is None:
    st.info(f"No parameter importance: {reason}.")
else:
    complete = int((history["state"] == "complete").sum()) if history is not None else 0
    if complete < queries.FEW_TRIALS:
        st.warning(f"Computed from only {complete} complete trials: with under {queries.FEW_TRIALS}, fANOVA's "
                   "importances are a rough hint, not a ranking. Run a longer study (`--trials`) to firm them up.")  # fmt: skip
    st.plotly_chart(charts.importance(importance, complete), key="trials_importance")
    st.dataframe(importance, hide_index=True)

st.subheader("Stored trials")
# Each trial judged by the study's constraints, as the Pareto page judges it.
stored = queries.judged(cache.trials(url, replace(filters, study=name)), studies)
st.dataframe(stored[["trial_id", "phase", "status", "failure_kind", "config_label", "verdict", "reason", "shape",
                     "latency_ms", "median_ms", "n_samples", "accuracy_drop", "gops", "share_of_peak", "peak_rss_mb",
                     "cpu_s_per_1k", "energy_j_per_1k", "under_load", "other_cores", "created_at"]], hide_index=True,
             column_config={"gops": "GOP/s", "share_of_peak": st.column_config.NumberColumn(
                 "share of peak", format="percent", help="GOP/s over the precision's peak on this device"),
                 "cpu_s_per_1k": st.column_config.NumberColumn("CPU s / 1k inferences", help="the worker's user + "
                                                               "system CPU time over the timed calls"),
                 "energy_j_per_1k": st.column_config.NumberColumn("J / 1k inferences", help="from the machine's "
                                                                  "energy meter, idle draw subtracted; empty: none")})  # fmt: skip
if stored["under_load"].fillna(False).astype(bool).any():
    st.caption(f"under_load: other processes kept more than {UNDER_LOAD_CORES} of a core busy while the trial was "
               "timed (other_cores: how many, on average); its times are likely slower and noisier.")  # fmt: skip
cache.csv_button(stored, f"{name}-trials.csv", key="trials_csv")

st.subheader("Distance to the limit")
limit = queries.roofline(stored)
if limit.empty:
    st.info("No trial of this study has a share of peak (operations counted against this device's peaks: "
            "`autodeploy engines` shows them); trials stored before they were counted have none.")  # fmt: skip
else:
    st.caption("Each config's fastest run: its GOP/s (2 x the MACs of its Conv, MatMul, Gemm and attention at the "
               "measured shape, over its median call) as a share of its precision's peak on this device (a MatMul "
               "and a Conv per engine, `autodeploy engines`). Far below 100%: tuning can pay; near it: only a "
               "cheaper precision can.")  # fmt: skip
    st.plotly_chart(charts.roofline(limit), key="trials_roofline")
