import numpy as np
import pytest

from autodeploy.data import Dataset, load_user_data, parse_input_pins, shapes_from_data, split, synthetic
from autodeploy.errors import DataError, ShapeError
from autodeploy.model import load_model
from tests.models import mlp, recurrent, seq_model


@pytest.fixture
def mlp_info(tmp_path):
    return load_model(mlp(tmp_path / "m.onnx"))


@pytest.fixture
def seq_info(tmp_path):
    return load_model(seq_model(tmp_path / "s.onnx"), {"input_ids": (1, 6), "attention_mask": (1, 6)})


def test_synthetic_respects_dtypes_and_names(seq_info, mlp_info):
    data = synthetic(seq_info, 10)
    ids, mask = data.inputs["input_ids"], data.inputs["attention_mask"]
    assert ids.dtype == np.int64 and ids.shape == (10, 6) and 0 <= ids.min() and ids.max() < 100
    assert (mask == 1).all()
    floats = synthetic(mlp_info, 5).inputs["x"]
    assert floats.dtype == np.float32 and floats.shape == (5, 8) and floats.std() > 0.5


def test_synthetic_is_seeded_and_pins(seq_info):
    a, b = synthetic(seq_info, 4, seed=1), synthetic(seq_info, 4, seed=1)
    assert a.sha256() == b.sha256()
    assert synthetic(seq_info, 4, seed=2).sha256() != a.sha256()
    pinned = synthetic(seq_info, 3, pins=parse_input_pins(["input_ids=7"]))
    assert (pinned.inputs["input_ids"] == 7).all()
    with pytest.raises(ShapeError, match="no input 'nope'"):
        synthetic(seq_info, 3, pins={"nope": 1.0})
    with pytest.raises(DataError, match="cannot parse --input"):
        parse_input_pins(["input_ids"])


def test_user_npz_with_labels(tmp_path, mlp_info):
    x = np.random.default_rng(0).standard_normal((12, 8)).astype(np.float32)
    np.savez(tmp_path / "d.npz", x=x, labels=np.arange(12) % 4)
    data = load_user_data(tmp_path / "d.npz", mlp_info)
    assert np.array_equal(data.inputs["x"], x) and data.labels.dtype == np.int64 and len(data) == 12


def test_user_folder_of_npy(tmp_path, mlp_info):
    (tmp_path / "d").mkdir()
    np.save(tmp_path / "d" / "x.npy", np.zeros((3, 8), np.float32))
    assert len(load_user_data(tmp_path / "d", mlp_info)) == 3


@pytest.mark.parametrize(
    "arrays, message",
    [
        ({"x": np.zeros((3, 8), np.float64)}, "dtype float64, the model wants float32"),
        ({"x": np.zeros((3, 9), np.float32)}, r"items of shape \(9,\), the model wants \(8,\)"),
        ({"y": np.zeros((3, 8), np.float32)}, "the model wants \\['x'\\]"),
    ],
)
def test_user_data_that_does_not_fit(tmp_path, mlp_info, arrays, message):
    np.savez(tmp_path / "d.npz", **arrays)
    with pytest.raises(DataError, match=message):
        load_user_data(tmp_path / "d.npz", mlp_info)


def test_user_data_pickle_is_refused(tmp_path, mlp_info):
    np.save(tmp_path / "x.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(DataError, match="cannot read input data"):
        load_user_data(tmp_path / "x.npy", mlp_info)


def test_split_is_disjoint_and_batches_pad(mlp_info):
    data = synthetic(mlp_info, 20)
    calibration, evaluation = split(data, 8)
    assert len(calibration) == 8 and len(evaluation) == 12
    rows = {r.tobytes() for r in calibration.inputs["x"]}
    assert not rows & {r.tobytes() for r in evaluation.inputs["x"]}
    batches = evaluation.batches(5)
    assert [b["x"].shape for b in batches] == [(5, 8), (5, 8), (5, 8)]
    assert np.array_equal(batches[-1]["x"][2:], np.repeat(batches[-1]["x"][:1], 3, axis=0))


def test_dataset_save_load_round_trip(tmp_path, mlp_info):
    data = Dataset(synthetic(mlp_info, 4).inputs, np.arange(4))
    data.save(tmp_path / "d.npz")
    again = Dataset.load(tmp_path / "d.npz")
    assert again.sha256() == data.sha256()


def test_batches_put_items_on_each_inputs_batch_axis(tmp_path):
    info = load_model(recurrent(tmp_path / "r.onnx"), {"input": (1, 5), "state": (2, 1, 128)})
    data = synthetic(info, 3, pins={"sr": 16000})
    assert data.inputs["state"].shape == (3, 2, 128) and data.inputs["sr"].shape == (3,)
    axes = {n: info.batch_axis(n) for n in info.input_names}
    first, last = data.batches(2, axes)
    assert first["input"].shape == (2, 5) and first["state"].shape == (2, 2, 128)
    assert first["sr"].shape == () and first["sr"] == 16000  # never batched
    np.testing.assert_array_equal(first["state"][:, 1], data.inputs["state"][1])
    np.testing.assert_array_equal(last["state"][:, 1], data.inputs["state"][2])  # padding repeats


def test_shapes_come_from_the_data(tmp_path):
    info = load_model(recurrent(tmp_path / "r.onnx"))
    arrays = {"input": np.zeros((4, 7), np.float32), "sr": np.array(8000, np.int64),
              "state": np.zeros((4, 2, 128), np.float32)}  # fmt: skip
    np.savez(tmp_path / "d.npz", **arrays)
    data = load_user_data(tmp_path / "d.npz", info)
    assert data.inputs["sr"].shape == (4,)  # one value for every item
    assert shapes_from_data(info, data) == {"input": (1, 7)}  # state has no open dim off its batch axis
    fitted = info.with_shapes(shapes_from_data(info, data))
    assert fitted.input_shape("input", 4) == (4, 7) and fitted.input_shape("state", 4) == (2, 4, 128)
    bad = {**arrays, "state": np.zeros((4, 3, 128), np.float32)}
    np.savez(tmp_path / "bad.npz", **bad)
    with pytest.raises(DataError, match=r"'state' has items of shape \(3, 128\), the model wants \(2, 128\)"):
        load_user_data(tmp_path / "bad.npz", info)
