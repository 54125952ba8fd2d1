"""Our ONNX Runtime ``offline`` scenario against a plain thread-pool loop over one session.

Both sides run the same model file with the same session options (``intra_op_num_threads``,
sequential execution) and the same number of requests in flight: N threads calling
``InferenceSession.run`` on one shared session as fast as they can, for the same number of
seconds. Ours is a full harness trial (fresh worker, warm-up, the closed loop of
:mod:`autodeploy.harness.concurrency`, ``sessions=shared``); theirs is the few lines anyone would
write with ``concurrent.futures``. Rounds are interleaved (A B A B ...); the ratio is ours / plain.
Usage::

    python benchmarks/ort_offline_vs_threadpool.py [--model zoo:mobilenetv2] [--requests 2] [--threads 1]
        [--batch 1] [--rounds 3] [--seconds 10] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import onnxruntime as ort
from rich.console import Console
from rich.table import Table

from autodeploy import zoo
from autodeploy.adapters.base import TrialConfig
from autodeploy.data import Dataset, feeds
from autodeploy.device import probe_device
from autodeploy.harness.run import HarnessSettings, prepare_data, run_trial
from autodeploy.harness.timing import TimingPolicy
from autodeploy.model import load_model


def plain(model_path: Path, batch_feeds: dict, threads: int, requests: int, seconds: float, batch: int) -> float:
    """Items/s of N threads looping ``session.run`` on one session for ``seconds`` (after a short warm-up)."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.log_severity_level = 3
    session = ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
    for _ in range(10):
        session.run(None, batch_feeds)
    stop = threading.Event()
    counts = [0] * requests

    def loop(i: int) -> None:
        while not stop.is_set():
            session.run(None, batch_feeds)
            counts[i] += 1

    with ThreadPoolExecutor(requests) as pool:
        start = time.perf_counter()
        futures = [pool.submit(loop, i) for i in range(requests)]
        time.sleep(seconds)
        stop.set()
        for f in futures:
            f.result()
        elapsed = time.perf_counter() - start
    return sum(counts) * batch / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="zoo:mobilenetv2")
    parser.add_argument("--requests", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--quick", action="store_true", help="zoo:tiny-cnn, 2 rounds of 2 s: a smoke run")
    args = parser.parse_args()
    if args.quick:
        args.model, args.rounds, args.seconds = "zoo:tiny-cnn", 2, 2.0
    console = Console()
    device = probe_device()
    console.print(device.cpu_line())

    name = zoo.parse_ref(args.model)
    info = load_model(zoo.get(name) if name else args.model)
    tmp = Path(tempfile.mkdtemp(prefix="autodeploy-bench-"))
    policy = TimingPolicy(min_samples=10, min_duration_s=args.seconds, max_duration_s=args.seconds)
    settings = HarnessSettings(workdir=tmp / "work", policy=policy)
    prepared = prepare_data(info, settings)
    evaluation = Dataset.load(prepared.evaluation_path)
    axes = {n: info.batch_axis(n) for n in info.input_names}
    batch_feeds = feeds(evaluation.inputs, 0, args.batch, axes)  # the worker times its first batch too
    config = TrialConfig("onnxruntime", batch=args.batch, threads=args.threads,
                         knobs={"num_requests": args.requests, "sessions": "shared"})  # fmt: skip

    samples: dict[str, list[float]] = {"plain thread pool": [], "autodeploy offline": []}
    for _ in range(args.rounds):
        samples["plain thread pool"].append(
            plain(info.path, batch_feeds, args.threads, args.requests, args.seconds, args.batch))
        result = run_trial(info, config, prepared, settings, scenario="offline")
        if not result.ok:
            raise SystemExit(f"harness trial failed: {result.failure_kind}: {result.failure_message}")
        samples["autodeploy offline"].append(result.throughput)

    title = (f"{args.model}, batch {args.batch}, {args.requests} requests x {args.threads} thread(s) on one session, "
             f"{args.rounds} rounds x {args.seconds:g} s")  # fmt: skip
    table = Table(title=title)
    for column in ("measured by", *(f"round {i + 1} items/s" for i in range(args.rounds)), "median items/s", "ratio"):
        table.add_column(column, justify="left" if column == "measured by" else "right")
    base = statistics.median(samples["plain thread pool"])
    for label, values in samples.items():
        median = statistics.median(values)
        table.add_row(label, *(f"{v:.1f}" for v in values), f"{median:.1f}", f"{median / base:.3f}")
    console.print(table)
    console.print(f"ours / plain = {statistics.median(samples['autodeploy offline']) / base:.3f}")


if __name__ == "__main__":
    main()
