"""The harness end to end: real worker processes, real ONNX Runtime, and a misbehaving engine."""

import signal
import time
from dataclasses import replace
from pathlib import Path

import psutil
import pytest

from autodeploy.adapters import registry
from autodeploy.adapters.base import TrialConfig
from autodeploy.harness.result import REASON_LINES, headline, reason
from autodeploy.harness.run import HarnessSettings, measure, prepare, prepare_data, reference, run_trial
from autodeploy.harness.timing import TimingPolicy
from autodeploy.model import load_model
from tests.adapters.faulty import TARGET
from tests.models import mlp

FAST = TimingPolicy(
    warmup_min_calls=2, warmup_max_s=0.2, min_samples=64, min_duration_s=0.2, max_duration_s=5
)


@pytest.fixture
def faulty():
    registry.register("faulty", TARGET)
    yield
    registry.unregister("faulty")


@pytest.fixture
def setup(tmp_path):
    model = load_model(mlp(tmp_path / "m.onnx"))
    settings = HarnessSettings(workdir=tmp_path / "work", policy=FAST, timeout_s=4.0, memory_cap_mb=700)
    return model, settings, prepare_data(model, settings)


def _no_orphans():
    children = psutil.Process().children(recursive=True)
    return [c for c in children if "autodeploy.harness.worker" in " ".join(c.cmdline())]


def test_a_good_trial_reports_every_measurement(setup):
    model, settings, data = setup
    result = run_trial(model, TrialConfig("onnxruntime", batch=2, threads=1), data, settings)
    assert result.ok, result.failure_message
    lat = result.latency
    assert lat.n >= 64 and lat.n == len(result.samples_ms) and result.duration_s >= 0.2
    assert lat.median_ci[0] <= lat.median <= lat.median_ci[1] and lat.p90 is not None
    assert result.warmup_calls >= 2 and result.throughput > 0 and result.artifact_mb > 0
    assert result.peak_rss_mb is not None and result.peak_rss_mb >= 0
    assert result.accuracy.passed and result.accuracy.outputs[0].cosine == pytest.approx(1.0)
    assert result.engine_version and result.build_s is not None


def test_one_build_measured_in_several_fresh_workers(setup):
    """What the gate does: build once, then measure the same artifact round after round."""
    model, settings, data = setup
    config = TrialConfig("onnxruntime", threads=1)
    prepared = prepare(model, config, data, settings)
    assert prepared.spec is not None and prepared.build_s is not None
    runs = [measure(prepared, settings) for _ in range(2)]
    assert all(r.ok for r in runs), [r.failure_message for r in runs]
    assert runs[0].artifact_path == runs[1].artifact_path and runs[0].samples_ms != runs[1].samples_ms
    # A given artifact (a bundle's) is measured as it is: nothing is built.
    again = prepare(model, config, data, settings, artifact=Path(runs[0].artifact_path))
    assert again.build_s is None and measure(again, settings).ok


def test_a_failed_build_is_a_failed_result_on_every_measure(setup):
    model, settings, data = setup
    reference(model, data, settings)  # cached, so only the build meets the damaged file
    model.path.write_bytes(b"not an onnx model")
    prepared = prepare(model, TrialConfig("onnxruntime", "int8", threads=1), data, settings)
    assert prepared.spec is None and prepared.failure is not None
    result = measure(prepared, settings)
    assert not result.ok and result.failure_kind == prepared.failure[0] and not result.samples_ms


@pytest.mark.slow
@pytest.mark.parametrize(
    "fault, kind, message, timeout_s",
    [
        ("segfault", "crashed", "SIGSEGV", 60.0),
        ("hang", "timeout", "still running after 4 s", 4.0),
        ("hang_ignoring_sigterm", "timeout", "still running after 4 s", 4.0),
        # A generous timeout: on a busy machine the worker's imports alone can take seconds.
        ("oom", "oom", "over the memory cap of 700 MB", 60.0),
        ("raise_in_run", "run_failed", "deliberate run failure", 60.0),
        ("raise_in_load", "load_failed", "deliberate load failure", 60.0),
        ("wrong_outputs", "conversion", "fp32 conversion breaks the model", 60.0),  # every argmax shifted, at fp32
    ],
)
def test_misbehaving_engine_is_recorded_with_its_kind(faulty, setup, fault, kind, message, timeout_s):
    model, settings, data = setup
    settings = replace(settings, timeout_s=timeout_s)
    start = time.monotonic()
    result = run_trial(model, TrialConfig("faulty", knobs={"fault": fault}), data, settings)
    assert not result.ok and result.failure_kind == kind, result.failure_message
    assert message in result.failure_message
    # Within its timeout (plus the reference, build and SIGTERM grace), and nothing left behind.
    assert time.monotonic() - start < timeout_s + 30
    assert _no_orphans() == []


@pytest.mark.slow
def test_a_build_past_its_timeout_names_the_build_phase_without_a_progress_callback(faulty, setup):
    # The corpus runs trials without progress: the message said "(phase: start)" for a quantizer past 420 s.
    model, settings, data = setup
    settings = replace(settings, timeout_s=60.0, build_timeout_s=4.0)
    result = run_trial(model, TrialConfig("faulty", knobs={"fault": "hang_in_build"}), data, settings)
    assert result.failure_kind == "timeout" and "still running after 4 s (phase: build)" in result.failure_message


@pytest.mark.slow
def test_a_native_abort_is_a_crash_whose_one_line_reason_is_the_librarys_words(faulty, setup):
    # The log's last lines are faulthandler's list of extension modules: they were the whole reason.
    model, settings, data = setup
    result = run_trial(model, TrialConfig("faulty", knobs={"fault": "abort_in_build"}), data, settings)
    message = result.failure_message
    assert result.failure_kind == "crashed" and "\n" not in message and "Extension modules" not in message
    assert message.startswith("worker killed by SIGABRT; worker log: stl_vector.h:1130:")
    assert "Assertion '__n < this->size()' failed. | Fatal Python error: Aborted | in faulty.py:" in message
    assert message.endswith(" _build")


@pytest.mark.slow
def test_an_engines_whole_reason_is_kept_and_its_headline_names_the_node(faulty, setup):
    # OpenVINO's first line is a file:line of its own source; only that line was stored.
    model, settings, data = setup
    result = run_trial(model, TrialConfig("faulty", knobs={"fault": "raise_in_load"}), data, settings)
    assert result.failure_message.splitlines() == [
        "RuntimeError: Exception from src/inference/src/cpp/core.cpp:117:",
        "Exception from src/plugins/intel_cpu/src/node.cpp:1621:",
        "[ GENERAL_ERROR ] deliberate load failure of node /model/Add_10",
    ]
    assert headline(result.failure_message) == "RuntimeError: [ GENERAL_ERROR ] deliberate load failure of node /model/Add_10"


def test_unsupported_config_is_a_result_not_an_exception(setup):
    model, settings, data = setup
    result = run_trial(model, TrialConfig("onnxruntime", precision="fp16"), data, settings)
    assert result.failure_kind == "unsupported" and "fp16" in result.failure_message


def test_an_unavailable_engine_says_why(setup):
    model, settings, data = setup
    registry.register("ghost", "autodeploy.adapters.nothing_here:Ghost")
    try:
        result = run_trial(model, TrialConfig("ghost"), data, settings)
    finally:
        registry.unregister("ghost")
    assert result.failure_kind == "unavailable" and "nothing_here" in result.failure_message


def test_signal_names_are_reported():
    assert signal.Signals(11).name == "SIGSEGV"


@pytest.mark.slow
def test_a_worker_dies_with_its_parent(faulty, tmp_path):
    """kill -9 of the process running a trial leaves no worker behind (nothing would enforce its timeout)."""
    import subprocess
    import sys
    import textwrap

    script = tmp_path / "parent.py"
    root = Path(__file__).resolve().parents[2]  # the test adapter is tests.adapters.faulty, importable from here
    script.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(root)!r})
        from autodeploy.adapters import registry
        from autodeploy.adapters.base import TrialConfig
        from autodeploy.harness.run import HarnessSettings, measure, prepare, prepare_data, reference, run_trial
        from autodeploy.model import load_model
        registry.register("faulty", "{TARGET}")
        model = load_model({str(mlp(tmp_path / "m.onnx"))!r})
        settings = HarnessSettings(workdir=__import__("pathlib").Path({str(tmp_path / "work")!r}), timeout_s=600)
        run_trial(model, TrialConfig("faulty", knobs={{"fault": "hang"}}), prepare_data(model, settings), settings)
    """))
    parent = subprocess.Popen([sys.executable, str(script)])
    deadline = time.monotonic() + 60
    workers = []
    while time.monotonic() < deadline and not workers:
        time.sleep(0.5)
        try:
            children = psutil.Process(parent.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            break
        workers = [c for c in children if _is_measure_worker(c)]
    assert workers, "the hanging worker never started"
    time.sleep(2)  # let it reach the hang
    parent.kill()
    parent.wait()
    gone, alive = psutil.wait_procs(workers, timeout=10)
    assert alive == [], f"workers outlived their parent: {[p.pid for p in alive]}"


def _is_measure_worker(proc: psutil.Process) -> bool:
    import json
    from pathlib import Path

    try:
        cmd = proc.cmdline()
        if "autodeploy.harness.worker" not in cmd:
            return False
        return json.loads(Path(cmd[-2]).read_text())["mode"] == "measure"
    except (psutil.Error, OSError, ValueError, KeyError, IndexError):
        return False


@pytest.mark.parametrize("batch", [1, 4])
def test_a_recurrent_model_batches_on_its_own_axis(tmp_path, batch):
    """``state[2, batch, 128]`` is batched on axis 1 and the scalar ``sr`` never: the reference and the
    trial run (the issue's ``Got invalid dimensions for input: state`` came from batching axis 0)."""
    from tests.models import recurrent

    model = load_model(recurrent(tmp_path / "r.onnx"), {"input": (1, 16), "state": (2, 1, 128)})
    settings = HarnessSettings(workdir=tmp_path / "work", policy=FAST, timeout_s=30.0,
                               calibration_items=4, evaluation_items=6)  # fmt: skip
    data = prepare_data(model, settings, pins={"sr": 16000})
    result = run_trial(model, TrialConfig("onnxruntime", batch=batch), data, settings)
    assert result.ok, result.failure_message
    assert result.accuracy is not None and {o.name for o in result.accuracy.outputs} == {"output", "stateN"}
    assert all(o.max_abs == 0.0 for o in result.accuracy.outputs)


def test_outputs_line_up_item_by_item_even_when_the_model_misdeclares_them():
    """ddddocr's CRNN declares ``[1, seqlen]`` and returns ``[seq, 1, classes]``: taking axis 0 as the
    batch would keep the first item's first time steps only. Each item keeps its call's whole output."""
    import numpy as np

    from autodeploy.harness.worker import run_all

    class Seq:  # the shapes the real model returns, computed from the feed
        def run(self, feeds):
            x = feeds["x"]
            return {"y": np.stack([x.sum(axis=1) * t for t in range(5)]), "s": x.sum(axis=1)}

    batches = [{"x": np.full((1, 3), i, np.float32)} for i in range(4)]
    out, time_major = run_all(Seq(), batches, 4, {"x": 0, "y": 0, "s": 0})
    assert out["y"].shape == (4, 5, 1) and out["y"][2, 4, 0] == 2 * 3 * 4
    assert out["s"].shape == (4,) and list(out["s"]) == [0, 3, 6, 9]
    assert time_major == frozenset()  # [seq, 1]: no vocabulary axis, repeated as before


def test_time_major_logits_are_split_per_item_on_axis_1():
    """CTC logits ``[T, B, V]`` under a declared ``[B, seqlen]``: each item gets its own ``[T, V]`` (at
    batch 2 as at 1), and the output is named time-major, for the comparison to judge by its tokens."""
    import numpy as np

    from autodeploy.harness.worker import run_all

    class Ctc:
        def run(self, feeds):
            x = feeds["x"]  # [B, 3]: item i's logits at step t are x[i] * t
            return {"logits": np.stack([x * t for t in range(5)])}  # [5, B, 3]

    rows = np.arange(12, dtype=np.float32).reshape(4, 3)
    for batch in (1, 2):
        batches = [{"x": rows[i : i + batch]} for i in range(0, 4, batch)]
        out, time_major = run_all(Ctc(), batches, 4, {"x": 0, "logits": 0})
        assert time_major == {"logits"} and out["logits"].shape == (4, 5, 3)
        assert np.array_equal(out["logits"][3, 2], rows[3] * 2)


def test_a_known_accuracy_is_reused_by_the_worker_not_computed_again(setup):
    """Accuracy depends on the artifact: given the accuracy an earlier trial measured on it, the worker
    times the artifact and returns that accuracy as it is (a marker no comparison could produce)."""
    from autodeploy.harness.run import KnownAccuracy

    model, settings, data = setup
    first = run_trial(model, TrialConfig("onnxruntime", threads=1), data, settings)
    assert first.ok and "accuracy_reused_from" not in first.extra and first.extra["wall_s"]["build"] > 0
    marker = replace(first.accuracy, constraint="measured by the first trial", n_samples=12345)
    again = run_trial(model, TrialConfig("onnxruntime", threads=2), data, settings,
                      artifact=Path(first.artifact_path), known=KnownAccuracy(first.uid, marker))  # fmt: skip
    assert again.ok and again.accuracy == marker and again.extra["accuracy_reused_from"] == first.uid
    assert again.artifact_path == first.artifact_path and again.build_s is None  # no build worker ran
    assert set(again.extra["wall_s"]) == {"build", "timing", "accuracy"} and again.latency.n >= 64


def test_the_headline_of_an_openvino_conversion_failure_is_the_op_that_failed():
    # As OpenVINO 2026 refuses a model with an ONNX Loop (stored until now as its first line only).
    stored = (
        "OpConversionFailure: Check 'false' failed at src/frontends/common_translators/src/unconverted_ops_report.cpp:151:\n"
        "FrontEnd API failed with OpConversionFailure:\nModel wasn't fully converted. Failed operations detailed log:\n"
        "-- Loop-13 with a message:\nNone\nSummary:\n-- Conversion is failed for: Loop-13"
    )
    assert headline(stored) == "OpConversionFailure: Conversion is failed for: Loop-13"
    # As it refuses an ai.onnx.ml op it has no rule for (a scikit-learn forest): the op, not "FrontEnd API failed".
    unknown = stored.replace("-- Conversion is failed for: Loop-13",
                             "-- No conversion rule found for operations: ai.onnx.ml.TreeEnsembleClassifier")
    assert headline(unknown) == ("OpConversionFailure: No conversion rule found for operations: "
                                 "ai.onnx.ml.TreeEnsembleClassifier")  # fmt: skip
    assert headline("run_failed: RuntimeError: deliberate run failure") == "run_failed: RuntimeError: deliberate run failure"
    assert headline(None) == ""


def test_the_headline_of_an_openvino_compile_failure_is_the_node_even_when_its_line_ends_in_a_location():
    # OpenVINO 2026.4 compiling an in-house int8 model (the detector head); the headline read
    # "RuntimeError: index '0' out of range": the node's line ends in "failed at <file>:<line>:".
    stored = (
        "RuntimeError: Exception from src/inference/src/cpp/core.cpp:117:\n"
        "Exception from src/inference/src/dev/plugin.cpp:54:\n"
        "Exception from src/core/src/pass/graph_rewrite.cpp:298:\n"
        "[AddTransformation] END: node: opset1::Add Add_4 (opset1::Multiply a1_DQ[0]:f32[1,2,128], opset1::Multiply "
        "d_DQ[0]:f32[8,2,128]) -> (f32[8,2,128]) CALLBACK HAS THROWN: Check 'index < m_inputs.size()' failed at "
        "src/core/src/node.cpp:304:\n"
        "index '0' out of range"
    )
    assert headline(stored).startswith("RuntimeError: [AddTransformation] END: node: opset1::Add Add_4 (")


def test_a_reason_keeps_every_line_up_to_a_cap_and_counts_the_rest():
    text = reason(ValueError("first\n\n" + "\n".join(f"line {i}" for i in range(100))))
    lines = text.splitlines()
    assert lines[0] == "ValueError: first" and lines[1] == "line 0"
    assert len(lines) == REASON_LINES + 1 and lines[-1] == f"... {101 - REASON_LINES} more lines"


def test_only_int8_is_judged_on_held_out_items_the_rest_on_every_item(setup):
    # Half of --data was held back for int8 calibration even for fp32/bf16/fp16, which calibrate nothing.
    from autodeploy.data import synthetic

    model, settings, _ = setup
    data = prepare_data(model, settings, data=synthetic(model, 32, seed=3))
    assert (data.calibration_items, data.evaluation_items, data.all_items) == (16, 16, 32)
    fp32 = run_trial(model, TrialConfig("onnxruntime", threads=1), data, settings)
    int8 = run_trial(model, TrialConfig("onnxruntime", "int8", threads=1), data, settings)
    assert fp32.accuracy.n_samples == 32 and int8.accuracy.n_samples == 16


def test_a_zipmap_output_is_compared_as_its_probabilities_and_returned_as_maps():
    """The runner returns ZipMap's list of ``{class: probability}`` (what is timed); the comparison gets
    ``[N, classes]``, one column per class in sorted order, item by item over calls."""
    import numpy as np

    from autodeploy.accuracy.measure import as_tensor
    from autodeploy.harness.worker import run_all

    assert as_tensor([{2: 0.5, 0: 0.25, 1: 0.25}]).tolist() == [[0.25, 0.25, 0.5]]
    assert as_tensor([{"b": 0.75, "a": 0.25}]).dtype == np.float32 and as_tensor([{"b": 0.75, "a": 0.25}])[0, 0] == 0.25
    assert as_tensor(np.ones(3)).shape == (3,) and as_tensor([]).shape == (0,)
    with pytest.raises(ValueError, match="different classes"):
        as_tensor([{0: 1.0}, {1: 1.0}])

    class Zip:
        def run(self, feeds):
            x = feeds["x"][:, 0]
            return {"label": x.astype(np.int64), "probabilities": [{0: 1.0 - v / 10, 1: v / 10} for v in x]}

    rows = np.arange(4, dtype=np.float32).reshape(4, 1)
    for batch in (1, 2):
        out, _ = run_all(Zip(), [{"x": rows[i : i + batch]} for i in range(0, 4, batch)], 4,
                          {"x": 0, "label": 0, "probabilities": 0})  # fmt: skip
        assert out["probabilities"].shape == (4, 2) and np.allclose(out["probabilities"][3], [0.7, 0.3])
        assert out["probabilities"].sum(axis=1) == pytest.approx(np.ones(4))
