"""``--format json|csv``: records that validate against the documented schema and carry the stored numbers."""

import csv
import io
import json
import math
import re

import jsonschema
import pytest

from autodeploy.report import SCHEMA, SCHEMA_VERSION
from autodeploy.results_db import TrialFilter
from autodeploy.results_db.store import Store
from tests.cli.test_cli import FAST, env, run  # noqa: F401 - env is a fixture
from tests.models import mlp

TUNE = ["--engine", "onnxruntime", "--precision", "fp32", "--batch", "1", "--threads", "1", "--trials", "2",
        "--finalists", "1", "--rounds", "1", "--min-samples", "64", "--min-duration", "0.05"]  # fmt: skip


def validate(record):
    jsonschema.validate(record, SCHEMA, cls=jsonschema.Draft202012Validator)


def test_the_schema_is_valid_and_printed_by_the_schema_command(capsys):
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    code, out, _ = run(capsys, "schema")
    assert code == 0 and json.loads(out) == SCHEMA and SCHEMA["$defs"]["trial"]["properties"]["schema_version"]["const"] == SCHEMA_VERSION


def test_bench_json_and_results_csv_carry_the_stored_numbers(env, capsys):  # noqa: F811
    tmp_path, db = env
    model = mlp(tmp_path / "m.onnx")
    code, out, err = run(capsys, "bench", str(model), "--format", "json", *FAST)
    assert code == 0, err
    record = json.loads(out)  # stdout holds the JSON alone: no table, no spinner
    validate(record)
    with Store.open(db) as store:
        (row,) = store.trials()
    m = row.measurement
    assert record["id"] == row.id and record["status"] == "ok" and record["schema_version"] == SCHEMA_VERSION
    assert record["measurement"]["median_ms"] == m.latency.median and record["measurement"]["p90_ms"] == m.latency.p90
    assert record["measurement"]["load"] == m.load.to_dict() and record["measurement"]["load"]["cpus"] >= 1
    assert record["measurement"]["median_ci"] == list(m.latency.median_ci)
    assert record["engine"] == {"name": "onnxruntime", "version": row.engine_version} and record["engine"]["version"]
    assert record["device"]["fingerprint"] == row.device_fingerprint
    assert record["measurement"]["accuracy"]["passed"] is True

    code, out, err = run(capsys, "results", "show", str(row.id), "--format", "json")
    assert code == 0, err
    shown = json.loads(out)
    validate(shown)
    assert shown["measurement"] == record["measurement"] and shown["created_at"]
    # One record of a stored trial: bench's (StoredTrial.row) is the store's, less what only a read-back knows.
    known = [k for k in record if k not in ("created_at", "command", "shape", "inputs")]
    assert {k: record[k] for k in known} == {k: shown[k] for k in known} and record["created_at"] is None

    code, out, err = run(capsys, "results", "list", "--format", "csv")
    assert code == 0, err
    (line,) = list(csv.DictReader(io.StringIO(out)))
    assert int(line["id"]) == row.id and line["config.engine"] == "onnxruntime"
    assert float(line["measurement.median_ms"]) == m.latency.median
    assert float(line["measurement.median_ci_low"]) == m.latency.median_ci[0]
    assert float(line["measurement.p90_ci_high"]) == m.latency.p90_ci[1]
    assert float(line["measurement.throughput"]) == m.throughput

    code, out, _ = run(capsys, "results", "list", "--format", "json")
    assert code == 0 and [r["id"] for r in json.loads(out)] == [row.id]
    validate(json.loads(out))


def test_engines_json_lists_every_engine(capsys):
    code, out, _ = run(capsys, "engines", "--format", "json")
    engines = {e["engine"]: e for e in json.loads(out)}
    assert code == 0 and engines["onnxruntime"]["available"] is True and engines["onnxruntime"]["version"]


def test_a_table_piped_is_never_cut(env, capsys, monkeypatch):  # noqa: F811
    from autodeploy.cli import _common

    monkeypatch.setattr(_common.out, "width", 100_000)  # what a pipe gets (see _common.out)
    tmp_path, _ = env
    model = mlp(tmp_path / ("a-model-with-a-very-long-name-" * 4 + ".onnx"))
    assert run(capsys, "bench", str(model), *FAST)[0] == 0
    code, out, _ = run(capsys, "results", "list")
    assert code == 0 and ("a-model-with-a-very-long-name-" * 4) in out and "…" not in out


@pytest.mark.slow
def test_tune_json_is_a_study_record_with_the_stored_winner(env, capsys):  # noqa: F811
    tmp_path, db = env
    model = mlp(tmp_path / "m.onnx")
    code, out, err = run(capsys, "tune", str(model), "--name", "s", "--format", "json", *TUNE)
    assert code == 0, err
    record = json.loads(out)
    validate(record)
    assert record["statistic"] == "p90_ms" and record["statistic_unit"] == "ms"
    assert record["winner"]["label"].startswith("onnxruntime/fp32/b1/") and record["winner"]["statistic"] > 0
    spent = record["time_by_engine"]["onnxruntime"]  # where the time went: screening and finalist workers
    assert spent["runs"] >= 3 and spent["timing_s"] > 0 and spent["accuracy_s"] > 0 and spent["build_s"] >= 0
    assert record["confidence"].startswith("re-measured interleaved: 1 of 1 rounds") and record["stopped_by"]
    # how far the winner is from this device's fp32 peak (the session's tiny microbenchmark: any positive share)
    assert record["roofline"]["precision"] == "fp32" and 0 < record["roofline"]["share"] < math.inf
    assert re.match(r"onnxruntime/fp32 runs at \d+% of this device's fp32 peak", record["limit"])
    code, out, _ = run(capsys, "results", "studies", "--format", "json")
    (stored,) = json.loads(out)
    validate(stored)
    assert stored["winner"] == record["winner"] and stored["model"]["name"] == "m"
    code, out, _ = run(capsys, "results", "studies", "--format", "csv")
    (line,) = list(csv.DictReader(io.StringIO(out)))
    assert float(line["winner.statistic"]) == record["winner"]["statistic"]


@pytest.mark.slow
def test_tune_with_a_time_budget_too_small_for_the_baseline_says_so_in_one_line(env, capsys):  # noqa: F811
    tmp_path, _ = env
    model = mlp(tmp_path / "m.onnx")
    code, out, err = run(capsys, "tune", str(model), "--time-budget", "0.1s", *TUNE)
    assert code == 2 and out == ""
    # one line, beside the note a busy machine adds before the study ("note: the machine is busy ...")
    (line,) = [text for text in err.splitlines() if text.strip() and "the machine is busy" not in text]
    assert "too small: measuring even the baseline (the ORT fp32 default) takes about" in line and "--time-budget" in line
    code, _, err = run(capsys, "tune", str(model), "--time-budget", "ten minutes", *TUNE)
    assert code == 2 and "is not a duration" in err


@pytest.mark.slow
def test_tune_with_no_config_under_the_memory_cap_names_the_closest_in_json_and_text(env, capsys):  # noqa: F811
    tmp_path, db = env
    model = mlp(tmp_path / "m.onnx")
    code, out, err = run(capsys, "tune", str(model), "--name", "s", "--format", "json", "--max-memory-mb", "0.001", *TUNE)
    assert code == 1, err  # no winner
    record = json.loads(out)
    validate(record)
    closest, rejected = record["closest"], record["rejected"]
    assert record["winner"] is None and rejected and closest == rejected[0]
    assert len({r["config"] for r in rejected}) == len(rejected)  # one entry per config
    with Store.open(db) as store:
        peaks = {r.config.label(): r.measurement.peak_rss_mb for r in store.trials(TrialFilter(study="s"))}
    for r in rejected:  # the measured peak memory and the cap, both
        assert (r["constraint"], r["value"], r["limit"], r["unit"]) == ("max_memory_mb", peaks[r["config"]], 0.001, "MB")
    assert closest["value"] == min(peaks.values()) > 0.001
    assert f"closest: {closest['config']}: {closest['reason']}" in record["note"]
    assert closest["reason"].startswith("peak memory ") and closest["reason"].endswith(" MB > 0.001 MB")

    # the text of the same configs (taken from the store: nothing runs again) says the same
    code, out, err = run(capsys, "tune", str(model), "--name", "t", "--max-memory-mb", "0.001", *TUNE)
    assert code == 1
    assert f"no winner: no trial meets the constraints; closest: {closest['config']}: {closest['reason']}" in " ".join(err.split())
    assert f"rejected by a constraint: {len(rejected)} config" in out
    assert all(f"{r['config']}: {r['reason']}" in out for r in rejected)
