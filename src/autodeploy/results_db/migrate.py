"""Alembic migrations of the results database, run programmatically (no alembic.ini).

To add a revision after changing :mod:`~autodeploy.results_db.schema`::

    from alembic import command
    from autodeploy.results_db.migrate import alembic_config
    command.revision(alembic_config(url="sqlite:////tmp/head.db"), autogenerate=True, message="...")

against a database already at head, then clean the generated file by hand.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

from autodeploy.results_db.schema import VERSION_TABLE

MIGRATIONS = Path(__file__).with_name("migrations")
#: PostgreSQL advisory lock key held while migrating, so concurrent openers take turns.
_PG_LOCK_KEY = 0x6175746F6465706C  # "autodepl"


def alembic_config(*, connection: sa.Connection | None = None, url: str | None = None) -> Config:
    """An Alembic config for our migrations, on an open connection or a URL."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    if url is not None:
        cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


@functools.cache
def head_revision() -> str:
    heads = ScriptDirectory.from_config(alembic_config()).get_heads()
    if len(heads) != 1:  # a bug in our migrations, not the user's problem
        raise RuntimeError(f"results_db migrations have {len(heads)} heads: {heads}")
    return heads[0]


def known_revisions() -> frozenset[str]:
    return frozenset(s.revision for s in ScriptDirectory.from_config(alembic_config()).walk_revisions())


def current_revision(connection: sa.Connection) -> str | None:
    """The revision the database is at; ``None`` for a database we never migrated."""
    ctx = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
    return ctx.get_current_revision()


def upgrade(engine: sa.Engine) -> None:
    """Bring the schema to head in one write transaction (no-op when already there).

    On SQLite the store begins write transactions with ``BEGIN IMMEDIATE``; on PostgreSQL an
    advisory lock does the same job, so two processes opening a new database take turns and
    the second finds it at head.
    """
    with engine.connect() as conn:
        if current_revision(conn) == head_revision():
            return
    _migrate(engine, command.upgrade, "head")


def downgrade(engine: sa.Engine, revision: str) -> None:
    """Take the schema back to ``revision`` (for tests and for undoing an upgrade by hand).

    Rows that the older schema can hold are kept: see :func:`_migrate`.
    """
    _migrate(engine, command.downgrade, revision)


def _migrate(engine: sa.Engine, step: Callable[[Config, str], None], revision: str) -> None:
    """Run one Alembic command in one write transaction.

    SQLite cannot drop or change a column in place, so batch mode copies the table and drops the
    old one. With foreign keys on, that drop cascades: every measurement of every trial would go
    with it. SQLite only lets a connection switch them off outside a transaction, so it is done
    here, before BEGIN, and checked after: a migration must leave no dangling row.
    """
    with engine.connect().execution_options(autodeploy_write=True) as conn:
        sqlite = conn.dialect.name == "sqlite"
        if sqlite:  # on the driver's connection: SQLAlchemy would open a transaction first
            conn.connection.dbapi_connection.execute("PRAGMA foreign_keys = OFF")
        try:
            with conn.begin():
                if conn.dialect.name == "postgresql":
                    conn.execute(sa.select(sa.func.pg_advisory_xact_lock(_PG_LOCK_KEY)))
                step(alembic_config(connection=conn), revision)
                if sqlite and (broken := conn.exec_driver_sql("PRAGMA foreign_key_check").fetchall()):
                    raise RuntimeError(f"migration to {revision} left rows without their parent: {broken[:3]}")
        finally:
            if sqlite:
                conn.connection.dbapi_connection.execute("PRAGMA foreign_keys = ON")
