"""Store conformance: every test runs against SQLite and PostgreSQL (see conftest.db_url)."""

from __future__ import annotations

import dataclasses
import multiprocessing
from datetime import datetime, timedelta, timezone

import pytest
import sqlalchemy as sa

from autodeploy.adapters.base import TrialConfig
from autodeploy.errors import StoreError, UsageError
from autodeploy.harness.result import TrialResult
from autodeploy.results_db import Catalog, DeviceRecord, ModelRecord, Store, TrialFilter
from autodeploy.results_db.schema import Device, Measurement, Model, Trial
from autodeploy.results_db.store import GateRunRecord
from tests.results_db.factories import DEVICE, MODEL, config, failed_result, ok_result


def counts(store: Store) -> dict[str, int]:
    with store.engine.connect() as conn:
        return {
            t.__tablename__.removeprefix("ad_"): conn.scalar(sa.select(sa.func.count()).select_from(t))
            for t in (Device, Model, Trial, Measurement)
        }


def test_ok_trial_round_trips(store: Store) -> None:
    result = ok_result()
    before = datetime.now(timezone.utc) - timedelta(seconds=1)
    trial_id = store.add_trial(
        result, model=MODEL, device=DEVICE, command="autodeploy tune m.onnx", study="s1"
    )
    row = store.trial(TrialFilter(id=trial_id))
    assert row is not None and row.measured
    lat = result.latency
    assert (row.uid, row.status, row.failure_kind, row.study, row.command) == (
        "trial-ok", "ok", None, "s1", "autodeploy tune m.onnx",
    )  # fmt: skip
    assert (row.engine, row.engine_version, row.precision, row.batch, row.threads) == (
        "onnxruntime", "1.20.0", "fp32", 1, 4,
    )  # fmt: skip
    assert row.config == result.config
    assert row.config_key == result.config.key()
    assert (row.model_name, row.model_sha256) == (MODEL.name, MODEL.sha256)
    assert (row.device_cpu, row.device_fingerprint) == (DEVICE.cpu, DEVICE.fingerprint)
    m, got = row.measurement, row.measurement.latency
    assert m.scenario == "single-stream" and got.n == lat.n
    assert (got.median, got.mean, got.stdev, got.cv) == (lat.median, lat.mean, lat.stdev, lat.cv)
    assert (got.min, got.max) == (lat.min, lat.max)
    assert (got.median_ci, got.p90, got.p90_ci, got.p99, got.p99_ci) == (
        lat.median_ci, lat.p90, lat.p90_ci, lat.p99, lat.p99_ci,
    )  # fmt: skip
    assert got.unstable is False and m.accuracy.passed is True
    assert row.accuracy == result.accuracy
    assert (m.throughput, m.peak_rss_mb, m.artifact_mb, m.build_s) == (800.0, 42.0, 1.5, 0.3)
    assert (m.warmup_calls, m.duration_s) == (12, 2.5)
    assert row.samples_ms == result.samples_ms
    assert row.created_at.tzinfo is not None and before <= row.created_at <= datetime.now(timezone.utc)


def test_failed_trial_has_no_measurement(store: Store) -> None:
    trial_id = store.add_trial(failed_result(), model=MODEL, device=DEVICE)
    row = store.trial(TrialFilter(id=trial_id))
    assert row is not None and not row.measured
    assert (row.status, row.failure_kind, row.failure_message) == ("failed", "build_failed", "boom\nline 2")
    assert (row.engine, row.precision, row.median_ms, row.samples_ms, row.accuracy) == (
        "openvino", "int8", None, None, None,
    )  # fmt: skip
    assert counts(store) == {"devices": 1, "models": 1, "trials": 1, "measurements": 0}


def test_measured_failure_keeps_its_measurement(store: Store) -> None:
    inaccurate = dataclasses.replace(ok_result("inacc"), status="failed", failure_kind="inaccurate")
    row = store.trial(TrialFilter(id=store.add_trial(inaccurate, model=MODEL, device=DEVICE)))
    assert row is not None and row.status == "failed" and row.measured and row.median_ms == 1.25


def test_p90_p99_may_be_missing(store: Store) -> None:
    lat = dataclasses.replace(ok_result().latency, p90=None, p90_ci=None, p99=None, p99_ci=None)
    row = store.trial(TrialFilter(id=store.add_trial(ok_result(latency=lat, accuracy=None), model=MODEL, device=DEVICE)))
    assert row is not None
    got = row.measurement.latency
    with store.engine.connect() as conn:
        accuracy_passed = conn.scalar(sa.select(Measurement.accuracy_passed))
    assert (got.p90, got.p90_ci, got.p99, got.p99_ci, row.accuracy, accuracy_passed) == (None,) * 6


def test_adding_twice_changes_nothing(store: Store) -> None:
    first = store.add_trial(ok_result(), model=MODEL, device=DEVICE)
    before = counts(store)
    other_model = dataclasses.replace(MODEL, sha256="cd" * 32)
    assert store.add_trial(ok_result(), model=other_model, device=DEVICE, command="again") == first
    assert counts(store) == before == {"devices": 1, "models": 1, "trials": 1, "measurements": 1}
    row = store.trial(TrialFilter(id=first))
    assert row is not None and row.command is None and row.model_sha256 == MODEL.sha256


def test_device_and_model_are_shared_between_trials(store: Store) -> None:
    store.add_trial(ok_result("a"), model=MODEL, device=DEVICE)
    store.add_trial(failed_result("b"), model=MODEL, device=DEVICE)
    store.add_trial(ok_result("c"), model=MODEL, device=DeviceRecord("fp-other", "Other CPU", {}))
    assert counts(store) == {"devices": 2, "models": 1, "trials": 3, "measurements": 2}


def test_model_interface_and_device_info_of_a_stored_trial(store: Store) -> None:
    assert store.model_interface(MODEL.sha256) is None and store.device_info(DEVICE.fingerprint) is None
    store.add_trial(ok_result("a"), model=MODEL, device=DEVICE)
    assert store.model_interface(MODEL.sha256) == {
        "name": MODEL.name, "sha256": MODEL.sha256, "inputs": MODEL.inputs, "outputs": MODEL.outputs,
    }  # fmt: skip
    assert store.device_info(DEVICE.fingerprint) == DEVICE.info


def test_failure_mid_transaction_rolls_back_everything(store: Store) -> None:
    store.add_trial(ok_result("kept"), model=MODEL, device=DEVICE)
    before = counts(store)
    new_model = dataclasses.replace(MODEL, sha256="ef" * 32)
    new_device = DeviceRecord("fp-new", "New CPU", {})
    # The device, model and trial rows insert fine; the measurement breaks NOT NULL.
    with pytest.raises(sa.exc.IntegrityError):
        store.add_trial(ok_result("broken", median=None), model=new_model, device=new_device)
    assert counts(store) == before
    assert [r.uid for r in store.trials(TrialFilter(newest_first=True))] == ["kept"]
    assert store.trials(TrialFilter(model_sha256=new_model.sha256)) == []


def test_hostile_strings_are_stored_verbatim(store: Store) -> None:
    hostile = "x'); DROP TABLE ad_trials;--"
    model = ModelRecord(sha256="12" * 32, name=hostile, path=f"/tmp/{hostile}.onnx", inputs=[], outputs=[])
    device = DeviceRecord(fingerprint=hostile, cpu='"; DELETE FROM devices; --', info={hostile: hostile})
    trial_id = store.add_trial(
        ok_result(hostile, config=config(knobs={"k": hostile})), model=model, device=device, command=hostile,
        study="100%_done\\",
    )  # fmt: skip
    row = store.trial(TrialFilter(id=trial_id))
    assert row is not None
    assert (row.uid, row.model_name, row.device_fingerprint, row.command) == (hostile,) * 4
    assert row.config.knobs == {"k": hostile} and row.study == "100%_done\\"
    assert [r.id for r in store.trials(TrialFilter(model=hostile))] == [trial_id]
    assert store.trials(TrialFilter(model="%")) == store.trials(TrialFilter(model="_")) == []  # LIKE wildcards escaped
    assert counts(store)["trials"] == 1


def test_one_trial_query_filters_orders_and_limits(store: Store) -> None:
    other = dataclasses.replace(MODEL, sha256="99" * 32, name="bert-tiny")
    ids = [
        store.add_trial(ok_result("t1"), model=MODEL, device=DEVICE),
        store.add_trial(failed_result("t2"), model=MODEL, device=DEVICE),
        store.add_trial(ok_result("t3", config=config("tflite")), model=other, device=DEVICE),
    ]
    assert [r.id for r in store.trials()] == ids  # oldest first: the order they ran
    newest = TrialFilter(newest_first=True)
    assert [r.id for r in store.trials(newest)] == ids[::-1]
    assert [r.uid for r in store.trials(TrialFilter(newest_first=True, limit=2))] == ["t3", "t2"]
    assert [r.uid for r in store.trials(TrialFilter(limit=2))] == ["t1", "t2"]
    assert [r.uid for r in store.trials(TrialFilter(model="tiny-cnn"))] == ["t1", "t2"]
    assert [r.uid for r in store.trials(TrialFilter(model="9999"))] == ["t3"]  # SHA-256 prefix
    assert [r.uid for r in store.trials(TrialFilter(engines=("openvino",)))] == ["t2"]
    assert [r.uid for r in store.trials(TrialFilter(status="ok"))] == ["t1", "t3"]
    assert [r.uid for r in store.trials(TrialFilter(model="tiny-cnn", status="ok"))] == ["t1"]
    assert all(r.samples_ms is None for r in store.trials())
    assert store.trials(TrialFilter(newest_first=True, limit=1), samples=True)[0].samples_ms == ok_result().samples_ms
    assert store.count_trials() == 3
    assert store.trial(TrialFilter(id=10_000)) is None
    assert store.trial(TrialFilter(id=ids[1])).uid == "t2"
    with pytest.raises(UsageError, match="unknown trial status 'done'"):
        TrialFilter(status="done")
    with pytest.raises(UsageError, match="cannot read 0 trials"):
        TrialFilter(limit=0)


def test_the_newest_measured_repeat_of_a_config(store: Store) -> None:
    """What the search reuses: the newest measured trial of this model, device, config, engine version and shape."""
    key_config = TrialConfig.from_dict(config())
    repeat = TrialFilter(model_sha256=MODEL.sha256, device=DEVICE.fingerprint, config_key=key_config.key(),
                         engine_version="1.20.0", shape_key="", measured_only=True, newest_first=True)  # fmt: skip
    assert store.trial(repeat) is None
    store.add_trial(ok_result("old"), model=MODEL, device=DEVICE)
    new_id = store.add_trial(ok_result("new"), model=MODEL, device=DEVICE)
    crashed = TrialResult.failed("crashed", key_config, "crashed", "SIGSEGV", engine_version="1.20.0")
    store.add_trial(crashed, model=MODEL, device=DEVICE)  # same config, no measurement
    found = store.trial(repeat, samples=False)
    assert found is not None and found.id == new_id and found.samples_ms is None
    assert store.trial(dataclasses.replace(repeat, engine_version="1.19.0")) is None
    assert store.trial(dataclasses.replace(repeat, device="fp-other")) is None
    assert store.trial(dataclasses.replace(repeat, scenario="offline")) is None
    assert store.trial(dataclasses.replace(repeat, shape_key="x=1x3x8x8")) is None
    assert store.trial(dataclasses.replace(repeat, scenario="single-stream")).id == new_id
    # The gate's history of the same config: every measured run, newest first.
    history = TrialFilter(model_sha256=MODEL.sha256, device=DEVICE.fingerprint, config_key=key_config.key(),
                          measured_only=True, newest_first=True)  # fmt: skip
    assert [r.uid for r in store.trials(history)] == ["new", "old"]


def test_readonly_store_refuses_writes(db_url: str) -> None:
    with Store.open(db_url) as rw:
        rw.add_trial(ok_result(), model=MODEL, device=DEVICE)
    with Store.open(db_url, readonly=True) as ro:
        assert ro.readonly and ro.count_trials() == 1
        with pytest.raises(
            StoreError, match=r"cannot store trial t2 in results database .*: it is open read-only"
        ):
            ro.add_trial(ok_result("t2"), model=MODEL, device=DEVICE)
        # The database itself refuses too, not only the Python check.
        with pytest.raises(sa.exc.DBAPIError, match="(?i)read-?only"), ro.engine.begin() as conn:
            conn.execute(sa.delete(Trial))
        assert ro.count_trials() == 1


def test_readonly_never_creates_the_schema(db_url: str) -> None:
    if db_url.startswith("sqlite"):
        sa.create_engine(db_url).connect().close()  # an empty SQLite file
    with pytest.raises(
        StoreError, match="read-only: it has no autodeploy schema; fix: open it once read-write"
    ):
        Store.open(db_url, readonly=True)


def _write_all(url: str) -> dict[str, int]:
    with Store.open(url) as store:
        return {uid: store.add_trial(ok_result(uid), model=MODEL, device=DEVICE) for uid in "abcdefghijklmno"}


def test_concurrent_writers_agree(db_url: str) -> None:
    # Four processes open a new database (racing to migrate it) and store the same trials:
    # each uid, device and model ends up stored once, and every writer gets the same ids.
    with multiprocessing.get_context("fork").Pool(4) as pool:
        results = pool.map(_write_all, [db_url] * 4)
    assert all(r == results[0] for r in results)
    with Store.open(db_url) as store:
        assert counts(store) == {"devices": 1, "models": 1, "trials": 15, "measurements": 15}


def test_a_trial_is_found_by_its_uid(store: Store) -> None:
    assert store.trial(TrialFilter(uid="a")) is None
    ok_id = store.add_trial(ok_result("a"), model=MODEL, device=DEVICE, study="s1", phase="finalist")
    failed_id = store.add_trial(failed_result("b"), model=MODEL, device=DEVICE)
    row = store.trial(TrialFilter(uid="a"))
    assert row is not None and (row.id, row.uid, row.study, row.phase) == (ok_id, "a", "s1", "finalist")
    assert row == store.trial(TrialFilter(id=ok_id)) and row.samples_ms == ok_result().samples_ms
    assert store.trial(TrialFilter(uid="a"), samples=False).samples_ms is None
    failed = store.trial(TrialFilter(uid="b"))
    assert failed is not None and failed.id == failed_id and failed.measurement is None
    for hostile in ("a' OR '1'='1", "%", "_", "A"):  # bound, exact, case-sensitive
        assert store.trial(TrialFilter(uid=hostile)) is None


def test_the_dashboards_reads(store: Store) -> None:
    other_device = DeviceRecord("fp-other", "Other CPU", {"logical_cores": 2})
    a = store.add_trial(ok_result("a"), model=MODEL, device=DEVICE, study="s1")
    b = store.add_trial(failed_result("b"), model=MODEL, device=DEVICE, study="s1")
    c = store.add_trial(ok_result("c", config=config("tflite")), model=MODEL, device=other_device)
    assert [r.id for r in store.trials()] == [a, b, c]  # oldest first
    assert [r.uid for r in store.trials(TrialFilter(study="s1", measured_only=True))] == ["a"]
    assert [r.uid for r in store.trials(TrialFilter(device="fp-other"))] == ["c"]
    assert [r.uid for r in store.trials(TrialFilter(engines=("openvino", "tflite")))] == ["b", "c"]
    assert [r.uid for r in store.trials(TrialFilter(model_sha256=MODEL.sha256, scenario="single-stream"))] == [
        "a", "c",
    ]  # fmt: skip
    hostile = "x' OR '1'='1"
    for where in (TrialFilter(model_sha256=hostile), TrialFilter(device=hostile), TrialFilter(engines=(hostile,)),
                  TrialFilter(scenario=hostile), TrialFilter(study=hostile), TrialFilter(model=hostile),
                  TrialFilter(uid=hostile), TrialFilter(config_key=hostile), TrialFilter(phase=hostile),
                  TrialFilter(engine_version=hostile), TrialFilter(shape_key=hostile)):  # fmt: skip
        assert store.trials(where) == []
        assert store.trial_counts(where) == {}
    # The overview counts without reading rows, under the same filters as trials.
    assert store.trial_counts() == {"ok": 2, "failed": 1}
    assert store.trial_counts(TrialFilter(study="s1")) == {"ok": 1, "failed": 1}
    assert store.trial_counts(TrialFilter(device="fp-other", measured_only=True)) == {"ok": 1}
    pairs = [(MODEL.sha256, MODEL.name, DEVICE.fingerprint, DEVICE.cpu), (MODEL.sha256, MODEL.name, "fp-other", "Other CPU")]
    assert store.trial_pairs() == sorted(pairs, key=lambda p: p[3])  # by model name, then cpu
    assert store.trial_pairs(TrialFilter(study="s1", measured_only=True)) == [pairs[0]]
    assert store.trial_pairs(TrialFilter(study=hostile)) == []
    assert store.samples((a, b, c)) == {a: ok_result().samples_ms, c: ok_result().samples_ms}
    assert store.samples(()) == {}
    assert store.catalog() == Catalog(
        models=((MODEL.sha256, MODEL.name),), devices=((DEVICE.fingerprint, DEVICE.cpu), ("fp-other", "Other CPU")),
        engines=("onnxruntime", "openvino", "tflite"), scenarios=("single-stream",), studies=(),
    )  # fmt: skip
    devices = store.list_devices()
    assert [(d.fingerprint, d.cpu, d.info, d.trials) for d in devices] == [
        (DEVICE.fingerprint, DEVICE.cpu, DEVICE.info, 2), ("fp-other", "Other CPU", {"logical_cores": 2}, 1),
    ]  # fmt: skip
    assert all(d.created_at.tzinfo is not None for d in devices)
    assert store.has_tables("ad_trials", "ad_gate_runs") and not store.has_tables("ad_trials", "no_such_table")


def test_studies_filter_by_model_and_device(store: Store) -> None:
    other_device = DeviceRecord("fp-other", "Other CPU", {})
    store.save_study("s1", model=MODEL, device=DEVICE, objective="latency", settings={}, command=None)
    store.save_study("s2", model=MODEL, device=other_device, objective="latency", settings={}, command=None)
    assert {s.name for s in store.list_studies(limit=None)} == {"s1", "s2"}
    assert [(s.name, s.device_cpu) for s in store.list_studies(device="fp-other")] == [("s2", "Other CPU")]
    assert store.list_studies(model_sha256="x' OR '1'='1") == []


def test_gate_runs_filter_by_device(store: Store) -> None:
    run = GateRunRecord("interleaved", "pass", "a.onnx", "ab" * 32, config(), "b.onnx", "cd" * 32, config(),
                        settings={}, metrics=[], notes=[], wall_s=1.0)  # fmt: skip
    store.add_gate_run(run, device=DEVICE)
    store.add_gate_run(run, device=DeviceRecord("fp-other", "Other CPU", {}))
    assert [(r.device_fingerprint, r.device_cpu) for r in store.list_gate_runs(device="fp-other")] == [
        ("fp-other", "Other CPU")
    ]
    assert len(store.list_gate_runs()) == 2 and store.list_gate_runs(device="x' OR '1'='1") == []


def test_a_non_finite_number_round_trips_on_every_backend(store: Store):
    """An output bit-exact to its reference has SQNR inf: PostgreSQL's json type refused the row ("Token "Infinity"
    is invalid") and the trial was lost; each backend now keeps it as ``{"$float": "inf"}`` and reads back inf."""
    from autodeploy.accuracy.records import Accuracy, OutputAccuracy

    exact = OutputAccuracy("landmarks", max_abs=0.0, mean_rel=0.0, cosine=1.0, kind="regression", sqnr_db=float("inf"))
    nan = OutputAccuracy("nan", max_abs=float("nan"), mean_rel=float("nan"), cosine=float("nan"), kind="sqnr",
                         sqnr_db=float("-inf"))  # fmt: skip
    accuracy = Accuracy(outputs=(exact, nan), n_samples=8, constraint="error SNR >= 17 dB", passed=False)
    row = store.trial(TrialFilter(id=store.add_trial(ok_result(accuracy=accuracy), model=MODEL, device=DEVICE)))
    (got_exact, got_nan) = row.measurement.accuracy.outputs
    assert got_exact.sqnr_db == float("inf") and got_nan.sqnr_db == float("-inf")
    assert got_nan.cosine != got_nan.cosine  # NaN stays NaN
