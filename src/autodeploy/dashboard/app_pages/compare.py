"""Compare: engine × precision heatmap, bars with confidence intervals, latency distributions.

One model on one device at a time (configs of different models or devices are never one bar),
ranked as the study ranked them: its finalists by their re-measured values, winner on top. Each
config is judged by its own study's constraints (a bench by the default budget): a rejected one is
grey and hatched with its reason, and never colours a heatmap cell.
"""

from __future__ import annotations

from dataclasses import replace

import streamlit as st

from autodeploy.dashboard import cache, charts, queries
from autodeploy.objectives import DEFAULT_OBJECTIVE

TOP_BARS = 15
TOP_DISTRIBUTIONS = 6

st.title("Compare")
url, filters = cache.db_url(), cache.filters()
studies = cache.studies(url, filters)
left, middle, right = st.columns(3)
study = left.selectbox("Study", [cache.ALL, *studies["name"]], key="compare_study",
                       help="All: every stored trial that matches the filters (studies and single benches).")  # fmt: skip
objective = None
if study != cache.ALL:
    filters = replace(filters, study=study)
    objective = studies.loc[studies["name"] == study, "objective"].iloc[0]
metric_keys = list(queries.METRICS)
default = metric_keys.index(queries.OBJECTIVE_METRIC.get(objective or DEFAULT_OBJECTIVE.name,
                                                         DEFAULT_OBJECTIVE.trial_metric))  # fmt: skip
key = right.selectbox(
    "Metric",
    metric_keys,
    index=default,
    key="compare_metric",
    format_func=lambda k: queries.METRICS[k].label,
    help="p90 latency falls back to the median for trials with under 64 samples (too few to claim a p90).",
)
metric = queries.METRICS[key]

pairs = cache.groups(url, filters, measured_only=True)
if pairs.empty:
    st.info("No measurement matches the filters. Store one with `autodeploy bench MODEL` or `autodeploy tune MODEL`.")
    st.stop()
label = middle.selectbox("Model on device", list(pairs["label"]), key="compare_group",
                         help="Configs of different models or devices are not comparable: one pair at a time.")  # fmt: skip
pair = pairs[pairs["label"] == label].iloc[0]
filters = replace(filters, model=pair["model_sha256"], device=pair["device"])  # only this pair's trials are read
df = cache.trials(url, filters, measured_only=True)
best = queries.best_per_config(df, metric)
if best.empty:
    st.info(f"No successful measurement of {cache.md(label)} matches the filters (every trial failed).")
    st.stop()
finalists = queries.study_finalists(cache.finalists(url, filters), pair["model_sha256"], pair["device"], metric)
best = queries.rank_by_finalists(best, finalists, metric)
# Judged after ranking: an SLA judges the latency shown (a finalist's re-measured p90).
best = queries.judged(best, studies)

remeasured = (best["source"] != "best trial").sum()
ranking = (f"ranked as study {cache.md(finalists['study'].iloc[0])} ranked them: its {remeasured} finalists by their "
           "re-measured values (winner on top), then the other configs by their best trial"
           if remeasured else "ranked by each config's best trial")  # fmt: skip
st.caption(f"{len(best)} configs of {cache.md(label)}, {ranking}; "
           f"engines: {cache.md(', '.join(sorted(best['engine'].unique())))}.")
rejected = best[best["verdict"] == queries.REJECTED]
if not rejected.empty:
    st.caption(f"✗ {len(rejected)} config(s) rejected by their study's constraints (a bench without a study: "
               f"{queries.limits_text(None, None)}): grey and hatched, never a heatmap cell's colour; "
               "each reason is on hover and in the table below.")  # fmt: skip
few = best[best["n_samples"] < queries.FEW_SAMPLES]
if metric.ci is not None and not few.empty:
    st.caption(f"⚠ {len(few)} config(s) have under {queries.FEW_SAMPLES} samples: their confidence intervals are rough.")
st.plotly_chart(charts.heatmap(best, metric), key="compare_heatmap")
st.plotly_chart(charts.ci_bars(best.head(TOP_BARS), metric, title=f"{metric.label} with 95% CI, {label}"),
                key="compare_bars")  # fmt: skip

top = best.head(TOP_DISTRIBUTIONS)
samples = cache.samples(url, tuple(int(i) for i in top["trial_id"]))
if not samples.empty:
    name = charts.baseline_name(top)
    labels = {t: charts.role_label(c, r, v == queries.REJECTED, baseline=b, name=name)
              for t, c, r, v, b in zip(top["trial_id"], top["config_label"], top["role"], top["verdict"], top["baseline"],
                                       strict=True)}  # fmt: skip
    st.plotly_chart(charts.distributions(samples, labels, baseline=top.loc[top["baseline"], "trial_id"]),
                    key="compare_distributions")  # fmt: skip
    st.caption("Distributions are each config's best single trial (finalists: one of their re-measured runs).")

st.subheader("Per config")
columns = ["config_label", "role", "verdict", "reason", "source", "engine", "precision", "batch", "threads", "model",
           "cpu", "scenario", "phase", metric.column, *(metric.ci or ()), "median_ms", "p99_ms", "throughput", "cv", "unstable",
           "n_samples", "peak_rss_mb", "artifact_mb", "accuracy_drop", "trial_id"]  # fmt: skip
st.dataframe(best[list(dict.fromkeys(columns))], hide_index=True)
cache.csv_button(df, "autodeploy-trials.csv", key="compare_csv", label="Download the measured trials (CSV)")
