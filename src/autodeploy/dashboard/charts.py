"""Plotly figures, each a plain function of a DataFrame from :mod:`autodeploy.dashboard.queries`."""

from __future__ import annotations

import pandas as pd
import plotly.express as px
import plotly.graph_objects as go

from autodeploy.dashboard.queries import Metric

#: Bars switch to a log axis when the slowest config is this many times the fastest.
LOG_RATIO = 20
VERDICT_COLORS = {"winner": "#2ca02c", "pareto": "#1f77b4", "feasible": "#9ecae1", "rejected": "#d62728"}


def heatmap(best: pd.DataFrame, metric: Metric) -> go.Figure:
    """Engine × precision, each cell the best config's ``metric`` (from :func:`queries.best_per_config`)."""
    agg = "max" if metric.higher_is_better else "min"
    grid = best.pivot_table(index="engine", columns="precision", values=metric.column, aggfunc=agg)
    fig = px.imshow(
        grid,
        text_auto=".4g",
        aspect="auto",
        color_continuous_scale="RdYlGn" if metric.higher_is_better else "RdYlGn_r",  # green: better
        labels={"color": metric.label, "x": "precision", "y": "engine"},
    )
    fig.update_layout(title=f"Best {metric.label} per engine × precision", height=320)
    return fig


def ci_bars(best: pd.DataFrame, metric: Metric) -> go.Figure:
    """One horizontal bar per config, best on top, with its 95% confidence interval where the store has one.

    The axis turns logarithmic when the configs (or their intervals) differ by more than
    :data:`LOG_RATIO`, so that one pathological config does not flatten all the others.
    """
    error = None
    if metric.ci is not None:
        low, high = best[metric.ci[0]], best[metric.ci[1]]
        error = {"type": "data", "array": (high - best[metric.column]).tolist(),
                 "arrayminus": (best[metric.column] - low).tolist(), "visible": True}  # fmt: skip
    fig = go.Figure(
        go.Bar(
            y=best["config_label"],
            x=best[metric.column],
            orientation="h",
            error_x=error,
            marker_color=[_engine_color(e) for e in best["engine"]],
            hovertext=best["engine"] + " " + best["precision"],
        )
    )
    log = _wide(pd.concat([best[metric.column], best[metric.ci[1]] if metric.ci else best[metric.column]]))
    fig.update_layout(title=f"{metric.label} with 95% CI, best on top" + (" (log scale)" if log else ""),
                      xaxis_title=metric.label, xaxis_type="log" if log else "linear",
                      yaxis={"autorange": "reversed"}, height=120 + 32 * len(best))  # fmt: skip
    return fig


def distributions(samples: pd.DataFrame, labels: dict[int, str]) -> go.Figure:
    """Per-call latency of each trial as a box plot (the raw samples, not a summary), in ``labels`` order.

    Whiskers stop at 1.5 IQR and slower calls show as points; the axis turns logarithmic when
    those spread over more than :data:`LOG_RATIO`, as a few scheduler hiccups often do.
    """
    df = samples.assign(config=samples["trial_id"].map(labels))
    fig = px.box(df, x="config", y="latency_ms", points="outliers",
                 category_orders={"config": list(dict.fromkeys(labels.values()))},
                 labels={"latency_ms": "latency (ms)", "config": ""})  # fmt: skip
    log = _wide(df["latency_ms"])
    fig.update_layout(title="Latency distributions (per call)" + (" (log scale)" if log else ""),
                      yaxis_type="log" if log else "linear", xaxis_tickangle=-20, height=460)  # fmt: skip
    return fig


def pareto(df: pd.DataFrame) -> go.Figure:
    """Latency vs accuracy drop, marker size by peak memory, colour by verdict (from :func:`queries.verdicts`)."""
    measured = df[df["latency_ms"].notna()].copy()
    measured["memory_mb"] = measured["peak_rss_mb"].fillna(0.0).clip(lower=0.0)
    measured["accuracy_drop"] = measured["accuracy_drop"].fillna(0.0)
    fig = px.scatter(
        measured,
        x="latency_ms",
        y="accuracy_drop",
        size=measured["memory_mb"] + 1.0,
        color="verdict",
        color_discrete_map=VERDICT_COLORS,
        hover_name="config_label",
        hover_data={"memory_mb": ":.1f", "reason": True, "phase": True, "trial_id": True},
        labels={"latency_ms": "latency, ms (p90)", "accuracy_drop": "accuracy drop vs FP32"},
    )
    log = _wide(measured["latency_ms"])
    fig.update_layout(title="Latency vs accuracy drop (marker size: peak memory, MB)" + (" (log latency)" if log else ""),
                      xaxis_type="log" if log else "linear", height=460)  # fmt: skip
    return fig


def history(df: pd.DataFrame, value_label: str) -> go.Figure:
    """Optuna's history: each trial's value and the best feasible value so far."""
    done = df[df["value"].notna()]
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=done["number"], y=done["value"], mode="markers", name="trial",
                             text=done["config"], marker={"size": 9}))  # fmt: skip
    fig.add_trace(go.Scatter(x=df["number"], y=df["best_so_far"], mode="lines", name="best so far",
                             line={"shape": "hv"}))  # fmt: skip
    log = _wide(done["value"])
    fig.update_layout(title="Optimization history" + (" (log scale)" if log else ""), xaxis_title="trial",
                      yaxis_title=value_label, yaxis_type="log" if log else "linear", height=380)  # fmt: skip
    return fig


def importance(df: pd.DataFrame) -> go.Figure:
    fig = px.bar(df.iloc[::-1], x="importance", y="param", orientation="h")
    fig.update_layout(title="Parameter importance (fANOVA)", height=60 + 40 * len(df))
    return fig


def across_devices(df: pd.DataFrame, metric: Metric) -> go.Figure:
    """Best ``metric`` per engine/precision, one bar group per device fingerprint."""
    df = df.assign(
        config=df["engine"] + "/" + df["precision"],
        device_label=df["cpu"] + " (" + df["device"].str[:8] + ")",
    )
    fig = px.bar(df, x="config", y=metric.column, color="device_label", barmode="group",
                 labels={metric.column: metric.label, "config": "", "device_label": "device"})  # fmt: skip
    fig.update_layout(title=f"{metric.label} across devices", height=400)
    return fig


_PALETTE = px.colors.qualitative.Set2


def _wide(values: pd.Series) -> bool:
    """Whether positive ``values`` spread over more than :data:`LOG_RATIO` (then a log axis reads better)."""
    positive = values[values > 0]
    return len(positive) > 1 and positive.max() / positive.min() > LOG_RATIO


def _engine_color(engine: str) -> str:
    return _PALETTE[sum(map(ord, engine)) % len(_PALETTE)]


def gate_changes(metrics: pd.DataFrame) -> go.Figure:
    """Each gate run's change per metric with its CI, coloured by verdict (from :func:`queries.gate_metrics`)."""
    df = metrics[metrics["change"].notna()].copy()
    df["plus"] = (df["change_ci_high"] - df["change"]).fillna(0.0)
    df["minus"] = (df["change"] - df["change_ci_low"]).fillna(0.0)
    fig = px.scatter(df, x="created_at", y="change", color="verdict", symbol="metric", error_y="plus",
                     error_y_minus="minus", hover_data=["run_id", "reason"],
                     color_discrete_map={"pass": "#2ca02c", "fail": "#d62728", "inconclusive": "#ff7f0e"},
                     labels={"change": "change vs baseline (latency: relative; accuracy: drop)", "created_at": ""})  # fmt: skip
    fig.add_hline(y=0, line_dash="dot", line_color="grey")
    fig.update_layout(
        title="Gate history: change per metric with its interval (90%: upper end = one-sided 95% bound)",
        height=420,
    )
    return fig
