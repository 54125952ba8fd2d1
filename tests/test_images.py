"""Images as inputs: a folder (labelled by subfolder) and sample:images, preprocessed in benchmark_app's words."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from autodeploy.errors import DataError
from autodeploy.images import SAMPLE_IMAGES, Preprocess, parse_values, sample_images
from autodeploy.intake import load_data
from autodeploy.model import load_model

PIL = pytest.importorskip("PIL.Image")


def image_model(path, shape):
    """[N, ...] image input -> ReduceMean over all but N (a real, runnable model)."""
    x = helper.make_tensor_value_info("img", TensorProto.FLOAT, shape)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 1])
    node = helper.make_node("ReduceMean", ["img"], ["y0"], axes=list(range(1, len(shape))), keepdims=0)
    unsq = helper.make_node("Unsqueeze", ["y0", "ax"], ["y"])
    ax = helper.make_tensor("ax", TensorProto.INT64, [1], [1])
    graph = helper.make_graph([node, unsq], "img", [x], [y], [ax])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return load_model(path)


def solid(path, rgb, size=(12, 10)):
    path.parent.mkdir(parents=True, exist_ok=True)
    PIL.new("RGB", size, tuple(rgb)).save(path)


MEAN, SCALE = (10.0, 20.0, 30.0), (2.0, 4.0, 5.0)


def test_folder_nchw_mean_scale_and_labels_from_subfolders(tmp_path):
    model = image_model(tmp_path / "m.onnx", ["N", 3, 4, 5])
    solid(tmp_path / "imgs" / "cat" / "a.png", (110, 60, 230))
    solid(tmp_path / "imgs" / "dog" / "b.jpg", (50, 50, 50))
    solid(tmp_path / "imgs" / "dog" / "c.png", (0, 255, 40))
    data = load_data(tmp_path / "imgs", model, Preprocess(mean_values=MEAN, scale_values=SCALE))
    x = data.inputs["img"]
    assert x.shape == (3, 3, 4, 5) and x.dtype == np.float32  # resized to H x W, channels first
    np.testing.assert_allclose(x[0, :, 0, 0], [(110 - 10) / 2, (60 - 20) / 4, (230 - 30) / 5])
    np.testing.assert_allclose(x[2, :, 2, 3], [(0 - 10) / 2, (255 - 20) / 4, (40 - 30) / 5])
    assert np.allclose(x[1], x[1, :, :1, :1], atol=1.5)  # a solid JPEG stays (nearly) solid
    assert data.labels.tolist() == [0, 1, 1]  # classes in sorted subfolder order


def test_folder_nhwc_bgr_and_one_mean_for_all_channels(tmp_path):
    model = image_model(tmp_path / "m.onnx", ["N", 6, 7, 3])
    solid(tmp_path / "imgs" / "a.png", (110, 60, 230))
    data = load_data(tmp_path / "imgs", model, Preprocess(reverse_input_channels=True, mean_values=(100.0,)))
    x = data.inputs["img"]
    assert x.shape == (1, 6, 7, 3) and data.labels is None  # channels last, read from the model
    np.testing.assert_allclose(x[0, 3, 4], [230 - 100, 60 - 100, 110 - 100])  # BGR, then the mean


def test_layout_flag_wins_and_bad_values_say_how(tmp_path):
    model = image_model(tmp_path / "m.onnx", ["N", 3, 5, 3])  # ambiguous: 3 channels either way
    solid(tmp_path / "imgs" / "a.png", (1, 2, 3))
    assert load_data(tmp_path / "imgs", model, Preprocess(layout="NHWC")).inputs["img"][0, 0, 0].tolist() == [1, 2, 3]
    assert load_data(tmp_path / "imgs", model, None).inputs["img"][0, :, 0, 0].tolist() == [1, 2, 3]  # NCHW first
    assert parse_values("[123.675,116.28,103.53]", "--mean-values") == (123.675, 116.28, 103.53)
    with pytest.raises(DataError, match="cannot parse --mean-values"):
        parse_values("1;2", "--mean-values")
    with pytest.raises(DataError, match="2 mean values for an input of 3 channels"):
        load_data(tmp_path / "imgs", model, Preprocess(mean_values=(1.0, 2.0)))


def test_dynamic_size_needs_a_shape(tmp_path):
    model = image_model(tmp_path / "m.onnx", ["N", 3, "H", "W"])
    with pytest.raises(DataError, match=r"dynamic height or width.*--shape img=1x3x224x224"):
        load_data(SAMPLE_IMAGES, model, None)
    fixed = model.with_shapes({"img": (1, 3, 16, 20)})
    assert load_data(SAMPLE_IMAGES, fixed, None).inputs["img"].shape == (128, 3, 16, 20)


def test_preprocessing_is_for_images_only(tmp_path):
    model = image_model(tmp_path / "m.onnx", ["N", 3, 4, 5])
    np.savez(tmp_path / "d.npz", img=np.zeros((2, 3, 4, 5), np.float32))
    with pytest.raises(DataError, match="applies to images only"):
        load_data(tmp_path / "d.npz", model, Preprocess(mean_values=(1.0,)))


def test_sample_images_are_deterministic_real_photos(tmp_path):
    pytest.importorskip("sklearn")
    model = image_model(tmp_path / "m.onnx", ["N", 3, 32, 48])
    a, b = sample_images(model, Preprocess(), 16), sample_images(model, Preprocess(), 16)
    assert a.sha256() == b.sha256() and a.labels is None
    assert sample_images(model, Preprocess(), 16, seed=1).sha256() != a.sha256()
    x = a.inputs["img"]
    assert x.shape == (16, 3, 32, 48) and 0 <= x.min() and x.max() <= 255
    assert len({item.tobytes() for item in x}) == 16  # every crop differs
    # photographs, not noise: neighbouring pixels are far closer than random pixels
    assert np.abs(np.diff(x, axis=3)).mean() < 0.3 * np.abs(x - x.mean()).mean()
    normalized = sample_images(model, Preprocess(mean_values=(123.675, 116.28, 103.53),
                                                 scale_values=(58.395, 57.12, 57.375)), 16)
    np.testing.assert_allclose(normalized.inputs["img"][:, 0], (x[:, 0] - 123.675) / 58.395, rtol=1e-5, atol=1e-5)


def test_results_on_synthetic_inputs_say_so_and_point_image_models_to_sample_images(tmp_path, monkeypatch, capsys):
    import json

    from autodeploy.harness.run import SYNTHETIC_NOTE, synthetic_note
    from tests.cli_runner import run_cli
    from tests.models import mlp

    image = image_model(tmp_path / "m.onnx", ["N", 3, 8, 8])
    assert synthetic_note(image).startswith(SYNTHETIC_NOTE) and "--data sample:images" in synthetic_note(image)
    assert synthetic_note(load_model(mlp(tmp_path / "mlp.onnx"))) == SYNTHETIC_NOTE  # not an image model
    monkeypatch.setenv("AUTODEPLOY_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("AUTODEPLOY_DB", f"sqlite:///{tmp_path / 'r.db'}")
    fast = ["--min-samples", "8", "--min-duration", "0.1", "--threads", "1"]
    code, out, err = run_cli(capsys, "bench", str(tmp_path / "m.onnx"), "--format", "json", *fast)
    assert code == 0, err
    assert json.loads(out)["inputs"] == synthetic_note(image)
    code, out, err = run_cli(capsys, "bench", str(tmp_path / "m.onnx"), "--data", SAMPLE_IMAGES, "--format", "json",
                             "--mean-values", "[123.675,116.28,103.53]", "--scale-values", "58.4", *fast)
    assert code == 0, err
    assert json.loads(out)["inputs"] is None  # real photos: nothing to warn about


def test_tune_takes_sample_images_preprocessing_and_a_metric(tmp_path, monkeypatch):
    pytest.importorskip("sklearn")
    import autodeploy
    from autodeploy.search import config as study_config

    (tmp_path / "tm.py").write_text("def mean_y(outputs, labels):\n    return float(outputs['y'].mean())\n")
    monkeypatch.chdir(tmp_path)
    image_model(tmp_path / "m.onnx", ["N", 3, 8, 8])
    summary = autodeploy.tune(str(tmp_path / "m.onnx"), engines=["onnxruntime"], precisions=["fp32"], threads=[1],
                              trials=1, finalists=0, min_samples=8, min_duration_s=0.1, data=SAMPLE_IMAGES,
                              preprocess=Preprocess(mean_values=(128.0,), scale_values=(64.0,)), metric="tm.py:mean_y",
                              max_metric_drop=0.0, db=f"sqlite:///{tmp_path / 'r.db'}", cache=tmp_path / "c")  # fmt: skip
    assert summary.winner is not None and summary.inputs == ""  # real photos: no synthetic note
    cfg = study_config.validate({"model": "m.onnx", "data": SAMPLE_IMAGES,
                                 "preprocess": {"layout": "NCHW", "mean_values": [128.0]},
                                 "constraints": {"max_metric_drop": 0.01}}, {})  # fmt: skip
    assert cfg.preprocess.mean_values == [128.0] and cfg.constraints.max_metric_drop == 0.01
