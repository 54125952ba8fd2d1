"""Compare: engine × precision heatmap of the objective, bars with confidence intervals, latency distributions."""

from __future__ import annotations

from dataclasses import replace

import streamlit as st

from autodeploy.dashboard import cache, charts, queries

TOP_BARS = 15
TOP_DISTRIBUTIONS = 6

st.title("Compare")
url, filters = cache.db_url(), cache.filters()
studies = cache.studies(url, filters)
left, right = st.columns(2)
study = left.selectbox("Study", [cache.ALL, *studies["name"]], key="compare_study",
                       help="All: every stored trial that matches the filters (studies and single benches).")  # fmt: skip
objective = None
if study != cache.ALL:
    filters = replace(filters, study=study)
    objective = studies.loc[studies["name"] == study, "objective"].iloc[0]
metric_keys = list(queries.METRICS)
default = metric_keys.index(queries.OBJECTIVE_METRIC.get(objective or "latency", "latency"))
key = right.selectbox(
    "Metric",
    metric_keys,
    index=default,
    key="compare_metric",
    format_func=lambda k: queries.METRICS[k].label,
    help="p90 latency falls back to the median for trials with under 64 samples (too few to claim a p90).",
)
metric = queries.METRICS[key]

df = cache.trials(url, filters, measured_only=True)
best = queries.best_per_config(df, metric)
if best.empty:
    st.info("No successful measurement matches the filters. Store one with `autodeploy bench MODEL` "
            "or `autodeploy tune MODEL`.")  # fmt: skip
    st.stop()

st.caption(
    f"{len(best)} configs from {len(df)} measured trials; engines: {', '.join(sorted(best['engine'].unique()))}"
)
st.plotly_chart(charts.heatmap(best, metric), key="compare_heatmap")
st.plotly_chart(charts.ci_bars(best.head(TOP_BARS), metric), key="compare_bars")

top = best.head(TOP_DISTRIBUTIONS)
samples = cache.samples(url, tuple(int(i) for i in top["trial_id"]))
if not samples.empty:
    st.plotly_chart(charts.distributions(samples, dict(zip(top["trial_id"], top["config_label"], strict=True))),
                    key="compare_distributions")  # fmt: skip

st.subheader("Best trial per config")
columns = ["config_label", "engine", "precision", "batch", "threads", "model", "cpu", "scenario", "phase",
           metric.column, *(metric.ci or ()), "median_ms", "p99_ms", "throughput", "cv", "unstable",
           "n_samples", "peak_rss_mb", "artifact_mb", "accuracy_drop", "trial_id"]  # fmt: skip
st.dataframe(best[list(dict.fromkeys(columns))], hide_index=True)
cache.csv_button(df, "autodeploy-trials.csv", key="compare_csv", label="Download the measured trials (CSV)")
