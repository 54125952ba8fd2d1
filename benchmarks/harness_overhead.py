"""Harness overhead: the same ONNX Runtime session timed four ways, in one run.

1. a bare ``perf_counter_ns`` loop around ``session.run`` (the floor);
2. our timing loop (``harness.timing.time_calls``) around the same session, in-process;
3. ONNX Runtime's own timing of the same loop (its profiler's ``model_run`` events);
4. the full harness: a fresh worker process that builds, loads and times (``harness.run.run_trial``).

Rounds of 1-3 are interleaved (A B C A B C ...) so machine drift hits each alike; medians
are quoted, with the ratio to the bare loop. Usage::

    python benchmarks/harness_overhead.py [--model zoo:tiny-cnn] [--rounds 5] [--calls 300] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
from rich.console import Console
from rich.table import Table

from autodeploy import zoo
from autodeploy.adapters.base import TrialConfig
from autodeploy.data import synthetic
from autodeploy.harness.run import HarnessSettings, prepare_data, run_trial
from autodeploy.harness.timing import TimingPolicy, time_calls
from autodeploy.model import load_model


def session(path: Path, threads: int, profile_dir: Path | None = None) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    if profile_dir is not None:
        options.enable_profiling = True
        options.profile_file_prefix = str(profile_dir / "ort")
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def bare(sess: ort.InferenceSession, feeds: dict, calls: int) -> list[float]:
    out = []
    for _ in range(calls):
        t0 = time.perf_counter_ns()
        sess.run(None, feeds)
        out.append((time.perf_counter_ns() - t0) / 1e6)
    return out


def ours(sess: ort.InferenceSession, feeds: dict, calls: int) -> list[float]:
    policy = TimingPolicy(
        warmup_min_calls=0, warmup_max_s=0, min_samples=calls, min_duration_s=0, max_samples=calls
    )
    return list(time_calls(lambda: sess.run(None, feeds), policy).samples_ns / 1e6)


def ort_profiled(sess: ort.InferenceSession, feeds: dict, calls: int) -> list[float]:
    for _ in range(calls):
        sess.run(None, feeds)
    trace = json.loads(Path(sess.end_profiling()).read_text())
    return [e["dur"] / 1e3 for e in trace if e.get("name") == "model_run"][-calls:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="zoo:tiny-cnn")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()

    name = zoo.parse_ref(args.model)
    info = load_model(zoo.get(name) if name else args.model)
    feeds = {k: v for k, v in synthetic(info, 1).inputs.items()}
    tmp = Path(tempfile.mkdtemp(prefix="autodeploy-bench-"))
    plain = session(info.path, args.threads)
    profiled = session(info.path, args.threads, profile_dir=tmp)
    for s in (plain, profiled):  # same warm-up for both sessions, not counted
        bare(s, feeds, 50)

    samples: dict[str, list[float]] = {"bare loop": [], "our timing loop": [], "ORT profiler (model_run)": []}
    for _ in range(args.rounds):
        samples["bare loop"] += bare(plain, feeds, args.calls)
        samples["our timing loop"] += ours(plain, feeds, args.calls)
    # ORT's profiler records every call of its session; one pass over the same call count.
    samples["ORT profiler (model_run)"] = ort_profiled(profiled, feeds, args.calls * args.rounds)

    settings = HarnessSettings(
        workdir=tmp / "work", policy=TimingPolicy(min_samples=args.calls * args.rounds, min_duration_s=2.0)
    )
    result = run_trial(
        info, TrialConfig("onnxruntime", threads=args.threads), prepare_data(info, settings), settings
    )
    if not result.ok:
        raise SystemExit(f"harness trial failed: {result.failure_kind}: {result.failure_message}")
    samples["full harness (worker process)"] = list(result.samples_ms)

    base = statistics.median(samples["bare loop"])
    table = Table(title=f"{args.model}, batch 1, {args.threads} thread(s), {args.rounds}x{args.calls} calls")
    for column in ("timed by", "n", "median ms", "p90 ms", "ratio to bare loop"):
        table.add_column(column, justify="left" if column == "timed by" else "right")
    for label, values in samples.items():
        median = statistics.median(values)
        table.add_row(
            label,
            str(len(values)),
            f"{median:.4f}",
            f"{np.percentile(values, 90):.4f}",
            f"{median / base:.3f}",
        )
    Console().print(table)


if __name__ == "__main__":
    main()
