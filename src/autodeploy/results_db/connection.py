"""How the results store reaches its database: URLs, engines and what a driver's error means.

SQLite by default (one file, WAL mode, 30 s busy timeout, foreign keys on; writes take the lock
up front with ``BEGIN IMMEDIATE``), any PostgreSQL URL for a fleet (connect timeout, pre-ping,
read-only sessions for read-only stores). A path, URL or driver that cannot work fails here,
before any query, with a :class:`~autodeploy.errors.StoreError` naming the database and the fix.
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

import platformdirs
import sqlalchemy as sa

from autodeploy.errors import StoreError, StoreLocationError

ENV_VAR = "AUTODEPLOY_DB"
BUSY_TIMEOUT_MS = 30_000
PG_CONNECT_TIMEOUT_S = 10
FIX_PATH = f"pass --db with a writable path or set {ENV_VAR}"
FIX_URL = "use sqlite:///path/to/results.db or postgresql+psycopg://user@host/dbname"

#: What a driver's error text means and how to fix it: (text it contains, reason, fix).
_DIAGNOSES = (
    ("file is not a database", "the file is not an SQLite database", "pass --db with another path"),
    ("malformed", "the SQLite file is damaged", "restore it from a backup, or pass --db with another path"),
    (
        "database or disk is full",
        "the disk is full",
        "free disk space or pass --db with a path on another disk",
    ),
    (  # SQLite's word for a write the file system refused: ENOSPC, EDQUOT, EFBIG in the journal or WAL
        "disk i/o error",
        "the disk refused the write (full, over a quota or a file size limit, or failing)",
        "free disk space or pass --db with a path on another disk",
    ),
    ("no space left on device", "the disk is full", "free disk space or pass --db with a path on another disk"),
    ("unable to open database file", "the file cannot be opened or created", FIX_PATH),
    ("readonly database", "the file or its folder is read-only", FIX_PATH),
    (
        "database is locked",
        f"another process held the write lock for over {BUSY_TIMEOUT_MS // 1000} s",
        "let the other autodeploy process finish, or use PostgreSQL for parallel workers",
    ),
    (
        "connection refused",
        "the PostgreSQL server refused the connection",
        "start the server or fix the host and port in the URL",
    ),
    ("could not translate host name", "the PostgreSQL host name does not resolve", "fix the host in the URL"),
    (
        "timeout expired",
        f"PostgreSQL did not answer within {PG_CONNECT_TIMEOUT_S} s",
        "check the server is up and reachable from here",
    ),
    (
        "password authentication failed",
        "PostgreSQL rejected the user or password",
        "fix the user or password",
    ),
    (  # PostgreSQL's insufficient_privilege (42501): a read-only role, or one without rights on a table
        "permission denied",
        "the database role lacks a privilege (a read-only role?)",
        "grant the role write access (GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO ROLE, "
        "and USAGE ON ALL SEQUENCES) or use a URL whose role may write",
    ),
    (
        "does not exist",
        "the PostgreSQL database or role does not exist",
        "create it (createdb NAME) or fix the URL",
    ),
)


#: Seconds a thread waits for a connection of a capped pool (``connections``) before the store's error.
POOL_WAIT_S = 120.0


def connect(url: str | None, *, readonly: bool, connections: int | None = None) -> tuple[sa.Engine, str]:
    """An engine for ``url`` (default ``$AUTODEPLOY_DB``, else the user SQLite file) and the URL to show; on
    PostgreSQL, ``connections`` caps its pool (a fleet agent's budget), else SQLAlchemy's default pool grows.

    The URL shown hides the password. A SQLite path is checked first, so that a missing folder or
    an unwritable file says so instead of SQLite's "unable to open"; a read-only SQLite store opens
    the file with ``mode=ro``, so that the database itself refuses writes.
    """
    target, shown = _resolve_url(url)
    if target.get_backend_name() == "sqlite":
        target = _check_sqlite_path(target, shown, readonly=readonly)
    return _create_engine(target, shown, readonly=readonly, connections=connections), shown


def default_url() -> str:
    """``sqlite:///<user data folder>/results.db``, creating the folder."""
    folder = Path(platformdirs.user_data_dir("autodeploy"))
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise StoreError(
            f"cannot open results database in {folder}: cannot create the folder ({err.strerror})",
            fix=FIX_PATH,
        ) from err
    return sa.URL.create("sqlite", database=str(folder / "results.db")).render_as_string()


def _resolve_url(url: str | None) -> tuple[sa.URL, str]:
    url = url or os.environ.get(ENV_VAR) or default_url()
    if "://" not in url:  # a plain file path
        url = sa.URL.create("sqlite", database=url).render_as_string()
    try:
        parsed = sa.make_url(url)
    except (sa.exc.ArgumentError, ValueError) as err:  # ValueError: a port that is not a number
        raise StoreError(f"cannot open results database {url!r}: not a database URL", fix=FIX_URL) from err
    shown = parsed.render_as_string(hide_password=True)
    if parsed.get_backend_name() not in ("sqlite", "postgresql"):
        raise StoreError(
            f"cannot open results database {shown}: unknown URL scheme {parsed.drivername!r} "
            "(autodeploy stores results in SQLite or PostgreSQL)",
            fix=FIX_URL,
        )
    return parsed, shown


def _check_sqlite_path(url: sa.URL, shown: str, *, readonly: bool) -> sa.URL:
    """Fail early, with the reason, where SQLite would only say 'unable to open'."""
    if url.database and url.database.startswith("file:"):
        if not readonly:
            return url
        url = url.set(database=_uri_path(url.database, shown))
    if not url.database or url.database == ":memory:":
        return url

    def fail(reason: str, fix: str = FIX_PATH) -> StoreError:
        return StoreLocationError(f"cannot open results database {shown}: {reason}", fix=fix)

    path = Path(url.database).absolute()
    if path.is_dir():
        raise fail(f"{path} is a folder, not a database file")
    if readonly:
        if not path.is_file():
            raise fail(
                "the file does not exist",
                fix="store a result first (autodeploy bench), or pass --db with an existing database",
            )
        return _readonly_uri(url, path, shown)
    if not path.parent.is_dir() or not os.access(path.parent, os.W_OK):
        raise fail(f"parent {path.parent} is not a writable folder")
    if path.exists() and not os.access(path, os.W_OK):
        raise fail("the file is not writable")
    return url


#: Query keys a read-only SQLite URL may carry: ``mode`` is replaced by ``ro``; the others cannot write.
_READONLY_KEYS = frozenset({"mode", "uri", "cache", "timeout"})
_FIX_READONLY = (
    "give sqlite:///PATH (or sqlite:///file:PATH) with no '?' or '#' in the path and no other options"
)


def _uri_path(database: str, shown: str) -> str:
    """The file a ``file:`` URI names; a query or fragment inside it (``#``, ``%3F``) would override ``mode=ro``."""
    rest = database.removeprefix("file:")
    if "?" in rest or "#" in rest:
        raise StoreLocationError(
            f"cannot open results database {shown} read-only: its file: URI has a query or fragment in the path",
            fix=_FIX_READONLY,
        )
    if rest.startswith("//"):  # file://HOST/PATH: SQLite accepts only an empty host or localhost
        host, _, tail = rest[2:].partition("/")
        if host not in ("", "localhost"):
            raise StoreLocationError(
                f"cannot open results database {shown} read-only: file URI host {host!r} is not local",
                fix=_FIX_READONLY,
            )
        rest = "/" + tail
    return unquote(rest)


def _readonly_uri(url: sa.URL, path: Path, shown: str) -> sa.URL:
    """``sqlite:///file:PATH?mode=ro&uri=true``, built from the file's path, whatever mode the URL asked for."""
    foreign = sorted(set(url.query) - _READONLY_KEYS)
    if foreign:
        raise StoreLocationError(
            f"cannot open results database {shown} read-only: option {', '.join(foreign)} is not allowed there",
            fix=_FIX_READONLY,
        )
    query = {k: v for k, v in url.query.items() if k in ("cache", "timeout")}
    return url.set(database=f"file:{quote(str(path))}", query={**query, "mode": "ro", "uri": "true"})


def _create_engine(url: sa.URL, shown: str, *, readonly: bool, connections: int | None = None) -> sa.Engine:
    kwargs: dict[str, Any] = {}
    if url.get_backend_name() == "postgresql":
        connect_args: dict[str, Any] = {}
        if "connect_timeout" not in url.query:
            connect_args["connect_timeout"] = PG_CONNECT_TIMEOUT_S
        if readonly:
            connect_args["options"] = "-c default_transaction_read_only=on"
        if "application_name" not in url.query:  # pg_stat_activity names whose connection it is (a fleet's 30 agents)
            connect_args["application_name"] = f"autodeploy pid {os.getpid()}"
        kwargs = {"connect_args": connect_args, "pool_pre_ping": True}
        if connections is not None:  # a hard cap: a thread past it waits for one to come back
            kwargs.update(pool_size=connections, max_overflow=0, pool_timeout=POOL_WAIT_S)
    elif url.database in (None, "", ":memory:"):
        kwargs = {"poolclass": sa.pool.StaticPool}  # one in-memory database, not one per connection
    try:
        engine = sa.create_engine(url, json_serializer=dumps, json_deserializer=loads, **kwargs)
    except ImportError as err:
        fix = "pip install 'autodeploy[postgres]'" if url.get_backend_name() == "postgresql" else FIX_URL
        raise StoreError(
            f"cannot open results database {shown}: its driver is not installed ({err})", fix=fix
        ) from err
    except sa.exc.ArgumentError as err:  # includes NoSuchModuleError: unknown driver
        raise StoreError(f"cannot open results database {shown}: {err}", fix=FIX_URL) from err
    except (ValueError, TypeError) as err:  # an option of the wrong type: ?timeout=abc
        raise StoreError(f"cannot open results database {shown}: an option in its URL is not valid ({err})",
                         fix=FIX_URL) from err  # fmt: skip
    if url.get_backend_name() == "sqlite":
        _configure_sqlite(engine, readonly=readonly)
    return engine


def _configure_sqlite(engine: sa.Engine, *, readonly: bool) -> None:
    @sa.event.listens_for(engine, "connect")
    def on_connect(dbapi_conn: Any, _record: Any) -> None:
        # The driver's own BEGIN handling is off: on_begin below emits it, so that writes can
        # take the lock up front instead of failing with "locked" when upgrading a read lock.
        dbapi_conn.isolation_level = None
        cursor = dbapi_conn.cursor()
        cursor.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS:d}")
        cursor.execute("PRAGMA foreign_keys = ON")
        if not readonly:
            _enter_wal(cursor)
        cursor.close()

    @sa.event.listens_for(engine, "begin")
    def on_begin(conn: sa.Connection) -> None:
        conn.exec_driver_sql(
            "BEGIN IMMEDIATE" if conn.get_execution_options().get("autodeploy_write") else "BEGIN"
        )


def _enter_wal(cursor: Any) -> None:
    """Switch the file to WAL mode (it stays so), waiting as long as any other lock would.

    While another connection is switching the same new file, SQLite can answer "database is
    locked" at once instead of calling its busy handler (a plain read lock held elsewhere is
    waited for): four processes creating one new database failed this way on 9 files of 60.
    A file already in WAL mode needs no switch, so only its first connections can meet this.
    """
    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
    delay = 0.001
    while True:
        try:
            cursor.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as err:
            if "locked" not in str(err) or time.monotonic() + delay > deadline:
                raise
        time.sleep(delay)
        delay = min(delay * 2, 0.1)


#: How a JSON column keeps a non-finite number (an exact output's SQNR is infinite): PostgreSQL's json type
#: refuses JSON's non-standard ``Infinity``/``NaN``, so ``{"$float": "inf"}`` stands for it in every backend.
NONFINITE = "$float"


def _marked(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return {NONFINITE: repr(value)}  # 'inf', '-inf', 'nan': float() reads each back
    if isinstance(value, dict):
        return {k: _marked(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_marked(v) for v in value]
    return value


def _unmarked(obj: dict[str, Any]) -> Any:
    return float(obj[NONFINITE]) if len(obj) == 1 and NONFINITE in obj else obj


def dumps(value: Any) -> str:
    """A JSON column's text: strict JSON, a non-finite number as ``{"$float": "inf"}`` (:data:`NONFINITE`)."""
    return json.dumps(_marked(value), allow_nan=False)


def loads(text: str) -> Any:
    """A JSON column's value, non-finite numbers restored (rows written before as bare ``Infinity`` read too)."""
    return json.loads(text, object_hook=_unmarked)


#: PostgreSQL's SQLSTATE for a privilege the role lacks: SQLAlchemy raises it as a ProgrammingError.
INSUFFICIENT_PRIVILEGE = "42501"


def is_bug(err: sa.exc.DatabaseError) -> bool:
    """Whether a database error is ours: data that breaks the schema (IntegrityError, DataError, ProgrammingError)
    keeps its traceback; a privilege the role lacks is the database's setup and becomes one line (:func:`diagnose`)."""
    if getattr(err.orig, "sqlstate", None) == INSUFFICIENT_PRIVILEGE:
        return False
    return isinstance(err, (sa.exc.IntegrityError, sa.exc.DataError, sa.exc.ProgrammingError))


def diagnose(err: Exception) -> tuple[str, str]:
    """What a driver's error means and how to fix it: (reason with its first line, fix)."""
    text = str(getattr(err, "orig", None) or err)
    first = next((line.strip() for line in text.splitlines() if line.strip()), type(err).__name__)
    for needle, reason, fix in _DIAGNOSES:
        if needle in text.lower():
            return f"{reason} ({first[:200]})", fix
    return first[:300], f"check the database URL (--db or {ENV_VAR})"
