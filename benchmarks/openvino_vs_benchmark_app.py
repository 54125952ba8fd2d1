"""Our OpenVINO numbers against OpenVINO's own ``benchmark_app``, on the same IR and settings.

The IR is the one our adapter builds (``OpenVinoEngine.build``, into the folder the harness
caches artifacts in, so the harness measures the very same files). Both sides get the same
compile properties (our adapter's :func:`compile_properties`: ``PERFORMANCE_HINT``,
``INFERENCE_NUM_THREADS``, ``INFERENCE_PRECISION_HINT``), the same static input shape and
one synchronous infer request:

* ``benchmark_app -api sync -nireq 1 -hint latency -load_config props.json -shape ... -t S``
  (``-load_config`` because benchmark_app refuses ``-nthreads`` together with a hint);
* our harness: ``harness.run.run_trial`` (fresh worker process, warm-up, timed loop) with a
  ``TimingPolicy`` of the same duration.

Rounds are interleaved (A B A B ...) so machine drift hits both alike. The compiled-model
properties benchmark_app reports are checked against ours before timing. Usage::

    python benchmarks/openvino_vs_benchmark_app.py [--model zoo:resnet50] [--rounds 3] [--seconds 10]
        [--threads N] [--precision fp32] [--batch 1]
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from autodeploy import zoo
from autodeploy.adapters.base import TrialConfig
from autodeploy.adapters.openvino import IR_FILE, OpenVinoEngine, compile_properties
from autodeploy.data import Dataset
from autodeploy.device import probe_device
from autodeploy.harness.run import HarnessSettings, prepare_data, run_trial
from autodeploy.harness.timing import TimingPolicy
from autodeploy.model import load_model

MEDIAN = re.compile(r"Median:\s+([\d.]+)\s+(ms|us)")
PROPERTY = re.compile(r"\[ INFO \]\s{3}(\w+): (.+)")
#: Properties that must agree for the comparison to be fair.
CHECKED = ("PERFORMANCE_HINT", "NUM_STREAMS", "INFERENCE_NUM_THREADS", "INFERENCE_PRECISION_HINT")


def benchmark_app(xml: Path, shapes: str, properties: dict, seconds: int, tmp: Path) -> tuple[float, dict]:
    """Median latency in ms and the compiled-model properties benchmark_app reports."""
    config = tmp / "benchmark_app_config.json"
    config.write_text(json.dumps({"CPU": properties}))
    exe = shutil.which("benchmark_app")
    if exe is None:
        raise SystemExit("benchmark_app not found: pip install 'autodeploy[openvino]'")
    cmd = [exe, "-m", str(xml), "-d", "CPU", "-api", "sync", "-nireq", "1", "-hint", "latency"]
    cmd += ["-load_config", str(config), "-shape", shapes, "-t", str(seconds)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    out = done.stdout + done.stderr
    match = MEDIAN.search(out)
    if match is None:
        raise SystemExit(f"cannot find the median latency in benchmark_app's output:\n{out[-2000:]}")
    value, unit = float(match[1]), match[2]
    return value / 1000 if unit == "us" else value, dict(PROPERTY.findall(out))


def _shown(value: object) -> str:
    """A property value the way benchmark_app prints it (precisions as OpenVINO ``Type`` objects)."""
    types = {"f32": "float32", "bf16": "bfloat16", "f16": "float16"}
    return f"<Type: '{types[value]}'>" if value in types else str(value)


def ours(info, config, prepared, settings) -> tuple[float, str]:
    result = run_trial(info, config, prepared, settings)
    if not result.ok:
        raise SystemExit(f"harness trial failed: {result.failure_kind}: {result.failure_message}")
    return result.latency.median, result.artifact_path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="zoo:resnet50")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=10, help="timed seconds per run, each side")
    parser.add_argument("--threads", type=int, default=probe_device().physical_cores)
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--batch", type=int, default=1)
    args = parser.parse_args()

    name = zoo.parse_ref(args.model)
    info = load_model(zoo.get(name) if name else args.model)
    config = TrialConfig(
        "openvino",
        args.precision,
        batch=args.batch,
        threads=args.threads,
        knobs={"PERFORMANCE_HINT": "LATENCY"},
    )
    tmp = Path(tempfile.mkdtemp(prefix="autodeploy-bench-"))
    policy = TimingPolicy(min_samples=10, min_duration_s=args.seconds, max_duration_s=args.seconds)
    settings = HarnessSettings(workdir=tmp / "work", policy=policy)
    prepared = prepare_data(info, settings)
    # Build into the harness's artifact folder with the same key, so both sides run this IR.
    artifact = OpenVinoEngine().build(
        info,
        config,
        Dataset.load(prepared.calibration_path).inputs,
        settings.workdir / "artifacts",
        calibration_hash=prepared.calibration_sha256,
    )
    xml = artifact.path / IR_FILE
    shapes = ",".join(f"{n}[{','.join(map(str, info.input_shape(n, args.batch)))}]" for n in info.input_names)
    properties = compile_properties(config)

    samples: dict[str, list[float]] = {"benchmark_app": [], "autodeploy harness": []}
    reported: dict = {}
    for _ in range(args.rounds):
        median, reported = benchmark_app(xml, shapes, properties, args.seconds, tmp)
        samples["benchmark_app"].append(median)
        median, artifact_path = ours(info, config, prepared, settings)
        assert Path(artifact_path) == artifact.path, "the harness must measure the same IR"
        samples["autodeploy harness"].append(median)

    console = Console()
    ours_shown = {k: _shown(properties[k]) for k in CHECKED if k in properties}
    mismatched = {k: (reported.get(k), v) for k, v in ours_shown.items() if reported.get(k) != v}
    console.print(f"benchmark_app compiled-model properties: { {k: reported.get(k) for k in CHECKED} }")
    console.print(
        "benchmark_app reports request.latency (timed inside OpenVINO); ours is wall time around Runner.run"
    )
    if mismatched:
        console.print(f"[yellow]properties differ (benchmark_app, ours): {mismatched}[/]")
    title = (
        f"{args.model} {args.precision}, batch {args.batch}, {args.threads} thread(s), LATENCY hint, "
        f"sync, {args.rounds} rounds x {args.seconds} s"
    )
    table = Table(title=title)
    for column in ("timed by", *(f"round {i + 1} ms" for i in range(args.rounds)), "median ms", "ratio"):
        table.add_column(column, justify="left" if column == "timed by" else "right")
    base = statistics.median(samples["benchmark_app"])
    for label, values in samples.items():
        median = statistics.median(values)
        table.add_row(label, *(f"{v:.3f}" for v in values), f"{median:.3f}", f"{median / base:.3f}")
    console.print(table)
    console.print(f"ours / benchmark_app = {statistics.median(samples['autodeploy harness']) / base:.3f}")


if __name__ == "__main__":
    main()
