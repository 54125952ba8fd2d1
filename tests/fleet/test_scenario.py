"""The issue's "done when", with real agents: one job on two devices, one agent killed with -9 mid-tune.

``fleet submit zoo:tiny-cnn --devices all`` while only edge-a is registered; edge-a starts and is killed
once its study has stored a trial; its run reads ``running``, then ``lost``; edge-b registers late, inside the
job's ``--accept-late`` window, and takes the ``all`` job; edge-a restarts, takes its run back when the lease lapses
and resumes the study; edge-b is stopped with SIGTERM once it stored a trial (its run goes back to the queue) and
started again. Both end ``done`` with a winner, no measured trial lost or repeated, and ``fleet export`` writes
a bundle ``bundle verify`` accepts. The Fleet dashboard page is then checked in AppTest and in Chromium.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.fleet.conftest import JOB, Agents, database, finish, query, screening_trials, wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

LOST_AFTER_S = "4"


@dataclass(frozen=True)
class Scenario:
    url: str
    job: int
    status: dict
    before_stop: dict[str, list[tuple[str, str]]]  # each device's screening trials when it was killed or stopped
    logs: dict[str, str]


def cli(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "autodeploy", *argv], capture_output=True, text=True, timeout=120)


def device(status: dict, name: str) -> dict:
    """The device's entry in a job's status; an empty one before it has a run."""
    return next((d for d in status["devices"] if d["device"] == name), {})


def register(url: str, name: str) -> None:
    """Register a device of this machine as its agent would (the agent refreshes what it probes when it starts)."""
    from autodeploy import __version__
    from autodeploy.device import probe_device
    from autodeploy.fleet import ledger
    from autodeploy.results_db.store import Store

    with Store.open(url) as store:
        ledger.register(store, name, probe_device(), {"onnxruntime": "available"}, (), __version__)


def alive(proc: subprocess.Popen) -> bool:
    """True while the agent runs; its stderr in the failure when it ended before it should."""
    if proc.poll() is not None:
        pytest.fail(f"the agent ended with {proc.returncode}: {proc.stderr.read()[-3000:]}")
    return True


def tensorrt_missing() -> bool:
    from autodeploy.adapters import registry
    from autodeploy.device import probe_device

    return not registry.get("tensorrt").probe(probe_device()).available


@pytest.fixture(scope="module")
def scenario(postgres_server: str) -> Scenario:
    from autodeploy.fleet import jobs
    from autodeploy.results_db.store import Store

    agents = Agents()
    with database(postgres_server) as url:
        try:
            register(url, "edge-a")  # known before the job: its run is made at submission
            # A device that lacks an engine runs the rest: TensorRT is asked for where it cannot run.
            extra = ["--engine", "onnxruntime", "--engine", "tensorrt"] if tensorrt_missing() else []
            done = cli("fleet", "submit", "zoo:tiny-cnn", "--devices", "all", *JOB, *extra, "--lost-after", LOST_AFTER_S,
                       "--accept-late", "1h", "--db", url, "--format", "json")  # fmt: skip
            assert done.returncode == 0, done.stderr
            job = json.loads(done.stdout)["job"]
            study = f"fleet.{job}.edge-a"
            first = agents.start(url, "edge-a")
            before = wait_for("edge-a's first stored trial", lambda: alive(first) and screening_trials(url, study))
            os.kill(first.pid, signal.SIGKILL)  # mid-tune: a power loss
            first.wait(timeout=10)
            with Store.open(url, readonly=True) as store:
                assert device(jobs.status(store, job)[0], "edge-a")["state"] == "running"
                lost = wait_for("edge-a to read as lost", lambda: device(jobs.status(store, job)[0], "edge-a")["state"] == "lost", timeout=30)  # fmt: skip
            assert lost
            late = agents.start(url, "edge-b")  # registers after the job was submitted
            again = agents.start(url, "edge-a")
            # edge-b is stopped as systemd stops it (SIGTERM to the agent alone): its run goes back to the queue
            with Store.open(url, readonly=True) as store:  # its first trial (one edge-a measured is taken from the store)
                wait_for("edge-b's first trial", lambda: alive(late) and device(jobs.status(store, job)[0], "edge-b").get("trials"))
            b_before = screening_trials(url, f"fleet.{job}.edge-b")
            late.send_signal(signal.SIGTERM)
            code, out, err = finish(late)
            assert code == 0 and "stopped" in out and f"job {job}: back in the queue" in err, err
            with Store.open(url, readonly=True) as store:
                assert device(jobs.status(store, job)[0], "edge-b")["state"] == "queued"
            logs = {}
            for name, proc in (("edge-b", agents.start(url, "edge-b")), ("edge-a", again)):
                code, out, err = finish(proc)
                assert code == 0, f"{name}: {err}"
                logs[name] = err
            status = json.loads(cli("fleet", "status", str(job), "--db", url, "--format", "json").stdout)
            yield Scenario(url, job, status, {"edge-a": before, "edge-b": b_before}, logs)
        finally:
            agents.close()


def test_both_devices_end_done_with_a_winner(scenario):
    assert scenario.status["job"] == scenario.job and scenario.status["schema"] == "autodeploy.fleet"
    assert {d["device"]: d["state"] for d in scenario.status["devices"]} == {"edge-a": "done", "edge-b": "done"}
    for d in scenario.status["devices"]:
        assert d["winner"]["config"].startswith("onnxruntime/fp32/") and d["winner"]["statistic"] in ("p90", "median")
        assert d["winner"]["speedup"] > 0 and d["trials"] == 3 and d["reason"] is None
        assert d["study"] == f"fleet.{scenario.job}.{d['device']}"
        # issue 51: when each device started and ended, and how long it took (kills and restarts included)
        assert d["created_at"] <= d["started_at"] < d["finished_at"] and d["duration_s"] > 0, d
    assert device(scenario.status, "edge-a")["attempts"] == 2  # taken back after the kill
    assert device(scenario.status, "edge-b")["attempts"] == 2  # and after the stop
    assert "attempt 2: taken back" in scenario.logs["edge-a"] and "attempt 2: taken back" in scenario.logs["edge-b"]


def test_a_screening_only_winner_says_so_in_the_table_the_csv_and_the_json(scenario):
    """Issue 51: a screening-only winner (the job's one finalist round) showed the same confident cell as a
    finalist-proven one; only the JSON headline said it."""
    import csv
    import io

    assert scenario.status["status"] == "done"
    for d in scenario.status["devices"]:  # (and "under load" where the machine was busy)
        assert d["winner"]["screening_only"] and "screening only" in d["winner"]["caveats"]
    table = subprocess.run([sys.executable, "-m", "autodeploy", "fleet", "status", str(scenario.job), "--db", scenario.url],
                           capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "400"})  # no wrap
    assert table.returncode == 0 and table.stdout.count("screening only") == 2, table.stdout
    rows = list(csv.DictReader(io.StringIO(cli("fleet", "status", str(scenario.job), "--db", scenario.url,
                                               "--format", "csv").stdout)))  # fmt: skip
    assert sorted(r["device"] for r in rows) == ["edge-a", "edge-b"]  # one row per device
    assert all("screening only" in r["caveats"] for r in rows) and {r["job_status"] for r in rows} == {"done"}


def test_status_json_follows_the_schema(scenario):
    import jsonschema

    from autodeploy.report import SCHEMA

    jsonschema.validate(scenario.status, SCHEMA, cls=jsonschema.Draft202012Validator)


def test_a_missing_engine_is_skipped_with_its_reason(scenario):
    if not tensorrt_missing():
        pytest.skip("TensorRT runs here: no engine to be missing")
    for d in scenario.status["devices"]:
        assert [s["engine"] for s in d["skipped"]] == ["tensorrt"]
        assert d["skipped"][0]["reason"].startswith("unavailable: TensorRT")


@pytest.mark.parametrize("name", ["edge-a", "edge-b"])  # killed with -9; stopped with SIGTERM
def test_a_resumed_study_lost_and_repeated_no_measured_trial(scenario, name):
    from autodeploy.api import cache_dir
    from autodeploy.fleet import ledger
    from autodeploy.fleet.agent import measured_trials
    from autodeploy.fleet.provenance import study_file
    from autodeploy.results_db.store import Store

    study = f"fleet.{scenario.job}.{name}"
    after = screening_trials(scenario.url, study)
    assert set(scenario.before_stop[name]) <= set(after)  # nothing measured before the kill is gone
    keys = [key for _, key in after]
    assert len(keys) == len(set(keys))  # nor measured again after it
    with Store.open(scenario.url, readonly=True) as store:
        # the study (its search state in the agents' cache, never in the shared database) asked only for what was missing
        assert measured_trials(study_file(cache_dir() / "fleet", store, ledger.job(store, scenario.job), name), study) == 3
    assert query(scenario.url, "SELECT count(*) FROM ad_studies WHERE name = :s", s=study) == [(1,)]


def test_export_gives_a_bundle_that_bundle_verify_accepts(scenario, tmp_path):
    out = tmp_path / "edge-a-bundle"
    done = cli("fleet", "export", str(scenario.job), "--device", "edge-a", "-o", str(out), "--db", scenario.url)
    assert done.returncode == 0, done.stderr
    assert (out / "manifest.json").is_file()
    verified = cli("bundle", "verify", str(out), "--format", "json")
    assert verified.returncode == 0, verified.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["model"]["sha256"] == scenario.status["model_sha256"]


def test_the_fleet_page_shows_jobs_by_devices(scenario, monkeypatch):
    """Issue 51: human headers, no "None", short config labels (the knobs on hover), speed-ups to 2 decimals naming
    their statistic, caveats shown, a chart of the devices side by side, the Devices block, filters that filter."""
    import re

    pytest.importorskip("streamlit", reason="pip install 'autodeploy[dashboard]'")
    from streamlit.testing.v1 import AppTest

    from autodeploy.dashboard import APP, DB_ENV, cache
    from autodeploy.fleet import jobs
    from autodeploy.results_db.store import Store

    monkeypatch.setenv(DB_ENV, scenario.url)
    at = AppTest.from_file(str(APP), default_timeout=60)
    at.run()
    at.switch_page("app_pages/fleet.py")
    at.run()
    assert not at.exception and not at.error
    grid = next(m.value for m in at.markdown if m.value.startswith("| Job |"))
    assert "edge\\-a" in grid and "edge\\-b" in grid and grid.count(":green[done]") == 2
    assert f"(trials?study=fleet.{scenario.job}.edge-a " in grid  # the link, the full config as its title
    for d in scenario.status["devices"]:
        short = "/".join(d["winner"]["config"].split("/")[:4])
        assert f"[{cache.md(short)}](trials?study=fleet.{scenario.job}.{d['device']} " in grid
    assert len(re.findall(r":orange\[[^]]*screening only", grid)) == 2  # the caveat, in the cell
    assert re.search(r"\d\\\.\d\dx \\\((p90|median)\\\)", grid) and not re.search(r"\d\\\.\d{3,}x", grid)
    table = at.dataframe[0].value
    assert {"Job", "Device", "State", "Config", "Speed-up (statistic)", "Caveats", "Last heartbeat"} <= set(table.columns)  # fmt: skip
    assert not any("_" in c for c in table.columns) and "None" not in table.to_string() and not table.isna().any().any()  # fmt: skip
    assert set(table["State"]) == {"done"} and set(table["Device"]) == {"edge-a", "edge-b"}
    assert all(len(c) < 40 for c in table["Config"]) and all(table["Speed-up (statistic)"].str.match(r"\d+\.\d\dx \("))  # fmt: skip
    (chart,) = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]  # the job's devices side by side
    assert sorted(chart["data"][0]["x"]) == ["edge-a", "edge-b"]
    devices = at.dataframe[1].value  # the Devices block: both devices, one machine (one fingerprint)
    with Store.open(scenario.url, readonly=True) as store:
        fingerprints = {d["name"]: d["fingerprint"] for d in jobs.devices(store)}
    assert dict(zip(devices["Device"], devices["Fingerprint"], strict=True)) == fingerprints
    assert set(devices["Same machine as"]) == {"edge-a", "edge-b"} and "None" not in devices.to_string()
    at.multiselect(key="fleet_devices").set_value(["edge-b"]).run()  # a filter narrows the rows
    grid = next(m.value for m in at.markdown if m.value.startswith("| Job |"))
    assert "edge\\-a" not in grid and list(at.dataframe[0].value["Device"]) == ["edge-b"]
    assert list(at.dataframe[1].value["Device"]) == ["edge-b"]  # the Devices block too


def test_the_fleet_page_in_chromium_links_each_cell_to_its_study(scenario, tmp_path):
    from tests.dashboard import test_browser as browser

    if not browser.CHROMIUM.is_file():
        pytest.skip(f"no Chromium at {browser.CHROMIUM}: install Debian's package (apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright (the Python package only)")
    port, log = browser._free_port(), tmp_path / "dashboard.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "autodeploy", "dashboard", "--db", scenario.url, "--port", str(port)],
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    try:
        browser._wait_healthy(proc, port, log)
        with sync_api.sync_playwright() as p:
            chromium = p.chromium.launch(executable_path=str(browser.CHROMIUM), headless=True, args=browser.CHROMIUM_ARGS)
            try:
                page = chromium.new_page(viewport={"width": 1600, "height": 900})
                page.goto(f"http://127.0.0.1:{port}/fleet", timeout=browser.WAIT_MS)
                page.get_by_role("heading", name="Fleet").wait_for(timeout=browser.WAIT_MS)
                link = page.locator(f"a[href*='study=fleet.{scenario.job}.edge-b']")
                link.first.wait_for(timeout=browser.WAIT_MS)
                cell = page.locator("td", has=link.first)
                assert "done" in cell.inner_text() and "onnxruntime/fp32" in cell.inner_text()
                assert "screening only" in cell.inner_text() and "None" not in cell.inner_text()
                winner = device(scenario.status, "edge-b")["winner"]["config"]
                short = "/".join(winner.split("/")[:4])
                assert link.first.inner_text() == short  # the whole label on hover:
                assert link.first.get_attribute("title") == winner
                grid = page.locator("table").first  # every device on the screen: no column pushed off it
                assert grid.evaluate("t => t.scrollWidth <= t.parentElement.clientWidth + 1")
                page.locator(".js-plotly-plot").first.wait_for(timeout=browser.WAIT_MS)  # fmt: skip
                page.get_by_role("heading", name="Devices", exact=True).wait_for(timeout=browser.WAIT_MS)
                page.screenshot(path=str(Path(browser._screenshot_dir()) / "fleet.png"))
                page.goto(f"http://127.0.0.1:{port}/{link.first.get_attribute('href')}", timeout=browser.WAIT_MS)
                page.get_by_role("heading", name="Trials", exact=True).wait_for(timeout=browser.WAIT_MS)  # not "Stored trials"
                study = page.get_by_role("combobox", name="Study")
                study.wait_for(timeout=browser.WAIT_MS)
                assert study.input_value() == f"fleet.{scenario.job}.edge-b"  # the study the cell named
                assert not page.locator("[data-testid='stException']").count(), "the page raised"
            finally:
                chromium.close()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
