"""The README's corpus table from ``.cache/realmodels/corpus-results.json`` (written by the corpus run).

``python -m tests.realmodels.table`` prints, per model: ONNX Runtime fp32, then each engine's fastest
config that passes the accuracy budget (or why none does), with its speed-up over ONNX Runtime fp32.
``python -m tests.realmodels.table BEFORE.json AFTER.json`` prints every model, engine and precision of two
runs side by side: each run's verdict and the output it rests on (how a change to the rules moved them).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

RESULTS = Path(".cache/realmodels/corpus-results.json")


def table(rows: list[dict]) -> str:
    cpus = sorted({r["cpu"] for r in rows if r.get("cpu")})
    lines = [f"Measured on: {'; '.join(cpus) or 'machine not recorded'}", "",
             "| model | ORT fp32 (baseline) | engine | best config inside the budget | vs ORT fp32 | verdict |",
             "|---|---:|---|---|---:|---|"]  # fmt: skip
    for model in dict.fromkeys(r["model"] for r in rows):
        mine = [r for r in rows if r["model"] == model]
        base = next((r for r in mine if r["engine"] == "onnxruntime" and r["precision"] == "fp32"), None)
        base_ms = base.get("median_ms") if base else None
        for engine in sorted({r["engine"] for r in mine}):
            runs = [r for r in mine if r["engine"] == engine]
            passing = [r for r in runs if r.get("verdict") == "pass" and r.get("median_ms")]
            if passing:
                best = min(passing, key=lambda r: r["median_ms"])
                ratio = f"{base_ms / best['median_ms']:.2f}x" if base_ms else "-"
                acc = f"cosine {best['cosine']:.4f}" + (f", top-1 {best['top1']:.0%}" if best.get("top1") is not None else "")
                cell, verdict = f"{best['precision']}: {best['median_ms']:.2f} ms", f"pass ({acc})"
            else:
                ratio, cell = "-", "none"
                verdict = "; ".join(sorted({f"{r['precision']}: {_reason(r)}" for r in runs}))
            shown_base = f"{base_ms:.2f} ms" if base_ms else "-"
            lines.append(f"| {model} | {shown_base} | {engine} | {cell} | {ratio} | {verdict} |")
    return "\n".join(lines)


def verdicts(before: list[dict], after: list[dict]) -> str:
    """Every (model, engine, precision) of either run: its verdict before and after, and whether it changed."""
    key = lambda r: (r["model"], r["engine"], r["precision"])  # noqa: E731
    old, new = {key(r): r for r in before}, {key(r): r for r in after}
    lines = ["| model | engine | precision | before: judged on | before | after: judged on | after | changed |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for k in dict.fromkeys([*old, *new]):
        a, b = _verdict(old.get(k)), _verdict(new.get(k))
        lines.append(f"| {' | '.join(k)} | {a[0]} | {a[1]} | {b[0]} | {b[1]} | {'**yes**' if a[1] != b[1] else ''} |")
    return "\n".join(lines)


def _verdict(row: dict | None) -> tuple[str, str]:
    """``(judged on, verdict)`` of one row: ``pass``/``FAIL`` with the output it rests on, or why it did not run."""
    if row is None:
        return "-", "not run"
    if row.get("verdict"):
        return f"`{row.get('judged', '')}`", "pass" if row["verdict"] == "pass" else "FAIL"
    text = row.get("outcome", "")
    return "-", text.split(": ", 1)[0] if text.startswith(("pruned", "failed")) else text


def _reason(row: dict) -> str:
    text = row.get("outcome") or row.get("verdict") or ""
    return text.split(": ", 1)[0] if text.startswith(("pruned", "failed")) else text


if __name__ == "__main__":
    if len(sys.argv) == 3:
        print(verdicts(*(json.loads(Path(p).read_text()) for p in sys.argv[1:])))
    else:
        path = Path(sys.argv[1]) if len(sys.argv) > 1 else RESULTS
        print(table(json.loads(path.read_text())))
