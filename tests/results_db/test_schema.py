"""The migrations build exactly the schema the models declare, on every backend."""

from __future__ import annotations

import dataclasses

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from autodeploy.errors import StoreError
from autodeploy.results_db import Store, TrialFilter, migrate
from autodeploy.results_db.schema import VERSION_TABLE, Base
from tests.results_db.factories import DEVICE, MODEL, ok_result


def schema_diff(engine: sa.Engine) -> list:
    with engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"compare_type": True, "version_table": VERSION_TABLE})
        return compare_metadata(ctx, Base.metadata)


def test_migrated_database_matches_models(store: Store) -> None:
    assert schema_diff(store.engine) == []
    with store.engine.connect() as conn:
        assert migrate.current_revision(conn) == migrate.head_revision()
        tables = set(sa.inspect(conn).get_table_names())
    assert tables == {
        "ad_devices", "ad_models", "ad_trials", "ad_studies", "ad_measurements", "ad_gate_runs", "ad_exports",
        "ad_fleet_agents", "ad_fleet_blobs", "ad_fleet_blob_chunks", "ad_fleet_jobs", "ad_fleet_runs",
        VERSION_TABLE,
    }


def test_downgrade_to_base_and_back(store: Store) -> None:
    migrate.downgrade(store.engine, "base")
    with store.engine.connect() as conn:
        assert set(sa.inspect(conn).get_table_names()) == {VERSION_TABLE}
    migrate.upgrade(store.engine)
    assert schema_diff(store.engine) == []


def test_reopening_keeps_data_and_does_not_migrate(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with Store.open(db_url) as first:
        trial_id = first.add_trial(ok_result(), model=MODEL, device=DEVICE)

    def no_upgrade(engine: sa.Engine) -> None:
        raise AssertionError("a database at head must not be migrated again")

    monkeypatch.setattr(migrate, "upgrade", no_upgrade)
    with Store.open(db_url) as second:
        assert second.count_trials() == 1
        row = second.trial(TrialFilter(id=trial_id))
        assert row is not None and row.uid == "trial-ok"


def test_newer_schema_is_refused(db_url: str) -> None:
    with Store.open(db_url) as store, store.engine.begin() as conn:
        conn.execute(sa.table(VERSION_TABLE, sa.column("version_num")).update().values(version_num="9999"))
    for readonly in (False, True):
        with pytest.raises(StoreError, match=f"9999 is newer than this autodeploy.s {migrate.head_revision()}; fix: upgrade"):
            Store.open(db_url, readonly=readonly)


def test_a_revision_0001_database_upgrades_and_keeps_its_trials(store: Store) -> None:
    """A store written before artifact hashes were kept: its trials stay, with no hashes to check."""
    trial_id = store.add_trial(ok_result(), model=MODEL, device=DEVICE)
    migrate.downgrade(store.engine, "0001")
    with store.engine.connect() as conn:
        assert "ad_exports" not in sa.inspect(conn).get_table_names()
    migrate.upgrade(store.engine)
    assert schema_diff(store.engine) == []
    row = store.trial(TrialFilter(id=trial_id))
    assert row is not None and row.uid == "trial-ok" and row.artifact_files == {}
    assert row.measurement is not None and row.measurement.latency.median == 1.25


def test_a_revision_0002_database_upgrades_and_its_trials_read_as_shape_not_recorded(store: Store) -> None:
    """A store written before trials recorded their shape: its trials stay, shown as '-', and a
    model without fixed shapes still finds them as repeats."""
    from autodeploy.report import trial_record

    trial_id = store.add_trial(ok_result(), model=MODEL, device=DEVICE)
    migrate.downgrade(store.engine, "0002")  # SQLite re-creates ad_trials to drop a column
    with store.engine.connect() as conn:
        assert "shape_key" not in {c["name"] for c in sa.inspect(conn).get_columns("ad_trials")}
    migrate.upgrade(store.engine)
    assert schema_diff(store.engine) == []
    row = store.trial(TrialFilter(id=trial_id))
    assert row is not None and row.shape_key is None and row.shapes is None and row.shape_text == "-"
    assert row.measurement is not None and row.measurement.latency.median == 1.25  # not cascaded away
    assert trial_record(row)["shape"] is None
    repeat = TrialFilter(model_sha256=MODEL.sha256, device=DEVICE.fingerprint, config_key=row.config_key,
                         engine_version=row.engine_version, shape_key="", measured_only=True)  # fmt: skip
    found = store.trial(repeat)  # "" (no fixed shapes) matches a trial stored before shapes were
    assert found is not None and found.id == trial_id
    assert store.trial(dataclasses.replace(repeat, shape_key="x=1x3x8x8")) is None
    # new trials record theirs, and show it
    result = ok_result()
    new_id = store.add_trial(type(result)(**{**result.__dict__, "uid": "trial-shaped"}), model=MODEL, device=DEVICE,
                             shape_key="x=1x3x8x8", shapes={"x": (1, 3, 8, 8)})  # fmt: skip
    shaped = store.trial(TrialFilter(id=new_id))
    assert shaped.shape_key == "x=1x3x8x8" and shaped.shapes == {"x": [1, 3, 8, 8]} and shaped.shape_text == "x=1x3x8x8"


def test_a_revision_0005_database_upgrades_and_its_measurements_read_as_load_not_recorded(store: Store) -> None:
    """Measurements stored before the load was read keep NULL; new ones store theirs."""
    from autodeploy.harness.load import Load

    trial_id = store.add_trial(ok_result(), model=MODEL, device=DEVICE)
    migrate.downgrade(store.engine, "0005")
    with store.engine.connect() as conn:
        assert "load" not in {c["name"] for c in sa.inspect(conn).get_columns("ad_measurements")}
    migrate.upgrade(store.engine)
    assert schema_diff(store.engine) == []
    row = store.trial(TrialFilter(id=trial_id))
    assert row is not None and row.measurement is not None and row.measurement.load is None
    busy = Load(other_cores=1.1, cpus=2, wall_s=2.0, loadavg_1m=None, cpu_mhz=None)
    new_id = store.add_trial(ok_result("trial-busy", load=busy), model=MODEL, device=DEVICE)
    loaded = store.trial(TrialFilter(id=new_id))
    assert loaded is not None and loaded.measurement.load == busy and loaded.measurement.under_load
