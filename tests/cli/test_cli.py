"""The CLI end to end: real workers, a real SQLite file, one clear line for every bad input."""

import math
import re
from pathlib import Path

import numpy as np
import pytest

from autodeploy.cli import _common
from autodeploy.results_db.store import Store
from tests.cli_runner import run_cli
from tests.models import mlp

FAST = ["--min-samples", "64", "--min-duration", "0.2", "--threads", "1"]


@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTODEPLOY_CACHE", str(tmp_path / "cache"))
    db = f"sqlite:///{tmp_path / 'results.db'}"
    monkeypatch.setenv("AUTODEPLOY_DB", db)
    monkeypatch.setattr(_common.out, "width", 200)  # wide tables, so cells are not wrapped
    return tmp_path, db


def run(capsys, *argv):
    return run_cli(capsys, *argv)


def test_engines_lists_onnxruntime_available(capsys):
    code, out, _ = run(capsys, "engines")
    assert code == 0 and re.search(r"onnxruntime\s+│\s+available", out)
    # the peak each precision reaches here, measured on first use (the session's tiny microbenchmark)
    assert "Peak throughput per precision" in out and re.search(r"fp32\s+│\s+[\d.]+ GOP/s", out)


def test_bench_prints_statistics_and_stores_the_trial(env, capsys):
    tmp_path, db = env
    model = mlp(tmp_path / "m.onnx")
    code, out, err = run(capsys, "bench", str(model), "--batch", "2", *FAST)
    assert code == 0, err
    for word in ("median", "p90", "p99", "95% CI", "top-1 agreement"):
        assert word in out
    assert "n/a (needs >= 662 samples)" in out or re.search(r"p99\s+│\s+\d", out)
    with Store.open(db) as store:
        rows = store.trials()
    assert len(rows) == 1 and rows[0].status == "ok" and rows[0].batch == 2 and rows[0].measurement.latency.n >= 64
    assert rows[0].command.startswith("autodeploy")
    # its distance to the limit: operations at its shape, GOP/s and their share of this device's fp32 peak
    line = rows[0].measurement.roofline
    assert line is not None and line.gop > 0 and 0 < line.share < math.inf and line.precision == "fp32"
    assert re.search(r"achieved\s+│\s+[\d.]+ GOP/s, \d+% of this device's fp32 peak", out)
    assert re.search(r"operations\s+│\s+[\d.e-]+ GOP a call", out)

    code, out, _ = run(capsys, "results", "list")
    assert code == 0 and "m" in out and "onnxruntime/fp32/b2/t1" in out
    code, out, _ = run(capsys, "results", "show", str(rows[0].id))
    assert code == 0 and "median_ms" in out
    code, out, _ = run(capsys, "results", "studies")
    assert code == 0 and "0 study(ies)" in out


def _bad_inputs(tmp_path):
    good = mlp(tmp_path / "good.onnx")
    (tmp_path / "text.onnx").write_text("hello, not a model")
    data = good.read_bytes()
    (tmp_path / "trunc.onnx").write_bytes(data[: len(data) // 3])
    np.savez(tmp_path / "f64.npz", x=np.zeros((4, 8), np.float64))
    (tmp_path / "afile").write_text("")
    Store.open(f"sqlite:///{tmp_path / 'results.db'}").close()  # an empty store, for "unknown trial"
    return {
        "missing file": (["bench", str(tmp_path / "nope.onnx")], "model file not found"),
        "not onnx": (["bench", str(tmp_path / "text.onnx")], "not a readable ONNX model|holds no ONNX graph"),
        "truncated": (["bench", str(tmp_path / "trunc.onnx")], "truncated"),
        "unknown engine": (["bench", str(good), "--engine", "warp"], "unknown engine 'warp'"),
        "unknown precision": (["bench", str(good), "--precision", "int3"], "cannot run precision 'int3'"),
        "shape does not fit": (["bench", str(good), "--shape", "x=1x9"], "axis 1 is fixed at 8"),
        "dtype mismatch": (["bench", str(good), "--data", str(tmp_path / "f64.npz")], "dtype float64"),
        "unknown zoo model": (["bench", "zoo:nope"], "unknown zoo model"),
        "unwritable database": (
            ["bench", str(good), "--db", f"sqlite:///{tmp_path / 'afile' / 'r.db'}"],
            "results database",
        ),
        "unknown trial": (["results", "show", "999"], "no trial with id 999"),
        "server without sla": (["bench", str(good), "--scenario", "server"], "server scenario needs a p99 bound"),
        "tune server without sla": (["tune", str(good), "--objective", "server"], "needs constraints.sla_ms"),
        "unknown scenario": (["bench", str(good), "--scenario", "batch"], "unknown scenario 'batch'"),
        "negative queue delay": (["bench", str(good), "--scenario", "server", "--sla-ms", "5",
                                  "--knob", "max_queue_delay_us=-1"], "queue delay must be an integer >= 0"),
        "too many requests": (["bench", str(good), "--scenario", "offline", "--knob", "num_requests=65"],
                              "requests in flight must be 1 to 64"),
    }


BAD_INPUTS = [
    "missing file",
    "not onnx",
    "truncated",
    "unknown engine",
    "unknown precision",
    "shape does not fit",
    "dtype mismatch",
    "unknown zoo model",
    "unwritable database",
    "unknown trial",
    "server without sla",
    "tune server without sla",
    "unknown scenario",
    "negative queue delay",
    "too many requests",
]


@pytest.mark.parametrize("case", ["server without sla", "negative queue delay", "too many requests",
                                  "tune server without sla"])  # fmt: skip
def test_bad_serving_input_is_exit_code_2(env, capsys, case):
    tmp_path, _ = env
    argv, _ = _bad_inputs(tmp_path)[case]
    assert run(capsys, *argv)[0] == 2


def test_bench_offline_and_multi_stream_say_what_ran_in_flight(env, capsys):
    tmp_path, db = env
    model = mlp(tmp_path / "m.onnx")
    for scenario in ("offline", "multi-stream"):
        code, out, err = run(capsys, "bench", str(model), "--threads", "1", "--scenario", scenario,
                             "--knob", "num_requests=2", *FAST[:4])  # fmt: skip
        assert code == 0, err
        assert re.search(r"requests in flight\s+│\s+requests=2", out) and "items/s" in out
    with Store.open(db) as store:
        rows = store.trials()
    assert sorted(r.measurement.scenario for r in rows) == ["multi-stream", "offline"]
    assert all(r.measurement.serving["concurrency"]["requests"] == 2 for r in rows)


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_bad_input_gives_one_clear_line(env, capsys, case):
    tmp_path, _ = env
    argv, expected = _bad_inputs(tmp_path)[case]
    code, out, err = run(capsys, *argv)
    assert code != 0
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("error:") and re.search(expected, lines[0]), lines[0]
    assert "Traceback" not in out + err


def test_a_failing_run_loses_nothing_already_stored(env, capsys):
    tmp_path, db = env
    model = mlp(tmp_path / "m.onnx")
    assert run(capsys, "bench", str(model), *FAST)[0] == 0
    assert run(capsys, "bench", str(model), "--precision", "int3")[0] != 0
    assert run(capsys, "bench", str(tmp_path / "missing.onnx"))[0] != 0
    with Store.open(db) as store:
        assert store.count_trials() == 1


def test_help_and_zoo_commands(env, capsys):
    code, out, _ = run(capsys, "--help")
    assert code == 0 and "bench" in out and "engines" in out
    code, out, _ = run(capsys, "zoo", "list")
    assert code == 0 and "resnet50" in out and "digits" in out
    tmp_path, _ = env
    code, out, _ = run(capsys, "zoo", "build", "tiny-cnn")
    assert code == 0 and "zoo:tiny-cnn" in out
    assert (tmp_path / "cache" / "zoo").is_dir() and list((tmp_path / "cache" / "zoo").glob("tiny-cnn*.onnx"))


def test_bench_a_recurrent_model_as_the_issue_wrote_it(env, capsys):
    """The issue's command: ``state[2, batch, 128]`` batched on axis 1, ``sr`` a pinned scalar, the
    user's shapes used as given; without --data every result says its verdict is on synthetic inputs."""
    from tests.models import recurrent

    tmp_path, db = env
    model = recurrent(tmp_path / "r.onnx")
    argv = ["bench", str(model), "--shape", "input=1x512", "--shape", "state=2x1x128", "--input", "sr=16000"]
    code, out, err = run(capsys, *argv, *FAST)
    assert code == 0, err
    assert "synthetic inputs" in " ".join(err.split())
    with Store.open(db) as store:
        (row,) = store.trials()
    assert row.status == "ok"
    code, _, err = run(capsys, *argv, "--batch-axis", "state=3", *FAST)
    assert code != 0 and "past the last axis of input 'state'" in err and len(err.strip().splitlines()) == 1


def test_bench_takes_shapes_from_the_data_and_reads_negative_dims(env, capsys):
    from tests.models import paddle_like

    tmp_path, _ = env
    model = paddle_like(tmp_path / "p.onnx")
    code, _, err = run(capsys, "bench", str(model), *FAST)
    assert code != 0 and "fix it with --shape x=" in err  # no data, no shape: the one-line fix
    np.savez(tmp_path / "d.npz", x=np.random.default_rng(0).standard_normal((6, 3, 16, 24), dtype=np.float32))
    code, out, err = run(capsys, "bench", str(model), "--data", str(tmp_path / "d.npz"), *FAST)
    assert code == 0, err
    assert "negative dims" in err and "synthetic" not in err


def test_bench_at_two_shapes_prints_each_and_the_mix_and_lists_them_per_shape(env, capsys):
    from tests.models import paddle_like

    tmp_path, db = env
    model = paddle_like(tmp_path / "p.onnx")
    code, out, err = run(capsys, "bench", str(model), "--shape", "x=1x3x16x24@3", "--shape", "x=1x3x16x48", *FAST)
    assert code == 0, err
    assert "at x=1x3x16x24" in out and "at x=1x3x16x48" in out
    assert re.search(r"x=1x3x16x24\s+│\s+75%", out) and re.search(r"mix \(weighted\)\s+│\s+100%", out)
    assert err.count("synthetic inputs") == 1
    code, out, _ = run(capsys, "results", "list")
    assert code == 0 and "x=1x3x16x24" in out and "x=1x3x16x48" in out
    code, out, _ = run(capsys, "bench", str(model), "--shape", "x=1x3x16x24", "--shape", "x=1x3x16x48", "--format", "json",
                       *FAST)  # fmt: skip
    import json

    records = json.loads(out)
    assert code == 0 and [r["shape"] for r in records] == ["x=1x3x16x24", "x=1x3x16x48"]
    code, _, err = run(capsys, "bench", str(model), "--shape", "x=1x2x16x24", *FAST)
    assert code == 2 and "input 'x'" in err and "axis 1 is fixed at 3" in err and len(err.strip().splitlines()) == 1


def test_results_show_prints_an_engines_whole_reason_line_by_line(env, capsys):
    from tests.results_db.factories import DEVICE, MODEL, failed_result

    _, db = env
    with Store.open(db) as store:
        trial = store.add_trial(failed_result("f"), model=MODEL, device=DEVICE)
    code, out, _ = run(capsys, "results", "show", str(trial))
    assert code == 0
    assert re.search(r"failure_message\s+│\s+boom\s+│\n.*│\s+line 2\s+│", out), out  # two lines, not "boom\\nline 2"


def test_an_fp32_verdict_rests_on_every_item_given_and_says_when_they_are_few(env, capsys):
    tmp_path, _ = env
    model = mlp(tmp_path / "m.onnx")
    np.savez(tmp_path / "d.npz", x=np.random.default_rng(0).standard_normal((20, 8), dtype=np.float32))
    code, out, err = run(capsys, "bench", str(model), "--data", str(tmp_path / "d.npz"), *FAST)
    assert code == 0, err
    assert "on 20 items" in out  # none held back for a calibration nothing does
    assert "rests on 20 items, fewer than 32" in " ".join(err.split())


@pytest.mark.slow
def test_v_shows_the_onnx2tf_log_of_a_failed_tflite_conversion(env, capsys, monkeypatch):
    """The one-line reason keeps only onnx2tf's error lines; -v shows where each rung's whole log is and
    the first rung's last lines. onnx2tf has no converter for LpPool, so every rung fails (about 20 s)."""
    from autodeploy.adapters import registry
    from autodeploy.device import probe_device
    from tests.models import lp_pool

    availability = registry.get("tflite").probe(probe_device())
    if not availability.available or availability.reason:  # the runtime without onnx2tf converts nothing
        pytest.skip(f"tflite: {availability}")
    tmp_path, _ = env
    monkeypatch.setattr(_common, "_quiet", True)  # -v sets it for the process: restored after the test
    model = str(lp_pool(tmp_path / "lp.onnx"))
    code, _, err = run(capsys, "-v", "bench", model, "--engine", "tflite", *FAST)
    assert code == 1 and "failed (build_failed)" in err and "no converter for ONNX op LpPool" in err
    logs = re.findall(r"onnx2tf log, rung (\d): (\S+)", err)
    assert [int(i) for i, _ in logs] == [0, 1, 2], err
    assert all(path.endswith(f"onnx2tf-rung-{i}.log") and Path(path).is_file() for i, path in logs)
    tail = err.split("last 40 lines of onnx2tf-rung-0.log:", 1)[1]
    assert "LpPool" in tail, "the converter's own lines, not only the reason"

    monkeypatch.setattr(_common, "_quiet", True)
    code, _, err = run(capsys, "bench", model, "--engine", "tflite", *FAST)  # the kept outcome: no rung runs again
    assert code == 1 and "no converter for ONNX op LpPool" in err and "onnx2tf log, rung" not in err
