"""In-house INT8 vs ONNX Runtime's ``quantize_static`` vs NNCF (OpenVINO): latency and accuracy.

Every config of one model runs through the same harness (``harness.run.run_trial``: fresh
worker, same timing policy, accuracy against the same ONNX Runtime FP32 reference) on the
same calibration and evaluation data, in one run. zoo:digits brings real labelled data
(task accuracy); the other zoo models have random weights and synthetic inputs, so only
agreement with FP32 means anything there. NNCF's column is skipped, with a note, when
``import nncf`` fails. Usage::

    python benchmarks/inhouse_int8.py [--models digits,mobilenetv2,resnet50] [--threads 1] [--batch 1]
"""

from __future__ import annotations

import argparse
import importlib.util
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from autodeploy import zoo
from autodeploy.adapters.base import TrialConfig
from autodeploy.data import Dataset
from autodeploy.harness.result import TrialResult
from autodeploy.harness.run import HarnessSettings, prepare_data, run_trial
from autodeploy.harness.timing import TimingPolicy
from autodeploy.model import load_model

CONFIGS = (
    ("ORT fp32", "onnxruntime", "fp32", {}),
    ("ORT quantize_static (QDQ)", "onnxruntime", "int8", {"quant_method": "static"}),
    ("in-house int8 (percentile)", "inhouse", "int8", {"calibration": "percentile"}),
    ("in-house int8 (minmax)", "inhouse", "int8", {"calibration": "minmax"}),
    ("in-house int8 (entropy)", "inhouse", "int8", {"calibration": "entropy"}),
    ("in-house QDQ on OpenVINO", "inhouse", "int8", {"calibration": "percentile", "runtime": "openvino"}),
    ("NNCF int8 (OpenVINO)", "openvino", "int8", {}),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="digits,mobilenetv2,resnet50")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--min-duration", type=float, default=2.0)
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    console = Console(width=170)
    has_openvino = importlib.util.find_spec("openvino") is not None
    has_nncf = has_openvino and importlib.util.find_spec("nncf") is not None
    if not has_nncf:
        console.print("[yellow]note:[/yellow] `import nncf` fails here: the NNCF column is skipped")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="autodeploy-int8-"))
    for name in args.models.split(","):
        settings = HarnessSettings(
            workdir=workdir, policy=TimingPolicy(min_samples=64, min_duration_s=args.min_duration)
        )
        info = load_model(zoo.get(name), name=f"zoo:{name}")
        arrays = zoo.dataset(name)
        data = prepare_data(
            info,
            settings,
            data=Dataset(arrays["inputs"], arrays["labels"]) if arrays else None,
            calibration=Dataset(arrays["calibration"]) if arrays else None,
        )
        table = Table(
            title=f"zoo:{name}, batch {args.batch}, {args.threads} thread(s): "
            f"{data.calibration_items} calibration / {data.evaluation_items} evaluation items"
            + ("" if data.has_labels else " (synthetic inputs, random weights)")
        )
        for column in (
            "config",
            "median ms",
            "p90 ms",
            "top-1 agreement",
            "task acc (fp32)",
            "constraint",
            "build s",
        ):
            table.add_column(column, justify="left" if column == "config" else "right")
        for label, engine, precision, knobs in CONFIGS:
            if (
                engine == "openvino"
                and not has_nncf
                or knobs.get("runtime") == "openvino"
                and not has_openvino
            ):
                table.add_row(label, *["skipped: not installed"] + [""] * 5)
                continue
            config = TrialConfig(engine, precision, batch=args.batch, threads=args.threads, knobs=knobs)
            console.print(f"{name}: {label} ...")
            table.add_row(label, *_cells(run_trial(info, config, data, settings)))
        console.print(table)


def _cells(result: TrialResult) -> list[str]:
    if result.latency is None:
        return [f"failed ({result.failure_kind})", "", "", "", (result.failure_message or "")[:60], ""]
    out = result.accuracy.outputs[0] if result.accuracy else None
    top1 = "-" if out is None or out.top1_agreement is None else f"{out.top1_agreement:.2%}"
    task = (
        "-"
        if out is None or out.task_accuracy is None
        else f"{out.task_accuracy:.2%} ({out.reference_task_accuracy:.2%})"
    )
    p90 = "-" if result.latency.p90 is None else f"{result.latency.p90:.3f}"
    verdict = "pass" if result.accuracy and result.accuracy.passed else "FAIL"
    return [f"{result.latency.median:.3f}", p90, top1, task, verdict, f"{result.build_s or 0:.1f}"]


if __name__ == "__main__":
    main()
