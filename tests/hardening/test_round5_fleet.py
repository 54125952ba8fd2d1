"""Issue 47, the fleet's run state: fencing a stale agent, whose run it is, ``.pt2`` jobs, healing a damaged blob,
job data refs, scratch folders left by kill -9, and a read-only database role. A real PostgreSQL (the suite's
throwaway cluster) and real agent processes (``tests/fleet/conftest.py``)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.cli_runner import run_cli
from tests.fleet import conftest as fleet
from tests.fleet.conftest import JOB, JOB_CONFIG, finish, query, screening_trials, wait_for

pytestmark = pytest.mark.postgres
agents = fleet.agents  # the fixture: agent processes, killed with their workers when a test ends


def register(url: str, name: str) -> None:
    from autodeploy import __version__
    from autodeploy.device import probe_device
    from autodeploy.fleet import ledger
    from autodeploy.results_db.store import Store

    with Store.open(url) as store:
        ledger.register(store, name, probe_device(), {"onnxruntime": "available"}, (), __version__)


def submit(url: str, devices: str) -> int:
    from autodeploy.fleet import jobs

    return jobs.submit("zoo:tiny-cnn", db=url, devices=devices, config=JOB_CONFIG).job


def run_of(url: str, job: int, device: str) -> dict[str, Any]:
    """The run row of ``job`` on ``device``, as stored."""
    ((run_id, state, attempts, reason, winner, bundle, trials),) = query(
        url, "SELECT r.id, r.state, r.attempts, r.reason, r.winner, r.bundle_sha256, r.trials FROM ad_fleet_runs r "
        "JOIN ad_fleet_agents a ON a.id = r.agent_id WHERE r.job_id = :j AND a.name = :n", j=job, n=device)  # fmt: skip
    return {"id": run_id, "state": state, "attempts": attempts, "reason": reason, "winner": winner,
            "bundle_sha256": bundle, "trials": trials}  # fmt: skip


def enqueue(url: str, runs: list[tuple[int, str]]) -> dict[int, int]:
    """Queue ``(run id, device entrypoint)`` pairs as the submitter does (fleet/queue.py)."""
    from autodeploy.fleet import queue

    async def put() -> dict[int, int]:
        async with queue.connected(url) as queries:
            return await queue.enqueue(queries, runs)

    return asyncio.run(put())


def job_options() -> dict[str, Any]:
    """The study options of the test job (tests/fleet/job.yaml), as ``fleet submit`` stores them."""
    from autodeploy.search import config as study_config

    cfg = study_config.validate(study_config.read(JOB_CONFIG), {"model": "zoo:tiny-cnn"})
    return {
        k: v
        for k, v in cfg.model_dump(mode="json").items()
        if k not in ("model", "name", "data", "metric", "per_shape")
    }


def execute(url: str, sql: str, **params: Any) -> None:
    """One SQL statement on the test database, committed (bound parameters)."""
    import sqlalchemy as sa

    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text(sql), params)
    finally:
        engine.dispose()


def lines_with(text: str, needle: str) -> list[str]:
    return [line for line in text.splitlines() if needle in line]


# -- 6: fencing ----------------------------------------------------------------------------------------------


def test_a_stale_holder_cannot_write_a_run_another_agent_took_and_finished(postgres_url):
    from autodeploy.fleet import ledger
    from autodeploy.results_db.store import Store

    register(postgres_url, "edge-a")
    with Store.open(postgres_url) as store:
        (agent,) = ledger.agents(store)
        model = ledger.put_blob(store, b"not a model: never run here")
        _, (queued,) = ledger.add_job(store, model_name="m", model_file="m.onnx", model_sha256=model, data=None,
                                      options={}, devices="all", lost_after_s=60.0, command=None)  # fmt: skip
        stale, _ = ledger.take(store, queued.id, agent)  # attempt 1, then its lease lapses
        fresh, _ = ledger.take(store, queued.id, agent)  # attempt 2: the device's next agent
        assert (stale.attempts, fresh.attempts) == (1, 2)
        ledger.progress(store, fresh, trials=3)
        winner = {"config": "onnxruntime/fp32/t1", "value": 0.001}
        ledger.finish(store, fresh, "done", winner=winner, bundle_sha256=model)
        writes = {"progress": lambda: ledger.progress(store, stale, trials=1),
                  "note_skipped": lambda: ledger.note_skipped(store, stale, [{"engine": "x", "reason": "y"}]),
                  "finish": lambda: ledger.finish(store, stale, "failed",
                                                  reason="internal error: ValueError: Cannot tell a FAIL trial."),
                  "requeue": lambda: ledger.requeue(store, stale, "its agent stopped"),
                  "check_held": lambda: ledger.check_held(store, stale)}  # fmt: skip
        for what, write in writes.items():
            with pytest.raises(
                ledger.StaleRun, match=r"taken over by another agent \(attempt 2, now done\)"
            ) as caught:
                write()
            assert "attempt 1 stopped and wrote nothing" in str(caught.value), what
    row = run_of(postgres_url, queued.job_id, "edge-a")
    assert (row["state"], row["attempts"], row["trials"], row["reason"]) == ("done", 2, 3, None)
    assert row["winner"] == winner and row["bundle_sha256"] == model
    assert query(postgres_url, "SELECT skipped FROM ad_fleet_runs WHERE id = :r", r=queued.id) == [
        (None,)
    ]  # never noted


def no_open_transaction(url: str, cache: Path) -> bool:
    """No session of the test database sits inside a transaction, and no SQLite file of the agents' cache (their
    local study files) is locked: a stopped agent would hold its locks, and the next would wait on them."""
    import sqlite3

    if query(url, "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() "
             "AND state <> 'idle'"):  # fmt: skip
        return False
    for path in cache.rglob("*.db"):
        conn = sqlite3.connect(path, timeout=0, isolation_level=None)
        try:
            conn.execute("BEGIN EXCLUSIVE")
            conn.execute("ROLLBACK")
        except sqlite3.OperationalError:
            return False
        finally:
            conn.close()
    return True


def stop_between_transactions(proc: subprocess.Popen, url: str, cache: Path) -> None:
    """SIGSTOP the agent (and its workers) at a moment it holds no open transaction, so the next agent is not
    blocked on a lock of the stopped one (this test is about the lease and the fence, not about locks)."""
    for _ in range(100):
        os.killpg(proc.pid, signal.SIGSTOP)
        time.sleep(0.2)
        if no_open_transaction(url, cache):
            return
        os.killpg(proc.pid, signal.SIGCONT)
        time.sleep(0.05)
    pytest.fail("the agent was inside a transaction at every try")


@pytest.mark.slow
def test_an_agent_stopped_past_its_lease_never_turns_a_done_run_failed(postgres_url, agents, tmp_path):
    register(postgres_url, "edge-a")
    job = submit(postgres_url, "edge-a")
    study = f"fleet.{job}.edge-a"
    cache = tmp_path / "cache"  # both agents' (one machine, one device name): its study files, its key
    env = {"AUTODEPLOY_CACHE": str(cache)}
    first = agents.start(postgres_url, "edge-a", env=env)
    wait_for(
        "edge-a's first stored trial", lambda: first.poll() is None and screening_trials(postgres_url, study)
    )
    stop_between_transactions(
        first, postgres_url, cache
    )  # mid-study, past its lease: the queue hands the run back
    try:
        code, _, err = agents.run(
            postgres_url, "edge-a", env=env
        )  # the device's next agent: attempt 2, to its end
        assert code == 0, err
        assert "attempt 2: taken back" in err and f"job {job}: done" in err, err
    finally:
        os.killpg(first.pid, signal.SIGCONT)
    done = run_of(postgres_url, job, "edge-a")
    assert done["state"] == "done" and done["winner"] and done["bundle_sha256"] and done["attempts"] == 2
    code, _, err = finish(first)  # the stale agent goes on where it stopped
    assert code == 0, err
    said = lines_with(err, "taken over")
    assert said == [line for line in said if f"job {job}: run {done['id']} was taken over by another agent "
                    "(attempt 2, now done); this agent's attempt 1 stopped and wrote nothing to it" in line]  # fmt: skip
    assert len(said) == 1, err
    assert "Traceback" not in err and "internal error" not in err
    assert run_of(postgres_url, job, "edge-a") == done  # still done, its winner and bundle kept


# -- 7: ownership --------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_forged_queue_entry_naming_another_devices_run_is_refused(postgres_url, agents, tmp_path):
    register(postgres_url, "edge-a")
    register(postgres_url, "edge-b")
    theirs = submit(postgres_url, "edge-b")
    arm = run_of(postgres_url, theirs, "edge-b")
    execute(postgres_url, "DELETE FROM autodeploy_queue.pgqueuer WHERE entrypoint = 'fleet.edge-b'")
    assert enqueue(postgres_url, [(arm["id"], "edge-a")])  # edge-b's run id on edge-a's entrypoint
    assert enqueue(postgres_url, [("../1", "edge-a")])  # and no run id at all
    mine = submit(postgres_url, "edge-a")  # after it in the queue: the agent takes the forged entry first
    cache = tmp_path / "cache"
    code, _, err = agents.run(postgres_url, "edge-a", env={"AUTODEPLOY_CACHE": str(cache)})
    assert code == 0, err
    said = lines_with(err, f"run {arm['id']}")
    assert (
        len(said) == 1
        and f"run {arm['id']} belongs to device 'edge-b', not to 'edge-a': refused, nothing run" in said[0]
    )
    assert len(lines_with(err, "payload '../1' is not a run id: refused, nothing run")) == 1
    assert run_of(postgres_url, theirs, "edge-b") == arm  # untouched: queued, never attempted
    assert arm["state"] == "queued" and arm["attempts"] == 0
    assert screening_trials(postgres_url, f"fleet.{theirs}.edge-b") == []
    assert run_of(postgres_url, mine, "edge-a")["state"] == "done"
    # 6 (scratch): the winner was exported under the agent's own scratch folder, and nothing is left there
    assert (cache / "fleet" / "scratch").is_dir() and not list((cache / "fleet" / "scratch").iterdir())


# -- 3: .pt2 jobs need --allow-pytorch -----------------------------------------------------------------------


def pt2_job(url: str, tmp_path: Path) -> tuple[int, str]:
    """A job whose model is a real ``.pt2`` (torch.export.save of a tiny module), queued for edge-a."""
    torch = pytest.importorskip("torch")
    from autodeploy.fleet import ledger
    from autodeploy.results_db.store import Store

    class Tiny(torch.nn.Module):
        def forward(self, x):
            return torch.relu(x) * 2

    path = tmp_path / "tiny.pt2"
    torch.export.save(torch.export.export(Tiny(), (torch.randn(1, 8),)), str(path))
    with Store.open(url) as store:
        sha = ledger.put_blob(store, path, "model tiny.pt2")
        job, runs = ledger.add_job(store, model_name=str(path), model_file="tiny.pt2", model_sha256=sha, data=None,
                                   options=job_options(), devices="edge-a", lost_after_s=60.0, command=None)  # fmt: skip
        ledger.set_queue_jobs(store, enqueue(url, [(r.id, r.device) for r in runs]))
    return job.id, sha


@pytest.mark.slow
def test_a_pt2_job_is_refused_without_allow_pytorch(postgres_url, agents, tmp_path):
    register(postgres_url, "edge-a")
    job, sha = pt2_job(postgres_url, tmp_path)
    cache = tmp_path / "cache"
    code, _, err = agents.run(postgres_url, "edge-a", env={"AUTODEPLOY_CACHE": str(cache)})
    assert code == 0, err
    run = run_of(postgres_url, job, "edge-a")
    assert run["state"] == "skipped" and run["winner"] is None
    assert run["reason"] == ("tiny.pt2 is a PyTorch .pt2, refused on this device (loading one comes close to running "
                             "its code); fix: start the agent with --allow-pytorch to run .pt2 jobs")  # fmt: skip
    assert len(lines_with(err, "--allow-pytorch")) == 1
    assert not (cache / "fleet" / sha).exists()  # not a byte of it written here
    assert query(postgres_url, "SELECT count(*) FROM ad_trials") == [(0,)]


def test_allow_pytorch_is_an_agent_flag(capsys):
    code, out, _ = run_cli(capsys, "agent", "--help")
    assert code == 0 and "--allow-pytorch" in out
    from autodeploy.fleet.agent import AgentSettings

    assert AgentSettings(name="edge-a").allow_pytorch is False  # refused unless the operator says so


# -- 10: put_blob heals a damaged row ------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["postgresql", "sqlite"])
def test_put_blob_heals_a_row_whose_bytes_no_longer_hash_to_its_key(request, backend, tmp_path):
    import sqlalchemy as sa

    from autodeploy.errors import StoreError
    from autodeploy.fleet import ledger
    from autodeploy.results_db.store import Store

    url = (
        request.getfixturevalue("postgres_url")
        if backend == "postgresql"
        else f"sqlite:///{tmp_path / 'r.db'}"
    )
    data = b"the model's bytes " * 1000
    with Store.open(url) as store:
        digest = ledger.put_blob(store, data)
        with store.engine.begin() as conn:  # damaged: one byte changed, and a tail cut off
            conn.execute(sa.text("UPDATE ad_fleet_blob_chunks SET data = :d WHERE sha256 = :s"),
                         {"d": bytes([data[0] ^ 1]) + data[1:-7], "s": digest})  # fmt: skip
        with pytest.raises(StoreError, match="does not match its SHA-256"):
            ledger.get_blob(store, digest, tmp_path / "damaged", "model blob")
        assert ledger.put_blob(store, data) == digest  # "submit the job again"
        assert ledger.get_blob(store, digest, tmp_path / "healed", "model blob").read_bytes() == data
        with store.engine.connect() as conn:
            assert conn.execute(
                sa.text("SELECT size FROM ad_fleet_blobs WHERE sha256 = :s"), {"s": digest}
            ).scalar_one() == len(data)
        assert ledger.put_blob(store, data) == digest  # a sound row is kept as it is


# -- partial: job data refs resolve only to blobs ------------------------------------------------------------


@pytest.mark.slow
def test_a_job_data_ref_naming_a_local_path_fails_the_run_in_one_line(postgres_url, agents, tmp_path):
    register(postgres_url, "edge-a")
    job = submit(postgres_url, "edge-a")
    planted = tmp_path / "planted"  # a folder of .npy on the device: the agent must never read it
    planted.mkdir()
    execute(postgres_url, "UPDATE ad_fleet_jobs SET data = CAST(:d AS json) WHERE id = :j",
            d=json.dumps({"ref": str(planted)}), j=job)  # fmt: skip
    code, _, err = agents.run(postgres_url, "edge-a")
    assert code == 0, err
    run = run_of(postgres_url, job, "edge-a")
    assert run["state"] == "failed" and "\n" not in run["reason"]
    assert run["reason"] == (f"fleet job {job}'s data {json.dumps({'ref': str(planted)})} is refused: a job's data is a "
                             "stored blob or sample:images, never a path on the device; fix: submit the job again "
                             "with --data FILE.npz (or sample:images)")  # fmt: skip
    assert screening_trials(postgres_url, f"fleet.{job}.edge-a") == []


# -- partial: scratch folders of killed agents are swept at start --------------------------------------------


def test_scratch_folders_of_dead_agents_are_swept_when_an_agent_starts(postgres_url, agents, tmp_path):
    import psutil

    scratch = tmp_path / "cache" / "fleet" / "scratch"
    ended = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(2)"])
    ended_at = int(psutil.Process(ended.pid).create_time())
    ended.wait()
    me = psutil.Process()
    planted = {"dead": scratch / f"{ended.pid}-{ended_at}-abc", "live": scratch / f"{me.pid}-{int(me.create_time())}-def",
               "reused pid": scratch / f"{me.pid}-{int(me.create_time()) - 3600}-ghi",
               "not an agent's": scratch / "notes"}  # fmt: skip
    for path in planted.values():
        (path / "bundle").mkdir(parents=True)
        (path / "bundle" / "model.onnx").write_bytes(b"x" * 4096)
    code, _, err = agents.run(postgres_url, "edge-a", env={"AUTODEPLOY_CACHE": str(tmp_path / "cache")})
    assert code == 0, err
    assert {what: path.exists() for what, path in planted.items()} == {"dead": False, "live": True, "reused pid": False,
                                                                        "not an agent's": True}  # fmt: skip
    assert f"removed 2 scratch folder(s) that killed agents left in {scratch}" in err


# -- partial: a read-only database role ----------------------------------------------------------------------


@pytest.fixture
def readonly_url(postgres_url):
    """The test database with a job in it, and a URL of a role that may only read it."""
    import sqlalchemy as sa
    from psycopg import sql

    from autodeploy.results_db.store import Store

    register(postgres_url, "edge-a")
    job = submit(postgres_url, "edge-a")  # the schema at head, the queue installed, a job to cancel
    role = f"autodeploy_ro_{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(postgres_url, poolclass=sa.pool.NullPool)
    grants = ["CREATE ROLE {} LOGIN", "GRANT USAGE ON SCHEMA public, autodeploy_queue TO {}",
              "GRANT SELECT ON ALL TABLES IN SCHEMA public, autodeploy_queue TO {}"]  # fmt: skip
    with admin.begin() as conn:
        for grant in grants:
            conn.exec_driver_sql(
                sql.SQL(grant).format(sql.Identifier(role)).as_string(conn.connection.driver_connection)
            )
    try:
        Store.open(postgres_url).close()
        yield sa.make_url(postgres_url).set(username=role).render_as_string(hide_password=False), job
    finally:
        with admin.begin() as conn:
            conn.exec_driver_sql(
                sql.SQL("DROP OWNED BY {}")
                .format(sql.Identifier(role))
                .as_string(conn.connection.driver_connection)
            )
            conn.exec_driver_sql(
                sql.SQL("DROP ROLE {}")
                .format(sql.Identifier(role))
                .as_string(conn.connection.driver_connection)
            )
        admin.dispose()


@pytest.mark.parametrize("argv", [("fleet", "submit", "zoo:tiny-cnn", *JOB), ("fleet", "cancel", "JOB"),
                                  ("agent", "--once", "--name", "edge-a")])  # fmt: skip
def test_a_read_only_role_is_one_line_with_the_fix(capsys, readonly_url, argv):
    url, job = readonly_url
    code, _, err = run_cli(capsys, *(str(job) if a == "JOB" else a for a in argv), "--db", url)
    assert code == 1 and "Traceback" not in err
    (line,) = err.strip().splitlines()
    assert line.startswith("error: cannot ") and f"results database {url}" in line
    assert (
        "the database role lacks a privilege (a read-only role?) (permission denied for table ad_fleet_"
        in line
    )
    assert line.endswith("; fix: grant the role write access (GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN "
                         "SCHEMA public TO ROLE, and USAGE ON ALL SEQUENCES) or use a URL whose role may write")  # fmt: skip
    assert query(url, "SELECT state FROM ad_fleet_jobs WHERE id = :j", j=job) == [
        ("open",)
    ]  # nothing written
