"""Every worker obeys a timeout, and a reference that cannot run is stored as a failed trial."""

import re
import time

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import autodeploy
from autodeploy.harness.timing import TimingPolicy
from autodeploy.results_db import Store, TrialFilter

FAST = TimingPolicy(warmup_min_calls=2, warmup_max_s=0.2, min_samples=10, min_duration_s=0.05, max_duration_s=2)


def _endless_loop(path):
    """y = x after a Loop of 2**62 iterations: ONNX Runtime runs it in C, forever for our purposes."""
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
    graph = helper.make_graph(
        [helper.make_node("Loop", ["trips", "cond", "x"], ["y"], body=body)], "endless",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])], [trips, cond],
    )  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


@pytest.mark.slow
def test_a_reference_that_never_ends_is_killed_at_the_timeout_and_stored(tmp_path):
    model = _endless_loop(tmp_path / "loop.onnx")
    db = f"sqlite:///{tmp_path / 'r.db'}"
    start = time.monotonic()
    stored = autodeploy.bench(str(model), timing=FAST, timeout_s=5, db=db, cache=tmp_path / "cache")
    assert time.monotonic() - start < 60  # 5 s, plus the worker's start and SIGTERM grace on a busy box
    result = stored.result
    assert not result.ok and result.failure_kind == "timeout"
    assert result.failure_message.startswith("the ONNX Runtime FP32 reference could not run")
    with Store.open(db, readonly=True) as store:
        row = store.trial(TrialFilter(id=stored.id))
    assert row.status == "failed" and row.failure_kind == "timeout" and "reference" in row.failure_message


def test_a_study_refuses_another_model_or_device(tmp_path):
    import dataclasses

    from autodeploy.errors import UsageError
    from autodeploy.model import load_model
    from autodeploy.search.study import run_study
    from tests.models import mlp
    from tests.search.test_study import make_ctx

    db = f"sqlite:///{tmp_path / 'r.db'}"
    ctx = make_ctx(tmp_path, db, name="S", trials=1, finalists={"count": 0})
    run_study(ctx)
    other_model = load_model(mlp(tmp_path / "other.onnx", in_features=12))
    with pytest.raises(UsageError, match="study 'S' belongs to model m .*not other"):
        run_study(dataclasses.replace(ctx, model=other_model, resume=True))
    other_device = dataclasses.replace(ctx.device, cpu_model="Some Other CPU")
    with pytest.raises(UsageError, match="study 'S' was measured on device .*this device is"):
        run_study(dataclasses.replace(ctx, device=other_device, resume=True))
    assert len(ctx.store.trials(TrialFilter(study="S"))) == 1  # nothing was added by the refused joins


def test_a_worker_that_prints_far_more_than_the_cap_keeps_a_capped_log_on_disk(tmp_path, monkeypatch):
    """A metric printing 40 MB: the log on disk keeps its head and tail and says what was cut."""
    import tempfile
    from pathlib import Path

    from autodeploy.harness import supervisor
    from tests.models import mlp

    (tmp_path / "loud.py").write_text(
        "import sys\n"
        "def metric(outputs, labels):\n"
        "    print('FIRST LINE', flush=True)\n"
        "    for _ in range(40):\n"
        "        sys.stdout.write('x' * (1 << 20))\n"
        "    sys.stdout.flush()\n"
        "    sys.stderr.write('LAST LINE\\n')\n"
        "    return 1.0\n"
    )
    logs = []

    class Kept(tempfile.TemporaryDirectory):  # the worker's folder, read just before it is removed
        def cleanup(self):
            log = Path(self.name, "stderr.log")
            if log.exists():
                logs.append((log.stat().st_size, log.read_bytes()[: 100 << 20]))
            super().cleanup()

    monkeypatch.setattr(supervisor.tempfile, "TemporaryDirectory", Kept)
    stored = autodeploy.bench(str(mlp(tmp_path / "m.onnx")), timing=FAST, timeout_s=120, db=f"sqlite:///{tmp_path / 'r.db'}",
                              cache=tmp_path / "cache", metric=f"{tmp_path / 'loud.py'}:metric")  # fmt: skip
    assert stored.result.ok, stored.result.failure_message
    loud = [text for size, text in logs if text.startswith(b"FIRST LINE")]
    assert loud, [text[:20] for _, text in logs]
    cap = 5 << 20  # a few MB, whatever was printed
    for text in loud:
        assert len(text) <= cap, f"worker log of {len(text)} bytes on disk, over the cap of {cap}"
        assert re.search(rb"\n\[autodeploy: \d+ bytes of the worker's output cut here", text)
        assert text.endswith(b"LAST LINE\n")
