"""The SQL store of every trial: schema, Alembic migrations and the :class:`Store` API."""

from autodeploy.results_db.store import (
    Catalog,
    DeviceRecord,
    DeviceRow,
    ModelRecord,
    Store,
    StudyRow,
    TrialFilter,
    TrialRow,
    default_url,
)

__all__ = ["Catalog", "DeviceRecord", "DeviceRow", "ModelRecord", "Store", "StudyRow", "TrialFilter", "TrialRow",
           "default_url"]  # fmt: skip
