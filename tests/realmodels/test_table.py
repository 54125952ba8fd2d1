"""The corpus results file: a partial run merges into it, and the README table names the machine."""

from __future__ import annotations

import json

from tests.realmodels.conftest import save
from tests.realmodels.table import table


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
