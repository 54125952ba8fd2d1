"""Issue 51's one answer across devices and its fleet-ready operations: a profile job (one config measured on
every device, beside each device's own winner), where a run stands (phase, place in line), an idle agent that
holds no engine, and health checks each agent hears alone."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.cli_runner import run_cli
from tests.fleet.conftest import JOB_CONFIG, wait_for
from tests.fleet.test_fleet import register, submit

#: Shared libraries of the engines an idle agent must not have loaded (probing them at registration did: 130 MB).
ENGINE_LIBRARIES = ("libonnxruntime", "libopenvino", "_pywrap_tensorflow_lite", "ai_edge_litert")


def status(url: str, job: int) -> dict:
    from autodeploy.fleet import jobs
    from autodeploy.results_db.store import Store

    with Store.open(url, readonly=True) as store:
        return jobs.status(store, job)[0]


@pytest.mark.postgres
@pytest.mark.slow
def test_a_profile_job_measures_one_config_on_every_device_beside_its_own_winner(postgres_url, agents, capsys):
    """``fleet submit --profile JOB:DEVICE`` measures that winner's config on every device (as AI Hub's profile jobs
    do): each device's numbers (median with its interval, every statistic, memory, verdict) beside its own winner,
    and what the one config costs it in its winner's statistic. The agent logs one line per trial and phase."""
    register(postgres_url, "edge-a")
    register(postgres_url, "edge-b")  # the same machine under another name: grouped in the table
    tuned = submit(postgres_url)
    for name in ("edge-a", "edge-b"):
        code, _, err = agents.run(postgres_url, name)
        assert code == 0, err
        assert f"job {tuned}: screening 3/3" in err and f"job {tuned}: finalist round 1/1" in err, err
        assert f"job {tuned}: exporting" in err, err
    own = {d["device"]: d["winner"] for d in status(postgres_url, tuned)["devices"]}
    assert all(w and w["memory_mb"] is not None and w["accuracy"].startswith("passed: ") for w in own.values()), own

    code, out, err = run_cli(capsys, "fleet", "submit", "zoo:tiny-cnn", "--profile", f"{tuned}:edge-a", "--config",
                             str(JOB_CONFIG), "--db", postgres_url, "--format", "json")  # fmt: skip
    assert code == 0, out + err
    profiled = json.loads(out)["job"]
    code, _, err = agents.run(postgres_url, "edge-a")
    assert code == 0 and f"job {profiled}: profiling" in err, err
    record = status(postgres_url, profiled)
    assert record["kind"] == "profile" and record["profile"] == own["edge-a"]["config"]
    by_device = {d["device"]: d for d in record["devices"]}
    a = by_device["edge-a"]
    assert a["state"] == "done" and a["winner"]["config"] == own["edge-a"]["config"], a
    low, high = a["winner"]["ci"]
    assert low <= a["winner"]["value"] <= high and {"median", "p90"} <= set(a["winner"]["values"]), a["winner"]
    assert a["winner"]["caveats"][0] == "one run, not finalist rounds"
    assert a["own_winner"]["job"] == tuned and a["own_winner"]["config"] == own["edge-a"]["config"]
    assert a["vs_own"]["statistic"] == own["edge-a"]["statistic"] and a["vs_own"]["ratio"] > 0, a["vs_own"]
    assert by_device["edge-b"]["state"] == "queued" and by_device["edge-b"]["queue_position"] == 1
    code, out, _ = run_cli(capsys, "fleet", "status", str(profiled), "--db", postgres_url)
    assert code == 0 and f"job {profiled}: profile of {own['edge-a']['config']}" in out, out
    assert "vs own" in out and "same machine as edge-b" in out and f"job {tuned}:" in out, out


@pytest.mark.postgres
def test_a_profile_config_that_does_not_parse_or_has_no_winner_is_refused_in_one_line(postgres_url, capsys):
    register(postgres_url, "edge-a")
    for given, said in (("onnxruntime/fp32", "is not ENGINE/PRECISION/bBATCH/tTHREADS"),
                        ("nosuch/fp32/b1/t1", "unknown engine 'nosuch'"),
                        ("999:edge-a", "fleet job 999 has no run on that device")):  # fmt: skip
        code, out, err = run_cli(capsys, "fleet", "submit", "zoo:tiny-cnn", "--profile", given, "--db", postgres_url)
        assert code == 2 and said in err and len(err.strip().splitlines()) == 1, (given, out, err)


@pytest.mark.postgres
def test_a_profile_of_an_engine_this_device_lacks_skips_it_with_the_reason(postgres_url, agents):
    from autodeploy.adapters import registry
    from autodeploy.device import probe_device

    missing = next((e for e in registry.all_engines() if not e.probe(probe_device()).available), None)
    if missing is None:
        pytest.skip("every engine runs here: no engine to be missing")
    register(postgres_url, "edge-a")
    job = submit(postgres_url, profile=f"{missing.name}/fp32/b1/t1")
    code, _, err = agents.run(postgres_url, "edge-a")
    (device,) = status(postgres_url, job)["devices"]
    assert code == 0 and device["state"] == "skipped" and device["reason"].startswith(f"{missing.name}: "), (device, err)


@pytest.mark.postgres
def test_each_queued_run_shows_its_place_in_line_and_a_running_one_its_phase(postgres_url):
    from autodeploy.fleet import ledger
    from autodeploy.results_db.states import RunPhase
    from autodeploy.results_db.store import Store

    register(postgres_url, "edge-a")
    first, second, third = (submit(postgres_url) for _ in range(3))
    assert [status(postgres_url, j)["devices"][0]["queue_position"] for j in (first, second, third)] == [1, 2, 3]
    with Store.open(postgres_url) as store:
        (agent,) = ledger.agents(store)
        run, _ = ledger.take(store, ledger.runs(store, [first])[0].id, agent)
        ledger.progress(store, run, trials=2, phase=RunPhase.SCREENING.text(2, 3))
        (running,) = status(postgres_url, first)["devices"]
        assert (running["phase"], running["queue_position"], running["trials"]) == ("screening 2/3", None, 2)
        assert status(postgres_url, second)["devices"][0]["queue_position"] == 1
        ledger.finish(store, run, "failed", reason="stopped by the test")
    assert status(postgres_url, first)["devices"][0]["phase"] is None  # over: no phase


def mapped(pid: int) -> str:
    return Path(f"/proc/{pid}/maps").read_text()


@pytest.mark.postgres
@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads /proc/PID/maps (Linux)")
def test_an_idle_agent_holds_no_engine_library_until_it_takes_a_run(postgres_url, agents):
    """Issue 51: probing the engines at registration imported every one into the agent (239 MB idle); now a child
    probes them, and the agent still registers what each engine can do here."""
    from autodeploy.fleet import ledger
    from autodeploy.results_db.store import Store

    proc = agents.start(postgres_url, "edge-idle", once=False)  # it waits for work

    def registered() -> list:
        with Store.open(postgres_url) as store:  # read-write: the schema may not be made yet
            return [a for a in ledger.agents(store) if a.name == "edge-idle"]

    (agent,) = wait_for("the agent to register", registered, timeout=60)
    assert agent.engines["onnxruntime"].startswith("available"), agent.engines
    time.sleep(1.0)  # past registration: listening, beating
    assert proc.poll() is None, proc.communicate()
    loaded = [lib for lib in ENGINE_LIBRARIES if lib in mapped(proc.pid)]
    assert not loaded, f"the idle agent loaded {loaded}"


@pytest.mark.postgres
def test_each_agent_hears_its_own_health_checks_and_a_submit_wakes_only_its_devices(postgres_url, agents):
    """PgQueuer checks its listener every 10 s with a NOTIFY on its channel: on one shared channel, each of N agents'
    checks reached all N agents (N x N deliveries). Now each agent listens on its device's channel."""
    import psycopg

    from autodeploy.fleet import queue

    register(postgres_url, "edge-a")
    register(postgres_url, "edge-b")
    heard: dict[str, list[dict]] = {queue.CHANNEL: [], queue.channel_of("edge-a"): [], queue.channel_of("edge-b"): []}
    with psycopg.connect(queue.dsn(postgres_url), autocommit=True) as conn:
        for channel in heard:
            conn.execute(psycopg.sql.SQL("LISTEN {}").format(psycopg.sql.Identifier(channel)))
        agents.start(postgres_url, "edge-a", once=False)
        deadline = time.monotonic() + 25
        submitted = False
        while time.monotonic() < deadline:
            for note in conn.notifies(timeout=1.0, stop_after=1):
                heard[note.channel].append(json.loads(note.payload))
            if not submitted and heard[queue.channel_of("edge-a")]:
                submit(postgres_url, devices="edge-b")  # wakes edge-b's channel only
                submitted = True
    kinds = {channel: {e["type"] for e in events} for channel, events in heard.items()}
    assert "health_check_event" in kinds[queue.channel_of("edge-a")], kinds
    assert "health_check_event" not in kinds[queue.CHANNEL] | kinds[queue.channel_of("edge-b")], kinds
    assert submitted and "table_changed_event" in kinds[queue.channel_of("edge-b")], kinds
