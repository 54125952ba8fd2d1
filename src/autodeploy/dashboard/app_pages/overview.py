"""Overview: the studies with their winners, the devices, and the winner's bundle or CSV."""

from __future__ import annotations

import streamlit as st

from autodeploy.dashboard import cache
from autodeploy.errors import AutodeployError

st.title("Overview")
url, filters = cache.db_url(), cache.filters()
studies = cache.studies(url, filters)
counts = cache.trial_counts(url, filters)  # counted by the database: the first page reads no trial rows
devices = cache.devices(url)

cols = st.columns(4)
cols[0].metric("Studies", len(studies))
cols[1].metric("Trials", sum(counts.values()))
cols[2].metric("Failed trials", sum(n for status, n in counts.items() if status != "ok"))
cols[3].metric("Devices", len(devices))

st.subheader("Studies")
if studies.empty:
    st.info("No study matches the filters. Run one with `autodeploy tune MODEL`; single runs from "
            "`autodeploy bench` show on the Compare page.")  # fmt: skip
else:
    st.dataframe(
        studies[
            [
                "name",
                "objective",
                "model",
                "cpu",
                "winner",
                "tie_with",
                "speedup",
                "limits",
                "rejected",
                "trials",
                "note",
            ]
        ],
        hide_index=True,
        column_config={
            "speedup": "speed-up vs its baseline [interval] (statistic)",
            "limits": "constraints",
            "rejected": st.column_config.NumberColumn(
                "configs rejected", help="configs its constraints rejected (the Pareto page lists why)"
            ),
        },
    )

st.subheader("Devices")
st.dataframe(devices, hide_index=True)

st.subheader("Winner")
name = cache.study_picker(list(studies["name"]), key="overview_study")
if name is not None:
    row = studies[studies["name"] == name].iloc[0]
    if row["winner"]:
        st.success(f"**{row['winner']}**" + (f" (tie with {row['tie_with']})" if row["tie_with"] else ""))
        if row["headline"]:
            st.caption(cache.md(row["headline"]))  # names its statistic, with the interval over rounds
        if row["screening_only"]:
            st.warning("Screening only: the winner rests on fewer than 3 finalist rounds; its speed-up has no interval.")
    else:
        st.warning(f"No winner: {row['note']}")
    study_trials = cache.trials(url, cache.Filters(study=name))
    cache.csv_button(
        study_trials, f"{name}-trials.csv", key="overview_csv", label="Download the study's trials (CSV)"
    )
    exporter = cache.bundle_exporter()
    if row["winner"] and exporter is not None:
        if st.button("Build the winner's bundle", key="overview_bundle"):
            try:
                with st.spinner("exporting the bundle"):
                    data, file_name = cache.build_bundle(exporter, name)
            except AutodeployError as error:  # shown in the page, with the exporter's fix
                st.error(f"cannot export the winner of {name}: {error}")
            else:
                st.download_button("Download the bundle (.tar.gz)", data, file_name=file_name,
                                   mime="application/gzip", key="overview_bundle_download")  # fmt: skip
    elif row["winner"]:
        st.caption("The bundle exporter is not installed here; export the winner from a shell:")
        st.code(cache.export_command(name), language="bash")
