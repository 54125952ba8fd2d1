"""The routes to ONNX as rows of one record (``converters.py``): the cache folder, the sealed record and the
``source`` each route writes, named as before the record existed (existing caches stay valid)."""

from __future__ import annotations

import json
from dataclasses import replace

from autodeploy import pytorch, tflite_onnx
from autodeploy.converters import ONNX_FILE, Converter

ROW = Converter("tflite", "tf2onnx", ("converter", "tf2onnx.convert.from_tflite"), "convert.json",
                lambda: {"tf2onnx": "1.16.1+local", "tensorflow": "2.17.0", "opset": 17})  # fmt: skip
SHA = "ab" * 32


def test_the_folder_is_named_by_the_files_sha256_and_the_tools_version(tmp_path):
    bound = ROW.bound(SHA)
    assert bound == {"source_sha256": SHA, "tf2onnx": "1.16.1+local", "tensorflow": "2.17.0", "opset": 17}
    name = f"{'ab' * 12}-tf2onnx1.16.1_local"  # the version's other characters made "_"
    assert ROW.folder(tmp_path, bound) == tmp_path / name
    assert replace(ROW, under="pytorch").folder(tmp_path, bound) == tmp_path / "pytorch" / name


def test_a_sealed_record_holds_only_the_onnx_it_names_for_the_versions_installed(tmp_path):
    bound = ROW.bound(SHA)
    assert not ROW.cached(tmp_path, bound)  # nothing yet
    (tmp_path / ONNX_FILE).write_bytes(b"onnx")
    ROW.seal(tmp_path, bound)
    assert list(json.loads((tmp_path / "convert.json").read_text())) == [*bound, "model_sha256", "digest"]
    assert ROW.cached(tmp_path, bound)
    assert not ROW.cached(tmp_path, {**bound, "tf2onnx": "1.17.0"})  # another converter: converted again
    (tmp_path / ONNX_FILE).write_bytes(b"planted")
    assert not ROW.cached(tmp_path, bound)


def test_the_source_names_the_route_its_versions_and_the_file():
    source = ROW.source(ROW.bound(SHA), "m.tflite", reference="program")
    assert source == {"framework": "tflite", "converter": "tf2onnx.convert.from_tflite", "tf2onnx": "1.16.1+local",
                      "tensorflow": "2.17.0", "opset": 17, "file": "m.tflite", "sha256": SHA, "reference": "program"}  # fmt: skip
    assert list(source)[:2] == ["framework", "converter"]


def test_each_route_is_a_row():
    tf2onnx, torch = tflite_onnx.TF2ONNX, pytorch.TORCH
    assert (tf2onnx.tool, tf2onnx.record, tf2onnx.under) == ("tf2onnx", "convert.json", "")
    assert (torch.tool, torch.record, torch.under, torch.how) == ("torch", "export.json", "pytorch",
                                                                  ("exporter", pytorch.EXPORTER))  # fmt: skip
