"""The store conformance fixtures (SQLite and PostgreSQL) for the gate's store tests."""

from tests.results_db.conftest import db_url, store  # noqa: F401
