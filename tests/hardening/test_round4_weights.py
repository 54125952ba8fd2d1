"""A model's weights (issue 37, partials): capped in size, copied only where there is room, and read
from one folder when the model is given through a link.

A 4 GiB sparse IR ``.bin`` took 86 s to hash and wrote a 4.3 GB dense copy into the cache; an IR
``.xml`` given through a link was taken in with the ``.bin`` beside the link and copied with the one
beside its target (a misleading external-data error). Sizes here are sparse files: nothing is written.
"""

from __future__ import annotations

import os
import shutil
from collections import namedtuple

import numpy as np
import pytest

from autodeploy import model as intake
from autodeploy.errors import ModelError, WriteError
from autodeploy.model import MAX_MODEL_BYTES, copy_unchanged, load_model
from tests.hardening.test_external_data import WEIGHTS, _save

IR = b'<?xml version="1.0"?>\n<net name="m" version="11">\n<layers></layers>\n</net>\n'


def _sparse(path, size: int) -> None:
    with open(path, "wb") as f:
        f.truncate(size)


def test_onnx_external_data_over_the_cap_is_refused_before_it_is_read(tmp_path):
    _save(tmp_path, "w.bin")
    os.truncate(tmp_path / "w.bin", MAX_MODEL_BYTES)  # the weights stay valid; the file grows, sparse
    with pytest.raises(
        ModelError, match=r"m\.onnx takes 4 GiB with its weights, more than the 4 GiB .*; fix: "
    ) as caught:
        load_model(tmp_path / "m.onnx")
    assert "\n" not in str(caught.value)


def test_an_ir_bin_over_the_cap_is_refused_before_any_engine_reads_it(tmp_path):
    """No OpenVINO needed: the cap is checked before the IR is described."""
    (tmp_path / "m.xml").write_bytes(IR)
    _sparse(tmp_path / "m.bin", MAX_MODEL_BYTES)
    with pytest.raises(
        ModelError, match=r"m\.xml takes 4 GiB with its weights, more than the 4 GiB"
    ) as caught:
        load_model(tmp_path / "m.xml")
    assert "\n" not in str(caught.value)


def test_weights_grown_after_intake_are_refused_before_the_copy(tmp_path, monkeypatch):
    monkeypatch.setattr(intake, "MAX_MODEL_BYTES", 1 << 20)  # the cap as the copy sees it, small
    _save(tmp_path / "model", "w.bin")
    info = load_model(tmp_path / "model" / "m.onnx")
    os.truncate(tmp_path / "model" / "w.bin", 2 << 20)
    (tmp_path / "artifact").mkdir()
    with pytest.raises(ModelError, match=r"takes 2 MiB with its weights, more than the 1 MiB"):
        copy_unchanged(info, tmp_path / "artifact", "model.onnx")
    assert not list((tmp_path / "artifact").iterdir()), "nothing is copied"


def test_no_copy_starts_without_room_for_it(tmp_path, monkeypatch):
    _save(tmp_path / "model", "w.bin")
    info = load_model(tmp_path / "model" / "m.onnx")
    (tmp_path / "artifact").mkdir()
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda _path: usage(1 << 30, (1 << 30) - 100, 100))
    with pytest.raises(
        WriteError, match=r"cannot copy m\.onnx and its weights \(.*\) into .*artifact: 100 B free"
    ):
        copy_unchanged(info, tmp_path / "artifact", "model.onnx")
    assert not list((tmp_path / "artifact").iterdir()), "nothing is copied"


def test_an_onnx_model_given_through_a_link_reads_its_external_data_beside_the_file(tmp_path):
    _save(tmp_path / "real", "w.bin")
    (tmp_path / "links").mkdir()
    (tmp_path / "links" / "alias.onnx").symlink_to(tmp_path / "real" / "m.onnx")
    info = load_model(tmp_path / "links" / "alias.onnx")
    assert info.path == tmp_path / "real" / "m.onnx" and info.name == "alias"
    assert info.sha256 == load_model(tmp_path / "real" / "m.onnx").sha256
    (tmp_path / "artifact").mkdir()
    copy_unchanged(info, tmp_path / "artifact", "model.onnx")
    assert (tmp_path / "artifact" / "w.bin").read_bytes() == (tmp_path / "real" / "w.bin").read_bytes()


def test_a_linked_model_with_other_data_beside_the_link_uses_the_data_beside_its_target(tmp_path):
    """The same name beside the link holds other weights: intake and copy must agree on one of them."""
    _save(tmp_path / "real", "w.bin")
    (tmp_path / "links").mkdir()
    (tmp_path / "links" / "m.onnx").symlink_to(tmp_path / "real" / "m.onnx")
    (tmp_path / "links" / "w.bin").write_bytes(np.zeros_like(WEIGHTS).tobytes())
    info = load_model(tmp_path / "links" / "m.onnx")
    (tmp_path / "artifact").mkdir()
    copy_unchanged(info, tmp_path / "artifact", "model.onnx")  # before: "changed since it was taken in"
    assert (tmp_path / "artifact" / "w.bin").read_bytes() == WEIGHTS.tobytes()


def test_an_ir_given_through_a_link_is_taken_with_the_bin_beside_its_target(tmp_path):
    ov = pytest.importorskip("openvino")
    from tests.models import mlp

    (tmp_path / "ir").mkdir()
    ov.save_model(ov.convert_model(str(mlp(tmp_path / "m.onnx"))), str(tmp_path / "ir" / "m.xml"))
    (tmp_path / "links").mkdir()
    (tmp_path / "links" / "alias.xml").symlink_to(tmp_path / "ir" / "m.xml")
    info = load_model(tmp_path / "links" / "alias.xml")
    assert info.external_files == ("m.bin",) and info.sha256 == load_model(tmp_path / "ir" / "m.xml").sha256
    (tmp_path / "artifact").mkdir()
    copy_unchanged(info, tmp_path / "artifact", info.path.name)
    assert (tmp_path / "artifact" / "m.bin").read_bytes() == (tmp_path / "ir" / "m.bin").read_bytes()
