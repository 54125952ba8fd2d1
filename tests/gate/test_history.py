"""The gate's baseline against its history on this device (issue 42): real workers, a real SQLite file whose history
is stored through the Store API. A note says when today's baseline lies outside the range of its earlier runs, with
the candidate's change over that range; the history is stored with the run (``settings.baseline_history``)."""

from __future__ import annotations

import json

import pytest

from autodeploy.adapters import registry
from autodeploy.adapters.base import TrialConfig
from autodeploy.device import probe_device
from autodeploy.model import load_model
from autodeploy.results_db import DeviceRecord, ModelRecord
from autodeploy.results_db.store import Store
from tests.gate.test_cli import db, gate, models  # noqa: F401
from tests.search.test_rounds_in_time import _stored_baseline


@pytest.mark.slow  # two rounds a side of a tiny model: about 8 s here
def test_a_baseline_outside_its_history_is_said_and_stored(models, db, tmp_path, capsys):  # noqa: F811
    _, base, _ = models
    config = TrialConfig("onnxruntime", "fp32", batch=1, threads=1)  # the gate's model arms by default
    version = registry.get("onnxruntime").probe_version()
    with Store.open(db) as store:  # three earlier studies read 40-50 ms; a tiny MatMul chain reads microseconds
        for i, median_ms in enumerate((40.0, 45.0, 50.0)):
            store.add_trial(_stored_baseline(median_ms / 0.9, f"old{i}", version, config), model=ModelRecord.of(load_model(base)),
                            device=DeviceRecord.of(probe_device()), study=f"old-{i}", phase="finalist", shape_key="")  # fmt: skip
    md = tmp_path / "gate.md"
    code, out, err = gate(capsys, "--baseline", str(base), "--candidate", str(base), "--rounds", "2", "--min-samples", "2",
                          "--calls", "64", "--duration", "0.05", "--db", db, "--markdown", str(md), "--format", "json")  # fmt: skip
    assert code == 2, out + err  # two runs a side: inconclusive, whatever the history says
    note = next(n for n in json.loads(out)["notes"] if n.startswith("the baseline (onnxruntime/fp32/b1/t1) read median"))
    assert "today; 40.00–50.00 ms in 3 earlier runs on this device: over that range the candidate's median changes by -" in note
    assert f"> {note[:40]}" in md.read_text()
    with Store.open(db) as store:
        (row,) = store.list_gate_runs()
    history = row.settings["baseline_history"]
    assert history["outside"] and (history["low"], history["high"], history["runs"]) == (40.0, 50.0, 3)
    assert history["today"] < 1.0 and history["over_range"][0] > 40  # the candidate (the same model) reads microseconds
