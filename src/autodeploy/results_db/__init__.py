"""The SQL store of every trial: schema, Alembic migrations and the :class:`Store` API.

The records (:mod:`.records`), the database connection (:mod:`.connection`), the row mapping
(:mod:`.rows`) and the :class:`Store` facade (:mod:`.store`) are separate modules; import the
names from here.
"""

from autodeploy.results_db.connection import default_url
from autodeploy.results_db.records import (
    Catalog,
    DeviceRecord,
    DeviceRow,
    ExportRow,
    GateRunRecord,
    GateRunRow,
    ModelRecord,
    StoredTrial,
    StudyRow,
    TrialFilter,
    TrialRow,
)
from autodeploy.results_db.store import Store

__all__ = ["Catalog", "DeviceRecord", "DeviceRow", "ExportRow", "GateRunRecord", "GateRunRow", "ModelRecord", "Store",
           "StoredTrial", "StudyRow", "TrialFilter", "TrialRow", "default_url"]  # fmt: skip
