"""Plotly figures, each a plain function of a DataFrame from :mod:`autodeploy.dashboard.queries`.

Every chart of configs marks the study's winner (★, green) and its baseline (the one every speed-up is
over: the ORT fp32 default, LiteRT fp32 for a ``.tflite`` study; grey, dashed line); ``role``, ``baseline``
and ``baseline_name`` columns (from :func:`queries.rank_by_finalists`) say which is which. A config its study's constraints rejected
(``verdict`` and ``reason``, from :func:`queries.judged`) is light grey and hatched, says
"✗ rejected" and gives its reason on hover: never green, never the best colour of a scale.
Log axes get 1-2-5 ticks with units.
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable

import pandas as pd
import plotly.express as px
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from autodeploy import objectives
from autodeploy.adapters import registry
from autodeploy.dashboard.queries import BASELINE_LABEL, REJECTED, Metric, vs_own_text
from autodeploy.units import time_unit
from autodeploy.verdict import Limits, sla_bounds_latency

#: Bars switch to a log axis when the slowest config is this many times the fastest.
LOG_RATIO = 20
VERDICT_COLORS = {"winner": "#2ca02c", "pareto": "#1f77b4", "feasible": "#9ecae1", "rejected": "#d62728"}
WINNER_COLOR, BASELINE_COLOR, LIMIT_COLOR = "#2ca02c", "#7f7f7f", "#d62728"
#: A rejected config: lighter than the baseline's grey, hatched with :data:`REJECTED_PATTERN`.
REJECTED_COLOR, REJECTED_PATTERN, REJECTED_TEXT = "#d9d9d9", "/", "✗ rejected"
ROLE_TEXT = {"winner": "★ winner", "runner-up": "runner-up", "tie": "tie with winner", "baseline": "baseline"}
#: What the baseline is called where a frame does not say (``baseline_name``): an ONNX model's, as a label.
BASELINE_NAME = registry.BASELINE_NAME.removeprefix("the ")


def baselines(df: pd.DataFrame) -> pd.Series:
    """Which rows are their study's baseline: the ``baseline`` column (:func:`queries.rank_by_finalists`,
    :func:`queries.finalist_bars`), else the ORT fp32 default's label (an ONNX model's baseline)."""
    if "baseline" in df:
        return df["baseline"].fillna(False).astype(bool)
    return df["config_label"] == BASELINE_LABEL


def baseline_name(df: pd.DataFrame) -> str:
    """What the baseline of ``df``'s study is called: ``LiteRT fp32, the file as given``, ``ORT fp32 default``."""
    names = df["baseline_name"].dropna() if "baseline_name" in df else pd.Series([], dtype=object)
    return str(names.iloc[0]).removeprefix("the ") if len(names) else BASELINE_NAME


def role_label(label: str, role: str, rejected: bool = False, *, baseline: bool | None = None,
               name: str = BASELINE_NAME) -> str:  # fmt: skip
    """A config label with its role: ``ort/int8/b1/t1  ★ winner``; the baseline (``baseline``: by default the
    ORT fp32 default's label) is named (``name``) even when it won; ``  ✗ rejected`` after it when its study's
    constraints rejected it."""
    text = ROLE_TEXT.get(role, "")
    if baseline is None:
        baseline = label == BASELINE_LABEL
    if baseline and role != "":
        text += f" ({name})"
    text = f"{text}  {REJECTED_TEXT}".strip() if rejected else text
    return f"{label}  {text}" if text else label


def rejected(df: pd.DataFrame) -> pd.Series:
    """Which rows their study's constraints rejected (``verdict``); none where there is no ``verdict`` column."""
    return df["verdict"] == REJECTED if "verdict" in df else pd.Series(False, index=df.index)


def heatmap(best: pd.DataFrame, metric: Metric) -> go.Figure:
    """Engine × precision, each cell coloured by its best config that meets its study's constraints.

    A faster config that was rejected never colours its cell (the hover names it and why); a cell
    whose every config was rejected is a grey layer reading "✗ rejected", with the best one's reason
    on hover. The winner's and the baseline's cells are marked.
    """
    engines, precisions = sorted(best["engine"].unique()), sorted(best["precision"].unique())
    ordered = best.sort_values(metric.column, ascending=not metric.higher_is_better, kind="stable")
    out = rejected(ordered)
    passing, failing = _per_cell(ordered[~out]), _per_cell(ordered[out])
    cells = [[(passing.get((e, p)), failing.get((e, p))) for p in precisions] for e in engines]
    # The colour layer holds passing configs only; a cell with none but a rejected one goes on the grey layer.
    z = [[None if ok is None else ok[metric.column] for ok, _ in row] for row in cells]
    grey = [[0.0 if ok is None and bad is not None else None for ok, bad in row] for row in cells]
    common = {"x": precisions, "y": engines, "hoverongaps": False, "hovertemplate": "%{customdata}<extra></extra>",
              "customdata": [[_cell_hover(ok, bad, metric) for ok, bad in row] for row in cells]}  # fmt: skip
    fig = go.Figure(go.Heatmap(z=z, texttemplate="%{z:.4g}", colorbar={"title": {"text": metric.label}},
                               colorscale="RdYlGn" if metric.higher_is_better else "RdYlGn_r",  # green: better
                               name="meets the constraints", **common))  # fmt: skip
    if any(v is not None for row in grey for v in row):
        fig.add_trace(go.Heatmap(z=grey, zmin=0.0, zmax=1.0, showscale=False, name="rejected",
                                 colorscale=[[0, REJECTED_COLOR], [1, REJECTED_COLOR]], texttemplate="%{text}",
                                 text=[[REJECTED_TEXT if v is not None else "" for v in row] for row in grey],
                                 **common))  # fmt: skip
    for role, label, shift in (("winner", "★ winner", -16), ("baseline", "baseline", 16)):
        for row in _with_role(best, role).itertuples():
            fig.add_annotation(x=row.precision, y=row.engine, text=label, showarrow=False, yshift=shift,
                               font={"size": 11, "color": "black"})  # fmt: skip
    fig.update_layout(title=f"Best {metric.label} per engine × precision (grey: every config rejected)", height=320,
                      xaxis={"title": "precision", "type": "category"},
                      yaxis={"title": "engine", "type": "category", "autorange": "reversed"})  # fmt: skip
    return fig


def _per_cell(ordered: pd.DataFrame) -> dict[tuple[str, str], pd.Series]:
    """The first row of each engine × precision in ``ordered`` (best first): that cell's best config."""
    first = ordered.drop_duplicates(["engine", "precision"])
    return {(row["engine"], row["precision"]): row for _, row in first.iterrows()}


def _cell_hover(ok: pd.Series | None, bad: pd.Series | None, metric: Metric) -> str:
    """What a heatmap cell says on hover: its best passing config, and a better one that was rejected, with why."""
    lines = []
    if ok is not None:
        lines.append(f"best: {_text(ok['config_label'])}: {ok[metric.column]:.4g}")
    if bad is not None and (ok is None or _better(bad[metric.column], ok[metric.column], metric)):
        why = _text(bad.get("reason", ""))
        lines.append(f"{REJECTED_TEXT}: {_text(bad['config_label'])}: {bad[metric.column]:.4g}<br>{why}")
    return "<br>".join(lines)


def _text(value: object) -> str:
    """Plain text for Plotly's hover, which reads a few HTML tags: a reason's ``<`` and ``>`` (``0.917 < 0.99;
    300 MB > 100 MB``) would read as a tag and vanish. Plotly turns the entities back into the characters."""
    return html.escape(str(value), quote=False)


def _better(a: float, b: float, metric: Metric) -> bool:
    return a > b if metric.higher_is_better else a < b


def ci_bars(best: pd.DataFrame, metric: Metric, title: str | None = None) -> go.Figure:
    """One horizontal bar per config in ``best``'s order (best on top), with its 95% CI where there is one.

    The winner is green with ★, the baseline grey with a dashed line at its value; a rejected config
    (:func:`rejected`) light grey and hatched, "✗ rejected" in its label and its reason on hover. The
    axis turns logarithmic (1-2-5 ticks) when the configs differ by more than :data:`LOG_RATIO`.
    """
    roles = best["role"] if "role" in best else pd.Series("", index=best.index)
    out = rejected(best)
    reasons = best["reason"].fillna("") if "reason" in best else pd.Series("", index=best.index)
    error = None
    if metric.ci is not None:
        low, high = best[metric.ci[0]], best[metric.ci[1]]
        error = {"type": "data", "array": (high - best[metric.column]).tolist(),
                 "arrayminus": (best[metric.column] - low).tolist(), "visible": True}  # fmt: skip
    base, name = baselines(best), baseline_name(best)
    colors = [REJECTED_COLOR if n else WINNER_COLOR if r == "winner" else BASELINE_COLOR if b
              else _engine_color(e) for n, r, b, e in zip(out, roles, base, best["engine"], strict=True)]  # fmt: skip
    hover = [f"{e} {p}" + (f"<br>{REJECTED_TEXT}: {_text(why)}" if n else "")
             for e, p, n, why in zip(best["engine"], best["precision"], out, reasons, strict=True)]  # fmt: skip
    fig = go.Figure(
        go.Bar(
            y=[role_label(label, r, n, baseline=b, name=name)
               for label, r, n, b in zip(best["config_label"], roles, out, base, strict=True)],
            x=best[metric.column],
            orientation="h",
            error_x=error,
            marker={"color": colors, "pattern": {"shape": [REJECTED_PATTERN if n else "" for n in out]}},
            hovertext=hover,
        )
    )
    values = [best[metric.column], *([best[metric.ci[1]]] if metric.ci else [])]
    log = _axis(fig, "x", values, _is_ms(metric.label))
    baseline = best[base]
    if not baseline.empty:
        _line(fig, "v", float(baseline[metric.column].iloc[0]), name, BASELINE_COLOR)
    fig.update_layout(title=(title or f"{metric.label} with 95% CI") + (" (log scale)" if log else ""),
                      xaxis_title=metric.label, yaxis={"autorange": "reversed"},
                      height=140 + 32 * len(best), margin={"l": 10})  # fmt: skip
    return fig


def roofline(df: pd.DataFrame, title: str = "Distance to this device's limit") -> go.Figure:
    """One horizontal bar per config (:func:`queries.roofline`): its share of its precision's peak on this device,
    coloured by precision, a dashed line at 100% (the microbenchmark's speed); the GOP/s, the peak and the
    median on hover. A config at 30% can gain from tuning; one near 100% only from a cheaper precision."""
    precisions = sorted(df["precision"].unique())
    fig = go.Figure()
    for precision in precisions:
        part = df[df["precision"] == precision]
        hover = [f"{g:.3g} GOP/s of a {p:.3g} GOP/s {precision} peak; {op:.3g} GOP a call, median {short_ms(ms)}"
                 for g, p, op, ms in zip(part["gops"], part["peak_gops"], part["gop"], part["median_ms"], strict=True)]  # fmt: skip
        fig.add_trace(go.Bar(y=part["config_label"], x=part["share_of_peak"] * 100, orientation="h", name=precision,
                             hovertext=hover, marker={"color": _engine_color(precision)}))  # fmt: skip
    _line(fig, "v", 100.0, "peak", LIMIT_COLOR)
    fig.update_layout(title=title, xaxis_title="share of the precision's peak (%)",
                      yaxis={"autorange": "reversed", "categoryorder": "array", "categoryarray": list(df["config_label"])},
                      height=140 + 32 * len(df), margin={"l": 10}, legend_title_text="precision")  # fmt: skip
    return fig


def distributions(samples: pd.DataFrame, labels: dict[int, str], baseline: Iterable[int] | None = None) -> go.Figure:
    """Per-call latency of each trial as a box plot (the raw samples, not a summary), in ``labels`` order.

    ``labels`` carry the roles (:func:`role_label`); ``baseline`` the trials of the study's baseline (by default
    those labelled as the ORT fp32 default). Whiskers stop at 1.5 IQR and slower calls show as points; the axis
    turns logarithmic when those spread over more than :data:`LOG_RATIO`.
    """
    df = samples.assign(config=samples["trial_id"].map(labels))
    order = list(dict.fromkeys(labels.values()))
    base = ({labels[t] for t in baseline if t in labels} if baseline is not None
            else {c for c in order if c.startswith(BASELINE_LABEL)})  # fmt: skip
    fig = go.Figure()
    for config in order:
        part = df[df["config"] == config]
        color = (REJECTED_COLOR if REJECTED_TEXT in config else WINNER_COLOR if "★" in config
                 else BASELINE_COLOR if config in base else _PALETTE[0])  # fmt: skip
        fig.add_trace(go.Box(x=part["config"], y=part["latency_ms"], name=config, boxpoints="outliers",
                             marker_color=color, showlegend=False))  # fmt: skip
    log = _axis(fig, "y", [df["latency_ms"]], ms=True)
    fig.update_layout(title="Latency distributions (per call)" + (" (log scale)" if log else ""),
                      yaxis_title="latency (ms)", xaxis_tickangle=-20, height=460)  # fmt: skip
    return fig


def pareto(df: pd.DataFrame, limits: Limits, objective: str | None = None) -> go.Figure:
    """Latency vs accuracy drop (%) and latency vs peak memory, one point per config, coloured by verdict.

    ``df`` is :func:`queries.verdicts` of one row per config. The study's constraints are drawn
    as red dashed lines: the accuracy budget, the memory cap and the latency SLA where it had them
    (a ``server`` study's SLA bounds the p99 under load, not this latency: not drawn). The winner
    is a star, the baseline an open diamond around its point.
    """
    m = df[df["latency_ms"].notna()].copy()
    m["accuracy_drop"] = m["accuracy_drop"].fillna(0.0)
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.1,
                        subplot_titles=("accuracy drop vs FP32", "peak memory above the worker's baseline"))  # fmt: skip
    hover = "%{text}<br>latency %{x:.4g} ms<br>accuracy drop %{customdata[0]:.2%}<br>memory %{customdata[1]:.1f} MB" \
            "<br>%{customdata[2]}<extra>%{fullData.name}</extra>"  # fmt: skip
    for name, color in VERDICT_COLORS.items():
        part = m[m["verdict"] == name]
        if part.empty:
            continue
        marker = {"color": color, "size": 18 if name == "winner" else 10, "symbol": "star" if name == "winner" else "circle"}
        custom = list(zip(part["accuracy_drop"], part["peak_rss_mb"].fillna(0.0), part["reason"].fillna(""), strict=True))
        for col, y in ((1, part["accuracy_drop"]), (2, part["peak_rss_mb"])):
            fig.add_trace(go.Scatter(x=part["latency_ms"], y=y, mode="markers", name=name, legendgroup=name,
                                     showlegend=col == 1, marker=marker, text=part["config_label"],
                                     customdata=custom, hovertemplate=hover), row=1, col=col)  # fmt: skip
    base = m[baselines(m)]
    for col, y in ((1, base["accuracy_drop"]), (2, base["peak_rss_mb"])):
        fig.add_trace(go.Scatter(x=base["latency_ms"], y=y, mode="markers", name=f"baseline: {baseline_name(m)}",
                                 legendgroup="baseline", showlegend=col == 1 and not base.empty, hoverinfo="skip",
                                 marker={"symbol": "diamond-open", "size": 20, "color": BASELINE_COLOR,
                                         "line": {"width": 2}}), row=1, col=col)  # fmt: skip
    sla = limits.sla_ms if sla_bounds_latency(objectives.stored(objective)) else None
    xs = [m["latency_ms"], pd.Series([sla] if sla is not None else [], dtype=float)]
    log = _axis(fig, "x", xs, ms=True, col=1)
    _axis(fig, "x", xs, ms=True, col=2)
    _limit(fig, "h", limits.max_accuracy_drop, "accuracy budget {:.2%}", col=1)
    _limit(fig, "h", limits.max_memory_mb, "memory cap {:g} MB", col=2)
    for col in (1, 2):
        _limit(fig, "v", sla, "latency SLA {:g} ms", col=col)
    top = max([limits.max_accuracy_drop, *m["accuracy_drop"]]) * 1.15
    fig.update_yaxes(tickformat=".1%", range=[min(0.0, m["accuracy_drop"].min()) - 0.02 * top, top], row=1, col=1)
    mem = [v for v in [limits.max_memory_mb, *m["peak_rss_mb"].dropna()] if v is not None]
    fig.update_yaxes(ticksuffix=" MB", range=[0, max(mem, default=1.0) * 1.15], row=1, col=2)
    fig.update_xaxes(title_text="latency, p90 (ms)" + (" (log)" if log else ""))
    fig.update_layout(title="Latency vs accuracy drop and memory, one point per config (red dashes: the constraints)",
                      height=480, legend={"orientation": "h", "y": -0.2})  # fmt: skip
    return fig


def history(df: pd.DataFrame, value_label: str, winner: str | None = None,
            baseline: float | None = None, name: str = BASELINE_NAME) -> go.Figure:  # fmt: skip
    """Optuna's history: each trial's value and the best feasible value so far.

    Trials of the ``winner`` config are stars; ``baseline`` (the ORT fp32 default's re-measured
    statistic, in the value's unit) is a dashed line.
    """
    done = df[df["value"].notna()]
    won = done["config"] == winner
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=done.loc[~won, "number"], y=done.loc[~won, "value"], mode="markers", name="trial",
                             text=done.loc[~won, "config"], marker={"size": 9}))  # fmt: skip
    if won.any():
        fig.add_trace(go.Scatter(x=done.loc[won, "number"], y=done.loc[won, "value"], mode="markers",
                                 name=f"★ winner config ({winner})", text=done.loc[won, "config"],
                                 marker={"size": 16, "symbol": "star", "color": WINNER_COLOR}))  # fmt: skip
    fig.add_trace(go.Scatter(x=df["number"], y=df["best_so_far"], mode="lines", name="best so far",
                             line={"shape": "hv"}))  # fmt: skip
    log = _axis(fig, "y", [done["value"], pd.Series([baseline] if baseline else [], dtype=float)],
                ms="ms" in value_label)  # fmt: skip
    if baseline is not None:
        _line(fig, "h", baseline, f"{name} (re-measured)", BASELINE_COLOR)
    fig.update_layout(title="Optimization history" + (" (log scale)" if log else ""), xaxis_title="trial",
                      yaxis_title=value_label, height=380)  # fmt: skip
    return fig


def importance(df: pd.DataFrame, n_trials: int) -> go.Figure:
    """Parameter importance (fANOVA) as bars; the title says how many trials it rests on.

    Parameters, not configs: there is no winner or baseline to mark here.
    """
    fig = px.bar(df.iloc[::-1], x="importance", y="param", orientation="h")
    fig.update_layout(title=f"Parameter importance (fANOVA, from {n_trials} complete trials)", height=80 + 40 * len(df))
    return fig


def across_devices(df: pd.DataFrame, metric: Metric) -> go.Figure:
    """Best ``metric`` per engine/precision, one bar group per device fingerprint; roles written on the bars.

    A bar whose config was rejected (:func:`rejected`: the page shows one only where no config of that
    engine/precision passed) is hatched and reads "✗ rejected", its reason on hover.
    """
    roles = df["role"] if "role" in df else pd.Series("", index=df.index)
    out = rejected(df)
    df = df.assign(
        config=df["engine"] + "/" + df["precision"],
        device_label=df["cpu"] + " (" + df["device"].str[:8] + ")",
        mark=[_mark(n, r, b) for n, r, b in zip(out, roles, baselines(df), strict=True)],
        label=df["config_label"].map(_text),
        why=df["reason"].fillna("").map(_text) if "reason" in df else "",
        pattern=[REJECTED_PATTERN if n else "" for n in out],
    )
    fig = px.bar(df, x="config", y=metric.column, color="device_label", barmode="group", text="mark",
                 custom_data=["label", "why", "pattern"],
                 labels={metric.column: metric.label, "config": "", "device_label": "device"})  # fmt: skip
    fig.update_traces(textposition="outside",
                      hovertemplate="%{customdata[0]}: %{y:.4g}<br>%{customdata[1]}<extra>%{fullData.name}</extra>")  # fmt: skip
    # One trace per device (px keeps each device's rows in order), in its device's colour: hatch its rejected bars.
    for trace in fig.data:
        trace.marker.pattern.shape = [row[2] for row in trace.customdata]
    log = _axis(fig, "y", [df[metric.column]], _is_ms(metric.label))
    fig.update_layout(title=f"{metric.label} across devices (★ each device's winner)" + (" (log scale)" if log else ""),
                      height=420)  # fmt: skip
    return fig


def _mark(rejected: bool, role: str, baseline: bool) -> str:
    if rejected:
        return REJECTED_TEXT
    return "★ winner" if role == "winner" else "baseline" if baseline else ""


#: A fleet winner weaker than a finalist-proven one (screening only, under load): hatched, its caveats written on it.
CAVEAT_PATTERN = "."


def fleet_job(rows: pd.DataFrame, title: str) -> go.Figure:
    """One fleet job's devices side by side (rows of :func:`queries.fleet_rows`): each device's winner value in its
    statistic's unit (a time in µs, ms or s, as reads best), with its interval where the record has one; a winner with
    caveats is hatched and names them.

    In a profile job each device's bar is the profiled config's value (blue) in the statistic of its own winner (green,
    from its latest tune job) beside it, the ratio written on it. The axis turns logarithmic on a wide spread.
    """
    df = rows[rows["value"].notna()]
    profile = bool((df["kind"] == "profile").any())
    # a profile's own number where it has one in the own winner's statistic; the interval only on its own statistic
    shown = df["value_as_own"].astype(float).fillna(df["value"]) if profile else df["value"].astype(float)
    same = shown == df["value"]
    unit = df["unit"].iloc[0] if len(df) else "ms"
    scale, unit = time_unit(float(shown.max())) if unit == "ms" and len(df) else (1.0, unit)
    value, low, high = shown * scale, df["ci_low"].astype(float).where(same) * scale, df["ci_high"].astype(float).where(same) * scale  # fmt: skip
    error = {"type": "data", "array": (high - value).tolist(), "arrayminus": (value - low).tolist(),
             "visible": bool(high.notna().any())}  # fmt: skip
    hover = [f"{_text(lbl)}<br>{_text(s)} {_text(v)}" + (f"<br>{_text(c)}" if c else "")
             for lbl, s, v, c in zip(df["label"], df["statistic"], df["value_text"], df["caveats"], strict=True)]  # fmt: skip
    if profile:  # the number plotted, where it is not the one the record names
        hover = [h + ("" if same_ else f"<br>its {_text(o)}: {v:.4g} {unit_name}") for h, same_, o, v, unit_name in
                 zip(hover, same, df["own_statistic"], shown, df["unit"], strict=True)]  # fmt: skip
        marks = [vs_own_text(r, s) for r, s in zip(df["ratio"], df["own_statistic"], strict=True)]
    else:  # the speed-up over the study's baseline, then why the winner is weak
        marks = [", ".join(t for t in (f"{s:.2f}x" if pd.notna(s) else "", c) if t)
                 for c, s in zip(df["caveats"], df["speedup"], strict=True)]  # fmt: skip
    fig = go.Figure(go.Bar(x=df["device"], y=value, error_y=error, text=marks, textposition="outside", hovertext=hover,
                           name="profiled config" if profile else "★ winner", hoverinfo="text",
                           marker={"color": _PALETTE[0] if profile else WINNER_COLOR,
                                   "pattern": {"shape": [CAVEAT_PATTERN if c and not profile else "" for c in df["caveats"]]}}))  # fmt: skip
    values, statistics = [value, high], df["statistic"]
    if profile:
        own = df[df["own_value"].notna()]
        fig.add_trace(go.Bar(x=own["device"], y=own["own_value"].astype(float) * scale, name="its own winner",
                             marker={"color": WINNER_COLOR}, hoverinfo="text",
                             hovertext=[f"own winner: {_text(lbl)}<br>{_text(s)} {_text(v)}" for lbl, s, v in
                                        zip(own["own_label"], own["own_statistic"], own["own_value_text"], strict=True)]))  # fmt: skip
        values.append(own["own_value"].astype(float) * scale)
        statistics = df["own_statistic"].where(~same, df["statistic"])
    log = _axis(fig, "y", values, ms=False)
    fig.update_layout(title=_text(title) + (" (log scale)" if log else ""), barmode="group", height=360,
                      yaxis_title=f"{' / '.join(dict.fromkeys(statistics.dropna()))} ({unit})",
                      showlegend=profile, margin={"t": 60})  # fmt: skip
    return fig


def gate_changes(metrics: pd.DataFrame) -> go.Figure:
    """Each gate run's change per metric with its CI, coloured by verdict (from :func:`queries.gate_metrics`).

    The gate compares a candidate with a baseline: the baseline is the dotted zero line; there is no winner.
    """
    df = metrics[metrics["change"].notna()].copy()
    df["plus"] = (df["change_ci_high"] - df["change"]).fillna(0.0)
    df["minus"] = (df["change"] - df["change_ci_low"]).fillna(0.0)
    fig = px.scatter(df, x="created_at", y="change", color="verdict", symbol="metric", error_y="plus",
                     error_y_minus="minus", hover_data=["run_id", "reason"],
                     color_discrete_map={"pass": "#2ca02c", "fail": "#d62728", "inconclusive": "#ff7f0e"},
                     labels={"change": "change vs baseline (latency: relative; accuracy: drop)", "created_at": ""})  # fmt: skip
    fig.add_hline(y=0, line_dash="dot", line_color="grey", annotation_text="baseline (no change)",
                  annotation_position="bottom right")  # fmt: skip
    fig.update_layout(
        title="Gate history: change per metric with its interval (90%: upper end = one-sided 95% bound)",
        height=420,
    )
    return fig


# -- axes -----------------------------------------------------------------------------------

#: Engine colours: no green and no grey, which mark the winner and the baseline.
_PALETTE = ["#1f77b4", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22"]


def _with_role(best: pd.DataFrame, role: str) -> pd.DataFrame:
    if role == "baseline":
        return best[baselines(best)]
    return best[best["role"] == role] if "role" in best else best.iloc[0:0]


def _is_ms(label: str) -> bool:
    return "(ms)" in label


def _wide(values: pd.Series) -> bool:
    """Whether positive ``values`` spread over more than :data:`LOG_RATIO` (then a log axis reads better)."""
    positive = values[values > 0]
    return len(positive) > 1 and positive.max() / positive.min() > LOG_RATIO


def _axis(fig: go.Figure, axis: str, values: Iterable[pd.Series], ms: bool, col: int | None = None) -> bool:
    """Make ``axis`` logarithmic with 1-2-5 ticks (``200 µs``, ``1 ms``) when ``values`` are :func:`_wide`.

    Returns whether it did. Plotly's own log ticks label every digit (``2, 5, 10, 2``), which reads
    as nonsense; these name each tick in full, in the unit that reads best.
    """
    series = pd.concat([v.dropna().astype(float) for v in values])
    if not _wide(series):
        return False
    positive = series[series > 0]
    ticks = log_ticks(float(positive.min()), float(positive.max()))
    text = [short_ms(v) if ms else f"{v:g}" for v in ticks]
    update = fig.update_xaxes if axis == "x" else fig.update_yaxes
    where = {} if col is None else {"row": 1, "col": col}
    # The range spans the ticks, so the first and last label show (Plotly's autorange may start past the first).
    span = [math.log10(ticks[0]) - 0.02, math.log10(ticks[-1]) + 0.02]
    update(type="log", tickvals=ticks, ticktext=text, range=span, **where)
    return True


def log_ticks(low: float, high: float) -> list[float]:
    """1-2-5 tick values that span ``low`` .. ``high`` (> 0), one tick beyond each end; decades only past 3 decades."""
    first, last = math.floor(math.log10(low)), math.ceil(math.log10(high))
    steps = (1,) if last - first > 3 else (1, 2, 5)
    ticks = [round(s * 10.0**e, 12) for e in range(first, last + 1) for s in steps]
    below = [t for t in ticks if t <= low]
    above = [t for t in ticks if t >= high]
    return [t for t in ticks if (below[-1] if below else ticks[0]) <= t <= (above[0] if above else ticks[-1])]


def short_ms(ms: float) -> str:
    """A tick label for a time in ms: ``200 µs``, ``1 ms``, ``1.5 s``."""
    scale, unit = time_unit(ms)
    return f"{ms * scale:.3g} {unit}"


def _limit(fig: go.Figure, direction: str, value: float | None, text: str, col: int) -> None:
    """A constraint as a red dashed line (``h`` or ``v``) in subplot ``col``, labelled ``text.format(value)``;
    nothing when the study had none."""
    if value is not None:
        _line(fig, direction, value, text.format(value), LIMIT_COLOR, col)


def _line(fig: go.Figure, direction: str, value: float, text: str, color: str, col: int | None = None) -> None:
    """A dashed line at ``value`` (``h``: on y, ``v``: on x), across subplot ``col`` if given, labelled at its start.

    Call it after :func:`_axis`: on a log axis Plotly places shapes by value but annotations by
    log10 of it, so the label is placed here, not by ``annotation_text`` (which lands elsewhere).
    """
    suffix = "" if col in (None, 1) else str(col)
    axis = fig.layout[("xaxis" if direction == "v" else "yaxis") + suffix]
    at = math.log10(value) if axis.type == "log" else value
    dash = {"line_dash": "dash", "line_color": color}
    where = {} if col is None else {"row": 1, "col": col}
    label = {"text": text, "showarrow": False, "font": {"size": 11, "color": color}, "xanchor": "left",
             "yanchor": "bottom"}  # fmt: skip
    if direction == "h":
        fig.add_hline(y=value, **dash, **where)
        fig.add_annotation(x=0, xref=f"x{suffix} domain", y=at, yref=f"y{suffix}", **label)
    else:
        fig.add_vline(x=value, **dash, **where)
        fig.add_annotation(x=at, xref=f"x{suffix}", y=1, yref=f"y{suffix} domain", **label)


def _engine_color(engine: str) -> str:
    return _PALETTE[sum(map(ord, engine)) % len(_PALETTE)]
