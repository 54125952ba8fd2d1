"""The gate's reports for CI systems: a markdown summary and JUnit XML (one testcase per metric).

Model paths, labels and reasons come from users and files: in both reports their control characters are
made visible (``\\x1b``), since XML 1.0 cannot hold them and a newline would start new markdown; in
markdown a backtick cannot end a code span and text outside one cannot render as a link, image or HTML.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from autodeploy.gate.core import WEAKER, GateResult
from autodeploy.gate.stats import MetricVerdict

_MARK = {"pass": "✅ pass", "fail": "❌ FAIL", "inconclusive": "⚠️ inconclusive"}
#: What XML 1.0 cannot hold (C0 controls but tab, newline and CR; surrogates; U+FFFE/F), with the C1 controls
#: and bidi overrides too: made visible as ``\\x01`` / ``\\u202e``.
_NOT_TEXT = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff\ufffe\uffff]")
#: Markdown's control characters outside a code span (links, images, HTML, emphasis, table cells).
_MD_SPECIAL = re.compile(r"([\\`*_\[\]<>!|~&])")


def _visible(value: object) -> str:
    """``value`` on one line, its control characters written as escapes."""
    text = _NOT_TEXT.sub(lambda m: repr(m.group())[1:-1], str(value))
    return text.replace("\r", "\\r").replace("\n", "\\n").replace("\t", "\\t")


def _code(value: object) -> str:
    """``value`` as one markdown code span that nothing in it can end: a fence longer than its longest
    run of backticks (CommonMark), on one line."""
    text = _visible(value)
    fence = "`" * (max((len(run) for run in re.findall("`+", text)), default=0) + 1)
    return f"{fence} {text} {fence}" if len(fence) > 1 else f"`{text}`"


def _md(value: object) -> str:
    """``value`` as plain markdown text on one line: every character that could start markup escaped."""
    return _MD_SPECIAL.sub(r"\\\1", _visible(value))


def title(result: GateResult) -> str:
    mode = WEAKER if result.weaker else "interleaved A/B"
    return f"autodeploy gate: {result.verdict.upper()} ({mode})"


def markdown(result: GateResult) -> str:
    """A summary for a pull request or ``$GITHUB_STEP_SUMMARY``."""
    b, c, s = result.baseline, result.candidate, result.settings
    n_b = sum(r.ok for r in result.rounds.baseline)
    n_c = sum(r.ok for r in result.rounds.candidate)
    lines = [
        f"## {title(result)}",
        "",
        f"- **baseline**: {_code(b['ref'])} ({_md(b['kind'])}, {_code(b['label'])}, sha256 {_code(b['sha256'][:12])}): "
        f"{n_b} " + ("stored trials" if result.weaker else "runs"),
        f"- **candidate**: {_code(c['ref'])} ({_md(c['kind'])}, {_code(c['label'])}, sha256 {_code(c['sha256'][:12])}): "
        f"{n_c} runs",
        f"- device {_code(result.device['cpu'])} (fingerprint {_code(result.device['fingerprint'])})",
        f"- fail = Holm-corrected p <= {s['alpha']:g} **and** latency change > {s['max_regression']:.1%}, or "
        f"accuracy drop > {s['max_accuracy_drop']:.2%}; pass needs the upper 95% bound of each latency change "
        f"<= {s['max_regression']:.1%}; inconclusive below {s['min_samples']} runs per side or when too noisy; wall time {result.wall_s:.0f} s",
        "",
        "| metric | baseline | candidate | change (90% CI) | p (Holm) | verdict | why |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += [_row(m) for m in result.metrics]
    if result.notes:
        lines += ["", *[f"> {_md(note)}" for note in result.notes]]
    return "\n".join(lines) + "\n"


def _row(m: MetricVerdict) -> str:
    def num(v: float | None) -> str:
        if v is None:
            return "-"
        return f"{v:.3f} ms" if m.unit == "ms" else f"{v:.2%}" if m.unit == "score" else f"{v:g}"

    change = "-"
    if m.change is not None and m.unit == "ms":
        change = f"{m.change:+.1%}" + (
            f" [{m.change_ci[0]:+.1%}, {m.change_ci[1]:+.1%}]" if m.change_ci else ""
        )
    elif m.change is not None:
        change = f"drop {m.change:+.2%}"
    p = "-" if m.p_adjusted is None else f"{m.p_adjusted:.2g}"
    return f"| {_md(m.name)} | {num(m.baseline)} | {num(m.candidate)} | {change} | {p} | {_MARK[m.verdict]} | {_md(m.reason)} |"


def junit_xml(result: GateResult) -> str:
    """JUnit XML: one testcase per metric; ``failure`` on fail, ``skipped`` on inconclusive."""
    suite_name = "autodeploy gate" + (f" ({WEAKER})" if result.weaker else "")
    suites = ET.Element("testsuites", name="autodeploy")
    suite = ET.SubElement(suites, "testsuite", {
        "name": suite_name, "tests": str(len(result.metrics)),
        "failures": str(sum(m.verdict == "fail" for m in result.metrics)), "errors": "0",
        "skipped": str(sum(m.verdict == "inconclusive" for m in result.metrics)),
        "time": f"{result.wall_s:.3f}", "timestamp": result.created_at.isoformat(timespec="seconds"),
    })  # fmt: skip
    props = ET.SubElement(suite, "properties")
    for key, value in (("verdict", result.verdict), ("mode", result.mode), ("baseline", result.baseline["ref"]),
                       ("candidate", result.candidate["ref"]), ("device", result.device["fingerprint"])):  # fmt: skip
        ET.SubElement(props, "property", name=key, value=str(value))
    for m in result.metrics:
        case = ET.SubElement(suite, "testcase", classname="autodeploy.gate", name=m.name, time="0")
        if m.verdict == "fail":
            ET.SubElement(case, "failure", message=m.reason, type="regression").text = _detail(m)
        elif m.verdict == "inconclusive":
            ET.SubElement(case, "skipped", message=f"inconclusive: {m.reason}")
        ET.SubElement(case, "system-out").text = _detail(m)
    ET.indent(suites)
    text = ET.tostring(suites, encoding="unicode")  # escapes markup, but writes control characters raw
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + _NOT_TEXT.sub(lambda m: repr(m.group())[1:-1], text) + "\n"


def _detail(m: MetricVerdict) -> str:
    return (f"{m.name}: baseline {m.baseline} candidate {m.candidate} ({m.unit}); change {m.change} "
            f"CI {m.change_ci}; p {m.p_value} (Holm {m.p_adjusted}); n {m.n_baseline}/{m.n_candidate}; "
            f"CV {m.cv_baseline}/{m.cv_candidate}; test: {m.test}; {m.verdict}: {m.reason}")  # fmt: skip
