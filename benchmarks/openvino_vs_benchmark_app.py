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

``--scenario offline`` compares throughput instead: ``benchmark_app -api async -hint throughput
-nireq R`` (streams and threads from ``-load_config``) against our ``offline`` scenario
(``AsyncInferQueue`` with R requests), where R and the streams are what OpenVINO's THROUGHPUT hint
picks for this IR (``OPTIMAL_NUMBER_OF_INFER_REQUESTS``, ``NUM_STREAMS`` read back from a compiled
model), given to both sides; the goal is ours / benchmark_app >= 0.97.

Rounds are interleaved (A B A B ...) so machine drift hits both alike. The compiled-model
properties benchmark_app reports are checked against ours before timing. Usage::

    python benchmarks/openvino_vs_benchmark_app.py [--model zoo:resnet50] [--rounds 3] [--seconds 10]
        [--threads N] [--precision fp32] [--batch 1] [--scenario single-stream|offline] [--quick]
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
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
FPS = re.compile(r"Throughput:\s+([\d.]+)\s+FPS")
PROPERTY = re.compile(r"\[ INFO \]\s{3}(\w+): (.+)")
#: Properties that must agree for the comparison to be fair.
CHECKED = ("PERFORMANCE_HINT", "NUM_STREAMS", "INFERENCE_NUM_THREADS", "INFERENCE_PRECISION_HINT")


def benchmark_app(xml: Path, shapes: str, properties: dict, seconds: int, tmp: Path,
                  requests: int | None = None) -> tuple[float, dict]:  # fmt: skip
    """Median latency in ms (sync), or items/s with ``requests`` in flight (async), and the
    compiled-model properties benchmark_app reports."""
    config = tmp / "benchmark_app_config.json"
    config.write_text(json.dumps({"CPU": properties}))
    exe = shutil.which("benchmark_app") or shutil.which("benchmark_app", path=str(Path(sys.executable).parent))
    if exe is None:
        raise SystemExit("benchmark_app not found: pip install 'autodeploy[openvino]'")
    if requests is None:
        cmd = [exe, "-m", str(xml), "-d", "CPU", "-api", "sync", "-nireq", "1", "-hint", "latency"]
    else:
        cmd = [exe, "-m", str(xml), "-d", "CPU", "-api", "async", "-nireq", str(requests), "-hint", "throughput"]
    cmd += ["-load_config", str(config), "-shape", shapes, "-t", str(seconds)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    out = done.stdout + done.stderr
    match = (MEDIAN if requests is None else FPS).search(out)
    if match is None:
        raise SystemExit(f"cannot find the result in benchmark_app's output:\n{out[-2000:]}")
    if requests is not None:
        return float(match[1]), dict(PROPERTY.findall(out))
    value, unit = float(match[1]), match[2]
    return value / 1000 if unit == "us" else value, dict(PROPERTY.findall(out))


def _shown(value: object) -> str:
    """A property value the way benchmark_app prints it (precisions as OpenVINO ``Type`` objects)."""
    types = {"f32": "float32", "bf16": "bfloat16", "f16": "float16"}
    return f"<Type: '{types[value]}'>" if value in types else str(value)


def ours(info, config, prepared, settings, scenario: str = "single-stream") -> tuple[float, str]:
    """Median ms (single-stream) or items/s (offline) from a full harness trial, and the artifact it ran."""
    result = run_trial(info, config, prepared, settings, scenario=scenario)
    if not result.ok:
        raise SystemExit(f"harness trial failed: {result.failure_kind}: {result.failure_message}")
    value = result.latency.median if scenario == "single-stream" else result.throughput
    return value, result.artifact_path


def throughput_setup(xml: Path, shapes: dict, properties: dict) -> tuple[int, int]:
    """(NUM_STREAMS, OPTIMAL_NUMBER_OF_INFER_REQUESTS) OpenVINO's THROUGHPUT hint picks for this IR."""
    from autodeploy.runtime.openvino import compiled_properties, core

    model = core().read_model(str(xml))
    model.reshape({name: list(shape) for name, shape in shapes.items()})
    compiled = compiled_properties(core().compile_model(model, "CPU", properties))
    return int(compiled["NUM_STREAMS"]), int(compiled["OPTIMAL_NUMBER_OF_INFER_REQUESTS"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="zoo:resnet50")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=10, help="timed seconds per run, each side")
    parser.add_argument("--threads", type=int, default=probe_device().physical_cores)
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--scenario", choices=("single-stream", "offline"), default="single-stream")
    parser.add_argument("--quick", action="store_true", help="zoo:tiny-cnn, 2 rounds of 2 s: a smoke run")
    args = parser.parse_args()
    if args.quick:
        args.model, args.rounds, args.seconds = "zoo:tiny-cnn", 2, 2
    offline = args.scenario == "offline"
    console = Console()
    device = probe_device()
    console.print(device.cpu_line())

    name = zoo.parse_ref(args.model)
    info = load_model(zoo.get(name) if name else args.model)
    config = TrialConfig(
        "openvino",
        args.precision,
        batch=args.batch,
        threads=args.threads,
        knobs={"PERFORMANCE_HINT": "THROUGHPUT" if offline else "LATENCY"},
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
        target=device,
        calibration_hash=prepared.calibration_sha256,
    )
    xml = artifact.path / IR_FILE
    shapes = ",".join(f"{n}[{','.join(map(str, info.input_shape(n, args.batch)))}]" for n in info.input_names)
    properties = compile_properties(config)
    requests = None
    if offline:  # both sides get the streams and requests the THROUGHPUT hint picks for this IR
        streams, requests = throughput_setup(xml, {n: info.input_shape(n, args.batch) for n in info.input_names},
                                             properties)  # fmt: skip
        config = TrialConfig("openvino", args.precision, batch=args.batch, threads=args.threads,
                             knobs={"PERFORMANCE_HINT": "THROUGHPUT", "NUM_STREAMS": streams, "num_requests": requests})
        properties = compile_properties(config)

    samples: dict[str, list[float]] = {"benchmark_app": [], "autodeploy harness": []}
    reported: dict = {}
    for _ in range(args.rounds):
        value, reported = benchmark_app(xml, shapes, properties, args.seconds, tmp, requests)
        samples["benchmark_app"].append(value)
        value, artifact_path = ours(info, config, prepared, settings, args.scenario)
        assert Path(artifact_path) == artifact.path, "the harness must measure the same IR"
        samples["autodeploy harness"].append(value)

    ours_shown = {k: _shown(properties[k]) for k in CHECKED if k in properties}
    mismatched = {k: (reported.get(k), v) for k, v in ours_shown.items() if reported.get(k) != v}
    console.print(f"benchmark_app compiled-model properties: { {k: reported.get(k) for k in CHECKED} }")
    if offline:
        console.print(f"both sides: {requests} infer requests in flight on {properties.get('NUM_STREAMS')} stream(s); "
                      "items/s over the timed wall time")  # fmt: skip
    else:
        console.print(
            "benchmark_app reports request.latency (timed inside OpenVINO); ours is wall time around Runner.run"
        )
    if mismatched:
        console.print(f"[yellow]properties differ (benchmark_app, ours): {mismatched}[/]")
    mode = f"THROUGHPUT hint, async, {requests} requests" if offline else "LATENCY hint, sync"
    unit = "items/s" if offline else "ms"
    title = (f"{args.model} {args.precision}, batch {args.batch}, {args.threads} thread(s), {mode}, "
             f"{args.rounds} rounds x {args.seconds} s")  # fmt: skip
    table = Table(title=title)
    for column in ("timed by", *(f"round {i + 1} {unit}" for i in range(args.rounds)), f"median {unit}", "ratio"):
        table.add_column(column, justify="left" if column == "timed by" else "right")
    base = statistics.median(samples["benchmark_app"])
    for label, values in samples.items():
        median = statistics.median(values)
        table.add_row(label, *(f"{v:.3f}" for v in values), f"{median:.3f}", f"{median / base:.3f}")
    console.print(table)
    goal = "goal >= 0.97" if offline else "goal within 3%"
    console.print(f"ours / benchmark_app = {statistics.median(samples['autodeploy harness']) / base:.3f} ({goal})")


if __name__ == "__main__":
    main()
