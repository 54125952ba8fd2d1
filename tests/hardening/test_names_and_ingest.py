"""Through the CLI: hostile names are stored and shown verbatim; storing results is idempotent and atomic.

The store-level cases (same uid twice, rollback of a broken row) are in ``tests/results_db``;
here the same guarantees are checked end to end: a ``tune`` whose database write fails
mid-commit leaves neither a partial row nor a RUNNING trial, and a resumed ``tune`` that
meets results it already has stores nothing again.
"""

from __future__ import annotations

import dataclasses
import re

import optuna
import pytest
import sqlalchemy as sa

from autodeploy.cli import _common
from autodeploy.results_db import Store, TrialFilter
from autodeploy.results_db import rows as rows_module
from tests.cli_runner import run_cli
from tests.models import mlp

FAST = ["--engine", "onnxruntime", "--threads", "1", "--precision", "fp32", "--batch", "1",
        "--min-samples", "64", "--min-duration", "0.1", "--finalists", "0"]  # fmt: skip
HOSTILE_MODEL = "x'); DROP TABLE trials;--"
HOSTILE_STUDY = "[red]study[bold] x'); DROP TABLE studies;-- [link=x]"  # no '/': study names are never paths


@pytest.fixture
def env(tmp_path, monkeypatch):
    db = f"sqlite:///{tmp_path / 'results.db'}"
    monkeypatch.setenv("AUTODEPLOY_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("AUTODEPLOY_DB", db)
    monkeypatch.setattr(_common.out, "width", 400)  # wide tables: names are not wrapped or cut
    monkeypatch.setattr(_common.err, "width", 400)
    return tmp_path, db


def run(capsys, *argv: str) -> tuple[int, str, str]:
    return run_cli(capsys, *argv)


@pytest.mark.slow
def test_hostile_names_are_stored_and_shown_verbatim(env, capsys):
    tmp_path, db = env
    model = mlp(tmp_path / f"{HOSTILE_MODEL}.onnx")
    code, out, err = run(capsys, "bench", str(model), *FAST[:-2])
    assert code == 0, err
    assert HOSTILE_MODEL in out  # the result table's title
    code, out, err = run(capsys, "tune", str(model), "--name", HOSTILE_STUDY, "--trials", "1", *FAST)
    assert code == 0, err
    assert f"study {HOSTILE_STUDY} " in out

    with Store.open(db, readonly=True) as store:
        rows = store.trials(TrialFilter(newest_first=True))
        assert len(rows) == 2 and {r.model_name for r in rows} == {HOSTILE_MODEL}
        assert [r.study for r in rows] == [HOSTILE_STUDY, None]
        assert [s.name for s in store.list_studies()] == [HOSTILE_STUDY]
        assert len(store.trials(TrialFilter(model=HOSTILE_MODEL))) == 2
        engine = store.engine
        assert sa.inspect(engine).has_table("ad_trials") and sa.inspect(engine).has_table("trials")
    code, out, _ = run(capsys, "results", "list")
    assert code == 0 and out.count(HOSTILE_MODEL) == 2
    code, out, _ = run(capsys, "results", "list", "--study", HOSTILE_STUDY)
    assert code == 0 and "1 trial(s)" in out and HOSTILE_MODEL in out
    code, out, _ = run(capsys, "results", "studies")
    assert code == 0 and HOSTILE_STUDY in out
    code, out, _ = run(capsys, "results", "show", str(rows[0].id))
    assert code == 0 and HOSTILE_STUDY in out and HOSTILE_MODEL in out

    queries = pytest.importorskip("autodeploy.dashboard.queries")
    with Store.open(db, readonly=True) as store:
        assert set(queries.trials(store)["model"]) == {HOSTILE_MODEL}
        assert list(queries.studies(store)["name"]) == [HOSTILE_STUDY]
        assert queries.study(store, HOSTILE_STUDY)["model"] == HOSTILE_MODEL


def _snapshot(db: str) -> list[dict]:
    with Store.open(db, readonly=True) as store:
        return [dataclasses.asdict(r) for r in store.trials(samples=True)]


@pytest.mark.slow
def test_failed_commit_leaves_no_trace_and_storing_again_changes_nothing(env, capsys, monkeypatch):
    tmp_path, db = env
    model = str(mlp(tmp_path / "m.onnx"))
    config = tmp_path / "one-config.yaml"  # a space of one config, so every later trial meets it again
    config.write_text("knobs: {onnxruntime: {execution_mode: [ORT_SEQUENTIAL]}}\n")
    tune = ["tune", model, "--config", str(config), "--name", "s", "--sampler", "random", *FAST]
    original = rows_module.insert_trial

    def fails_before_commit(*args, **kwargs):
        original(*args, **kwargs)  # the trial and its measurement are inserted and flushed ...
        raise sa.exc.OperationalError("COMMIT", {}, Exception("database or disk is full"))  # ... then this

    monkeypatch.setattr(rows_module, "insert_trial", fails_before_commit)
    code, out, err = run(capsys, *tune, "--trials", "2")
    lines = [line for line in err.splitlines() if line.strip() and line.startswith("error:")]
    assert code == 1 and len(lines) == 1 and re.search("disk is full", lines[0]), err
    assert "Traceback" not in out + err
    monkeypatch.setattr(rows_module, "insert_trial", original)
    with Store.open(db) as store:
        assert store.count_trials() == 0
        with store.engine.connect() as conn:
            assert conn.scalar(sa.text("SELECT count(*) FROM ad_measurements")) == 0
    trials = optuna.load_study(study_name="s", storage=db).trials
    assert [t.state.name for t in trials] == ["FAIL"]  # closed, not left RUNNING

    code, _, err = run(capsys, *tune, "--trials", "2", "--resume")
    assert code == 0, err
    stored = _snapshot(db)
    assert len(stored) == 1  # measured once, then taken from the store

    # The same configs again: taken from the store, nothing stored twice, nothing changed.
    before = len(optuna.load_study(study_name="s", storage=db).trials)
    code, _, err = run(capsys, *tune, "--trials", "3", "--resume")
    assert code == 0, err
    assert _snapshot(db) == stored
    # the space's one config was looked at already, so the search stops early: what it asked is reused
    again = optuna.load_study(study_name="s", storage=db).trials[before:]
    assert again and [t.user_attrs.get("reused") for t in again] == [True] * len(again)
