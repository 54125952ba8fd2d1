"""Fleet: fleet jobs × devices, each cell the device's state and winner, linked to its study's trials; a chart of
each job's devices side by side; every run in a table; the fleet's devices.

The states are ``autodeploy fleet status``'s (:func:`autodeploy.fleet.jobs.status`): a device silent longer than its
job allows reads ``lost``; a run row that does not fit reads ``unreadable``, alone. A config shows as
``engine/precision/bN/tT``, its knobs on hover and in the table. While a job is queued or running the page reads the
store again every :data:`LIVE_REFRESH_S` seconds; once every job is over, never. Every value from the store is
Markdown-escaped in the grid (no link or image of a row's is live) and plain text in the tables.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import pandas as pd
import streamlit as st

from autodeploy.dashboard import cache, charts, queries
from autodeploy.results_db.states import JobState, JobStatus, RunState
from autodeploy.search.budget import duration_text
from autodeploy.units import fmt_ms_ci

#: How often the page reads the store again while a job is queued or running (seconds).
LIVE_REFRESH_S = 10
LIVE = (JobStatus.QUEUED, JobStatus.RUNNING)

st.title("Fleet")
url = cache.db_url()
if not cache.fleet_status(url) and not cache.fleet_devices(url):
    st.info("No fleet job in this store. Submit one with `autodeploy fleet submit MODEL --devices all --db URL`, "
            "and start `autodeploy agent --db URL` on each device.")  # fmt: skip
    st.stop()


def live(records: list[dict[str, Any]]) -> bool:
    return any(JobStatus(r["status"]) in LIVE for r in records)


def link(row: dict[str, Any]) -> str:
    return f"trials?study={quote(row['study'])}"


def progress(row: dict[str, Any]) -> str:
    """Where a run is: its phase, trials done (of its budget), its place in the queue."""
    bits = [row["phase"] or ""]
    if row["trials"] and row["trials_budget"]:
        bits.append(f"{row['trials']} of {row['trials_budget']} trials")
    elif row["trials"]:
        bits.append(f"{row['trials']} trials")
    if row["queue_position"] is not None and row["state"] == RunState.QUEUED:
        bits.append(f"#{row['queue_position']} in the queue")
    return ", ".join(b for b in bits if b)


def value(row: dict[str, Any], own: bool = False) -> str:
    """The winner's statistic and value, with its interval where the record has one: ``p90 91.85 µs [90.1, 93.2]``."""
    statistic, text = (row["own_statistic"], row["own_value_text"]) if own else (row["statistic"], row["value_text"])  # fmt: skip
    if not own and row["ci_low"] is not None and row["unit"] == "ms":
        text = fmt_ms_ci(row["value"], (row["ci_low"], row["ci_high"]))
    return f"{statistic} {text}" if statistic and text else ""


def speedup(row: dict[str, Any]) -> str:
    return f"{row['speedup']:.2f}x ({row['statistic']})" if row["speedup"] else ""


def cell(row: dict[str, Any]) -> str:
    """A grid cell: the state, then the winner (short config linked to its study, the full label on hover; value,
    speed-up, caveats) or a profile job's result beside the device's own winner, or the run's progress or reason."""
    text = [RunState(row["state"]).marked()]  # in Streamlit's colour markup
    if row["label"]:
        hover = cache.md(row["label"]).replace('"', '\\"')
        text.append(f'[{cache.md(row["config"])}]({link(row)} "{hover}") {cache.md(value(row))}')
        if row["kind"] == "profile" and row["own_label"]:
            versus, own = queries.vs_own_text(row["ratio"], row["own_statistic"]), f"its own winner {row['own_config']}"  # fmt: skip
            text.append(cache.md(f"{versus} than {own}" if versus else own) + f" \\({cache.md(value(row, own=True))}\\)")  # fmt: skip
        elif row["speedup"]:
            text.append(cache.md(speedup(row)))
        if row["caveats"]:
            text.append(f":orange[{cache.md(row['caveats'])}]")
    else:
        reason = row["reason"] or ""
        text += [cache.md(t) for t in (progress(row), reason[:80] + "…" * (len(reason) > 80)) if t]
        text.append(f"[study]({link(row)})")
    return " · ".join(text)


def grid(records: list[dict[str, Any]], rows: list[dict[str, Any]]) -> str:
    """Jobs × devices as a Markdown table (its devices the columns)."""
    devices = sorted({r["device"] for r in rows})
    lines = ["| Job | " + " | ".join(cache.md(d) for d in devices) + " |", "|" + " --- |" * (len(devices) + 1)]  # fmt: skip
    for record in records:
        by_device = {r["device"]: r for r in rows if r["job"] == record["job"]}
        # beside the job: where it stands (running, done, done with failures, ...), or (unreadable) in red
        shown = JobState.UNREADABLE if JobState(record["state"]) == JobState.UNREADABLE else JobStatus(record["status"])  # fmt: skip
        job = f"**{record['job']}** {cache.md(record['model'])} {shown.marked(f'({shown})')}"
        if record.get("kind") == "profile" and record.get("profile"):
            job += f" · profile of {cache.md(queries.split_label(record['profile'])[0])}"
        lines.append(f"| {job} | " + " | ".join(cell(by_device[d]) if d in by_device else "" for d in devices) + " |")  # fmt: skip
    return "\n".join(lines)


def when(iso: str | None) -> str:
    return pd.Timestamp(iso).tz_convert("UTC").strftime("%Y-%m-%d %H:%M") if iso else ""


def runs_table(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """Every run as text (empty where there is nothing), under human headers; the profile columns in a profile job."""
    profile = any(r["kind"] == "profile" for r in rows)
    out = []
    for r in rows:
        own = {"Own winner": r["own_config"] or "", "Own winner's value": value(r, own=True),
               "Profiled vs own winner": queries.vs_own_text(r["ratio"], r["own_statistic"])}  # fmt: skip
        reason = "; ".join(t for t in (r["reason"], r["skipped"] and f"skipped {r['skipped']}") if t)
        out.append({"Job": r["job"], "Model": r["model"], "Device": r["device"], "State": r["state"],
                    "Progress": progress(r), "Config": r["config"] or "", "Value": value(r),
                    "Speed-up (statistic)": speedup(r), "Caveats": r["caveats"], **(own if profile else {}),
                    "Reason": reason, "Started (UTC)": when(r["started_at"]),
                    "Took": duration_text(r["duration_s"]) if r["duration_s"] is not None else "",
                    "Last heartbeat": f"{duration_text(r['heartbeat_age_s'])} ago" if r["heartbeat_age_s"] is not None else "",
                    "Attempts": r["attempts"], "Study": link(r), "Knobs": r["knobs"] or ""})  # fmt: skip
    return pd.DataFrame(out)


def devices_table(devices: pd.DataFrame) -> pd.DataFrame:
    """The fleet's devices as text under human headers, one machine's (one fingerprint's) together."""
    return pd.DataFrame({
        "Device": devices["device"] + devices["retired"].map({True: " (retired)", False: ""}),
        "Status": devices["online"].map({True: "online", False: "offline"}).fillna(""),
        "Last heartbeat": [f"{duration_text(a)} ago" if pd.notna(a) else "" for a in devices["heartbeat_age_s"]],
        "Current run": [f"job {int(j)}, {int(t or 0)} trials" if pd.notna(j) else "" for j, t in
                        zip(devices["run_job"], devices["run_trials"], strict=True)],
        "Tags": devices["tags"], "Fingerprint": devices["fingerprint"].fillna(""),
        "Same machine as": devices["same_machine_as"], "CPU": devices["cpu"].fillna(""), "Engines": devices["engines"],
        "Engines missing": devices["missing"], "autodeploy": devices["version"].fillna(""), "ISA flags": devices["isa"],
    })  # fmt: skip


def page_filters(models: dict[int, str], names: list[str], rows: list[dict[str, Any]]) -> queries.FleetFilters:  # fmt: skip
    """The page's own filters, above the grid: jobs, devices, states (those some run is in)."""
    left, middle, right = st.columns(3)
    return queries.FleetFilters(
        jobs=tuple(left.multiselect("Job", list(models), format_func=lambda j: f"{j}: {models[j]}", key="fleet_jobs",
                                    placeholder="All jobs")),
        devices=tuple(middle.multiselect("Device", names, key="fleet_devices", placeholder="All devices")),
        states=tuple(right.multiselect("State", [s.value for s in RunState if any(r["state"] == s for r in rows)],
                                       key="fleet_states", placeholder="All states")),
    )  # fmt: skip


def filtered(records: list[dict[str, Any]], devices: list[dict[str, Any]]) -> tuple[list[dict], list[dict], set[str]]:  # fmt: skip
    """The page's filters (job, device, state) and the sidebar's that apply; the records, rows and device names kept."""
    fingerprints = {d["name"]: d["fingerprint"] for d in devices}
    rows = queries.fleet_rows(records, fingerprints)
    names = sorted({r["device"] for r in rows} | set(fingerprints))
    page, side = page_filters({r["job"]: r["model"] for r in records}, names, rows), cache.filters()
    used = [name for name, given in (("model", side.model), ("device", side.device), ("engine", side.engines)) if given]  # fmt: skip
    if used or side.scenario:
        st.caption((f"The sidebar's {' and '.join(used)} filter applies here too (engine: the winner's). " if used else "")
                   + ("Its scenario filter does not apply to fleet jobs." if side.scenario else ""))  # fmt: skip
    rows = queries.fleet_filtered(rows, page, side)
    by_device = page.devices or side.device
    kept = {r["job"] for r in rows}
    # a job no device has taken yet shows while no filter on its devices is set
    records = [r for r in records if r["job"] in kept or (not r["devices"] and not by_device and not page.states
                                                          and (not page.jobs or r["job"] in page.jobs))]  # fmt: skip
    shown = {d for d in names if (not page.devices or d in page.devices)
             and (not side.device or fingerprints.get(d) == side.device)}  # fmt: skip
    return records, rows, shown


def side_by_side(records: list[dict[str, Any]], frame: pd.DataFrame) -> None:
    """A chart per job with a value: its devices side by side, two jobs a row."""
    charted = [r for r in records if frame.loc[frame["job"] == r["job"], "value"].notna().any()]
    if charted:
        st.subheader("Devices side by side")
        columns = st.columns(2)
        for i, record in enumerate(charted):
            kind = "profile" if record.get("kind") == "profile" else "winners"
            fig = charts.fleet_job(frame[frame["job"] == record["job"]], f"job {record['job']}: {record['model']} ({kind})")  # fmt: skip
            columns[i % 2].plotly_chart(fig, key=f"fleet_chart_{record['job']}")


def draw(records: list[dict[str, Any]], devices: list[dict[str, Any]]) -> None:
    records, rows, names = filtered(records, devices)
    if not records:
        st.info("No fleet job matches the filters.")
    else:
        st.markdown(grid(records, rows))
        for record in records:
            if record.get("reason"):  # a job row changed outside autodeploy: its one line, as text
                st.error(cache.md(record["reason"]), icon=None)
        st.caption("Each device runs its own study (fleet.JOB.DEVICE): a cell's link opens it on the Trials page, the "
                   "full config on hover. Speed-ups are over each study's baseline, by the statistic named. A device "
                   "silent for longer than its job allows (--lost-after), queued or running, reads lost.")  # fmt: skip
        side_by_side(records, pd.DataFrame(rows, columns=queries.FLEET_COLUMNS))
        st.subheader("Runs")
        st.dataframe(runs_table(rows), hide_index=True, column_config={
            "Study": st.column_config.LinkColumn("Study", display_text=r"study=(.*)$", help="its trials on the Trials page"),
            "Progress": st.column_config.TextColumn("Progress", width="medium"),
            "Value": st.column_config.TextColumn("Value", width="medium", help="the statistic named, [its interval]"),
            "Knobs": st.column_config.TextColumn("Knobs", help="the engine's settings beyond engine/precision/batch/threads"),
            "Caveats": st.column_config.TextColumn("Caveats", width="medium",
                                                   help="why a winner is weaker than a finalist-proven one"),
        })  # fmt: skip
    st.subheader("Devices")
    table = queries.fleet_devices([d for d in devices if d["name"] in names])
    if table.empty:
        st.info("No fleet device matches the filters. Start `autodeploy agent --db URL --name NAME` on a device.")  # fmt: skip
        return
    st.caption("Every agent that registered, as `autodeploy fleet devices` lists them; devices that share a fingerprint "
               "run on one machine, and sit together here.")  # fmt: skip
    st.dataframe(devices_table(table), hide_index=True)


started_live = live(cache.fleet_status(url))


@st.fragment(run_every=LIVE_REFRESH_S if started_live else None)
def fleet() -> None:
    records = cache.fleet_status(url)
    if started_live and not live(records):
        st.rerun()  # every job is over now: the page once more, without the timer
    draw(records, cache.fleet_devices(url))


fleet()
