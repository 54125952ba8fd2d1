"""Markdown and JUnit XML from a synthetic gate result, and the store's gate-run rows."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from datetime import datetime, timezone

from autodeploy.gate import report
from autodeploy.gate.core import AGAINST_DB, INTERLEAVED, WEAKER, GateResult, GateSettings
from autodeploy.gate.measure import Round, Rounds
from autodeploy.gate.stats import MetricVerdict
from autodeploy.results_db.store import DeviceRecord, Store

ARM = {"ref": "m.onnx", "kind": "model", "name": "m", "sha256": "ab" * 32,
       "config": {"engine": "onnxruntime"}, "label": "onnxruntime/fp32/b1/t1"}  # fmt: skip


def result(mode: str = INTERLEAVED) -> GateResult:
    def metric(name: str, verdict: str) -> MetricVerdict:
        return MetricVerdict(name, "ms", verdict, f"{verdict} because", "test", 0.05, 6, 6, 1.0, 1.2, 0.2,
                             (0.1, 0.3), 0.02, 0.03, 0.001, 0.002)  # fmt: skip

    rounds = Rounds([Round("baseline", 0, median_ms=1.0)], [Round("candidate", 0, median_ms=1.2)])
    return GateResult("fail", mode, ARM, {**ARM, "ref": "c.onnx"},
                      (metric("latency median", "fail"), metric("latency p90", "inconclusive"),
                       metric("latency mean", "pass")), rounds, {"fingerprint": "f" * 16, "cpu": "CPU"},
                      GateSettings().to_dict(), ("a note",), 12.5, datetime.now(timezone.utc))  # fmt: skip


def test_junit_has_one_testcase_per_metric_with_failure_and_skipped():
    root = ET.fromstring(report.junit_xml(result()))
    suite = root.find("testsuite")
    assert suite.get("tests") == "3" and suite.get("failures") == "1" and suite.get("skipped") == "1"
    cases = {c.get("name"): c for c in suite.findall("testcase")}
    assert set(cases) == {"latency median", "latency p90", "latency mean"}
    assert cases["latency median"].find("failure").get("message") == "fail because"
    assert cases["latency p90"].find("skipped") is not None and cases["latency mean"].find("failure") is None
    props = {p.get("name"): p.get("value") for p in suite.find("properties")}
    assert props["verdict"] == "fail" and props["mode"] == INTERLEAVED


def test_markdown_has_the_verdict_and_a_row_per_metric():
    text = report.markdown(result())
    assert text.startswith("## autodeploy gate: FAIL (interleaved A/B)")
    assert "| latency median | 1.000 ms | 1.200 ms | +20.0% [+10.0%, +30.0%] | 0.002 | ❌ FAIL |" in text
    assert "> a note" in text and WEAKER not in text


def test_against_db_is_labelled_weaker_everywhere():
    weak = result(AGAINST_DB)
    assert WEAKER in report.markdown(weak) and WEAKER in report.title(weak)
    assert WEAKER in ET.fromstring(report.junit_xml(weak)).find("testsuite").get("name")


def test_gate_runs_are_stored_and_listed(store: Store):
    device = DeviceRecord("f" * 16, "CPU", {"cpu_model": "CPU"})
    first = store.add_gate_run(result().to_record(), device=device, command="autodeploy gate ...")
    second = store.add_gate_run(result(AGAINST_DB).to_record(), device=device)
    rows = store.list_gate_runs()
    assert [r.id for r in rows] == [second, first]
    row = rows[1]
    assert row.verdict == "fail" and row.mode == INTERLEAVED and row.device_fingerprint == "f" * 16
    assert (
        row.baseline_ref == "m.onnx"
        and row.candidate_ref == "c.onnx"
        and row.command == "autodeploy gate ..."
    )
    assert [m["name"] for m in row.metrics] == ["latency median", "latency p90", "latency mean"]
    assert (
        row.metrics[0]["change_ci"] == [0.1, 0.3]
        and row.settings["rounds_measured"]["baseline"][0]["median_ms"] == 1.0
    )
    assert [r.id for r in store.list_gate_runs(verdict="pass")] == []
    assert len(store.list_gate_runs(candidate_sha256="ab" * 32, limit=1)) == 1
