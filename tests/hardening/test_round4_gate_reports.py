"""Red-team round 4 (issue 37, partial): ``gate --junit/--markdown`` with hostile model paths.

A model path is the user's (or a pull request's) text. Written raw, its control characters made the
JUnit XML unparsable (XML 1.0 cannot hold ``\\x1b``), and a backtick ended the markdown code span, so an
image, a link or HTML rendered in the CI summary. The reports are written by the CLI's own writer here.
"""

from __future__ import annotations

import dataclasses
import xml.etree.ElementTree as ET
from datetime import datetime, timezone

import pytest
from markdown_it import MarkdownIt

from autodeploy.cli.gate import _report
from autodeploy.gate.core import INTERLEAVED, GateResult, GateSettings
from autodeploy.gate.measure import Round, Rounds
from autodeploy.gate.stats import MetricVerdict

#: A model path a pull request can choose: terminal escapes, a bell, a backtick that ends a code span,
#: then an image, raw HTML and a new heading.
HOSTILE = "m`![pwn](https://evil.example/p.png)<img src=x onerror=alert(1)>\x1b[31m\x07\n## injected`.onnx"
ARM = {"ref": "base.onnx", "kind": "model", "name": "m", "sha256": "ab" * 32,
       "config": {"engine": "onnxruntime"}, "label": "onnxruntime/fp32/b1/t1"}  # fmt: skip


def _result() -> GateResult:
    metric = MetricVerdict("latency median [x](https://evil.example)", "ms", "fail",
                           "slower <b>by</b> 20%\x1b[0m", "test", 0.05, 6, 6, 1.0, 1.2, 0.2, (0.1, 0.3), 0.02, 0.03,
                           0.001, 0.002)  # fmt: skip
    rounds = Rounds([Round("baseline", 0, median_ms=1.0)], [Round("candidate", 0, median_ms=1.2)])
    return GateResult("fail", INTERLEAVED, ARM, {**ARM, "ref": HOSTILE, "label": "b`<i>x</i>"}, (metric,), rounds,
                      {"fingerprint": "f" * 16, "cpu": "CPU\x00`<script>"}, GateSettings().to_dict(),
                      (f"candidate {HOSTILE} note",), 12.5, datetime.now(timezone.utc))  # fmt: skip


@pytest.fixture
def written(tmp_path, capsys):
    markdown, junit = tmp_path / "summary.md", tmp_path / "junit.xml"
    _report(_result(), markdown, junit)
    capsys.readouterr()
    return markdown.read_text(), junit.read_text()


def test_the_junit_xml_parses_and_shows_the_control_characters(written):
    root = ET.fromstring(written[1])  # raw \x1b, \x07 or \x00 made this a ParseError
    props = {p.get("name"): p.get("value") for p in root.iter("property")}
    assert props["candidate"].startswith("m`![pwn]") and "\\x1b[31m\\x07" in props["candidate"]
    case = root.find("testsuite/testcase")
    assert case.get("name") == "latency median [x](https://evil.example)"
    assert case.find("failure").get("message") == "slower <b>by</b> 20%\\x1b[0m"


def test_the_markdown_renders_no_image_link_html_or_heading(written):
    text = written[0]
    assert "\x1b" not in text and "\x07" not in text and "\x00" not in text
    html = MarkdownIt("commonmark").enable("table").render(text)
    for tag in ("<img", "<a ", "<script", "<b>", "<i>", "<h2>injected"):
        assert tag not in html, (tag, html)
    # the whole path stays in one code span, its backticks and markup as text
    assert "<code>m`![pwn](https://evil.example/p.png)&lt;img src=x onerror=alert(1)&gt;" in html
    assert "\\n## injected`.onnx</code>" in html
    assert "<td>latency median [x](https://evil.example)</td>" in html


def test_plain_paths_read_as_before(tmp_path, capsys):
    plain = dataclasses.replace(_result(), candidate={**ARM, "ref": "models/c.onnx"}, notes=())
    _report(plain, tmp_path / "s.md", None)
    capsys.readouterr()
    assert "- **candidate**: `models/c.onnx` (model, `onnxruntime/fp32/b1/t1`, sha256 `abababababab`)" in (
        tmp_path / "s.md"
    ).read_text()
