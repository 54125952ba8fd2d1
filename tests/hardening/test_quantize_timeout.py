"""``inhouse quantize`` runs in a supervised worker: a calibration that never ends is one line at the timeout."""

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import onnx
import psutil
import pytest
from onnx import TensorProto, helper, numpy_helper

from autodeploy.child import module_argv
from autodeploy.cli import _common
from tests.cli_runner import run_cli
from tests.models import mlp

WORKER = "autodeploy.harness.worker"


@pytest.fixture(autouse=True)
def wide(monkeypatch, tmp_path):
    monkeypatch.setenv("AUTODEPLOY_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(_common.out, "width", 250)


def _endless_loop_then_matmul(path):
    """y = x after a Loop of 2**62 iterations, then a MatMul the quantizer calibrates: ONNX Runtime's
    calibration run never ends (it runs the Loop in C, where no signal interrupts it)."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]), helper.make_node("Identity", ["v_in"], ["v_out"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_in", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_out", TensorProto.FLOAT, None)],
    )  # fmt: skip
    trips = numpy_helper.from_array(np.array(2**62, np.int64), "trips")
    cond = numpy_helper.from_array(np.array(True), "cond")
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Loop", ["trips", "cond", "x"], ["looped"], body=body),
         helper.make_node("MatMul", ["looped", "w"], ["y"])],
        "endless",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])], [trips, cond, w],
    )  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def _workers(parent: psutil.Process) -> list[psutil.Process]:
    """``parent``'s harness workers still running (a zombie has ended; init reaps it)."""
    alive = []
    for child in parent.children(recursive=True):
        try:
            if WORKER in " ".join(child.cmdline()) and child.status() != psutil.STATUS_ZOMBIE:
                alive.append(child)
        except psutil.Error:  # gone while we looked
            pass
    return alive


def _leftovers(folder):
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(".autodeploy-quantize-"))


@pytest.mark.slow
def test_a_calibration_that_never_ends_is_one_line_at_the_timeout_and_nothing_stays(capsys, tmp_path):
    model = _endless_loop_then_matmul(tmp_path / "loop.onnx")
    out_path = tmp_path / "q.onnx"
    start = time.monotonic()
    code, out, err = run_cli(capsys, "inhouse", "quantize", str(model), "-o", str(out_path), "--items", "2",
                             "--timeout", "3")  # fmt: skip
    elapsed = time.monotonic() - start
    assert code == 1, (out, err)
    assert elapsed < 45, elapsed  # 3 s, plus the worker's start and SIGTERM grace on a busy machine
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    # On a busy machine the worker may spend the 3 s importing; the Ctrl-C test below sees it calibrate.
    assert re.match(r"error: inhouse quantize still running after its timeout of 3 s \(while (starting the worker|optimizing|"
                    r"calibrating \(percentile\) and quantizing)\); the worker was stopped and nothing was written; "
                    r"fix: give it more time with --timeout SECONDS", lines[0]), lines[0]  # fmt: skip
    assert not out_path.exists() and _leftovers(tmp_path) == []
    assert _workers(psutil.Process()) == []


def test_a_quick_quantize_still_writes_its_model(capsys, tmp_path):
    model = mlp(tmp_path / "m.onnx", in_features=16)
    out_path = tmp_path / "sub" / "q.onnx"
    code, out, err = run_cli(capsys, "inhouse", "quantize", str(model), "-o", str(out_path), "--items", "16",
                             "--timeout", "600")  # fmt: skip
    assert code == 0, err
    assert "int8 quantization (percentile, asymmetric)" in out and "matmul-add-to-gemm" in out
    assert f"wrote {out_path}" in out
    assert any(n.op_type == "QuantizeLinear" for n in onnx.load(str(out_path)).graph.node)
    assert _leftovers(out_path.parent) == [] and _workers(psutil.Process()) == []


@pytest.mark.slow
def test_ctrl_c_stops_the_cli_at_once_and_its_worker_with_it(tmp_path):
    model = _endless_loop_then_matmul(tmp_path / "loop.onnx")
    cli = subprocess.Popen(
        module_argv("autodeploy", "inhouse", "quantize", str(model), "-o", str(tmp_path / "q.onnx"), "--items", "2"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "AUTODEPLOY_CACHE": str(tmp_path / "cache")},
    )  # fmt: skip
    try:
        parent, deadline = psutil.Process(cli.pid), time.monotonic() + 60
        while not (workers := _workers(parent)) and time.monotonic() < deadline and cli.poll() is None:
            time.sleep(0.1)
        assert workers, cli.communicate(timeout=10)
        phase = Path(workers[0].cmdline()[-1] + ".phase")  # the worker's argv ends with its result file
        while time.monotonic() < deadline and not (phase.exists() and phase.read_text().startswith("calibrating")):
            time.sleep(0.1)
        time.sleep(1.0)
        assert phase.read_text().startswith("calibrating") and cli.poll() is None  # stuck in the Loop
        cli.send_signal(signal.SIGINT)
        _, err = cli.communicate(timeout=15)  # the CLI waits in Python, so Ctrl-C is seen at once
    finally:
        if cli.poll() is None:
            cli.kill()
    assert cli.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    psutil.wait_procs(workers, timeout=5)
    assert not [w for w in workers if w.is_running() and w.status() != psutil.STATUS_ZOMBIE]
    assert not (tmp_path / "q.onnx").exists() and _leftovers(tmp_path) == []
