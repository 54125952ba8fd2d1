"""Dashboard load time: the first page on a store of 1,000 trials (issue 19; goal: under 3 s).

1. Builds a SQLite store through the real store API: a few real trials of two small models
   (ONNX Runtime fp32 and int8, measured by the harness here), then copies of them, re-labelled
   with other thread counts, batches and knobs and their times scaled, up to ``--trials``
   trials on two device fingerprints, eight finished latency studies with finalists among them.
   The copies are a load test: their numbers are not results.
2. Times each page in a fresh process through Streamlit's AppTest, which runs the same entry
   point as ``autodeploy dashboard``: *cold* is the first view with the app's imports, the store
   opened, every query; *served* the same after the imports ``autodeploy dashboard`` does before
   its server listens (:mod:`autodeploy.dashboard.serve`); *warm* is the page again (cached).
3. With ``--browser`` (Debian's chromium + Playwright's Python package), also starts
   ``autodeploy dashboard`` on a localhost port and times the first page in headless Chromium,
   from navigation until the studies table is drawn.

``--profile`` prints the cold load's slowest calls (cProfile, cumulative). Prints the CPU
model and flags it ran on; times are this machine's (a ratio to the goal, not a promise).
Usage::

    python benchmarks/dashboard_load.py [--trials 1000] [--runs 3] [--browser] [--profile] [--db PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import replace
from pathlib import Path

GOAL_S = 3.0
PAGES = ["overview", "winners", "compare", "pareto", "trials", "devices", "regressions"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=3, help="fresh processes per page (the median is quoted)")
    parser.add_argument("--db", type=Path, help="build the store here (kept; reused when it exists), not in a temp folder")
    parser.add_argument("--browser", action="store_true", help="also time the first page in headless Chromium")
    parser.add_argument("--profile", action="store_true", help="print the cold first page's slowest calls")
    parser.add_argument("--measure", nargs=2, metavar=("URL", "PAGE"), help=argparse.SUPPRESS)
    parser.add_argument("--preloaded", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        measure(*args.measure, profile=args.profile, preloaded=args.preloaded)
        return

    from autodeploy.device import probe_device

    device = probe_device()
    print(device.cpu_line())
    with tempfile.TemporaryDirectory(prefix="autodeploy-dashboard-load-") as tmp:
        path = args.db or Path(tmp) / "results.db"
        url = f"sqlite:///{path}"
        if path.exists():  # --db of an earlier run: time the same store again
            print(f"store: {path} (kept from an earlier run)")
        else:
            t0 = time.perf_counter()
            build_store(url, args.trials, Path(tmp))
            print(f"store: {args.trials} trials in {path} (built in {time.perf_counter() - t0:.1f} s)")
        rows = []
        for page in PAGES:
            cold = [child(url, page) for _ in range(args.runs)]
            served = [child(url, page, preloaded=True) for _ in range(args.runs)]
            rows.append((page, statistics.median(r["cold_s"] for r in cold),
                         statistics.median(r["cold_s"] for r in served), statistics.median(r["warm_s"] for r in cold)))  # fmt: skip
        print(f"\n{'page':<12} {'cold (s)':>9} {'served (s)':>11} {'warm (s)':>9}   (medians of {args.runs} fresh "
              "processes each)")  # fmt: skip
        print("  cold: the first view with the app's imports; served: the first view as `autodeploy dashboard` serves "
              "it (heavy imports done at start); warm: the view again (caches)")  # fmt: skip
        for page, cold, served, warm in rows:
            print(f"{page:<12} {cold:>9.2f} {served:>11.2f} {warm:>9.2f}")
        first = rows[0][2]
        print(f"\nfirst page (overview) as served: {first:.2f} s = {first / GOAL_S:.2f} x the {GOAL_S:g} s goal "
              f"({'met' if first < GOAL_S else 'NOT met'}); without the preload: {rows[0][1]:.2f} s")  # fmt: skip
        if args.browser:
            first_tab, second_tab = browser_load(url)
            print(f"first page in headless Chromium (server up, until the studies table is drawn): {first_tab:.2f} s;"
                  f" again in a new tab: {second_tab:.2f} s")  # fmt: skip
        if args.profile:
            child(url, "overview", profile=True)


# -- the store ------------------------------------------------------------------------------


def build_store(url: str, n_trials: int, tmp: Path) -> None:
    """Real trials of two small models, then re-labelled, scaled copies up to ``n_trials`` (see the module doc)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.models, from a checkout
    from tests.models import mlp

    from autodeploy.adapters.base import TrialConfig
    from autodeploy.device import probe_device
    from autodeploy.harness.run import HarnessSettings, prepare_data, run_trial
    from autodeploy.harness.timing import TimingPolicy
    from autodeploy.model import load_model
    from autodeploy.results_db import DeviceRecord, ModelRecord, Store

    policy = TimingPolicy(warmup_min_calls=2, warmup_max_s=0.2, min_samples=200, min_duration_s=0.2, max_duration_s=5)
    settings = HarnessSettings(workdir=tmp / "work", policy=policy, timeout_s=60)
    here = DeviceRecord.of(probe_device())
    other = DeviceRecord("0000loadtest0000", "Load Test CPU", {"cpu_model": "Load Test CPU", "logical_cores": 8})
    models = [load_model(mlp(tmp / "small.onnx")), load_model(mlp(tmp / "wide.onnx", in_features=64, classes=10, seed=1))]
    real = {}
    for model in models:
        data = prepare_data(model, settings)
        for precision in ("fp32", "int8"):
            result = run_trial(model, TrialConfig("onnxruntime", precision, batch=1, threads=1), data, settings)
            if result.measurement is None:
                raise SystemExit(f"the real trial {model.name} {precision} failed: {result.failure_message}")
            real[model.name, precision] = result
    pairs = [(m, d) for m in models for d in (here, other)]
    per_pair = n_trials // len(pairs)
    with Store.open(url) as store:
        stored = 0
        for i, (model, device) in enumerate(pairs):
            count = per_pair + (n_trials - per_pair * len(pairs) if i == len(pairs) - 1 else 0)
            stored += _pair_trials(store, model, ModelRecord.of(model), device, real, count, i)
    assert stored == n_trials, (stored, n_trials)


def _pair_trials(store, model, model_record, device, real, count: int, seed: int) -> int:
    """``count`` trials of one model on one device: two studies of 40% each (screening + 3 finalists x 2 rounds),
    the rest single benches."""
    import random

    from autodeploy.search.study import BASELINE, Finalist, StudySummary

    rng = random.Random(seed)
    stored = 0
    for s in range(2):
        name = f"{model.name}-{device.fingerprint[:6]}-{s}"
        store.save_study(name, model=model_record, device=device, objective="latency", settings={"constraints": {}},
                         command=f"autodeploy tune {model.name}.onnx --name {name}")  # fmt: skip
        screened = []
        for _ in range(int(count * 0.4) - 7):
            config, result = _copy(real, model.name, rng)
            store.add_trial(result, model=model_record, device=device, study=name, phase="screening")
            screened.append((result.measurement.latency.p90 or result.measurement.latency.median, config))
        top = [c for _, c in sorted(screened, key=lambda t: t[0])[:3]]
        finalists = []
        for config in [*top, BASELINE]:
            runs = []
            for _ in range(2 if config is not BASELINE else 1):
                _, result = _copy(real, model.name, rng, config)
                store.add_trial(result, model=model_record, device=device, study=name, phase="finalist")
                runs.append(result)
            lat = runs[-1].measurement.latency
            finalists.append(Finalist(config, config.label(), lat.p90, lat.p90_ci, lat.n * len(runs),
                                      [r.uid for r in runs], config is BASELINE))  # fmt: skip
        winner = min(finalists, key=lambda f: f.statistic)
        base = finalists[-1]
        summary = StudySummary(name, "latency", {"complete": len(screened)}, finalists, winner, [],
                               base.statistic / winner.statistic)  # fmt: skip
        store.finish_study(name, winner_uid=winner.uids[-1], summary=summary.to_dict())
        stored += len(screened) + 7
    while stored < count:
        _, result = _copy(real, model.name, rng)
        store.add_trial(result, model=model_record, device=device, command=f"autodeploy bench {model.name}.onnx")
        stored += 1
    return stored


def _copy(real, model_name: str, rng, config=None):
    """A real trial of ``model_name`` re-labelled with ``config`` (random when ``None``) and its times scaled."""
    from autodeploy.adapters.base import TrialConfig
    from autodeploy.harness.result import Measurement

    if config is None:
        knobs = {"execution_mode": rng.choice(["ORT_SEQUENTIAL", "ORT_PARALLEL"]),
                 "graph_optimization_level": rng.choice(["ORT_ENABLE_BASIC", "ORT_ENABLE_ALL"])}  # fmt: skip
        config = TrialConfig("onnxruntime", rng.choice(["fp32", "int8"]), batch=rng.choice([1, 2, 4, 8]),
                             threads=rng.choice([1, 2, 4, 8, None]), knobs=knobs)  # fmt: skip
    source = real[model_name, config.precision]
    factor = rng.uniform(0.5, 3.0) * config.batch
    flat = source.measurement.to_dict()
    for key, value in list(flat.items()):
        if value is None:
            continue
        if key.endswith("_ms") and key != "samples_ms":
            flat[key] = value * factor
        elif key.endswith("_ci"):
            flat[key] = [v * factor for v in value]
        elif key == "samples_ms":
            flat[key] = [v * factor for v in value]
        elif key == "throughput":
            flat[key] = value / factor * config.batch
    flat["batch"] = config.batch
    return config, replace(source, uid=uuid.uuid4().hex, config=config, measurement=Measurement.from_dict(flat))


# -- timing ---------------------------------------------------------------------------------


def child(url: str, page: str, profile: bool = False, preloaded: bool = False) -> dict:
    """Run :func:`measure` in a fresh Python process (cold imports, empty caches) and return its timings."""
    cmd = [sys.executable, __file__, "--measure", url, page, *(["--profile"] if profile else []),
           *(["--preloaded"] if preloaded else [])]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"timing the {page} page failed:\n{out.stderr[-3000:]}")
    if profile:
        print(out.stdout)
        return {}
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(url: str, page: str, profile: bool = False, preloaded: bool = False) -> None:
    """In this (fresh) process: the page's first load through AppTest, then again from the caches.

    ``preloaded``: the heavy imports done first, untimed, as ``autodeploy dashboard`` does at start.
    """
    t0 = time.perf_counter()
    from streamlit.testing.v1 import AppTest

    from autodeploy.dashboard import APP, DB_ENV, serve

    if preloaded:
        serve.preload()

    imported = time.perf_counter() - t0
    os.environ[DB_ENV] = url
    at = AppTest.from_file(str(APP), default_timeout=120)
    if page != "overview":
        at.switch_page(f"app_pages/{page}.py")
    profilers = _profile_new_threads() if profile else []  # AppTest runs the script in a thread of its own
    t1 = time.perf_counter()
    at.run()
    cold = time.perf_counter() - t1
    if profilers:
        import pstats

        threading.setprofile(None)  # type: ignore[arg-type]
        stats = pstats.Stats(profilers[0], stream=sys.stdout)
        for other in profilers[1:]:
            stats.add(other)
        stats.sort_stats("cumulative").print_stats(30)
    if at.exception:
        raise SystemExit(f"the {page} page raised: {at.exception[0].value}")
    t2 = time.perf_counter()
    at.run()
    warm = time.perf_counter() - t2
    print(json.dumps({"page": page, "streamlit_import_s": imported, "cold_s": cold, "warm_s": warm}))


def _profile_new_threads() -> list:
    """Profile every thread started from now on (each with its own cProfile.Profile, returned in a list)."""
    import cProfile

    profilers: list[cProfile.Profile] = []

    def start(*_: object) -> None:
        sys.setprofile(None)
        profiler = cProfile.Profile()
        profilers.append(profiler)
        profiler.enable()

    threading.setprofile(start)
    return profilers


def browser_load(url: str) -> tuple[float, float]:
    """Start ``autodeploy dashboard``; time the overview in headless Chromium until its studies table is drawn,
    in the first tab and again in a second one (the server warm)."""
    import signal
    import socket
    import urllib.request

    from playwright.sync_api import sync_playwright

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cmd = [sys.executable, "-m", "autodeploy", "dashboard", "--db", url, "--port", str(port)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        for _ in range(240):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2):
                    break
            except OSError:
                time.sleep(0.5)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", headless=True,
                                        args=["--headless", "--no-sandbox", "--disable-gpu"])  # fmt: skip
            times = []
            for _ in range(2):  # the first load, then a new tab: the server's imports and caches are warm
                page = browser.new_page(viewport={"width": 1400, "height": 1600})
                t0 = time.perf_counter()
                page.goto(f"http://127.0.0.1:{port}/", timeout=120_000)
                page.get_by_role("heading", name="Overview").wait_for(timeout=120_000)
                page.locator("[data-testid='stDataFrame']").first.wait_for(timeout=120_000)
                times.append(time.perf_counter() - t0)
                page.close()
            browser.close()
        return times[0], times[1]
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)


if __name__ == "__main__":
    main()
