"""LiteRT with the runtime only: a board that installed ``ai-edge-litert`` but not the ONNX → TFLite
converter (onnx2tf, TensorFlow) runs its own ``.tflite``, and an ONNX model is refused with the fix.

The converter is really hidden: a ``sitecustomize`` on the ``PYTHONPATH`` of a child Python makes
``importlib.util.find_spec`` answer ``None`` for ``onnx2tf`` and ``tensorflow`` and their imports fail.
The child passes its ``PYTHONPATH`` on (:func:`autodeploy.child.child_env`), so the hide reaches every
process it starts too (the CLI, the bench's workers); each of them records its pid. The engine is the
real one; the child prints what it saw as JSON.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import zipfile

import pytest

from autodeploy import zoo
from tests.realmodels.corpus import WHEELS

pytestmark = pytest.mark.slow  # a child Python, the CLI in a grandchild and a real bench: about 20 s

MEMBER = "basic_pitch/saved_models/icassp_2022/nmp.tflite"
FIX = "pip install 'autodeploy[tflite]'"
MISSING = "the ONNX → TFLite converter is missing (onnx2tf, tensorflow not installed)"

#: Installed in every process of the test's child tree: the converter cannot be found or imported.
HIDE = """
import os, sys

HIDDEN = ("onnx2tf", "tensorflow")


class Hide:
    '''Wraps one finder of sys.meta_path: a hidden package is not found (find_spec answers None).'''

    def __init__(self, finder):
        self.finder = finder

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in HIDDEN:
            return None
        find = getattr(self.finder, "find_spec", None)
        return find(name, path, target) if find else None

    def __getattr__(self, name):  # invalidate_caches, find_distributions, ...
        return getattr(self.finder, name)


sys.meta_path[:] = [Hide(f) for f in sys.meta_path]
with open(os.path.join(os.environ["HIDE_LOG"], str(os.getpid())), "w") as f:
    f.write(" ".join(sys.orig_argv))  # the whole command line: python -m MODULE ...
"""

#: Run in the child: the engine's probe and space, a study's space, a bench of each model, the CLI's listing.
CHILD = textwrap.dedent("""
    import importlib.util, json, os, subprocess, sys
    from pathlib import Path

    import autodeploy
    from autodeploy.adapters import registry
    from autodeploy.device import probe_device
    from autodeploy.errors import UnsupportedConfigError
    from autodeploy.harness.timing import TimingPolicy
    from autodeploy.model import load_model
    from autodeploy.search.config import validate
    from autodeploy.search.space import build_space, unsupported_reason
    from autodeploy.adapters.base import TrialConfig

    onnx_path, tflite_path, work = (Path(p) for p in sys.argv[1:4])
    seen = {"find_spec": [importlib.util.find_spec(m) is None for m in ("onnx2tf", "tensorflow")]}
    try:
        import tensorflow  # noqa: F401
        seen["import"] = "imported"
    except ImportError as exc:
        seen["import"] = type(exc).__name__
    engine, device = registry.get("tflite"), probe_device()
    availability = engine.probe(device)
    seen["probe"] = {"available": availability.available, "reason": availability.reason, "fix": availability.fix,
                     "text": str(availability)}
    for kind, path in (("onnx", onnx_path), ("tflite", tflite_path)):
        model = load_model(path)
        space = engine.space(device, model)
        study = build_space(validate({"model": str(path), "engines": ["onnxruntime", "tflite"]}, {}), device, model)
        seen[kind] = {"precisions": list(space.precisions), "unsupported": dict(space.unsupported),
                      "study_engines": list(study.engines), "study_skipped": study.skipped,
                      "pruned": unsupported_reason(TrialConfig("tflite", "fp32"), device, model)}
    quick = TimingPolicy(warmup_min_calls=2, warmup_max_s=1.0, min_samples=10, min_duration_s=0.3, max_duration_s=2.0)
    try:
        autodeploy.bench(onnx_path, engine="tflite", timing=quick, db=f"sqlite:///{work / 'onnx.db'}", cache=work / "c")
        seen["onnx"]["bench"] = "ran"
    except UnsupportedConfigError as exc:
        seen["onnx"]["bench"] = str(exc)
    stored = autodeploy.bench(tflite_path, timing=quick, timeout_s=300.0, db=f"sqlite:///{work / 'tflite.db'}",
                              cache=work / "c")
    result = stored.result
    seen["tflite"]["bench"] = {"ok": result.ok, "failure": result.failure_message, "engine": result.config.engine,
                               "samples": result.latency.n if result.latency else 0}
    cli = subprocess.run([sys.executable, "-m", "autodeploy", "engines", "--format", "json"],
                         capture_output=True, text=True)
    table = subprocess.run([sys.executable, "-m", "autodeploy", "engines"], capture_output=True, text=True,
                           env={**os.environ, "COLUMNS": "400"})
    seen["cli"] = {"code": cli.returncode, "stderr": cli.stderr[-2000:],
                   "tflite": [e for e in json.loads(cli.stdout or "[]") if e["engine"] == "tflite"],
                   "table": [line for line in table.stdout.splitlines() if "tflite" in line]}
    seen["converter_imported"] = [m for m in ("onnx2tf", "tensorflow") if m in sys.modules]
    print(json.dumps(seen))
""")


@pytest.fixture(scope="module")
def seen(tmp_path_factory) -> dict:
    """What the child saw with the converter hidden, and the pids of the processes the hide reached."""
    pytest.importorskip("ai_edge_litert", reason="the LiteRT runtime (ai-edge-litert) is not installed")
    wheels = sorted(WHEELS.glob("basic_pitch-0.4.0-*.whl"))
    if not wheels:
        pytest.skip(f"wheel basic_pitch-0.4.0-*.whl not in {WHEELS} (.ci/run fetches it with pip download)")
    work = tmp_path_factory.mktemp("runtime-only")
    with zipfile.ZipFile(wheels[-1]) as wheel:
        (work / "nmp.tflite").write_bytes(wheel.read(MEMBER))
    onnx_path = zoo.get("tiny-cnn", work / "zoo")
    (work / "hide").mkdir()
    (work / "hide" / "sitecustomize.py").write_text(HIDE)
    (work / "pids").mkdir()
    env = {**os.environ, "HIDE_LOG": str(work / "pids"),
           "PYTHONPATH": os.pathsep.join([str(work / "hide"), *(p for p in sys.path if p and os.path.isabs(p))])}  # fmt: skip
    child = subprocess.run([sys.executable, "-c", CHILD, str(onnx_path), str(work / "nmp.tflite"), str(work)],
                           capture_output=True, text=True, env=env, cwd=work, timeout=600)  # fmt: skip
    assert child.returncode == 0, child.stderr[-4000:]
    seen = json.loads(child.stdout.strip().splitlines()[-1])
    seen["processes"] = sorted(p.read_text() for p in (work / "pids").iterdir())
    return seen


def test_the_converter_is_really_hidden(seen):
    assert seen["find_spec"] == [True, True] and seen["import"] == "ModuleNotFoundError"
    assert seen["converter_imported"] == []
    workers = [p for p in seen["processes"] if "autodeploy.harness.worker" in p]
    assert workers, f"the hide reached the bench's workers: {seen['processes']}"


def test_the_engine_is_available_and_names_the_missing_converter(seen):
    probe = seen["probe"]
    assert probe["available"] and probe["reason"] == MISSING and probe["fix"] == FIX
    assert probe["text"].startswith("available (") and MISSING in probe["text"]


def test_an_onnx_model_gets_every_precision_refused_with_the_fix(seen):
    onnx = seen["onnx"]
    assert onnx["precisions"] == []
    for precision in ("fp32", "fp16", "int8-dynamic", "int8"):
        assert onnx["unsupported"][precision] == f"{MISSING}; fix: {FIX}"
    # A study leaves tflite out with that reason and searches the others; a config asked for is pruned with it.
    assert onnx["study_engines"] == ["onnxruntime"]
    assert onnx["study_skipped"] == {"tflite": f"{MISSING}; fix: {FIX}"}
    assert onnx["pruned"] == f"tflite cannot run precision 'fp32' here: {MISSING}; fix: {FIX}"
    # bench's one line, with the install hint as its only fix.
    assert onnx["bench"] == onnx["pruned"]


def test_a_tflite_file_is_offered_fp32_and_benched(seen):
    tflite = seen["tflite"]
    assert tflite["precisions"] == ["fp32"] and tflite["pruned"] is None
    assert tflite["study_engines"] == ["tflite"]
    bench = tflite["bench"]
    assert bench["ok"], bench["failure"]
    assert bench["engine"] == "tflite" and bench["samples"] > 0


def test_the_engines_listing_says_the_converter_is_missing(seen):
    cli = seen["cli"]
    assert cli["code"] == 0, cli["stderr"]
    (entry,) = cli["tflite"]
    assert entry["available"] is True and entry["reason"] == MISSING and entry["fix"] == FIX
    (row,) = cli["table"]
    assert "available, limited" in row and f"{MISSING}; fix: {FIX}" in row
