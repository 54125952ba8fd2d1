"""Opening a database that cannot work fails with one line naming it and the fix (SQLite and URLs)."""

from __future__ import annotations

import multiprocessing
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

from autodeploy.errors import StoreError
from autodeploy.results_db import Store, connection
from tests.results_db.factories import DEVICE, MODEL, ok_result


def open_error(url: str | None, **kw: bool) -> str:
    with pytest.raises(StoreError) as info:
        Store.open(url, **kw)
    message = str(info.value)
    assert "\n" not in message and "; fix: " in message
    return message


def test_parent_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "plain").write_text("not a folder")
    url = f"sqlite:///{tmp_path}/plain/results.db"
    assert open_error(url) == (
        f"cannot open results database {url}: parent {tmp_path}/plain is not a writable folder; "
        "fix: pass --db with a writable path or set AUTODEPLOY_DB"
    )


def test_parent_is_missing(tmp_path: Path) -> None:
    assert "parent " + str(tmp_path / "no" / "such") + " is not a writable folder" in open_error(
        f"sqlite:///{tmp_path}/no/such/results.db"
    )


def test_path_is_a_folder(tmp_path: Path) -> None:
    assert f"{tmp_path} is a folder, not a database file" in open_error(f"sqlite:///{tmp_path}")


def test_file_is_not_a_database(tmp_path: Path) -> None:
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is a text file, not SQLite\n" * 100)
    for readonly in (False, True):
        message = open_error(f"sqlite:///{junk}", readonly=readonly)
        assert f"results database sqlite:///{junk}: the file is not an SQLite database" in message
        assert message.endswith("fix: pass --db with another path")
    assert junk.read_bytes().startswith(b"this is a text file")


def test_readonly_needs_an_existing_file(tmp_path: Path) -> None:
    assert "the file does not exist; fix: store a result first" in open_error(
        f"sqlite:///{tmp_path}/missing.db", readonly=True
    )
    assert not (tmp_path / "missing.db").exists()


def test_disk_full_rolls_back_and_says_so(tmp_path: Path) -> None:
    with Store.open(f"sqlite:///{tmp_path}/full.db") as store:
        kept = store.add_trial(ok_result("kept"), model=MODEL, device=DEVICE)
        with store.engine.connect() as conn:
            pages = conn.exec_driver_sql("PRAGMA page_count").scalar()
        store.engine.dispose()

        # Cap the file at its current size, as a full disk would.
        @sa.event.listens_for(store.engine, "connect")
        def cap(dbapi_conn, _record) -> None:  # noqa: ANN001
            dbapi_conn.execute(f"PRAGMA max_page_count = {int(pages)}")

        with pytest.raises(
            StoreError, match=r"cannot store trial big in results database .*: the disk is full"
        ):
            store.add_trial(ok_result("big", samples_ms=tuple(range(50_000))), model=MODEL, device=DEVICE)
        assert [r.id for r in store.trials()] == [kept]


def test_unknown_scheme() -> None:
    message = open_error("mysql://user@host/db")
    assert "cannot open results database mysql://user@host/db: unknown URL scheme 'mysql'" in message
    assert message.endswith("fix: use sqlite:///path/to/results.db or postgresql+psycopg://user@host/dbname")
    assert open_error("postgresql://host:port/db").startswith(
        "cannot open results database 'postgresql://host:port/db': not a database URL; fix: use sqlite:///"
    )


def test_unknown_driver() -> None:
    assert "cannot open results database postgresql+nodriver://h/db:" in open_error(
        "postgresql+nodriver://h/db"
    )


def test_missing_postgres_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "psycopg", None)  # import psycopg now raises ImportError
    message = open_error("postgresql+psycopg://user:secret@db.example/results")
    assert message.startswith(
        "cannot open results database postgresql+psycopg://user:***@db.example/results:"
    )
    assert "driver is not installed" in message and message.endswith(
        "fix: pip install 'autodeploy[postgres]'"
    )
    assert "secret" not in message


def test_postgres_unreachable() -> None:
    pytest.importorskip("psycopg")
    from tests.conftest import _free_port

    url = f"postgresql+psycopg://postgres:hunter2@127.0.0.1:{_free_port()}/results"
    message = open_error(url)
    assert message.startswith(f"cannot open results database {url.replace('hunter2', '***')}: ")
    assert "refused the connection" in message and "fix: start the server" in message
    assert "hunter2" not in message


def test_default_location_and_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = tmp_path / "user-data" / "autodeploy"
    monkeypatch.setattr(connection.platformdirs, "user_data_dir", lambda app: str(data))
    monkeypatch.delenv("AUTODEPLOY_DB", raising=False)
    with Store.open() as store:
        assert store.url == f"sqlite:///{data}/results.db"
    assert (data / "results.db").is_file()

    monkeypatch.setenv("AUTODEPLOY_DB", f"sqlite:///{tmp_path}/env.db")
    with Store.open() as store:
        assert store.url == f"sqlite:///{tmp_path}/env.db"
    with Store.open(str(tmp_path / "plain-path.db")) as store:  # a plain path means SQLite
        assert store.url == f"sqlite:///{tmp_path}/plain-path.db"


def test_sqlite_pragmas(tmp_path: Path) -> None:
    with Store.open(f"sqlite:///{tmp_path}/p.db") as store, store.engine.connect() as conn:
        pragma = {name: conn.exec_driver_sql(f"PRAGMA {name}").scalar() for name in
                  ("journal_mode", "busy_timeout", "foreign_keys")}  # fmt: skip
    assert pragma == {"journal_mode": "wal", "busy_timeout": 30000, "foreign_keys": 1}


def _journal_mode(path: str) -> str:
    engine, _ = connection.connect(f"sqlite:///{path}", readonly=False)
    try:
        with engine.connect() as conn:
            return str(conn.exec_driver_sql("PRAGMA journal_mode").scalar())
    finally:
        engine.dispose()


def test_processes_racing_to_create_one_file_all_wait_for_the_wal_switch(tmp_path: Path) -> None:
    # SQLite refuses the switch to WAL at once ("database is locked"), without waiting its busy
    # timeout, while another process is opening or switching the same new file. Before
    # connection._enter_wal retried, this loop failed in 5 runs of 5 (CI met it once in
    # test_store's concurrent writers).
    with multiprocessing.get_context("fork").Pool(4) as pool:
        for i in range(150):
            assert pool.map(_journal_mode, [str(tmp_path / f"new{i}.db")] * 4) == ["wal"] * 4
