"""Mixed precision from the verdict's evidence (issue 41): the layers that feed the channels int8 breaks stay
float, in the in-house quantizer, NNCF (``ignored_scope``) and ONNX Runtime (``nodes_to_exclude``) alike.

The model is a YOLOv8-shaped head (``tests/inhouse/detector.py``): box and class logits concatenated under one
int8 scale, box values in pixels beside class probabilities in one output ``[N, 4 + 3, 256]``. Every verdict
here is the harness's own (:func:`autodeploy.accuracy.measure.compare` on held-out items).
"""

from __future__ import annotations

import json
import time

import numpy as np
import onnx
import pytest

from autodeploy.accuracy.measure import compare, producers, readers
from autodeploy.adapters import registry
from autodeploy.adapters.base import TrialConfig
from autodeploy.data import Dataset
from autodeploy.device import probe_device
from autodeploy.errors import UnsupportedConfigError
from autodeploy.harness.run import HarnessSettings, prepare_data, run_trial
from autodeploy.harness.timing import TimingPolicy
from autodeploy.inhouse.quantize import QuantConfig, mixed, quantize
from autodeploy.inhouse.quantize.evidence import Target, feeders, head, static_shapes
from autodeploy.inhouse.quantize.run import run
from autodeploy.inhouse.search_time import STOPPED_KEY, stopped_note, time_limit
from autodeploy.model import load_model
from tests.inhouse.detector import CLASS_CHANNELS, CLASS_HEAD, TRUNK, detector, images

CLASSES = Target("y", 1, CLASS_CHANNELS)
X = images(32)
CAL, HELD_OUT = {"x": X[:16]}, {"x": X[16:]}


def _verdict(model: onnx.ModelProto, candidate, runner=None) -> object:
    """The harness's accuracy of ``candidate`` (an ONNX model, or a loaded runner) against ``model`` in fp32, held out."""
    reference = run(model, [HELD_OUT])[0]
    got = run(candidate, [HELD_OUT])[0] if runner is None else \
        {"y": np.concatenate([runner.run({"x": HELD_OUT["x"][i : i + 1]})["y"] for i in range(len(HELD_OUT["x"]))])}  # fmt: skip
    return compare(got, reference, producers=producers(model), readers=readers(model))


def _info(tmp_path, **kwargs):
    detector(tmp_path / "d.onnx", **kwargs)
    return load_model(tmp_path / "d.onnx")


def test_the_class_channels_head_is_traced_back_through_concat_reshape_and_split():
    model = detector()
    shapes = static_shapes(model, CAL)
    assert shapes["y"] == [16, 7, 256]
    assert set(head(model, [CLASSES], shapes)) == set(CLASS_HEAD)
    boxes = feeders(model, [Target("y", 1, (0, 1, 2, 3))], shapes)
    classes = feeders(model, [CLASSES], shapes)
    assert "cls_conv" not in boxes and {"box_conv", "dfl_conv", TRUNK} <= set(boxes)
    assert {"box_conv", "dfl_conv"}.isdisjoint(classes) and classes[TRUNK] and not classes["concat_k"]
    # the whole output needs every node but the shape-only ones
    assert set(feeders(model, [Target("y")], shapes)) == {n.name for n in model.graph.node}


def test_in_house_int8_with_the_class_head_float_passes_where_all_int8_fails():
    model = detector()
    int8, _ = quantize(model, CAL, QuantConfig(max_accuracy_drop=None))  # every layer int8
    broken = _verdict(model, int8)
    assert not broken.passed and broken.outputs[0].channels == "axis 1, channels 4-6"
    mixed_int8, report = quantize(model, CAL, QuantConfig(float_layers="head"))
    assert _verdict(model, mixed_int8).passed
    assert report.budget_met and report.evidence == ("output 'y', axis 1, channels 4-6",)
    assert report.kept_float and set(report.kept_float) <= set(CLASS_HEAD)
    assert all("channels 4-6" in report.reasons[n] and "head" in report.reasons[n] for n in report.kept_float)
    producer = {o: n for n in mixed_int8.graph.node for o in n.output}
    trunk = next(n for n in mixed_int8.graph.node if n.name == TRUNK)
    assert producer[trunk.input[1]].op_type == "DequantizeLinear", "the trunk stays int8"
    cls = next(n for n in mixed_int8.graph.node if n.name == "cls_conv")
    assert cls.input[1] == "w_cls", "the class head runs its float weights"
    # the search finds fewer float layers than the whole head, and still passes
    searched, found = quantize(model, CAL, QuantConfig(float_layers="search"))
    assert _verdict(model, searched).passed and 0 < len(found.kept_float) <= len(report.kept_float)
    assert all(found.reasons[n].startswith("rank ") for n in found.kept_float)
    assert found.evaluations <= mixed.MAX_TRIAL_BUILDS + 1 and found.ranking == "output"


def test_the_search_stops_at_the_first_passing_config_within_its_build_budget():
    model = detector()
    shapes = static_shapes(model, CAL)
    nodes = [n.name for n in model.graph.node if n.op_type in ("Conv", "Concat", "Reshape")]
    built: list[tuple[str, ...]] = []

    def build(keep):
        built.append(tuple(keep))
        return tuple(keep)

    def judge(keep):  # passes once cls_conv is float: what only the head's evidence can say
        return "cls_conv" in keep, {}, () if "cls_conv" in keep else (CLASSES,)

    def effects(layers, targets):
        return {u: (1.0 if "cls_conv" in u else 0.1) for u in layers}

    found = mixed.find(model, nodes, build, judge, shapes=shapes, effects=effects)
    assert found.passed and found.kept == ("cls_conv",) and found.builds == len(built) <= mixed.MAX_TRIAL_BUILDS
    assert built[0] == () and "cls_conv" in built[1], "all int8, then the head"
    two = mixed.find(model, nodes, build, judge, shapes=shapes, effects=effects, budget=2)
    assert two.passed and two.builds == 2 and set(two.kept) > {"cls_conv"}, "out of builds: the head it passed with"
    head_only = mixed.find(model, nodes, build, judge, shapes=shapes, effects=effects, mode="head")
    assert head_only.builds == 2 and head_only.passed


def test_the_in_house_artifact_records_its_float_layers_and_why(tmp_path):
    info = _info(tmp_path)
    engine, device = registry.get("inhouse"), probe_device()
    config = TrialConfig("inhouse", "int8", knobs={"float_layers": "head"})
    engine.check(device, info, config)
    artifact = engine.build(info, config, {"x": X}, tmp_path / "a", target=device)
    quant = json.loads((artifact.path / "inhouse.json").read_text())["quantization"]
    assert quant["float_layers"] == "head" and quant["kept_float"] and quant["budget_met"]
    assert set(quant["kept_float_why"]) == set(quant["kept_float"])
    assert artifact.meta["float_evidence"] == ["output 'y', axis 1, channels 4-6"]
    assert artifact.meta["kept_float"] == len(quant["kept_float"])
    for knobs, precision in (({"float_layers": "head", "fallback": False}, "int8"), ({"float_layers": "head"}, "fp32")):
        with pytest.raises(UnsupportedConfigError, match="float_layers=head"):
            engine.check(device, info, TrialConfig("inhouse", precision, knobs=knobs))


def test_ort_static_int8_excludes_the_nodes_the_evidence_names(tmp_path):
    info = _info(tmp_path)
    engine, device = registry.get("onnxruntime"), probe_device()
    results = {}
    for mode in ("none", "head"):
        config = TrialConfig("onnxruntime", "int8", knobs={"quant_method": "static", "float_layers": mode})
        engine.check(device, info, config)
        artifact = engine.build(info, config, CAL, tmp_path / mode, target=device)
        results[mode] = (artifact, _verdict(onnx.load(str(info.path)), onnx.load(str(artifact.path / "model.onnx"))))
    assert not results["none"][1].passed, "ORT's static int8 breaks the class channels"
    artifact, accuracy = results["head"]
    assert accuracy.passed and artifact.meta["float_layers_met"]
    assert set(artifact.meta["float_nodes"]) == set(CLASS_HEAD), "the head, Split included: ORT quantizes it"
    assert artifact.meta["float_evidence"] == ["output 'y', axis 1, channels 4-6"]
    graph = onnx.load(str(artifact.path / "model.onnx")).graph
    producer = {o: n.op_type for n in graph.node for o in n.output}
    convs = {n.name: n for n in graph.node if n.op_type == "Conv"}
    assert producer[convs[TRUNK].input[1]] == "DequantizeLinear", "the trunk stays int8"
    assert producer.get(convs["cls_conv"].input[1]) is None, "the class head reads its float weights"
    for knobs, precision in (({"float_layers": "head"}, "fp32"), ({"float_layers": "search", "quant_method": "dynamic"}, "int8")):
        with pytest.raises(UnsupportedConfigError, match="float_layers"):
            engine.check(device, info, TrialConfig("onnxruntime", precision, knobs=knobs))


def test_nncf_ignored_scope_is_built_from_the_evidence(tmp_path):
    pytest.importorskip("nncf", reason="NNCF int8 needs the [openvino] extra")
    info = _info(tmp_path, outlier=True)
    engine, device = registry.get("openvino"), probe_device()
    verdicts, artifacts = {}, {}
    for mode in ("none", "search"):
        config = TrialConfig("openvino", "int8", knobs={"float_layers": mode})
        engine.check(device, info, config)
        artifacts[mode] = engine.build(info, config, CAL, tmp_path / mode, target=device)
        with engine.load(artifacts[mode], config, info) as runner:
            verdicts[mode] = _verdict(onnx.load(str(info.path)), None, runner)
    assert not verdicts["none"].passed and verdicts["none"].outputs[0].channels == "axis 1, channels 4-6"
    meta = artifacts["search"].meta
    assert verdicts["search"].passed and meta["float_layers_met"]
    assert list(meta["float_nodes"]) == ["cls_conv"], "the one layer whose int8 input the outlier channel ruins"
    import openvino as ov

    ir = ov.Core().read_model(str(artifacts["search"].path / "model.xml"))
    convolutions = {op.get_friendly_name(): op for op in ir.get_ops() if op.get_type_name() == "Convolution"}
    fed = {name: op.input_value(0).get_node().get_type_name() for name, op in convolutions.items()}
    assert fed["cls_conv/WithoutBiases"] != "FakeQuantize" and fed["trunk_conv/WithoutBiases"] == "FakeQuantize"


def test_the_search_stops_at_its_time_limit_with_the_best_it_found():
    """Issue 52 item 14: the build count alone let one search of a pose model run 13 minutes (a build judged a
    minute). Inside a time limit the search asks for no build once the time is up, keeps the best passing config
    found by then, and says which limit stopped it."""
    model = detector()
    shapes = static_shapes(model, CAL)
    nodes = [n.name for n in model.graph.node if n.op_type in ("Conv", "Concat", "Reshape")]

    def build(keep):
        time.sleep(0.2)  # a slow build: the clock, not the count, ends this search
        return tuple(keep)

    def judge(keep):  # passes once cls_conv is float
        return "cls_conv" in keep, {}, () if "cls_conv" in keep else (CLASSES,)

    def effects(layers, targets):
        return {u: (1.0 if "cls_conv" in u else 0.1) for u in layers}

    unbounded = mixed.find(model, nodes, build, judge, shapes=shapes, effects=effects)
    assert unbounded.stopped_s is None and unbounded.builds > 2
    with time_limit(0.3):  # all-int8 (0.2 s), then the head (0.4 s): no build after that
        cut = mixed.find(model, nodes, build, judge, shapes=shapes, effects=effects)
    assert cut.stopped_s == 0.3 and cut.builds == 2 < unbounded.builds
    assert cut.passed and "cls_conv" in cut.kept, "the head passed: it is what the search had found"
    with time_limit(0.0):
        nothing = mixed.find(model, nodes, build, judge, shapes=shapes, effects=effects)
    assert nothing.stopped_s == 0.0 and nothing.builds == 1 and not nothing.passed and nothing.kept == ()


def test_a_build_says_where_the_clock_stopped_its_float_search(tmp_path):
    """The harness's limit reaches the build worker, the artifact records it, and the trial's result carries it."""
    model = _info(tmp_path)
    settings = HarnessSettings(workdir=tmp_path / "work", policy=TimingPolicy(min_samples=8, min_duration_s=0.05),
                               float_search_s=0.0)  # fmt: skip
    assert settings.search_s() == 0.0 and HarnessSettings(workdir=tmp_path, build_timeout_s=100).search_s() == 25.0
    data = prepare_data(model, settings, data=Dataset({"x": X}))
    result = run_trial(model, TrialConfig("inhouse", "int8", threads=1), data, settings)
    # judged: all-int8, and the build with its clipped ranges widened (tried before the search, not a float set)
    assert result.extra[STOPPED_KEY] == 0.0 and result.extra["float_builds"] == 2, result.extra
    assert result.failure_kind == "inaccurate", "all-int8 breaks the class channels, and nothing was searched"
    assert "stopped at its time limit (0 s" in stopped_note(result.extra)
