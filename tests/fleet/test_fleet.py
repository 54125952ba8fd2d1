"""Fleet jobs one fault at a time: cancel, a tampered blob, a renamed device, SQLite, a metric; and the rules
that need no agent (the lost-agent state, the queue's own schema)."""

from __future__ import annotations

import dataclasses
import json
from datetime import timedelta
from pathlib import Path

import pytest

from tests.cli_runner import run_cli
from tests.fleet.conftest import JOB_CONFIG, query, wait_for


def submit(url: str, devices: str = "all", config: Path = JOB_CONFIG, **options) -> int:
    from autodeploy.fleet import jobs

    return jobs.submit("zoo:tiny-cnn", db=url, devices=devices, config=config, **options).job


def register(url: str, name: str, device=None) -> None:
    from autodeploy import __version__
    from autodeploy.device import probe_device
    from autodeploy.fleet import ledger
    from autodeploy.results_db.store import Store

    with Store.open(url) as store:
        ledger.register(store, name, device or probe_device(), {"onnxruntime": "available"}, (), __version__)


def states(url: str, job: int) -> dict[str, tuple[str, str | None]]:
    from autodeploy.fleet import jobs
    from autodeploy.results_db.store import Store

    with Store.open(url, readonly=True) as store:
        return {d["device"]: (d["state"], d["reason"]) for d in jobs.status(store, job)[0]["devices"]}


# -- with agents ------------------------------------------------------------------------------------------


@pytest.mark.postgres
@pytest.mark.slow
def test_cancel_stops_a_running_device_and_withdraws_a_queued_one(postgres_url, agents, capsys):
    register(postgres_url, "edge-a")
    register(postgres_url, "edge-b")  # registered, never started: its run stays queued until the cancel
    job = submit(postgres_url, config=JOB_CONFIG.with_name("job-long.yaml"))  # still running when cancelled
    running = agents.start(postgres_url, "edge-a")
    wait_for("edge-a to run", lambda: states(postgres_url, job)["edge-a"][0] == "running")
    code, out, err = run_cli(capsys, "fleet", "cancel", str(job), "--db", postgres_url)
    assert code == 0 and f"job {job} cancelled; stopping on edge-a" in out
    assert states(postgres_url, job)["edge-b"] == ("cancelled", "the job was cancelled before it started")
    # edge-b's withdrawn from the queue; edge-a's held (picked) by its agent until it stops (which may be now)
    assert set(query(postgres_url, "SELECT entrypoint, status::text FROM autodeploy_queue.pgqueuer")) <= {("fleet.edge-a", "picked")}
    out, err = running.communicate(timeout=120)
    assert running.returncode == 0, err
    assert states(postgres_url, job)["edge-a"] == ("cancelled", "the job was cancelled while it ran")
    assert f"job {job}: cancelled" in err


@pytest.mark.postgres
@pytest.mark.slow
def test_a_tampered_model_blob_is_refused_by_the_agent(postgres_url, agents, tmp_path):
    register(postgres_url, "edge-a")
    job = submit(postgres_url)
    (sha,) = query(postgres_url, "SELECT model_sha256 FROM ad_fleet_jobs WHERE id = :j", j=job)[0]
    import sqlalchemy as sa

    engine = sa.create_engine(postgres_url, poolclass=sa.pool.NullPool)
    with engine.begin() as conn:  # one byte changed in the store's copy (its first chunk)
        data = conn.execute(sa.text("SELECT data FROM ad_fleet_blob_chunks WHERE sha256 = :s AND seq = 0"),
                            {"s": sha}).scalar_one()  # fmt: skip
        conn.execute(sa.text("UPDATE ad_fleet_blob_chunks SET data = :d WHERE sha256 = :s AND seq = 0"),
                     {"d": bytes([data[0] ^ 1]) + data[1:], "s": sha})  # fmt: skip
    engine.dispose()
    # its own cache: no good copy of the model from an earlier test to take instead
    code, _, err = agents.run(postgres_url, "edge-a", env={"AUTODEPLOY_CACHE": str(tmp_path / "cache")})
    assert code == 0, err
    state, reason = states(postgres_url, job)["edge-a"]
    assert state == "failed" and f"model blob {sha[:12]}" in reason and "does not match its SHA-256" in reason
    assert query(postgres_url, "SELECT count(*) FROM ad_trials") == [(0,)]  # nothing ran on it
    assert not (tmp_path / "cache" / "fleet" / sha).exists()


@pytest.mark.postgres
def test_a_name_registered_with_another_fingerprint_is_refused(postgres_url, agents):
    from autodeploy.device import probe_device

    other = dataclasses.replace(probe_device(), cpu_model="Another Test CPU")  # another machine's fingerprint
    register(postgres_url, "edge-x", other)
    code, out, err = agents.run(postgres_url, "edge-x")
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: device name 'edge-x' is registered with fingerprint "
                                                   f"{other.fingerprint} (Another Test CPU); this machine is "
                                                   f"{probe_device().fingerprint}")  # fmt: skip
    assert "results never mix devices; fix: give this machine its own --name" in lines[0]


# -- without agents ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("argv", [("agent", "--once"), ("fleet", "status"), ("fleet", "cancel", "1"),
                                  ("fleet", "submit", "zoo:tiny-cnn"), ("fleet", "export", "1", "--device", "a", "-o", "x")])  # fmt: skip
def test_sqlite_is_refused_in_one_line(capsys, tmp_path, argv):
    code, out, err = run_cli(capsys, *argv, "--db", f"sqlite:///{tmp_path / 'r.db'}")
    assert code == 2 and err.count("\n") == 1
    assert err.startswith("error: autodeploy fleet and agent need PostgreSQL; the results database is SQLite")
    assert not (tmp_path / "r.db").exists()  # refused before anything was opened


def test_a_fleet_job_refuses_a_metric(capsys, tmp_path):
    metric = tmp_path / "m.py"
    metric.write_text("def top1(outputs, labels):\n    return 1.0\n")
    code, _, err = run_cli(capsys, "fleet", "submit", "zoo:tiny-cnn", "--metric", f"{metric}:top1", "--db", "postgresql+psycopg://u@h/d")
    assert code == 2 and err.count("\n") == 1
    assert err.startswith("error: --metric is refused for fleet jobs: a metric is code, and a fleet job carries no code")


def test_a_config_naming_a_metric_or_a_study_is_refused(tmp_path):
    from autodeploy.errors import UsageError
    from autodeploy.fleet import jobs

    for key, value in (("metric", "m.py:f"), ("name", "mine"), ("per_shape", True)):
        config = tmp_path / f"{key}.yaml"
        config.write_text(f"model: zoo:tiny-cnn\n{key}: {value}\n")
        with pytest.raises(UsageError, match=f"fleet jobs refuse {key}"):
            jobs.submit(None, db="postgresql+psycopg://u@h/d", config=config)


def test_a_bad_device_selector_is_refused():
    from autodeploy.errors import UsageError
    from autodeploy.fleet import jobs

    for devices in ("a/b", "tag:", "../x", ""):
        with pytest.raises(UsageError, match="is not a valid name"):
            jobs.check_devices(devices)


def test_a_silent_device_reads_as_lost_after_its_job_allows_queued_or_running():
    from autodeploy.fleet import jobs, ledger
    from autodeploy.results_db.states import JobState, JobStatus, RunState

    at = ledger.now()
    job = ledger.Job(1, "zoo:tiny-cnn", "m.onnx", "0" * 64, None, {}, "all", 60.0, "open", at)
    run = ledger.Run(1, 1, "edge-a", "fleet.1.edge-a", "running", 1, 2, None, None, None, [], at - timedelta(seconds=59))
    assert jobs.device_state(run, job, at) == ("running", None)
    silent = dataclasses.replace(run, heartbeat_at=at - timedelta(seconds=61))
    state, reason = jobs.device_state(silent, job, at)
    assert state == "lost" and reason.startswith("agent lost: no heartbeat for 61 s") and "stays running" in reason
    assert jobs.device_state(dataclasses.replace(silent, state="done"), job, at)[0] == "done"  # over: never lost
    # issue 51: a queued run of a device that never comes back stayed queued forever, and its job never read over
    assert jobs.device_state(dataclasses.replace(silent, state="queued"), job, at)[0] == "lost"
    assert jobs.device_state(dataclasses.replace(run, state="queued"), job, at)[0] == "queued"
    assert JobStatus.of(JobState.OPEN, [RunState.DONE, RunState.LOST]) == JobStatus.DONE_WITH_FAILURES
    assert JobStatus.of(JobState.OPEN, [RunState.DONE, RunState.SKIPPED]) == JobStatus.DONE
    assert JobStatus.of(JobState.OPEN, [RunState.DONE, RunState.QUEUED]) == JobStatus.RUNNING
    assert JobStatus.of(JobState.OPEN, [RunState.QUEUED, RunState.QUEUED]) == JobStatus.QUEUED
    assert JobStatus.of(JobState.CANCELLED, [RunState.DONE]) == JobStatus.CANCELLED
    assert JobStatus.of(JobState.OPEN, []) == JobStatus.NO_DEVICES


@pytest.mark.postgres
def test_the_queue_lives_in_its_own_schema_outside_alembic(postgres_url):
    import asyncio

    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    from autodeploy.fleet import queue
    from autodeploy.results_db.schema import VERSION_TABLE, Base
    from autodeploy.results_db.store import Store

    with Store.open(postgres_url) as store:

        async def install_twice() -> None:  # the second finds it made
            for _ in range(2):
                async with queue.connected(postgres_url):
                    pass

        asyncio.run(install_twice())
        tables = {t for (t,) in query(postgres_url, "SELECT tablename FROM pg_tables WHERE schemaname = :s", s=queue.SCHEMA)}
        assert {"pgqueuer", "pgqueuer_log", "pgqueuer_statistics"} <= tables
        assert not {t for (t,) in query(postgres_url, "SELECT tablename FROM pg_tables WHERE schemaname = 'public' "
                                        "AND tablename LIKE 'pgqueuer%'")}  # fmt: skip
        with store.engine.connect() as conn:
            ctx = MigrationContext.configure(conn, opts={"compare_type": True, "version_table": VERSION_TABLE})
            assert compare_metadata(ctx, Base.metadata) == []  # autogenerate sees none of the queue's tables


@pytest.mark.postgres
def test_one_queued_job_per_run_and_a_late_device_adopts_an_open_all_job(postgres_url):
    import asyncio

    from autodeploy.fleet import ledger, queue
    from autodeploy.results_db.store import Store

    register(postgres_url, "edge-a")
    job = submit(postgres_url, accept_late_s=3600)
    tagged = submit(postgres_url, devices="tag:arm", accept_late_s=3600)
    closed = submit(postgres_url)  # no --accept-late: only the devices registered now
    register(postgres_url, "edge-b")  # after every job
    with Store.open(postgres_url) as store:
        agent = next(a for a in ledger.agents(store) if a.name == "edge-b")
        mine = ledger.adopt(store, agent)
        assert [(r.job_id, r.study, r.state) for r in mine] == [(job, f"fleet.{job}.edge-b", "queued")]  # not the tag job
        assert ledger.adopt(store, agent) == mine  # once

        async def enqueue_twice() -> list[dict[int, int]]:
            async with queue.connected(postgres_url) as queries:
                return [await queue.enqueue(queries, [(r.id, "edge-b") for r in mine]) for _ in range(2)]

        first, second = asyncio.run(enqueue_twice())
    assert list(first) == [mine[0].id] and second == {}  # the dedupe key: one queued job per run
    queued = [("fleet.edge-a",)] * 2 + [("fleet.edge-b",)]  # edge-a's runs of the all jobs, edge-b's late one
    assert query(postgres_url, "SELECT entrypoint FROM autodeploy_queue.pgqueuer ORDER BY id") == queued
    assert tagged not in {r.job_id for r in mine} and closed not in {r.job_id for r in mine}


def test_the_fleet_page_on_a_store_without_jobs_says_how_to_submit_one(monkeypatch, tmp_path):
    pytest.importorskip("streamlit", reason="pip install 'autodeploy[dashboard]'")
    from streamlit.testing.v1 import AppTest

    from autodeploy.dashboard import APP, DB_ENV
    from autodeploy.results_db.store import Store

    url = f"sqlite:///{tmp_path / 'results.db'}"
    Store.open(url).close()  # at head, fleet tables and all, and empty
    monkeypatch.setenv(DB_ENV, url)
    at = AppTest.from_file(str(APP), default_timeout=60)
    at.run()
    at.switch_page("app_pages/fleet.py")
    at.run()
    assert not at.exception and not at.error
    assert [t.value for t in at.title] == ["Fleet"]
    assert "autodeploy fleet submit MODEL --devices all --db URL" in at.info[0].value


@pytest.mark.postgres
@pytest.mark.slow
def test_a_job_ends_and_a_device_registering_after_takes_nothing(postgres_url, agents, capsys):
    """Issue 51's churn story: a job's state was only open or cancelled, so ``fleet status`` said ``(open)`` for a job
    every device had finished, and a device registering 17 minutes later took the old ``tag:`` job and queued the old
    ``all`` one. Now a job is over when its runs are, ``--wait`` says how, and late devices take only what a job's
    ``--accept-late`` window (``fleet close`` ends it) still allows."""
    register(postgres_url, "edge-a")
    register(postgres_url, "edge-gone")  # registered, and never comes back
    done = submit(postgres_url, devices="edge-a")
    lost = submit(postgres_url, lost_after_s=1.0)  # edge-gone's run: lost a second after it last beat
    window = submit(postgres_url, accept_late_s=3600)
    code, _, err = agents.run(postgres_url, "edge-a")
    assert code == 0, err
    code, out, err = run_cli(capsys, "fleet", "status", str(done), "--wait", "--db", postgres_url)
    assert code == 0 and f"job {done}: zoo:tiny-cnn on edge-a (done)" in out, out + err
    code, out, err = run_cli(capsys, "fleet", "status", str(lost), "--wait", "--db", postgres_url, "--format", "json")
    record = json.loads(out)
    assert code == 1 and record["status"] == "done with failures", (code, out, err)
    assert {d["device"]: d["state"] for d in record["devices"]} == {"edge-a": "done", "edge-gone": "lost"}
    code, out, _ = run_cli(capsys, "fleet", "close", str(window), "--db", postgres_url)
    assert code == 0 and f"job {window} closed" in out
    register(postgres_url, "edge-late")  # after every job ended or closed: takes none of them
    code, _, err = agents.run(postgres_url, "edge-late")
    assert code == 0, err
    assert not query(postgres_url, "SELECT r.id FROM ad_fleet_runs r JOIN ad_fleet_agents a ON a.id = r.agent_id "
                     "WHERE a.name = 'edge-late'")  # fmt: skip
    # the devices a fleet user can see: all three, one machine (one fingerprint) under three names
    code, out, _ = run_cli(capsys, "fleet", "devices", "--db", postgres_url, "--format", "json")
    seen = {d["name"]: d for d in json.loads(out)}
    assert code == 0 and set(seen) == {"edge-a", "edge-gone", "edge-late"}
    assert len({d["fingerprint"] for d in seen.values()}) == 1 and seen["edge-a"]["same_machine_as"] == ["edge-gone", "edge-late"]
    assert seen["edge-a"]["online"] and seen["edge-a"]["running"] is None and seen["edge-a"]["isa"]
    code, out, _ = run_cli(capsys, "fleet", "forget", "edge-gone", "--db", postgres_url)
    assert code == 0 and "device edge-gone retired; 2 queued run(s) cancelled" in out, out  # its lost and window runs
    code, out, _ = run_cli(capsys, "fleet", "devices", "--db", postgres_url, "--format", "json")
    assert {d["name"] for d in json.loads(out)} == {"edge-a", "edge-late"}
    code, out, _ = run_cli(capsys, "fleet", "devices", "--db", postgres_url)
    assert code == 0 and "2 fleet device(s)" in out and "online" in out and "(= edge-a, edge-gone)" in out, out
    code, out, _ = run_cli(capsys, "fleet", "devices", "--all", "--db", postgres_url, "--format", "json")
    assert next(d for d in json.loads(out) if d["name"] == "edge-gone")["retired_at"]
    assert states(postgres_url, lost)["edge-gone"] == ("cancelled", "its device was retired (fleet forget)")


@pytest.mark.postgres
def test_status_on_a_new_database_says_how_to_submit_a_job(postgres_url, capsys):
    """Issue 51: ``fleet status`` on a database nothing wrote to yet said "open it once read-write" and exited 1."""
    code, out, err = run_cli(capsys, "fleet", "status", "--db", postgres_url)
    assert code == 0 and "no fleet job yet: autodeploy fleet submit MODEL --db URL" in out, out + err
    code, out, err = run_cli(capsys, "fleet", "status", "3", "--db", postgres_url)
    assert code == 2 and "no fleet job 3" in err and "autodeploy fleet submit" in err, out + err


@pytest.mark.postgres
def test_a_resumed_run_and_its_cancel_say_what_happened(postgres_url):
    """Issue 51: a run taken back after SIGTERM read "its agent stopped; it resumes when ..." until it finished, and
    a run that had started and was requeued read "cancelled before it started" after a cancel."""
    from autodeploy.fleet import jobs, ledger
    from autodeploy.results_db.store import Store

    register(postgres_url, "edge-a")
    job = submit(postgres_url)
    with Store.open(postgres_url) as store:
        agent = next(a for a in ledger.agents(store) if a.name == "edge-a")
        (run,) = ledger.runs(store, [job])
        taken, _ = ledger.take(store, run.id, agent)
        assert taken.reason is None  # a first start has nothing to explain
        ledger.requeue(store, taken, "its agent stopped; it resumes when this device's agent runs again")
        again, _ = ledger.take(store, run.id, agent)
        assert again.reason == "resumed after its agent stopped (attempt 2)", again.reason
        ledger.requeue(store, again, "its agent stopped; it resumes when this device's agent runs again")
        (cancelled,) = jobs.cancel(store, job)
    assert cancelled.state == "cancelled" and cancelled.reason == \
        "the job was cancelled while it waited to resume (its agent had stopped)", cancelled.reason  # fmt: skip


@pytest.mark.postgres
@pytest.mark.slow
def test_sigterm_while_the_finalist_rounds_wait_ends_the_agent_in_seconds(postgres_url, agents):
    """Issue 51: the study slept between its spread finalist rounds (up to 300 s) and looked at the stop flag only
    after: SIGTERM took 103 s, and systemd's 90 s stop timeout would SIGKILL the agent with its run leased."""
    import signal
    import time

    from tests.fleet.conftest import finish

    register(postgres_url, "edge-a")
    job = submit(postgres_url, config=JOB_CONFIG.with_name("job-spread.yaml"))
    proc = agents.start(postgres_url, "edge-a")
    study = f"fleet.{job}.edge-a"
    wait_for("the first finalist round", lambda: query(postgres_url, "SELECT id FROM ad_trials WHERE study = :s AND "
                                                       "phase = 'finalist'", s=study), timeout=120)  # fmt: skip
    time.sleep(1.0)  # into the wait before round 2, due up to 300 s later
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    code, _, err = finish(proc, timeout=60)
    assert code == 0 and time.monotonic() - sent < 15, err
    assert f"job {job}: back in the queue" in err and states(postgres_url, job)["edge-a"][0] == "queued", err


@pytest.mark.postgres
@pytest.mark.slow
def test_an_agent_stays_within_its_connection_budget_while_it_tunes(postgres_url, agents):
    """Issue 51: 30 agents tuning at once peaked at 165 connections (the store's pool grew during tune), past
    PostgreSQL's default max_connections of 100. An agent's store pool is capped (``agent.STORE_CONNECTIONS``), and
    with the queue's one that is its budget, read here from pg_stat_activity while it tunes."""
    import time

    from autodeploy.fleet.agent import STORE_CONNECTIONS
    from tests.fleet.conftest import finish

    register(postgres_url, "edge-a")
    submit(postgres_url)
    proc = agents.start(postgres_url, "edge-a")
    peak: dict[str, int] = {}
    while proc.poll() is None:
        for name, n in query(postgres_url, "SELECT application_name, count(*) FROM pg_stat_activity WHERE "
                             "application_name LIKE :pid GROUP BY 1", pid=f"autodeploy% pid {proc.pid}"):  # fmt: skip
            peak[name] = max(peak.get(name, 0), n)
        time.sleep(0.1)
    code, _, err = finish(proc)
    assert code == 0, err
    assert peak.get(f"autodeploy queue pid {proc.pid}") == 1, peak
    assert 1 <= peak.get(f"autodeploy pid {proc.pid}", 0) <= STORE_CONNECTIONS, peak


def test_a_winner_stored_before_caveats_reads_its_screening_only_flag_as_one():
    from autodeploy.fleet.readback import Winner

    old = {"config": "onnxruntime/fp32/b1/t1", "statistic": "p90", "value": 1.0, "screening_only": True}
    assert Winner.model_validate(old).caveats == ["screening only"]
    assert Winner.model_validate({**old, "screening_only": False}).caveats == []
    assert Winner.model_validate({**old, "caveats": ["under load", "screening only"]}).caveats == ["under load", "screening only"]
