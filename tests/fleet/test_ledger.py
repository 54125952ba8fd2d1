"""The fleet's ledger on a real SQLite file: its writes go through the store's write transaction, which on SQLite
begins ``IMMEDIATE`` (results_db/connection.py), so a second writer is waited for rather than met half-way."""

from __future__ import annotations

import sqlite3
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from autodeploy import __version__
from autodeploy.device import probe_device
from autodeploy.errors import StoreError
from autodeploy.fleet import ledger
from autodeploy.results_db import connection
from autodeploy.results_db.store import Store


def _queued_run(store: Store) -> tuple[ledger.Agent, ledger.Run]:
    agent = ledger.register(store, "box", probe_device(), {"onnxruntime": "available"}, (), __version__)
    model = ledger.put_blob(store, b"a model")
    _, (run,) = ledger.add_job(store, model_name="m", model_file="m.onnx", model_sha256=model, data=None,
                               options={}, devices="all", lost_after_s=60.0, command=None)  # fmt: skip
    return agent, run


def _hold_write_lock(path: Path) -> sqlite3.Connection:
    """A second connection in the middle of a write: it holds the write lock and has changed a row."""
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    other.execute("UPDATE ad_fleet_agents SET version = 'other'")
    return other


def test_a_ledger_write_waits_for_another_writer_instead_of_failing_late(tmp_path: Path) -> None:
    # take() reads the run, then writes it. Begun deferred, it would read at once, then fail with "database is
    # locked" on its first write once the other writer commits (its snapshot is stale; SQLite does not wait).
    with Store.open(f"sqlite:///{tmp_path}/fleet.db") as store:
        agent, run = _queued_run(store)
        other = _hold_write_lock(tmp_path / "fleet.db")
        with ThreadPoolExecutor(1) as pool:
            taking = pool.submit(ledger.take, store, run.id, agent)
            time.sleep(0.5)
            assert not taking.done()  # waiting at BEGIN IMMEDIATE for the lock
            other.execute("COMMIT")
            taken = taking.result(timeout=30)
        other.close()
    assert taken is not None and taken[0].state == "running" and taken[0].attempts == 1


def test_a_ledger_write_past_the_busy_timeout_is_the_stores_one_line_error(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    with Store.open(f"sqlite:///{tmp_path}/fleet.db") as store:
        agent, _ = _queued_run(store)
    monkeypatch.setattr(connection, "BUSY_TIMEOUT_MS", 200)
    with Store.open(f"sqlite:///{tmp_path}/fleet.db") as store:
        other = _hold_write_lock(tmp_path / "fleet.db")
        try:
            with pytest.raises(StoreError, match=r"^cannot write to results database .*locked") as err:
                ledger.beat(store, agent.id)
        finally:
            other.close()
    assert "\n" not in str(err.value)


# -- blobs in chunks (issue 51) ----------------------------------------------------------------------------


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/fleet.db" if request.param == "sqlite" else request.getfixturevalue("postgres_url")


def _chunk_rows(store: Store, digest: str) -> list[tuple[int, int]]:
    import sqlalchemy as sa

    with store.engine.connect() as conn:
        sql = "SELECT seq, length(data) FROM ad_fleet_blob_chunks WHERE sha256 = :s ORDER BY seq"
        return [tuple(r) for r in conn.execute(sa.text(sql), {"s": digest})]


def test_a_blob_is_stored_from_a_file_in_chunks_and_read_back_to_a_file(url, tmp_path, monkeypatch) -> None:
    import sqlalchemy as sa

    monkeypatch.setattr(ledger, "BLOB_CHUNK_BYTES", 1000)
    model = tmp_path / "m.onnx"
    model.write_bytes(bytes(range(256)) * 10 + b"tail")  # 2,564 bytes: chunks of 1000, 1000, 564
    with Store.open(url) as store:
        digest = ledger.put_blob(store, model, "model m.onnx")
        assert _chunk_rows(store, digest) == [(0, 1000), (1, 1000), (2, 564)]
        assert ledger.get_blob(store, digest, tmp_path / "out", "model blob").read_bytes() == model.read_bytes()
        with store.engine.begin() as conn:  # one byte of the middle chunk changed
            conn.execute(sa.text("UPDATE ad_fleet_blob_chunks SET data = :d WHERE sha256 = :s AND seq = 1"),
                         {"d": b"x" * 1000, "s": digest})  # fmt: skip
        with pytest.raises(StoreError, match=f"^model blob {digest[:12]} .* does not match its SHA-256") as err:
            ledger.get_blob(store, digest, tmp_path / "bad", "model blob")
        assert "\n" not in str(err.value) and not (tmp_path / "bad").exists()  # nothing half-written stays
        assert ledger.put_blob(store, model) == digest  # "submit the job again" writes it anew
        assert ledger.get_blob(store, digest, tmp_path / "healed", "model blob").read_bytes() == model.read_bytes()
        assert _chunk_rows(store, digest) == [(0, 1000), (1, 1000), (2, 564)]


def test_a_blob_over_the_cap_is_refused_before_a_byte_is_read(tmp_path, monkeypatch) -> None:
    from autodeploy.errors import UsageError

    monkeypatch.setattr(ledger, "MAX_BLOB_BYTES", 10)
    (tmp_path / "big.onnx").write_bytes(b"x" * 11)
    with Store.open(f"sqlite:///{tmp_path}/fleet.db") as store:
        with pytest.raises(UsageError, match="has 11 bytes: a fleet job stores at most 10"):
            ledger.put_blob(store, tmp_path / "big.onnx", "model big.onnx")


def test_a_blob_stored_in_one_row_before_0012_reads_after_the_upgrade(url, tmp_path) -> None:
    """An old database: a blob written the old way (its bytes in ad_fleet_blobs.data) is split into chunks by the
    migration, in the database, and reads back whole."""
    import sqlalchemy as sa

    from autodeploy.results_db import migrate

    data = bytes(range(256)) * (9 * 2**12) + b"tail"  # 9 MiB and 4 bytes: three chunks of the migration's 4 MiB
    digest = __import__("hashlib").sha256(data).hexdigest()
    with Store.open(url) as store:
        migrate.downgrade(store.engine, "0011")
        with store.engine.begin() as conn:
            conn.execute(sa.text("INSERT INTO ad_fleet_blobs (sha256, size, data, created_at) VALUES (:s, :n, :d, :t)"),
                         {"s": digest, "n": len(data), "d": data, "t": ledger.now()})  # fmt: skip
        migrate.upgrade(store.engine)
        assert _chunk_rows(store, digest) == [(0, 4 * 2**20), (1, 4 * 2**20), (2, 2**20 + 4)]
        assert ledger.get_blob(store, digest, tmp_path / "out", "model blob").read_bytes() == data
        assert ledger.put_blob(store, data) == digest  # sound: kept as it is
        migrate.downgrade(store.engine, "0011")  # and back: the bytes in one row again
        with store.engine.connect() as conn:
            assert conn.execute(sa.text("SELECT data FROM ad_fleet_blobs")).scalar_one() == data
        migrate.upgrade(store.engine)


# -- retention: fleet prune (issue 51) ---------------------------------------------------------------------


WINNER = {"config": "onnxruntime/fp32/b1/t1", "uid": "u1", "statistic": "p90", "value": 1.5, "value_text": "1.500 ms",
          "speedup": 1.2, "baseline": "onnxruntime/fp32/b1/tdefault", "screening_only": False, "caveats": [],
          "headline": "p90 1.500 ms"}  # fmt: skip


def _finished_run(store: Store, agent: ledger.Agent, run: ledger.Run, bundle: bytes, days_ago: float) -> str:
    """The run taken and done with ``bundle`` as its winner bundle, finished ``days_ago`` days ago."""
    import sqlalchemy as sa

    taken, _ = ledger.take(store, run.id, agent)
    digest = ledger.put_blob(store, bundle)
    ledger.finish(store, taken, "done", winner=WINNER, bundle_sha256=digest)
    with store.engine.begin() as conn:
        conn.execute(sa.text("UPDATE ad_fleet_runs SET finished_at = :t WHERE id = :r"),
                     {"t": ledger.now() - __import__("datetime").timedelta(days=days_ago), "r": run.id})  # fmt: skip
    return digest


@pytest.mark.postgres
def test_prune_removes_old_bundles_but_never_one_a_newer_run_or_a_job_names(postgres_url, tmp_path, capsys) -> None:
    from tests.cli_runner import run_cli

    with Store.open(postgres_url) as store:
        old, new = (ledger.register(store, n, probe_device(), {"onnxruntime": "available"}, (), __version__) for n in ("old", "new"))
        model = ledger.put_blob(store, b"a model")
        def job() -> dict[str, ledger.Run]:
            _, runs = ledger.add_job(store, model_name="m", model_file="m.onnx", model_sha256=model, data=None,
                                     options={}, devices="all", lost_after_s=60.0, command=None)  # fmt: skip
            return {r.device: r for r in runs}

        first, second, third = job(), job(), job()
        gone = _finished_run(store, old, first["old"], b"old bundle " * 100_000, days_ago=40)  # 1.1 MB
        kept = _finished_run(store, new, first["new"], b"new bundle", days_ago=1)
        shared = _finished_run(store, old, second["old"], b"shared bundle", days_ago=40)
        assert _finished_run(store, new, second["new"], b"shared bundle", days_ago=2) == shared  # a newer run names it
        assert _finished_run(store, old, third["old"], b"a model", days_ago=40) == model  # a job's model: never
        # third["new"] is still queued: its job is not over, and names the model

    code, out, err = run_cli(capsys, "fleet", "prune", "--older-than", "30d", "--dry-run", "--db", postgres_url)
    assert code == 0 and "would remove 1 winner bundle(s), 1.1 MB, of 1 run(s) finished before" in out, (out, err)
    code, out, err = run_cli(capsys, "fleet", "prune", "--older-than", "30d", "--db", postgres_url)
    assert code == 0 and "removed 1 winner bundle(s), 1.1 MB, of 1 run(s)" in out, (out, err)
    code, out, _ = run_cli(capsys, "fleet", "prune", "--older-than", "30d", "--db", postgres_url)
    assert "removed 0 winner bundle(s), 0.0 MB" in out  # once is enough
    with Store.open(postgres_url) as store:
        for digest in (kept, shared, model):
            assert ledger.get_blob(store, digest, tmp_path / digest, "blob").is_file()
        assert _chunk_rows(store, gone) == []
        (run,) = [r for r in ledger.runs(store, [first["old"].job_id]) if r.device == "old"]
        assert (run.state, run.bundle_sha256, run.winner["config"]) == ("done", gone, WINNER["config"])  # both stay

    code, _, err = run_cli(capsys, "fleet", "export", str(first["old"].job_id), "--device", "old", "-o",
                           str(tmp_path / "bundle"), "--db", postgres_url)  # fmt: skip
    lines = err.strip().splitlines()
    assert code == 1 and len(lines) == 1, err
    assert f"winner bundle {gone[:12]} was pruned from results database" in lines[0] and " on 20" in lines[0]
    assert "fix: submit the job again (autodeploy fleet submit)" in lines[0]
    assert not (tmp_path / "bundle").exists()
