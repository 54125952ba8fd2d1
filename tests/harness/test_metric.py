"""The user's task metric (--metric FILE.py:FUNCTION): loaded from the file, called on outputs and labels, budgeted."""

import json
import textwrap

import numpy as np
import pytest

from autodeploy.accuracy import records, rules
from autodeploy.cli import _common
from autodeploy.errors import UsageError
from autodeploy.harness.metric import load_metric, score
from tests.cli_runner import run_cli
from tests.models import mlp

FAST = ["--min-samples", "16", "--min-duration", "0.1", "--threads", "1"]

METRICS = '''
import json, os
import numpy as np

def accuracy(outputs, labels):
    with open(os.environ["METRIC_LOG"], "a") as log:  # what it was given, for the test to check
        log.write(json.dumps({"names": sorted(outputs), "shape": list(outputs["logits"].shape),
                              "labels": labels.tolist()}) + "\\n")
    return float((outputs["logits"].argmax(axis=1) == labels).mean())

CALLS = []

def worse_each_time(outputs, labels):
    CALLS.append(1)  # called on the engine's outputs first, then on the reference's
    return 0.5 if len(CALLS) % 2 else 0.9

def box_recall(outputs, labels):
    """A detector's metric: labels are one box per item [N, 4]; recall of boxes within 40 px."""
    boxes = outputs["output0"][:, :4, :]                    # [N, 4, anchors], pixels
    scores = outputs["output0"][:, 4:, :].max(axis=1)       # [N, anchors]
    best = boxes[np.arange(len(boxes)), :, scores.argmax(axis=1)]  # the top-scoring anchor's box
    with open(os.environ["METRIC_LOG"], "a") as log:
        log.write(json.dumps({"labels_shape": list(labels.shape)}) + "\\n")
    return float((np.abs(best - labels).max(axis=1) < 40).mean())

def broken(outputs, labels):
    raise KeyError("no output named 'boxes'")
'''


@pytest.fixture
def metrics(tmp_path, monkeypatch):
    (tmp_path / "mymetrics.py").write_text(textwrap.dedent(METRICS))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("METRIC_LOG", str(tmp_path / "calls.jsonl"))
    monkeypatch.setenv("AUTODEPLOY_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("AUTODEPLOY_DB", f"sqlite:///{tmp_path / 'r.db'}")
    monkeypatch.setattr(_common.out, "width", 200)
    return tmp_path


def test_load_from_a_file_and_bad_specs(metrics):
    assert load_metric("mymetrics.py:accuracy").__name__ == "accuracy"
    assert load_metric(f"{metrics / 'mymetrics.py'}:accuracy").__name__ == "accuracy"
    for spec, said in (("mymetrics:accuracy", "not a .py file"), ("mymetrics.py:missing", "has no function 'missing'"),
                       ("mymetrics", "cannot parse"), ("gone.py:f", "file gone.py not found")):
        with pytest.raises(UsageError, match=said):
            load_metric(spec)
    with pytest.raises(ValueError, match="metric m raised KeyError"):
        score(load_metric("mymetrics.py:broken"), "m", {}, None)
    with pytest.raises(ValueError, match="not a finite number"):
        score(lambda outputs, labels: float("nan"), "m", {}, None)


def test_metric_budget_rule():
    base = records.AccuracyVerdict("top-1 agreement >= 0.99", True)
    assert rules.with_metric(base, "m:f", 0.5, 0.9, None) == base  # no budget: reported only
    judged = rules.with_metric(base, "m:f", 0.5, 0.9, 0.1)
    assert not judged.passed and judged.constraint.endswith("m:f drop <= 0.1")
    assert rules.with_metric(base, "m:f", 0.85, 0.9, 0.1).passed


def test_bench_calls_the_metric_with_outputs_and_labels(metrics, capsys):
    model = mlp(metrics / "m.onnx")
    labels = np.arange(20) % 4
    np.savez(metrics / "d.npz", x=np.random.default_rng(0).standard_normal((20, 8), dtype=np.float32), labels=labels)
    code, out, err = run_cli(capsys, "bench", str(model), "--data", "d.npz", "--metric", "mymetrics.py:accuracy",
                             "--max-metric-drop", "0.01", *FAST)
    assert code == 0, err
    assert "metric mymetrics.py:accuracy:" in out and "drop 0" in out and "mymetrics.py:accuracy drop <= 0.01" in out
    calls = [json.loads(line) for line in (metrics / "calls.jsonl").read_text().splitlines()]
    # fp32 calibrates nothing: it is judged on every item given, and the metric sees all 20 (engine, reference)
    assert len(calls) == 2 and all(c["names"] == ["logits"] and c["shape"] == [20, 4] for c in calls)
    assert calls[0]["labels"] == labels.tolist()  # one label per item, in order


def test_the_metric_budget_is_enforced(metrics, capsys):
    model = mlp(metrics / "m.onnx")
    argv = ["bench", str(model), "--metric", "mymetrics.py:worse_each_time", *FAST]
    code, out, err = run_cli(capsys, *argv)  # no budget: the drop is reported, the run passes
    assert code == 0, err
    assert "drop 0.4" in out
    code, out, err = run_cli(capsys, *argv, "--max-metric-drop", "0.1", "--format", "json")
    assert code == 1
    record = json.loads(out)
    assert record["failure_kind"] == "inaccurate" and "mymetrics.py:worse_each_time 0.5 (reference 0.9)" in record["failure_message"]
    accuracy = record["measurement"]["accuracy"]
    assert accuracy["metric_value"] == 0.5 and accuracy["reference_metric_value"] == 0.9 and not accuracy["passed"]


def test_a_bad_metric_is_one_line_and_exit_2(metrics, capsys):
    model = mlp(metrics / "m.onnx")
    for argv in (["--metric", "nowhere.mod:f"], ["--metric", "nowhere.py:f"], ["--max-metric-drop", "0.1"]):
        code, _, err = run_cli(capsys, "bench", str(model), *argv, *FAST)
        assert code == 2 and len(err.strip().splitlines()) == 1 and "fix:" in err
    code, _, err = run_cli(capsys, "bench", str(model), "--metric", "mymetrics.py:broken", *FAST)
    assert code == 1 and "metric mymetrics.py:broken raised KeyError" in " ".join(err.split())


def test_a_metric_scores_a_detector_on_labels_of_any_shape(metrics, capsys):
    # `--metric` with per-item labels failed every trial: "labels were given but no output is classifier-shaped".
    from tests.models import detector

    model = detector(metrics / "det.onnx")
    rng = np.random.default_rng(0)
    boxes = rng.uniform(0, 320, (24, 4)).astype(np.float32)  # one box per item: labels of shape [N, 4]
    np.savez(metrics / "d.npz", x=rng.uniform(0, 1, (24, 3, 32, 32)).astype(np.float32), labels=boxes)
    code, out, err = run_cli(capsys, "bench", str(model), "--data", "d.npz", "--metric", "mymetrics.py:box_recall",
                             "--max-metric-drop", "0.01", *FAST)
    assert code == 0, err
    assert "metric mymetrics.py:box_recall:" in out and "drop 0" in out
    calls = [json.loads(line) for line in (metrics / "calls.jsonl").read_text().splitlines()]
    assert calls and all(c["labels_shape"] == [24, 4] for c in calls)
