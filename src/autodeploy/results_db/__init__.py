"""The SQL store of every trial: schema, Alembic migrations and the :class:`Store` API."""

from autodeploy.results_db.store import DeviceRecord, ModelRecord, Store, StudyRow, TrialRow, default_url

__all__ = ["DeviceRecord", "ModelRecord", "Store", "StudyRow", "TrialRow", "default_url"]
