import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from autodeploy.errors import ModelError, ShapeError
from autodeploy.model import load_model, parse_batch_axis_flags, parse_shape_flags
from tests.models import mlp, paddle_like, recurrent, seq_model, with_external_data


def test_loads_specs_and_hash(tmp_path):
    info = load_model(mlp(tmp_path / "m.onnx"))
    assert info.input_names == ("x",) and info.output_names == ("logits",)
    assert info.inputs[0].dtype == "float32" and info.inputs[0].shape == ("N", 8)
    assert info.batchable() and info.input_shape("x", batch=4) == (4, 8)
    assert info.opset == 17 and len(info.sha256) == 64
    assert load_model(tmp_path / "m.onnx").sha256 == info.sha256
    assert load_model(mlp(tmp_path / "m2.onnx", seed=1)).sha256 != info.sha256


@pytest.mark.parametrize(
    "content, expected",
    [
        (b"", "not a readable ONNX model|holds no ONNX graph"),
        (b"this is not onnx at all\x00\xff\xfe", "not a readable ONNX model|holds no ONNX graph"),
    ],
)
def test_garbage_files_are_refused(tmp_path, content, expected):
    path = tmp_path / "bad.onnx"
    path.write_bytes(content)
    with pytest.raises(ModelError, match=expected):
        load_model(path)


def test_an_openvino_ir_is_taken_as_given_with_its_weights_beside_it(tmp_path):
    # A model in another format is described by the engine that runs it (a .tflite: tests/realmodels/test_formats.py).
    ov = pytest.importorskip("openvino")
    xml = tmp_path / "ir" / "m.xml"
    xml.parent.mkdir()
    ov.save_model(ov.convert_model(str(mlp(tmp_path / "m.onnx"))), str(xml))
    info = load_model(xml)
    assert info.format == "openvino" and info.external_files == ("m.bin",)
    assert info.input_names == ("x",) and info.output_names == ("logits",)
    assert info.inputs[0].dtype == "float32" and info.inputs[0].shape == (None, 8)  # OpenVINO keeps no dim names
    assert info.batch_axis("x") == 0 and info.input_shape("x", batch=4) == (4, 8)
    assert "run as given on openvino" in info.notes[0]
    weights = xml.with_suffix(".bin")
    weights.write_bytes(weights.read_bytes() + b"\0")
    assert load_model(xml).sha256 != info.sha256, "the weights are hashed with the graph"
    weights.rename(tmp_path / "elsewhere.bin")
    with pytest.raises(ModelError, match=r"OpenVINO IR .*m.xml has no weights file m.bin beside it; fix: copy"):
        load_model(xml)
    weights.symlink_to(tmp_path / "elsewhere.bin")  # weights from outside the folder: refused
    with pytest.raises(ModelError, match="the weights m.bin of OpenVINO IR .* are a link or not a plain file"):
        load_model(xml)


@pytest.mark.parametrize(
    "name, content, expected",
    [
        # A flatbuffer's root offset, then its file identifier, then nothing LiteRT can read.
        ("m.tflite", b"\x1c\x00\x00\x00TFL3" + bytes(64),
         r"looks like a TFLite flatbuffer, but LiteRT's interpreter cannot read it: .*; fix: the file may be truncated"),
        ("m.tflite", b"not a flatbuffer at all", r"is not a TFLite flatbuffer \(no TFL3 file identifier"),
        ("m.xml", b'<?xml version="1.0"?>\n<net name="m" version="11">\n<layers><layer id="0"',
         r"looks like an OpenVINO IR, but OpenVINO's read_model cannot read it: "),
        ("m.xml", b'<?xml version="1.0"?>\n<config></config>', r"is not an OpenVINO IR \(no <net> root element\)"),
    ],
)
def test_a_corrupt_tflite_or_ir_is_one_clear_error(tmp_path, name, content, expected):
    path = tmp_path / name
    path.write_bytes(content)
    if name.endswith(".xml"):
        path.with_suffix(".bin").write_bytes(b"")
    with pytest.raises(ModelError, match=expected) as caught:
        load_model(path)
    assert "\n" not in str(caught.value)


def test_truncated_model_is_refused(tmp_path):
    data = mlp(tmp_path / "m.onnx").read_bytes()
    (tmp_path / "t.onnx").write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelError, match="truncated"):
        load_model(tmp_path / "t.onnx")


def test_missing_and_directory(tmp_path):
    with pytest.raises(ModelError, match="not found"):
        load_model(tmp_path / "nope.onnx")
    with pytest.raises(ModelError, match="not a file"):
        load_model(tmp_path)


def test_checker_failure_names_the_problem(tmp_path):
    graph = helper.make_graph(
        [helper.make_node("Relu", ["undefined"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / "c.onnx"))
    with pytest.raises(ModelError, match="fails the ONNX checker"):
        load_model(tmp_path / "c.onnx")


def test_external_data_inside_folder_is_hashed(tmp_path):
    path = with_external_data(tmp_path / "m.onnx", "weights.bin")
    info = load_model(path)
    assert info.external_files == ("weights.bin",)
    data = bytearray((tmp_path / "weights.bin").read_bytes())
    data[0] ^= 1
    (tmp_path / "weights.bin").write_bytes(bytes(data))
    assert load_model(path).sha256 != info.sha256


@pytest.mark.parametrize("location", ["../weights.bin", "/etc/passwd", "sub/../../weights.bin"])
def test_external_data_outside_folder_is_refused(tmp_path, location):
    folder = tmp_path / "model"
    folder.mkdir()
    path = with_external_data(folder / "m.onnx", location)
    (tmp_path / "weights.bin").write_bytes((folder / "weights.bin").read_bytes())
    with pytest.raises(ModelError, match="outside the model's folder"):
        load_model(path)


def test_external_data_symlink_is_refused(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    path = with_external_data(folder / "m.onnx", "link.bin")
    os.symlink(folder / "weights.bin", folder / "link.bin")
    with pytest.raises(ModelError, match="outside the model's folder"):
        load_model(path)


def test_shapes_fix_dynamic_dims(tmp_path):
    path = seq_model(tmp_path / "s.onnx")
    info = load_model(path)
    with pytest.raises(ShapeError, match="--shape input_ids=NxS|fix it with --shape input_ids="):
        info.input_shape("input_ids", batch=1)
    fixed = load_model(path, parse_shape_flags(["input_ids=1x16", "attention_mask=1x16"]))
    assert fixed.input_shape("input_ids", batch=3) == (3, 16)
    assert fixed.item_shape("attention_mask") == (16,)


def test_shapes_that_do_not_fit(tmp_path):
    path = mlp(tmp_path / "m.onnx")
    with pytest.raises(ShapeError, match="rank"):
        load_model(path, {"x": (1, 8, 1)})
    with pytest.raises(ShapeError, match="axis 1 is fixed at 8"):
        load_model(path, {"x": (1, 9)})
    with pytest.raises(ShapeError, match="no input 'y'"):
        load_model(path, {"y": (1, 8)})
    with pytest.raises(ShapeError, match="cannot parse"):
        parse_shape_flags(["x=1xfoo"])


def test_static_batch_refuses_other_batches(tmp_path):
    info = load_model(mlp(tmp_path / "m.onnx", batch=1))
    assert not info.batchable()
    assert info.input_shape("x", 1) == (1, 8)
    with pytest.raises(ShapeError, match="static batch dim 1"):
        info.input_shape("x", 2)


def test_model_info_round_trips(tmp_path):
    info = load_model(seq_model(tmp_path / "s.onnx"), {"input_ids": (1, 4), "attention_mask": (1, 4)})
    again = type(info).from_dict(info.to_dict())
    assert again == info
    assert np.dtype(again.inputs[0].dtype) == np.int64


def test_negative_dims_are_dynamic_with_one_note(tmp_path):
    info = load_model(paddle_like(tmp_path / "p.onnx"))
    assert info.input("x").shape == (None, 3, None, None)
    assert info.input_names == ("x",)  # 'scale' has an initializer default: optional
    assert len([n for n in info.notes if "negative dims" in n]) == 1
    assert "'x' axis 0, 2, 3" in info.notes[0] and any("'scale'" in n for n in info.notes)
    assert info.batchable() and info.batch_axis("y") == 0
    with pytest.raises(ShapeError, match="dynamic dim \\? at axis 2"):
        info.input_shape("x", 1)
    assert load_model(tmp_path / "p.onnx", {"x": (1, 3, 32, 48)}).input_shape("x", 4) == (4, 3, 32, 48)


def test_batch_axis_is_the_dim_inputs_and_outputs_share(tmp_path):
    info = load_model(recurrent(tmp_path / "r.onnx"), {"input": (1, 512), "state": (2, 1, 128)})
    axes = {n: info.batch_axis(n) for n in (*info.input_names, *info.output_names)}
    assert axes == {"input": 0, "sr": None, "state": 1, "output": 0, "stateN": 1}
    assert info.input_shape("state", 1) == (2, 1, 128)  # the user's shape, as given
    assert info.input_shape("state", 4) == (2, 4, 128)
    assert info.input_shape("sr", 4) == ()
    assert info.item_shape("state") == (2, 128) and info.item_shape("sr") == ()


def test_batch_axis_override_and_its_errors(tmp_path):
    path = recurrent(tmp_path / "r.onnx")
    shapes = {"input": (1, 8), "state": (2, 1, 128)}
    info = load_model(path, shapes, batch_axes=parse_batch_axis_flags(["state=none"]))
    assert info.batch_axis("state") is None and info.batch_axis("input") == 0
    assert info.item_shape("state") == (2, 1, 128) and info.input_shape("state", 4) == (2, 1, 128)
    assert type(info).from_dict(info.to_dict()) == info
    assert info.shape_overrides_key() != load_model(path, shapes).shape_overrides_key()
    with pytest.raises(ShapeError, match="past the last axis of input 'state'"):
        load_model(path, batch_axes={"state": 3})
    with pytest.raises(ShapeError, match="cannot parse --batch-axis"):
        parse_batch_axis_flags(["state:1"])


def test_a_fixed_batch_of_one_with_a_shared_sequence_dim(tmp_path):
    """``ids[1, seq]`` → ``out[1, seq, 4]``: ``seq`` is shared but is not the batch."""
    path = tmp_path / "f.onnx"
    graph = helper.make_graph(
        [helper.make_node("Unsqueeze", ["ids", "ax"], ["u"]), helper.make_node("Tile", ["u", "reps"], ["out"])],
        "fixed",
        [helper.make_tensor_value_info("ids", TensorProto.FLOAT, [1, "seq"])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, "seq", 4])],
        [numpy_helper.from_array(np.array([2], np.int64), "ax"),
         numpy_helper.from_array(np.array([1, 1, 4], np.int64), "reps")],
    )  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    info = load_model(path, {"ids": (1, 16)})
    assert info.batch_axis("ids") == 0 and info.fixed_batch() == 1 and not info.batchable()
    with pytest.raises(ShapeError, match="static batch dim 1"):
        info.input_shape("ids", 2)


def test_what_onnx_runtime_loads_is_accepted_and_what_it_refuses_says_why(tmp_path):
    """The ONNX checker objects to ir_version 0; ONNX Runtime loads it, so intake does, with a note.
    A model both refuse gets both reasons on one line."""
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 0
    (tmp_path / "ir0.onnx").write_bytes(model.SerializeToString())
    info = load_model(tmp_path / "ir0.onnx")
    assert any("ONNX Runtime loads the model" in n for n in info.notes)
    model.ir_version = 8
    model.graph.node[0].op_type = "NoSuchOp"
    (tmp_path / "bad.onnx").write_bytes(model.SerializeToString())
    with pytest.raises(ModelError, match="fails the ONNX checker: .*; ONNX Runtime refuses it too: .*NoSuchOp") as exc:
        load_model(tmp_path / "bad.onnx")
    assert "\n" not in str(exc.value)


def test_one_shape_commands_refuse_an_input_given_twice():
    with pytest.raises(ShapeError, match="--shape x is given twice; this command runs one shape per input"):
        parse_shape_flags(["x=1x2", "x=1x3"])


def test_a_zipmap_output_is_read_as_the_class_probabilities_it_holds(tmp_path):
    """skl2onnx's default classifier ends in ZipMap (``seq(map(int64|string, float))``): read as float32
    ``[N, classes]`` on the batch axis the model's input has, said once in a note."""
    from tests.models import zipmap_classifier

    for string_labels in (False, True):
        info = load_model(zipmap_classifier(tmp_path / f"z{string_labels}.onnx", classes=3, string_labels=string_labels))
        probabilities = info.outputs[1]
        assert (probabilities.name, probabilities.dtype, probabilities.shape) == ("probabilities", "float32", ("N", 3))
        assert info.batch_axis("probabilities") == 0
        assert any("'probabilities' is a sequence of maps (ZipMap" in note and "timed as the model returns it" in note
                   for note in info.notes)  # fmt: skip


def test_a_non_tensor_input_or_output_is_named_as_what_it_is_with_a_fix(tmp_path):
    def save(node, inputs, outputs):
        model = helper.make_model(helper.make_graph([node], "g", inputs, outputs),
                                  opset_imports=[helper.make_opsetid("", 17)])  # fmt: skip
        onnx.save(model, str(tmp_path / "m.onnx"))
        return tmp_path / "m.onnx"

    seq_in = save(helper.make_node("SequenceLength", ["x"], ["y"]),
                  [helper.make_tensor_sequence_value_info("x", TensorProto.FLOAT, [4])],
                  [helper.make_tensor_value_info("y", TensorProto.INT64, [])])  # fmt: skip
    with pytest.raises(ModelError, match=r"^input 'x' is a sequence, not a tensor; .*fix: re-export") as err:
        load_model(seq_in)
    assert "output" not in str(err.value) and "\n" not in str(err.value)
    seq_out = save(helper.make_node("SequenceConstruct", ["x"], ["y"]),
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                   [helper.make_tensor_sequence_value_info("y", TensorProto.FLOAT, [4])])  # fmt: skip
    with pytest.raises(ModelError, match=r"^output 'y' is a sequence, not a tensor or a ZipMap.*fix: re-export"):
        load_model(seq_out)
