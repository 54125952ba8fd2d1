"""Winners: per model × device, the study's winner, its speed-up over the ORT fp32 default, and the runner-up.

Every number comes from the study record ``autodeploy tune`` and ``autodeploy results studies``
print (the finalists' re-measured values), so the page and the CLI agree.
"""

from __future__ import annotations

import streamlit as st

from autodeploy.dashboard import cache, charts, queries

st.title("Winners")
url, filters = cache.db_url(), cache.filters()
table = cache.winners(url, filters)
if table.empty:
    st.info("No finished study matches the filters. Run one with `autodeploy tune MODEL`; its winner shows here.")
    st.stop()

st.caption("Per model × device and objective, the newest finished study: its finalists re-measured interleaved, "
           "as `autodeploy tune` printed them. Speed-up is over the study's baseline (the ONNX Runtime fp32 default; LiteRT fp32 "
           "for a .tflite), re-measured beside "
           "the finalists (>1 is faster): the median of the per-round ratios of the statistic named, with its "
           "interval over rounds; a winner from fewer than 3 rounds is a screening result only.")  # fmt: skip
shown = ["model", "cpu", "objective", "winner", "winner_value", "speedup", "limit", "runner_up", "runner_up_value",
         "tie_with", "limits", "rejected", "study", "note"]  # fmt: skip
st.dataframe(table[shown], hide_index=True, column_config={
    "winner_value": "winner [interval]",
    "speedup": "speed-up vs its baseline [interval] (statistic)",
    "limit": st.column_config.TextColumn("distance to the limit", help="the winner's GOP/s as a share of its "
                                         "precision's peak on this device, and what int8 would take at that share"),
    "runner_up": "runner-up",
    "runner_up_value": "runner-up [interval]",
    "tie_with": "tied with the winner",
    "limits": "constraints",
    "rejected": st.column_config.NumberColumn("configs rejected", help="configs the study's constraints rejected "
                                              "(the Pareto page lists each with its reason)"),
})  # fmt: skip

finalists = cache.finalists(url, filters)
few = finalists[(finalists["n_samples"] > 0) & (finalists["n_samples"] < queries.FEW_SAMPLES)]
if not few.empty:
    st.warning(f"{len(few)} finalist(s) have fewer than {queries.FEW_SAMPLES} samples: their confidence intervals "
               "are rough. Re-run with a longer `--min-duration` for firmer ones.")  # fmt: skip

st.subheader("Finalists of each study")
if (finalists["verdict"] == queries.REJECTED).any():
    st.caption("A finalist its study's constraints rejected (where no config met them, the finalists are "
               "best-so-far, not winners) is grey and hatched, its reason on hover.")  # fmt: skip
for row in table.itertuples():
    bars, metric = queries.finalist_bars(finalists[finalists["study"] == row.study], row.objective)
    if bars.empty:
        st.caption(f"{cache.md(row.model)} on {cache.md(row.cpu)} ({cache.md(row.study)}): no finalist has a value. "
                   f"{cache.md(row.note)}")
        continue
    title = f"{row.model} on {row.cpu}: {row.study}"
    st.plotly_chart(charts.ci_bars(bars, metric, title=title), key=f"winners_{row.study}")
