"""A results store filled by a real small study, shared by the dashboard tests (session scope).

ONNX Runtime fp32 and int8 on a tiny MLP classifier (a Softmax head, so the graph proves its
class scores and top-1 judges them; an outlier hidden unit int8 cannot resolve beside the others), one thread, 4 screening trials and 2 finalists with short
timing (about 30-40 s in all). int8 breaks the default 1% accuracy budget on this model, so
the Pareto and Compare pages have a rejected config with its reason. One more real fp32
trial is stored under a second, made-up device fingerprint so the devices page has two
machines to compare (the numbers are this machine's; only the fingerprint differs), and a
second model ("wide") is benched here with the baseline's config, so that the pages must keep
models apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import onnx
import pytest
from onnx import helper, numpy_helper

from autodeploy.adapters.base import TrialConfig
from autodeploy.device import probe_device
from autodeploy.harness.run import HarnessSettings, prepare_data, run_trial
from autodeploy.harness.timing import TimingPolicy
from autodeploy.model import load_model
from autodeploy.results_db import DeviceRecord, ModelRecord, Store
from autodeploy.search.config import StudyConfig
from autodeploy.search.study import BASELINE, StudyContext, StudySummary, run_study
from tests.models import mlp

STUDY = "mlp-latency"
SECOND_DEVICE = DeviceRecord(
    "0000second000000", "Second Test CPU", {"cpu_model": "Second Test CPU", "logical_cores": 4}
)
FAST = TimingPolicy(
    warmup_min_calls=2, warmup_max_s=0.2, min_samples=64, min_duration_s=0.1, max_duration_s=5
)


@dataclass(frozen=True)
class StudyDB:
    url: str
    summary: StudySummary
    engines: tuple[str, ...]
    precisions: tuple[str, ...]


@pytest.fixture(scope="session")
def study_db(tmp_path_factory: pytest.TempPathFactory) -> StudyDB:
    tmp = tmp_path_factory.mktemp("dashboard")
    url = f"sqlite:///{tmp / 'results.db'}"
    model = load_model(classifier(mlp(tmp / "mlp.onnx")))
    settings = HarnessSettings(workdir=tmp / "work", policy=FAST, timeout_s=30)
    # ORT's execution modes alone: thread pinning needs 2 threads, and would only add pruned configs here
    config = StudyConfig(model=str(model.path), engines=["onnxruntime"], precisions=["fp32", "int8"], threads=[1],
                         knobs={"onnxruntime": {"execution_mode": ["ORT_SEQUENTIAL", "ORT_PARALLEL"]}},
                         trials=4, finalists={"count": 2, "rounds": 1, "min_samples": 64, "min_duration_s": 0.1})  # fmt: skip
    data = prepare_data(model, settings)
    with Store.open(url) as store:
        ctx = StudyContext(
            config, STUDY, model, probe_device(), data, settings, store, url, "autodeploy tune test"
        )
        summary = run_study(ctx)
        other = run_trial(model, TrialConfig("onnxruntime", "fp32", batch=1, threads=1), data, settings)
        store.add_trial(
            other, model=ModelRecord.of(model), device=SECOND_DEVICE, command="autodeploy bench test"
        )
        # A second model benched on this device with the baseline's config: never one bar with the study's.
        wide = load_model(mlp(tmp / "wide.onnx", in_features=32, classes=10, seed=1))
        bench = run_trial(wide, BASELINE, prepare_data(wide, settings), settings)
        store.add_trial(bench, model=ModelRecord.of(wide), device=DeviceRecord.of(probe_device()),
                        command="autodeploy bench wide.onnx")  # fmt: skip
    return StudyDB(url, summary, ("onnxruntime",), ("fp32", "int8"))


def classifier(path: Path) -> Path:
    """The model at ``path`` with a Softmax over its logits: class probabilities, which top-1 judges
    (a bare linear head is a regression, judged by its error), and one outlier hidden unit: its weights
    and bias 300x and its outgoing weights /300, so fp32 computes the same function while per-tensor int8
    activations lose the other units' resolution (the classic activation-outlier failure): int8 flips
    classes the reference decided. Rewritten in place."""
    model = onnx.load(str(path))
    graph = model.graph
    weights = {i.name: i for i in graph.initializer}
    for name, scale in (("w1", 300.0), ("b1", 300.0), ("w2", 1 / 300.0)):
        values = numpy_helper.to_array(weights[name]).copy()
        if name == "w2":
            values[0] *= scale
        else:
            values[..., 0] *= scale
        weights[name].CopyFrom(numpy_helper.from_array(values, name))
    logits = graph.output[0].name
    graph.node.append(helper.make_node("Softmax", [logits], ["probs"], axis=-1))
    out = onnx.ValueInfoProto()
    out.CopyFrom(graph.output[0])
    out.name = "probs"
    del graph.output[:]
    graph.output.append(out)
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def artifacts_dir() -> Path:
    """Where the browser test leaves its screenshot (git-ignored)."""
    path = Path(__file__).parent / "artifacts"
    path.mkdir(exist_ok=True)
    return path
