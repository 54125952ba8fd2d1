"""The format table (``formats.py``): each format names its engine's runtime module, which reads the file
(``describe``), and the files it reads beside itself. Corrupt files end to end: ``tests/test_model.py``."""

from __future__ import annotations

import importlib
import json

import pytest

from autodeploy import formats
from autodeploy.errors import ModelError
from tests.models import mlp


def test_each_format_is_read_by_its_engines_runtime_module():
    for kind, fmt in formats.FORMATS.items():
        module = importlib.import_module(fmt.module)
        assert module.__name__.startswith("autodeploy.runtime.") and callable(module.describe), kind
        assert module.__name__.rpartition(".")[2] == fmt.engine, "the runtime of the engine that runs it as given"


def test_only_an_ir_reads_a_file_beside_it(tmp_path):
    xml, tflite = tmp_path / "m.xml", tmp_path / "m.tflite"
    xml.write_text("<net/>")
    tflite.write_bytes(b"")
    assert formats.files_beside(tflite, "tflite") == ()
    with pytest.raises(ModelError, match="has no weights file m.bin beside it"):
        formats.files_beside(xml, "openvino")
    xml.with_suffix(".bin").write_bytes(b"")
    assert formats.files_beside(xml, "openvino") == ("m.bin",)


def test_the_child_reads_an_ir_through_openvinos_runtime_and_checks_its_weights_first(tmp_path, capsys):
    ov = pytest.importorskip("openvino")
    xml = tmp_path / "ir" / "m.xml"
    xml.parent.mkdir()
    ov.save_model(ov.convert_model(str(mlp(tmp_path / "m.onnx"))), str(xml))
    assert formats.main(["openvino", str(xml)]) == 0
    described = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert described == {"inputs": [{"name": "x", "dtype": "float32", "shape": [None, 8]}],
                         "outputs": [{"name": "logits", "dtype": "float32", "shape": [None, 4]}]}  # fmt: skip
    xml.with_suffix(".bin").rename(tmp_path / "elsewhere.bin")
    assert formats.main(["openvino", str(xml)]) == 3  # the reader's reason, one line, for describe() to quote
    assert "has no weights file m.bin beside it" in capsys.readouterr().out
