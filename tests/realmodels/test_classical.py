"""Classical ML as users export it: scikit-learn classifiers fitted on its bundled digits, converted with
skl2onnx twice: ``zipmap=False`` (a probability tensor) and ``to_onnx``'s defaults (``-zipmap``: the
probabilities as ZipMap's sequence of ``{class: probability}`` maps), run on every engine in fp32 and in
its cheapest reduced precision, beside the wheel models of ``test_corpus.py``.

What they prove: an int8 that quantized nothing (no op of a tree ensemble or a linear classifier has an
int8 kernel) is pruned as "identical to fp32", never measured as a separate int8 candidate; the
probabilities (rows that sum to 1, ZipMap's maps read as ``[N, 10]``) are judged by top-1, the labels
exactly; an engine without the ai.onnx.ml ops is pruned in one line naming them, before any build.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from autodeploy.accuracy.rules import output_drop, output_metric
from autodeploy.adapters import registry
from autodeploy.adapters.base import TrialConfig
from autodeploy.data import Dataset
from autodeploy.device import probe_device
from autodeploy.harness.result import JUDGED, headline
from autodeploy.harness.run import HarnessSettings, prepare_data, run_trial
from autodeploy.model import load_model
from autodeploy.search.space import unsupported_reason
from tests.realmodels.conftest import ROWS
from tests.realmodels.test_corpus import ENGINES, ITEMS, QUICK, TIMEOUT_S, _precision

pytestmark = pytest.mark.slow

CLASSIFIERS = ("forest", "logistic", "forest-zipmap", "logistic-zipmap")
#: The op each classifier's probabilities come from (what an engine without ai.onnx.ml has no rule for).
OPS = {"forest": "TreeEnsembleClassifier", "logistic": "LinearClassifier"}


@pytest.fixture(scope="module")
def classical(tmp_path_factory) -> dict[str, tuple]:
    """Each classifier fitted on digits' first 1500 images, as ``.onnx`` (without ZipMap, and with it:
    ``to_onnx``'s defaults), with 16 held-out images as data."""
    datasets = pytest.importorskip("sklearn.datasets", reason="scikit-learn (the dev extras) fits the models")
    skl2onnx = pytest.importorskip("skl2onnx", reason="skl2onnx (the dev extras) converts them")
    from sklearn.ensemble import RandomForestClassifier
    from sklearn.linear_model import LogisticRegression

    x, y = datasets.load_digits(return_X_y=True)
    x = x.astype(np.float32)
    fitted = {"forest": RandomForestClassifier(n_estimators=20, max_depth=10, random_state=0),
              "logistic": LogisticRegression(max_iter=2000)}  # fmt: skip
    folder = tmp_path_factory.mktemp("classical")
    out = {}
    for name, model in fitted.items():
        model.fit(x[:1500], y[:1500])
        onx = skl2onnx.to_onnx(model, x[:1], options={id(model): {"zipmap": False}},
                               target_opset={"": 17, "ai.onnx.ml": 3})  # fmt: skip
        path = folder / f"{name}.onnx"
        path.write_bytes(onx.SerializeToString())
        out[name] = (path, {"X": x[1500 : 1500 + ITEMS]}, y[1500 : 1500 + ITEMS])
        default = folder / f"{name}-zipmap.onnx"  # as a user converts it: output_label, output_probability (ZipMap)
        default.write_bytes(skl2onnx.to_onnx(model, x[:1]).SerializeToString())
        out[f"{name}-zipmap"] = (default, *out[name][1:])
    return out


def _run(classical, name: str, engine: str, reduced: bool, folder: Path):
    path, inputs, labels = classical[name]
    model = load_model(path, name=f"sklearn-{name}")
    settings = HarnessSettings(workdir=folder / "work", policy=QUICK, timeout_s=TIMEOUT_S, build_timeout_s=TIMEOUT_S,
                               calibration_items=ITEMS // 2, evaluation_items=ITEMS // 2)  # fmt: skip
    data = prepare_data(model, settings, data=Dataset(inputs, labels=labels.astype(np.int64)))
    precision, knobs = _precision(engine, reduced, model)
    config = TrialConfig(engine, precision, batch=1, threads=1, knobs=knobs)
    reason = unsupported_reason(config, probe_device(), model)
    availability = registry.get(engine).probe(probe_device())
    if reason is None and not availability.available:
        reason = str(availability)
    return config, reason, None if reason else run_trial(model, config, data, settings)


@pytest.mark.parametrize("reduced", [False, True], ids=["fp32", "reduced"])
@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("name", CLASSIFIERS)
def test_classical_classifier_on_engine(classical, name, engine, reduced, tmp_path):
    config, reason, result = _run(classical, name, engine, reduced, tmp_path)
    row = {"model": f"sklearn-{name}", "engine": engine, "precision": config.precision}
    if result is None:
        ROWS.append({**row, "outcome": f"pruned: {reason}"})
        assert reason.strip() and "\n" not in reason
        return
    if result.latency is not None:
        acc = result.accuracy
        judged = max(acc.outputs, key=output_drop)
        label, value = output_metric(judged)
        ROWS.append({**row, "median_ms": result.latency.median, "verdict": "pass" if acc.passed else "FAIL",
                     "judged": f"{judged.name}: {label} {value:.4f}",
                     "outputs": {o.name: f"{o.kind}: {output_metric(o)[0]} {output_metric(o)[1]:.4f}" for o in acc.outputs},
                     "outcome": f"{result.latency.median:.3f} ms, worst {judged.kind} output {judged.name}: "
                                f"{label} {value:.4f}, {'pass' if acc.passed else 'FAIL'}"})  # fmt: skip
        assert result.ok or result.failure_kind in JUDGED
        kinds = {o.name.removeprefix("output_"): o.kind for o in acc.outputs}
        assert kinds in ({"label": "exact", "probabilities": "top1"}, {"label": "exact", "probability": "top1"})
        return
    line = headline(result.failure_message)
    ROWS.append({**row, "outcome": f"failed ({result.failure_kind}): {line}"})
    assert line.strip() and "Traceback" not in line, result.failure_message
    assert result.failure_kind not in ("timeout", "crashed"), line


@pytest.mark.parametrize("name, op", [("forest", "TreeEnsembleClassifier"), ("logistic", "LinearClassifier")])
def test_an_int8_that_quantizes_nothing_is_pruned_as_identical_to_fp32(classical, name, op, tmp_path):
    config, reason, result = _run(classical, name, "onnxruntime", True, tmp_path)
    assert reason is None and config.precision == "int8"
    assert result.failure_kind == "unsupported", result.failure_message
    assert "onnxruntime int8 is identical to fp32: no op of kinds" in result.failure_message
    assert op in result.failure_message and "use fp32" in result.failure_message


@pytest.mark.parametrize("name", ["forest-zipmap", "logistic-zipmap"])
def test_the_default_export_runs_on_onnx_runtime_and_elsewhere_is_pruned_in_one_line(classical, name, tmp_path):
    """``to_onnx(classifier, X[:1])`` with its defaults: ONNX Runtime times the maps it returns and judges
    the probabilities by top-1, the label exactly; OpenVINO and onnx2tf are pruned before any build, in
    one line naming the op they lack; an int8 of ONNX Runtime or the in-house path is "identical to fp32"."""
    op = OPS[name.removesuffix("-zipmap")]
    _, reason, result = _run(classical, name, "onnxruntime", False, tmp_path)
    assert reason is None and result.ok, result.failure_message
    assert {o.name: o.kind for o in result.accuracy.outputs} == {"output_label": "exact", "output_probability": "top1"}
    assert result.accuracy.passed and result.accuracy.outputs[1].top1_agreement == 1.0
    for engine, words in (("openvino", f"openvino has no conversion rule for ai.onnx.ml ops {op}, "),
                          ("tflite", f"onnx2tf has no converter for ONNX ops {op}, ")):  # fmt: skip
        if not registry.get(engine).probe(probe_device()).available:
            continue
        if engine == "tflite":
            pytest.importorskip("onnx2tf", reason="without the converter tflite names that first")
        _, reason, result = _run(classical, name, engine, False, tmp_path / engine)
        assert result is None and words in reason and "ZipMap" in reason and "\n" not in reason, reason
    for engine in ("onnxruntime", "inhouse"):
        config, reason, result = _run(classical, name, engine, True, tmp_path / engine)
        assert reason is None and config.precision == "int8"
        assert result.failure_kind == "unsupported", result.failure_message
        assert f"{engine} int8 is identical to fp32" in result.failure_message and op in result.failure_message
