"""TFLite specifics: layout (NCHW ↔ NHWC), variant sizes, full int8, XNNPACK knob, reload.

Conversions through onnx2tf take 10-30 s each, so one module-scoped set of artifacts of
zoo:tiny-cnn serves every slow test. The pure layout helpers need no converter.
"""

import json
import shutil

import numpy as np
import onnxruntime as ort
import pytest

from autodeploy import zoo
from autodeploy.adapters import tflite
from autodeploy.adapters.base import Artifact, TrialConfig
from autodeploy.data import synthetic
from autodeploy.device import probe_device
from autodeploy.errors import BuildError, UnsupportedConfigError
from autodeploy.model import load_model
from tests.models import lp_pool, seq_model

ENGINE = tflite.TfliteEngine()
PRECISIONS = ("fp32", "fp16", "int8-dynamic", "int8")


def _needs_engine():
    """The runtime and the converter: these tests build from ONNX (without onnx2tf, see test_tflite_runtime_only)."""
    availability = ENGINE.probe(probe_device())
    if not availability.available or tflite.converter_missing():
        pytest.skip(f"tflite: {availability}")


@pytest.fixture(scope="module")
def cnn(tmp_path_factory):
    _needs_engine()
    return load_model(zoo.get("tiny-cnn", tmp_path_factory.mktemp("zoo")))


@pytest.fixture(scope="module")
def artifacts(cnn, tmp_path_factory):
    work = tmp_path_factory.mktemp("artifacts")
    calibration = synthetic(cnn, 64, seed=1).inputs
    return {
        p: ENGINE.build(
            cnn, TrialConfig("tflite", p), calibration, work, target=probe_device(), calibration_hash="c1"
        )
        for p in PRECISIONS
    }


def _run(cnn, artifact, feeds, **config):
    with ENGINE.load(artifact, TrialConfig("tflite", artifact.precision, **config), cnn) as runner:
        return runner.run(feeds)


def _reference(cnn, feeds):
    session = ort.InferenceSession(str(cnn.path), providers=["CPUExecutionProvider"])
    return dict(zip(cnn.output_names, session.run(None, feeds), strict=True))


def _cosine(a, b):
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.mark.slow
def test_cnn_takes_and_returns_onnx_layout(cnn, artifacts):
    layout = json.loads((artifacts["fp32"].path / tflite.LAYOUT_FILE).read_text())
    assert layout["inputs"][0]["perm"] == [0, 2, 3, 1], "onnx2tf made the NCHW input NHWC"
    assert artifacts["fp32"].files == (tflite.LAYOUT_FILE, tflite.MODEL_FILE)
    for batch in (3, 1):  # a new batch size resizes the interpreter's inputs
        feeds = synthetic(cnn, batch, seed=batch).inputs
        got, want = _run(cnn, artifacts["fp32"], feeds, batch=batch), _reference(cnn, feeds)
        assert list(got) == list(cnn.output_names)
        for name in cnn.output_names:
            assert got[name].shape == want[name].shape and got[name].dtype == want[name].dtype
            np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_quantized_variants_are_smaller_than_fp32(artifacts):
    fp32 = artifacts["fp32"].size_bytes()
    for precision in ("fp16", "int8-dynamic", "int8"):
        assert artifacts[precision].size_bytes() < fp32, precision
    assert artifacts["int8-dynamic"].size_bytes() < artifacts["fp16"].size_bytes()


@pytest.mark.slow
@pytest.mark.parametrize("precision,min_cosine", [("fp16", 0.9999), ("int8-dynamic", 0.99), ("int8", 0.99)])
def test_reduced_precisions_stay_close(cnn, artifacts, precision, min_cosine):
    feeds = synthetic(cnn, 16, seed=2).inputs
    got, want = _run(cnn, artifacts[precision], feeds)["logits"], _reference(cnn, feeds)["logits"]
    assert _cosine(got, want) > min_cosine
    assert (got.argmax(1) == want.argmax(1)).mean() >= 0.9
    if precision == "int8":
        assert np.abs(got - want).max() > 0, "int8 equals fp32 exactly: nothing was quantized"


@pytest.mark.slow
@pytest.mark.parametrize("xnnpack", [True, False])
def test_xnnpack_on_and_off_both_run(cnn, artifacts, xnnpack):
    feeds = synthetic(cnn, 2, seed=3).inputs
    ENGINE.check(probe_device(), cnn, TrialConfig("tflite", knobs={"xnnpack": xnnpack}))
    got = _run(cnn, artifacts["fp32"], feeds, threads=2, knobs={"xnnpack": xnnpack})
    np.testing.assert_allclose(got["logits"], _reference(cnn, feeds)["logits"], rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_artifact_reloads_and_is_cached(cnn, artifacts):
    first = artifacts["int8"]
    config = TrialConfig("tflite", "int8")
    again = ENGINE.build(cnn, config, None, first.path.parent, target=probe_device(), calibration_hash="c1")
    assert again.path == first.path, "same key: the cached artifact, no rebuild (no calibration needed)"
    reread = Artifact.read(first.path)
    assert reread.meta["converter"]["onnx2tf"] and reread.meta["converter"]["tensorflow"]
    assert reread.meta["conversion"]["rung"] == tflite.LADDER[0].name, "the first rung (onnxslim) converts the CNN"
    assert reread.meta["conversion"]["failed_rungs"] == []
    feeds = synthetic(cnn, 4, seed=4).inputs
    with tflite.TfliteEngine().load(reread, config, cnn) as fresh:
        np.testing.assert_array_equal(fresh.run(feeds)["logits"], _run(cnn, first, feeds)["logits"])


# -- pure helpers: no converter needed -----------------------------------------------------


def test_int8_is_pruned_for_integer_inputs(tmp_path):
    model = load_model(seq_model(tmp_path / "seq.onnx"))
    space = ENGINE.space(probe_device(), model)
    assert "int8" not in space.precisions and "float32" in space.unsupported["int8"]
    assert "int8-dynamic" in space.precisions and space.knobs["xnnpack"] == (True, False)
    assert "bf16" in space.unsupported


def test_layout_of_prefers_channels_last_and_refuses_misfits():
    assert tflite._layout_of((2, 3, 32, 32), (-1, 32, 32, 3)) == [0, 2, 3, 1]
    assert tflite._layout_of((2, 3, 3, 3), (-1, 3, 3, 3)) == [0, 2, 3, 1]
    assert tflite._layout_of((2, 10), (-1, 10)) is None
    assert tflite._layout_of((2, 5, 7), (-1, 7, 5)) == [0, 2, 1]
    assert tflite._layout_of((2, 3, 32, 32), (-1, 16, 16, 3)) is False


def test_outputs_are_matched_by_value_and_transposed_back():
    rng = np.random.default_rng(0)
    feature = rng.standard_normal((2, 4, 5, 6)).astype(np.float32)  # NCHW
    logits = rng.standard_normal((2, 10)).astype(np.float32)
    got = {"Identity": logits + 1e-6, "Identity_1": feature.transpose(0, 2, 3, 1)}
    entries = tflite._match_outputs({"features": feature, "logits": logits}, got)
    assert [(e["name"], e["tflite"], e["perm"]) for e in entries] == [
        ("features", "Identity_1", [0, 3, 1, 2]),
        ("logits", "Identity", None),
    ]


def test_dynamic_dims_are_written_into_the_graph_before_onnx2tf(tmp_path):
    """Symbolic height/width take the user's (or the data's) size in the file onnx2tf reads, at
    batch 1; intermediate and output shapes are re-inferred from the fixed ones."""
    import onnx

    from autodeploy.adapters.tflite import _fixed_graph
    from autodeploy.model import load_model
    from tests.models import mlp, paddle_like

    model = load_model(paddle_like(tmp_path / "p.onnx"), {"x": (1, 3, 32, 48)})
    fixed = onnx.load(str(_fixed_graph(model, tmp_path)))
    dims = [d.dim_param or d.dim_value for d in fixed.graph.input[0].type.tensor_type.shape.dim]
    assert dims == [1, 3, 32, 48]
    out = [d.dim_param or d.dim_value for d in fixed.graph.output[0].type.tensor_type.shape.dim]
    assert out == [1, 4, 32, 48]
    plain = load_model(mlp(tmp_path / "m.onnx"))
    assert _fixed_graph(plain, tmp_path) == plain.path  # nothing to fix: the model itself


def test_conversion_leaves_the_users_model_file_unchanged(tmp_path):
    """onnx2tf rewrites the ONNX file it converts; the adapter hands it a copy."""
    import hashlib

    from tests.models import mlp

    engine = tflite.TfliteEngine()
    _needs_engine()
    path = mlp(tmp_path / "m.onnx")
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    engine.build(
        load_model(path), TrialConfig("tflite", "fp32"), None, tmp_path / "artifacts", target=probe_device()
    )
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["artifacts", "m.onnx"]


def test_an_xnnpack_failure_fails_only_the_xnnpack_configs(cnn, tmp_path, monkeypatch):
    """The issue's PaddleOCR detector: "XNNPack delegate failed to reshape runtime" failed the fp32 *build*,
    so no precision was tried. The file is fine; TFLite's own kernels run it. Here XNNPACK is made to
    fail the same way (a fault injected into the delegate only): fp32 and fp16 both build, the xnnpack
    configs are unsupported with the fix, and xnnpack=False runs and matches ONNX Runtime."""
    from ai_edge_litert import interpreter as litert

    real = litert.Interpreter

    class XnnpackFails(real):  # the real interpreter; only the default delegate's prepare is made to fail
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self._xnnpack = kwargs.get("experimental_op_resolver_type", litert.OpResolverType.AUTO) == litert.OpResolverType.AUTO

        def allocate_tensors(self):
            if self._xnnpack:
                raise RuntimeError("tensorflow/lite/kernels/xnnpack: XNNPack delegate failed to reshape runtime")
            return super().allocate_tensors()

    monkeypatch.setattr(litert, "Interpreter", XnnpackFails)
    feeds = synthetic(cnn, 2, seed=3).inputs
    for precision in ("fp32", "fp16"):
        artifact = ENGINE.build(
            cnn, TrialConfig("tflite", precision), None, tmp_path, target=probe_device(), calibration_hash="x"
        )
        assert "XNNPack delegate failed" in json.loads((artifact.path / tflite.LAYOUT_FILE).read_text())[tflite.XNNPACK_FAILED]
        with pytest.raises(UnsupportedConfigError, match=r"XNNPACK delegate cannot run .*; fix: use --knob xnnpack=false"):
            ENGINE.load(artifact, TrialConfig("tflite", precision), cnn)
        got = _run(cnn, artifact, feeds, knobs={"xnnpack": False})
        assert _cosine(got["logits"], _reference(cnn, feeds)["logits"]) > 0.999


@pytest.mark.slow
def test_a_failed_conversion_fails_every_precision_at_once(tmp_path, monkeypatch):
    """One onnx2tf conversion serves every precision, so its failure is kept: the first build pays
    for onnx2tf (one rung here), the other precisions fail at once with the same reason."""
    _needs_engine()
    monkeypatch.setattr(tflite, "LADDER", tflite.LADDER[:1])
    runs = []
    convert = tflite._convert
    monkeypatch.setattr(tflite, "_convert", lambda *a: runs.append(a[1]) or convert(*a))
    model = load_model(lp_pool(tmp_path / "lp.onnx"))
    reasons = []
    for precision in PRECISIONS:
        config, data = TrialConfig("tflite", precision), synthetic(model, 4).inputs
        with pytest.raises(BuildError) as failed:
            ENGINE.build(model, config, data, tmp_path / "work", target=probe_device())
        reasons.append(str(failed.value))
    assert len(runs) == 1, "onnx2tf ran once for four precisions"
    assert len(set(reasons)) == 1 and "no converter for ONNX op LpPool" in reasons[0] and "[onnxslim]" in reasons[0]
    assert "\n" not in reasons[0]
    assert sorted(p.name for p in (tmp_path / "work").iterdir()) == ["tflite-onnx2tf"], "the kept outcome, no artifact"
    (folder,) = (tmp_path / "work" / "tflite-onnx2tf").iterdir()
    assert f"onnx2tf log kept in {folder}" in reasons[0]
    assert "LpPool" in (folder / "onnx2tf-rung-0.log").read_text(), "the converter's whole log is kept"


def test_the_ladder_climbs_until_a_rung_converts_and_keeps_the_outcome(tmp_path, monkeypatch):
    """Rungs are tried in order; the first that writes the float files wins, with the earlier rungs'
    reasons recorded; a second conversion of the same model runs no rung."""
    from tests.models import mlp

    model = load_model(mlp(tmp_path / "m.onnx"))
    tried = []

    def fake(model, slim, options, fixed, out):
        tried.append(options)
        if len(tried) == 1:
            return "exit 1: ValueError: Dimensions must be equal"
        out.mkdir()
        tflite._variant(out, model, "fp32").write_bytes(b"tflite")
        return None

    monkeypatch.setattr(tflite, "_convert", fake)
    folder, record = tflite._conversion(model, tmp_path)
    assert record["rung"] == tflite.LADDER[1].name and record["onnxslim"] is tflite.LADDER[1].slim
    assert record["options"]["keep_shape_absolutely_input_names"] == list(model.input_names), "INPUTS is the model's inputs"
    assert record["failed_rungs"] == [{"rung": tflite.LADDER[0].name, "reason": "exit 1: ValueError: Dimensions must be equal"}]
    assert tflite._variant(folder, model, "fp32").read_bytes() == b"tflite"
    assert tflite._conversion(model, tmp_path) == (folder, record) and len(tried) == 2, "kept: no rung runs again"


def test_a_failed_rungs_reason_says_what_keras_said_under_its_wrapper(tmp_path):
    # basic-pitch's onnx2tf log (cut): the reason read 'ValueError: Exception encountered when calling layer
    # "tf.math.multiply" (type TFOpLambda).' and the node, not the line under it that says what was wrong.
    log = tmp_path / "onnx2tf.log"
    log.write_text(
        "\x1b[31mERROR:\x1b[0m The trace log is below.\nTraceback (most recent call last):\n"
        '  File "/site-packages/onnx2tf/ops/Mul.py", line 319, in make_node\n    tf.math.multiply(\n'
        'ValueError: Exception encountered when calling layer "tf.math.multiply" (type TFOpLambda).\n\n'
        "Dimensions must be equal, but are 324 and 309 for '{{node tf.math.multiply/Mul}} = Mul[T=DT_FLOAT]"
        "(Placeholder, tf.math.multiply/Mul/y)' with input shapes: [?,172,2,324], [1,1,1,309].\n\n"
        'Call arguments received by layer "tf.math.multiply" (type TFOpLambda):\n'
        "  \u2022 x=tf.Tensor(shape=(None, 172, 2, 324), dtype=float32)\n"
        "\x1b[31mERROR:\x1b[0m onnx_op_name: model_1/cq_t2010v2_1/mul_1\n"
        "\x1b[31mERROR:\x1b[0m Read this and deal with it. https://github.com/PINTO0309/onnx2tf#parameter-replacement\n"
    )
    assert tflite._log_tail(log) == (
        'ValueError: Exception encountered when calling layer "tf.math.multiply" (type TFOpLambda). | '
        "Dimensions must be equal, but are 324 and 309 with input shapes: [?,172,2,324], [1,1,1,309]. | "
        "at ONNX node model_1/cq_t2010v2_1/mul_1"
    )
    assert len(tflite._log_tail(log)) < tflite.MAX_RUNG_REASON, "the node is not cut from the rung's reason"


def test_the_kept_logs_are_found_from_the_reason_that_names_their_folder(tmp_path):
    folder = tmp_path / "work dir (1)" / "tflite-onnx2tf" / ("0123456789abcdef" + "01234567")
    folder.mkdir(parents=True)
    for i in (0, 2):  # a rung that never ran (or a folder from an older ladder) has no log
        (folder / tflite.RUNG_LOG.format(i)).write_text(f"\x1b[31mERROR:\x1b[0m rung {i}\n\nlast line\n")
    reason = f"BuildError: onnx2tf could not convert m to TFLite ({tflite.LOGS_KEPT}{folder}): no rung converted it"
    logs = tflite.kept_logs(reason)
    assert logs == [folder / "onnx2tf-rung-0.log", folder / "onnx2tf-rung-2.log"]
    assert tflite.log_lines(logs[1], 40) == ["ERROR: rung 2", "last line"] and tflite.log_lines(logs[1], 1) == ["last line"]
    assert tflite.kept_logs("load_failed: something else") == [] and tflite.kept_logs(None) == []
    shutil.rmtree(folder)
    assert tflite.kept_logs(reason) == [], "deleted to convert again: nothing to show"
