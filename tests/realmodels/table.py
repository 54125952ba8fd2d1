"""The README's corpus table from ``.cache/realmodels/corpus-results.json`` (written by the corpus run).

``python -m tests.realmodels.table`` prints, per model: ONNX Runtime fp32, then each engine's fastest
config that passes the accuracy budget (or why none does), with its speed-up over ONNX Runtime fp32.
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


def _reason(row: dict) -> str:
    text = row.get("outcome") or row.get("verdict") or ""
    return text.split(": ", 1)[0] if text.startswith(("pruned", "failed")) else text


if __name__ == "__main__":
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else RESULTS
    print(table(json.loads(path.read_text())))
