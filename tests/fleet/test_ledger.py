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
