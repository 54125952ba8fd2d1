"""Regressions: the CI gate's history (baseline vs candidate verdicts per metric)."""

from __future__ import annotations

import streamlit as st

from autodeploy.dashboard import cache, charts, queries

st.title("Regressions")
runs = cache.gate_runs(cache.db_url(), cache.filters())
if runs is None:
    st.info(f"No regression gate history: this store has no `{queries.GATE_TABLE}` table, so it was made "
            "before the CI gate (issue 8) existed. Open it once read-write with a newer autodeploy to add it.")  # fmt: skip
    st.stop()
if runs.empty:
    st.info("The regression gate has not run on this store (or not for the filtered model and device). "
            "Run `autodeploy gate --baseline A --candidate B` in CI to fill this page.")  # fmt: skip
    st.stop()

counts = runs["verdict"].value_counts().to_dict()
cols = st.columns(3)
for col, verdict in zip(cols, ("pass", "fail", "inconclusive"), strict=True):
    col.metric(verdict, counts.get(verdict, 0))
metrics = queries.gate_metrics(runs)
if not metrics.empty:
    st.plotly_chart(charts.gate_changes(metrics), key="regressions_changes")
shown = [c for c in ("id", "created_at", "verdict", "mode", "baseline_ref", "candidate_ref", "cpu", "failing",
                     "notes", "wall_s", "command") if c in runs.columns]  # fmt: skip
st.dataframe(runs[shown], hide_index=True)
st.subheader("Per metric")
st.dataframe(metrics, hide_index=True)
cache.csv_button(metrics, "autodeploy-gate-metrics.csv", key="regressions_csv")
