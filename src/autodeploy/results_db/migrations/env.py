"""Alembic environment of the results database.

Run through :mod:`autodeploy.results_db.migrate`, which passes an open connection in
``config.attributes["connection"]`` (or a ``sqlalchemy.url`` main option) and owns the
transaction.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context

from autodeploy.results_db.schema import VERSION_TABLE, Base

config = context.config
OPTIONS = {"target_metadata": Base.metadata, "version_table": VERSION_TABLE, "compare_type": True}


def run_offline() -> None:
    context.configure(url=config.get_main_option("sqlalchemy.url"), literal_binds=True, **OPTIONS)
    with context.begin_transaction():
        context.run_migrations()


def run_online(connection: sa.Connection) -> None:
    # SQLite cannot ALTER most things in place; batch mode copies the table instead.
    context.configure(connection=connection, render_as_batch=connection.dialect.name == "sqlite", **OPTIONS)
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_offline()
elif (conn := config.attributes.get("connection")) is not None:
    run_online(conn)
else:
    engine = sa.create_engine(config.get_main_option("sqlalchemy.url"), poolclass=sa.pool.NullPool)
    with engine.begin() as conn:
        run_online(conn)
