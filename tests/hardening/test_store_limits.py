"""Red-team cases against the results store: damaged files give one line, read-only means read-only."""

import sqlite3

import pytest

from autodeploy.errors import StoreError
from autodeploy.results_db.store import Store
from tests.cli.test_cli import run as run_cli


def _damage_tables(path, prefix):
    """Overwrite the root pages of the tables and indexes named ``prefix*``: the file opens and
    migrates (its schema and version table are intact), reading those tables fails."""
    with sqlite3.connect(path) as conn:  # no WAL left behind: the damage must be in the main file
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        roots = [r for (r,) in conn.execute("SELECT rootpage FROM sqlite_master WHERE tbl_name LIKE ? AND rootpage > 0",
                                            (prefix + "%",))]  # fmt: skip
        page = conn.execute("PRAGMA page_size").fetchone()[0]
    data = bytearray(path.read_bytes())
    for root in roots:
        data[(root - 1) * page : root * page] = b"\xa5" * page
    path.write_bytes(bytes(data))


def test_a_store_damaged_in_its_data_pages_gives_one_line(tmp_path, capsys, monkeypatch):
    path = tmp_path / "r.db"
    Store.open(f"sqlite:///{path}").close()
    _damage_tables(path, "ad_")
    monkeypatch.setenv("AUTODEPLOY_DB", f"sqlite:///{path}")
    code, out, err = run_cli(capsys, "results", "list")
    assert code != 0 and "Traceback" not in err
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and "results database" in lines[0] and "fix:" in lines[0], err


@pytest.mark.parametrize("query", ["", "?mode=rwc", "?mode=rw&cache=shared"])
def test_file_uri_stores_open_read_only_when_asked(tmp_path, query):
    path = tmp_path / "r.db"
    Store.open(f"sqlite:///{path}").close()
    before = path.read_bytes()
    with Store.open(f"sqlite:///file:{path}{query}", readonly=True) as store:
        assert store.count_trials() == 0
        with store.engine.connect() as conn, pytest.raises(Exception, match="readonly|read-only"):
            conn.exec_driver_sql("CREATE TABLE evil (x INTEGER)")
    assert path.read_bytes() == before
    with pytest.raises(StoreError):
        Store.open(f"sqlite:///file:{tmp_path / 'missing.db'}?mode=rwc", readonly=True).count_trials()
    assert not (tmp_path / "missing.db").exists()


#: Every SQLite URL form: {P} is the database file. Each opens truly read-only or is refused in one line.
READONLY_FORMS = [
    "sqlite:///{P}", "sqlite:///{P}?mode=rw", "sqlite:///file:{P}", "sqlite:///file:{P}?uri=true",
    "sqlite:///file:{P}?mode=rwc&uri=true", "sqlite:///file://localhost{P}", "sqlite:///file:{P}#",
    "sqlite:///file:{P}%23", "sqlite:///file:{P}%3Fmode%3Drw?uri=true", "sqlite:///file:{P}%3Fmode%3Drw%26x%3D1",
    "sqlite:///file:{P}?immutable=1", "sqlite:///file:{P}?vfs=unix-none", "sqlite:///{P}?nolock=1",
    "sqlite:///:memory:", "sqlite://", "sqlite:///file::memory:?uri=true",
]  # fmt: skip


@pytest.mark.parametrize("form", READONLY_FORMS)
def test_every_sqlite_url_form_is_read_only_or_refused(tmp_path, form):
    path = tmp_path / "r.db"
    Store.open(f"sqlite:///{path}").close()
    before = path.read_bytes()
    try:
        store = Store.open(form.format(P=path), readonly=True)
    except StoreError as exc:
        assert "\n" not in str(exc) and ("read-only" in str(exc) or "does not exist" in str(exc)), exc
    else:
        with store, store.engine.connect() as conn:
            for sql in ("CREATE TABLE evil (x INTEGER)", "INSERT INTO autodeploy_alembic_version VALUES ('x')"):
                with pytest.raises(Exception, match="readonly|read-only"):
                    conn.exec_driver_sql(sql)
                conn.rollback()
    assert path.read_bytes() == before
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT count(*) FROM sqlite_master WHERE name = 'evil'").fetchone() == (0,)


def test_control_characters_in_model_names_never_reach_the_terminal(tmp_path, capsys, monkeypatch):
    """An input named with ANSI escapes (a hostile model) is printed with the escapes made visible."""
    import onnx
    from onnx import TensorProto, helper

    name = "\x1b[2J\x1b[31mx\x1b[0m"
    graph = helper.make_graph([helper.make_node("Relu", [name], ["y"])], "g",
                              [helper.make_tensor_value_info(name, TensorProto.FLOAT, ["N", "K"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", "K"])])  # fmt: skip
    path = tmp_path / "ansi.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    monkeypatch.setenv("AUTODEPLOY_DB", f"sqlite:///{tmp_path / 'r.db'}")
    monkeypatch.setenv("AUTODEPLOY_CACHE", str(tmp_path / "cache"))
    code, out, err = run_cli(capsys, "bench", str(path))  # its dynamic dim K needs --shape: an error naming it
    assert code == 2 and "\x1b" not in err + out
    assert "\\x1b[31mx\\x1b[0m" in err, err
