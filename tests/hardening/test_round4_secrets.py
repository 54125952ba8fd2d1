"""Red-team round 4 (issue 37, case 3): a database password is never stored, shipped or printed.

``--db 'postgresql+psycopg://ad:SECRET@host/db'`` was kept verbatim in ``ad_trials.command`` and
``ad_studies.command``, in a bundle's manifest.json (3 times) and README, and printed by ``bundle info``,
``results show --format json`` and tune's ``next:`` lines. Every URL's password is now masked by one
function (:func:`autodeploy.redact.mask_secrets`) before a command is stored or printed; records an
older version stored are masked when read.
"""

from __future__ import annotations

import shutil
import sqlite3
import sys

import pytest

from autodeploy.results_db.store import Store
from tests.cli_runner import run_cli

SECRET = "S3cr3t-pw"
URL = f"postgresql+psycopg://ad:{SECRET}@db.example:5432/results"
#: The same password in every form a command line carries it.
ARGVS = [["--db", URL], [f"--db={URL}"], ["--storage", URL], [f"--storage={URL}"],
         ["--db", f"postgresql://ad@db.example/results?sslmode=require&password={SECRET}"],
         ["--db", f"postgresql://ad:{SECRET}x@y@db.example/results"]]  # fmt: skip


@pytest.mark.parametrize("args", ARGVS, ids=["db", "db=", "storage", "storage=", "query", "at-in-password"])
def test_the_recorded_command_line_masks_the_password(monkeypatch, args):
    from autodeploy.cli._common import command_line
    from autodeploy.cli.tune import resume_command

    monkeypatch.setattr(sys, "argv", ["autodeploy", "tune", "m.onnx", *args, "--trials", "3"])
    for text in (command_line(), resume_command("s")):
        assert SECRET not in text and "***" in text and "db.example" in text, text
        assert text.startswith("autodeploy tune m.onnx ") and text.count("--trials 3") == 1


def test_the_library_records_no_password_either():
    from autodeploy.api._common import python_call

    text = python_call("tune", "m.onnx", storage=URL)
    assert SECRET not in text and "ad:***@db.example" in text


@pytest.fixture
def store_copy(stored, tmp_path):
    """A copy of the real measured store, its trial part of a study, both recorded with the password,
    as an older autodeploy wrote them (straight into the columns)."""
    path = tmp_path / "r.db"
    shutil.copyfile(stored.db.removeprefix("sqlite:///"), path)
    raw = f"autodeploy tune m.onnx --db {URL} --name s"
    with Store.open(f"sqlite:///{path}") as store:
        store.save_study("s", model=_model(stored), device=_device(), objective="latency", settings={}, command=raw)
    with sqlite3.connect(path) as db:
        db.execute("UPDATE ad_trials SET command = ?, study = 's' WHERE id = ?", (raw, stored.trial_id))
        db.execute("UPDATE ad_studies SET command = ?", (raw,))
    return path


def _model(stored):
    from autodeploy.results_db.store import ModelRecord

    return ModelRecord.of(stored.model)


def _device():
    from autodeploy.device import probe_device
    from autodeploy.results_db.store import DeviceRecord

    return DeviceRecord.of(probe_device())


def _columns(path) -> list[str]:
    with sqlite3.connect(path) as db:
        return [row[0] or "" for table in ("ad_trials", "ad_studies", "ad_exports", "ad_gate_runs")
                for row in db.execute(f"SELECT command FROM {table}")]  # fmt: skip


def test_the_store_never_writes_a_password(stored, tmp_path):
    """Whoever passes the command (the library, a plug-in, an older CLI), the store masks it as it writes."""
    from autodeploy.gate.core import INTERLEAVED
    from tests.gate.test_report import result as gate_result

    path = tmp_path / "r.db"
    shutil.copyfile(stored.db.removeprefix("sqlite:///"), path)
    raw = f"autodeploy gate a.onnx b.onnx --db {URL}"
    with Store.open(f"sqlite:///{path}") as store:
        store.save_study("s", model=_model(stored), device=_device(), objective="latency", settings={}, command=raw)
        store.add_gate_run(gate_result(INTERLEAVED).to_record(), device=_device(), command=raw)
        store.add_export(stored.trial_id, manifest_sha256="0" * 64, format="bundle", destination="ship",
                         signed=False, command=raw)  # fmt: skip
    commands = [c for c in _columns(path) if "gate" in c]
    assert len(commands) == 3 and all(SECRET not in c and "ad:***@db.example" in c for c in commands), commands


@pytest.mark.slow  # a real reference, build and measurement in workers: about 4 s
def test_a_bench_with_a_password_in_the_url_stores_none(stored, tmp_path, monkeypatch):
    """The CLI's own path: command_line() into Store.add_trial, through a real worker into a real file."""
    from autodeploy.api import bench
    from autodeploy.cli._common import command_line
    from autodeploy.harness.timing import TimingPolicy

    path = tmp_path / "bench.db"
    monkeypatch.setattr(sys, "argv", ["autodeploy", "bench", "m.onnx", "--db", URL])
    policy = TimingPolicy(warmup_min_calls=2, warmup_max_s=0.2, min_samples=8, min_duration_s=0.05, max_duration_s=2)
    bench(stored.root / "m.onnx", batch=1, threads=1, db=f"sqlite:///{path}", timing=policy, command=command_line(),
          cache=tmp_path / "cache")  # fmt: skip
    commands = _columns(path)
    assert len(commands) == 1 and SECRET not in commands[0] and "ad:***@db.example" in commands[0], commands


def test_nothing_shipped_or_printed_carries_a_stored_password(stored, store_copy, tmp_path, capsys):
    from autodeploy.bundle import export

    db = f"sqlite:///{store_copy}"
    with Store.open(db, readonly=True) as store:
        source = export.stored_trial(store, stored.trial_id)
    bundle = export.write_bundle(source, tmp_path / "ship", command=f"autodeploy export s -o ship --db={URL}")
    manifest, readme = (bundle / "manifest.json").read_text(), (bundle / "README.md").read_text()
    assert SECRET not in manifest and SECRET not in readme
    assert manifest.count("ad:***@db.example") == 3 and "ad:***@db.example" in readme
    code, out, err = run_cli(capsys, "bundle", "info", str(bundle))
    assert code == 0 and SECRET not in out + err and "ad:***@db.example" in out.replace("\n", "")
    code, out, err = run_cli(capsys, "results", "show", str(stored.trial_id), "--db", db, "--format", "json")
    assert code == 0 and SECRET not in out + err and "ad:***@db.example" in out
    code, out, err = run_cli(capsys, "results", "studies", "--db", db, "--format", "json")
    assert code == 0 and SECRET not in out + err


def test_tunes_next_lines_mask_the_password(capsys):
    from autodeploy.cli.tune import _print_next_steps

    _print_next_steps("s", URL)
    out = capsys.readouterr().out
    assert SECRET not in out and out.count("ad:***@db.example") == 2


def test_the_mask_keeps_urls_without_a_password():
    from autodeploy.redact import mask_secrets

    for text in ("sqlite:////tmp/a:b@c/r.db", "postgresql+psycopg://ad@db.example:5432/results", "m.onnx --db r.db"):
        assert mask_secrets(text) == text


def test_a_storage_that_cannot_be_opened_names_it_without_its_password():
    """The study storage's error line (search/storage.py) carried the whole --storage URL."""
    from types import SimpleNamespace

    from autodeploy.errors import StoreError
    from autodeploy.search.storage import open_study

    ctx = SimpleNamespace(storage="postgresql+psycopg://ad:S3CRETpw@127.0.0.1:1/none", name="s", resume=False)
    with pytest.raises(StoreError) as caught:
        open_study(ctx)
    assert "S3CRETpw" not in str(caught.value) and "***" in str(caught.value)
