"""Fleet: fleet jobs × devices, each cell the device's state and winner, linked to its study's trials.

The states are ``autodeploy fleet status``'s (:func:`autodeploy.fleet.jobs.status`): a running device whose
heartbeat is older than its job allows reads ``failed``, agent lost; a run row that does not fit reads
``unreadable``, alone. Every value from the store is Markdown-escaped in the grid (no link or image of a row's
is live) and plain text in the table.
"""

from __future__ import annotations

from urllib.parse import quote

import pandas as pd
import streamlit as st

from autodeploy.dashboard import cache
from autodeploy.results_db.states import JobState, JobStatus, RunState

st.title("Fleet")
records = cache.fleet_status(cache.db_url())
if not records:
    st.info("No fleet job in this store. Submit one with `autodeploy fleet submit MODEL --devices all --db URL`, "
            "and start `autodeploy agent --db URL` on each device.")  # fmt: skip
    st.stop()


def cell(device: dict) -> str:
    """The device's state and winner (speed-up over the baseline, its statistic), linked to its study."""
    text = RunState(device["state"]).marked()  # in Streamlit's colour markup
    winner = device["winner"]
    if winner:
        speedup = f", {winner['speedup']:.2f}x {cache.md(winner['statistic'])}" if winner.get("speedup") else ""  # fmt: skip
        weak = winner.get("caveats") or []  # a winner stored before caveats gets them on read (fleet/readback.py)
        text += f" {cache.md(winner['config'])}{speedup}" + (f" :orange[({cache.md(', '.join(weak))})]" if weak else "")
    elif device["reason"]:
        text += f": {cache.md(device['reason'][:80])}"
    return f"{text} [study](trials?study={quote(device['study'])})"


devices = sorted({d["device"] for r in records for d in r["devices"]})
header = "| job | " + " | ".join(cache.md(d) for d in devices) + " |"
lines = [header, "|" + " --- |" * (len(devices) + 1)]
for record in records:
    by_device = {d["device"]: d for d in record["devices"]}
    cells = [cell(by_device[d]) if d in by_device else "-" for d in devices]
    # beside the job: where it stands (running, done, done with failures, ...), or (unreadable) in red
    shown = JobState.UNREADABLE if JobState(record["state"]) == JobState.UNREADABLE else JobStatus(record["status"])
    note = f" {shown.marked(f'({shown})')}"
    job = f"{record['job']}: {cache.md(record['model'])}{note}"
    lines.append(f"| {job} | " + " | ".join(cells) + " |")
st.markdown("\n".join(lines))
for record in records:
    if record.get("reason"):  # a job row changed outside autodeploy: its one line, as text
        st.error(cache.md(record["reason"]), icon=None)
st.caption("Each device runs its own study (fleet.JOB.DEVICE); a cell's link opens it on the Trials page. "
           "A device silent for longer than its job allows (--lost-after), queued or running, reads lost.")  # fmt: skip

rows = [{"job": r["job"], "model": r["model"], "device": d["device"], "state": d["state"], "trials": d["trials"],
         "heartbeat_age_s": d["heartbeat_age_s"], "winner": (d["winner"] or {}).get("config"),
         "speedup": (d["winner"] or {}).get("speedup"), "statistic": (d["winner"] or {}).get("statistic"),
         "reason": d["reason"], "skipped": "; ".join(f"{s['engine']}: {s['reason']}" for s in d["skipped"]),
         "attempts": d["attempts"], "study": d["study"]}
        for r in records for d in r["devices"]]  # fmt: skip
st.dataframe(pd.DataFrame(rows), hide_index=True)
