"""The corpus results file: a partial run merges into it, and the README table names the machine."""

from __future__ import annotations

import json

from tests.realmodels.conftest import save
from tests.realmodels.table import table, verdicts


def row(model: str, engine: str, precision: str, ms: float) -> dict:
    return {"model": model, "engine": engine, "precision": precision, "median_ms": ms, "cosine": 1.0,
            "top1": None, "verdict": "pass", "outcome": f"{ms} ms"}  # fmt: skip


def test_a_partial_run_replaces_its_own_rows_and_keeps_the_others(tmp_path):
    path = tmp_path / "corpus-results.json"
    save([row("det", "onnxruntime", "fp32", 10.0), row("det", "openvino", "bf16", 5.0)], path)
    save([row("det", "openvino", "bf16", 4.0)], path)  # e.g. pytest -k openvino
    rows = json.loads(path.read_text())
    assert [(r["engine"], r["median_ms"]) for r in rows] == [("onnxruntime", 10.0), ("openvino", 4.0)]
    assert all(r["cpu"].startswith("CPU: ") for r in rows)
    text = table(rows)
    assert text.splitlines()[0] == f"Measured on: {rows[0]['cpu']}"
    assert "| det | 10.00 ms | openvino | bf16: 4.00 ms | 2.50x | pass (cosine 1.0000) |" in text


def test_two_runs_side_by_side_mark_each_changed_verdict():
    before = [{**row("onet", "onnxruntime", "int8", 1.0), "verdict": "FAIL (top-1)", "judged": "dense_6: top-1 agreement 0.9688"},
              {**row("onet", "openvino", "bf16", 1.0), "judged": "dense_6: top-1 agreement 1.0000"}]  # fmt: skip
    after = [{**row("onet", "onnxruntime", "int8", 1.0), "judged": "dense_6: error SNR 34.30 dB"},
             {"model": "onet", "engine": "tflite", "precision": "fp32", "outcome": "failed (build_failed): no converter"}]  # fmt: skip
    lines = verdicts(before, after).splitlines()
    assert "| onet | onnxruntime | int8 | `dense_6: top-1 agreement 0.9688` | FAIL | `dense_6: error SNR 34.30 dB` | pass | **yes** |" in lines
    assert "| onet | openvino | bf16 | `dense_6: top-1 agreement 1.0000` | pass | - | not run | **yes** |" in lines
    assert "| onet | tflite | fp32 | - | not run | - | failed (build_failed) | **yes** |" in lines
