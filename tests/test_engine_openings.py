"""Every engine session in ``src/autodeploy`` is opened through ``autodeploy/runtime/`` (issue 29).

``runtime/`` is what a bundle ships verbatim, so what is measured is what is shipped; a session opened
anywhere else (the quantizer's calibration or judge, a zoo builder, a layout probe) would be a second,
unreviewed way of setting threads, optimization levels or compile properties. The runtime functions
they call instead: ``runtime/onnxruntime.py`` ``session``, ``runtime/openvino.py`` ``read`` and
``compile_at``, ``runtime/tflite.py`` ``interpreter``.

Not openings, so not checked: building or converting, which is the adapters' job (``ov.convert_model``
and ``ov.save_model`` in ``adapters/openvino.py``, ``trt.Builder`` in ``adapters/tensorrt.py``,
``onnxruntime.quantization`` in ``adapters/ort.py``, onnx2tf in ``adapters/tflite.py``), and asking an
engine what it offers (``get_available_providers``).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "autodeploy"
RUNTIME = SRC / "runtime"

#: What opens or compiles an engine session: ONNX Runtime, OpenVINO, LiteRT, TensorRT.
OPENERS = frozenset({
    "InferenceSession", "SessionOptions",  # onnxruntime
    "Core", "compile_model", "read_model", "AsyncInferQueue",  # openvino
    "Interpreter",  # ai_edge_litert / tflite
    "deserialize_cuda_engine",  # tensorrt (trt.Runtime(...).deserialize_cuda_engine)
})  # fmt: skip
#: A code string run in a child process (``python -c``) that opens an engine by hand.
CODE_STRING = re.compile(rf"\b(?:{'|'.join(sorted(OPENERS))})\s*\(")

#: Files outside ``runtime/`` allowed to open an engine, each with why. None today: keep it that way,
#: or say here why a file cannot go through the runtime.
EXCEPTIONS: dict[str, str] = {}


def openings(path: Path) -> list[str]:
    """``file:line name`` for each use of an opener in ``path``: a name, an attribute, an import, or a
    code string that calls one."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Name):
            names = [node.id]
        elif isinstance(node, ast.Attribute):
            names = [node.attr]
        elif isinstance(node, ast.ImportFrom):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names = [m.group(0).rstrip("( ") for m in CODE_STRING.finditer(node.value)]
        shown = path.relative_to(SRC) if SRC in path.parents else path.name
        found += [f"{shown}:{node.lineno} {name}" for name in names if name in OPENERS]
    return found


def test_no_engine_is_opened_outside_the_runtime():
    outside = [p for p in sorted(SRC.rglob("*.py")) if RUNTIME not in p.parents]
    found = [hit for p in outside if p.relative_to(SRC).as_posix() not in EXCEPTIONS for hit in openings(p)]
    assert not found, (
        "engine sessions opened outside autodeploy/runtime/ (call runtime/onnxruntime.py session, "
        "runtime/openvino.py read/compile_at or runtime/tflite.py interpreter instead):\n" + "\n".join(found)
    )


def test_the_check_sees_the_runtimes_own_openings():
    """The scan is not blind: inside ``runtime/`` it finds every engine's opener."""
    seen = {hit.split()[-1] for p in sorted(RUNTIME.glob("*.py")) for hit in openings(p)}
    assert {"InferenceSession", "SessionOptions", "Core", "compile_model", "read_model", "Interpreter",
            "deserialize_cuda_engine"} <= seen  # fmt: skip


def test_the_check_sees_a_code_string(tmp_path):
    """``model.py`` once loaded a model in a child with ``python -c "...ort.InferenceSession(...)"``."""
    sample = tmp_path / "sample.py"
    sample.write_text('CODE = "import sys, onnxruntime as ort\\nort.InferenceSession(sys.argv[1])"\n')
    assert openings(sample) == ["sample.py:1 InferenceSession"]


def test_every_exception_still_exists_and_says_why():
    for name, why in EXCEPTIONS.items():
        assert (SRC / name).is_file() and openings(SRC / name) and why.strip(), name
