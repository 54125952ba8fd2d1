"""External data in a subfolder (issue 28): legitimate ONNX (``location="d/w.bin"``) must work end
to end, and no folder on the way to it may be a link, at intake or later (a folder swapped for a
link between intake and build won the race 1 time in 300 and copied an outside file into the
artifact: ``O_NOFOLLOW`` guards only the last component). Deterministic: no race is needed, since
every component is opened from its parent's descriptor without following links."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from autodeploy.adapters import registry
from autodeploy.adapters.base import TrialConfig
from autodeploy.device import probe_device
from autodeploy.errors import ModelError
from autodeploy.harness.run import HarnessSettings, prepare_data, reference, run_trial
from autodeploy.model import load_model

WEIGHTS = np.arange(16, dtype=np.float32).reshape(4, 4)


def _save(folder, location: str) -> None:
    """A MatMul whose weights are external data at ``location`` (relative to ``folder``)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
                              [numpy_helper.from_array(WEIGHTS, "w")])  # fmt: skip
    (folder / location).parent.mkdir(parents=True, exist_ok=True)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(proto, str(folder / "m.onnx"), save_as_external_data=True, location=location, size_threshold=0)


def test_external_data_in_a_subfolder_is_referenced_measured_and_copied(tmp_path):
    _save(tmp_path / "model", "d/w.bin")
    model = load_model(tmp_path / "model" / "m.onnx")
    assert model.external_files == ("d/w.bin",)
    settings = HarnessSettings(workdir=tmp_path / "work", timeout_s=120)
    data = prepare_data(model, settings)
    outputs = np.load(reference(model, data, settings))["y"]
    inputs = np.load(data.evaluation_path)["input:x"]
    np.testing.assert_allclose(outputs, inputs @ WEIGHTS, rtol=1e-5, atol=1e-4)
    result = run_trial(model, TrialConfig("onnxruntime"), data, settings)
    assert result.ok, result.failure_message
    copied = list((tmp_path / "work" / "artifacts").glob("*/d/w.bin"))
    assert copied and all(c.read_bytes() == (tmp_path / "model" / "d" / "w.bin").read_bytes() for c in copied)


@pytest.mark.parametrize("where", ["outside", "inside"])
def test_a_linked_folder_on_the_way_to_external_data_is_refused_at_intake(tmp_path, where):
    _save(tmp_path / "model", "d/w.bin")
    real = tmp_path / "elsewhere" if where == "outside" else tmp_path / "model" / "real"
    shutil.move(tmp_path / "model" / "d", real)
    (tmp_path / "model" / "d").symlink_to(real, target_is_directory=True)
    with pytest.raises(ModelError, match="outside the model's folder" if where == "outside" else "d is a link"):
        load_model(tmp_path / "model" / "m.onnx")


@pytest.mark.parametrize("where", ["outside", "inside"])
def test_a_folder_swapped_for_a_link_after_intake_never_reaches_the_artifact(tmp_path, where):
    """Same bytes behind the link, so the hash alone cannot tell: the component walk refuses the link."""
    _save(tmp_path / "model", "d/w.bin")
    model = load_model(tmp_path / "model" / "m.onnx")
    real = tmp_path / "secret" if where == "outside" else tmp_path / "model" / "real"
    shutil.move(tmp_path / "model" / "d", real)
    (tmp_path / "model" / "d").symlink_to(real, target_is_directory=True)
    with pytest.raises(ModelError, match=r"cannot read external data 'd/w.bin' .*: d is a link; fix: .*not links"):
        registry.get("onnxruntime").build(
            model, TrialConfig("onnxruntime"), None, tmp_path / "artifacts", target=probe_device()
        )
    assert not list(tmp_path.glob("artifacts/**/w.bin"))
