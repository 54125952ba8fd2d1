"""A corpus of malformed and hostile ONNX inputs, generated in code (no file is checked in).

Each case is a path handed to ``autodeploy bench`` and the regular expression its one-line
error must match. Cases vary one thing each: how the bytes are broken (truncated, foreign
magic, protobuf garbage), what the graph claims (opsets, dangling or cyclic edges, absurd
shapes), where its external data points, what its weights hold, or what the path itself is.
Most are refused at intake without starting a worker; the few that reach the harness are
listed in :data:`REACHES_HARNESS`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tests.models import mlp, with_external_data

UNREADABLE = "not a readable ONNX model|holds no ONNX graph"
CHECKER = "fails the ONNX checker"
OUTSIDE = "outside the model's folder"


@dataclass(frozen=True)
class Case:
    path: Path
    expected: str  # regular expression the error line must match


# -- building blocks -------------------------------------------------------------------------


def _save(model: onnx.ModelProto, path: Path) -> Path:
    """Serialize without the checker: the point is to write what the checker would refuse."""
    path.write_bytes(model.SerializeToString())
    return path


def _model(
    nodes: list[onnx.NodeProto],
    inputs: list[onnx.ValueInfoProto] | None = None,
    outputs: list[onnx.ValueInfoProto] | None = None,
    initializers: list[onnx.TensorProto] | None = None,
    *,
    opset: int | None = 17,
    domain: str = "",
    ir_version: int = 8,
) -> onnx.ModelProto:
    inputs = inputs if inputs is not None else [_vi("x", [1, 4])]
    outputs = outputs if outputs is not None else [_vi("y", [1, 4])]
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializers or [])
    opsets = [] if opset is None else [helper.make_opsetid(domain, opset)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = ir_version
    return model


def _vi(name: str, shape: list[int | str], elem: int = TensorProto.FLOAT) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def _relu(src: str = "x", dst: str = "y", op: str = "Relu", **attrs: object) -> onnx.NodeProto:
    return helper.make_node(op, [src], [dst], **attrs)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _mlp_weights(path: Path, weights: Callable[[np.ndarray], np.ndarray]) -> Path:
    """The test MLP with its first weight matrix replaced by ``weights(w1)``."""
    mlp(path)
    model = onnx.load(str(path))
    w1 = model.graph.initializer[0]
    w1.CopyFrom(numpy_helper.from_array(weights(numpy_helper.to_array(w1)).astype(np.float32), w1.name))
    return _save(model, path)


# -- the corpus ------------------------------------------------------------------------------


def build(root: Path) -> dict[str, Case]:
    """Write every case under ``root`` (one folder per case) and return them by name."""
    cases: dict[str, Case] = {}

    def folder(name: str) -> Path:
        d = root / name
        d.mkdir(parents=True)
        return d

    def add(
        name: str, expected: str, make: Callable[[Path], Path | None], filename: str = "model.onnx"
    ) -> None:
        d = folder(name)
        path = make(d / filename) or d / filename
        cases[name] = Case(path, expected)

    good = mlp(root / "good.onnx").read_bytes()

    # Bytes: empty, truncated at many offsets, foreign formats, random noise, protobuf garbage.
    add("zero-bytes", UNREADABLE, lambda p: p.write_bytes(b"") and None)
    n = len(good)
    for cut in sorted({1, 2, 3, 5, 8, 16, 33, 64, n // 8, n // 4, n // 3, n // 2, 2 * n // 3, n - 40, n - 9,
                       n - 3, n - 1}):  # fmt: skip
        add(
            f"truncated-{cut}-of-{n}",
            f"{UNREADABLE}|{CHECKER}",
            lambda p, c=cut: p.write_bytes(good[:c]) and None,
        )
    foreign = {
        "magic-png": b"\x89PNG\r\n\x1a\n" + bytes(64),
        "magic-zip-torch": b"PK\x03\x04" + b"\x14\x00" * 20 + b"archive/data.pkl",
        "magic-gzip": b"\x1f\x8b\x08\x00" + bytes(40),
        "magic-elf": b"\x7fELF\x02\x01\x01" + bytes(57),
        "magic-pickle": b"\x80\x04\x95" + bytes(8) + b"cos\nsystem\n.",
        "text-json": b'{"graph": {"node": []}}',
        "text-utf16-bom": "\ufeffir_version: 8".encode("utf-16"),
        "onnx-text-format": b"<ir_version: 8, opset_import: [\"\" : 17]>\nagraph (float[N] x) => (float[N] y) {\n y = Relu(x)\n}\n",
    }  # fmt: skip
    for name, data in foreign.items():
        add(name, UNREADABLE, lambda p, d=data: p.write_bytes(d) and None)
    # A TFLite flatbuffer or an OpenVINO IR is run as given (tests/realmodels/test_formats.py); a broken one is
    # named as what it looks like, read by its engine in a child process (LiteRT crashes on some).
    add("magic-tflite", "looks like a TFLite flatbuffer, but LiteRT's interpreter cannot read it",
        lambda p: p.write_bytes(bytes(4) + b"TFL3" + bytes(56)) and None)
    add("magic-openvino-ir", "looks like an OpenVINO IR, but OpenVINO's read_model cannot read it",
        lambda p: (p.write_bytes(b'<?xml version="1.0"?>\n<net name="x" version="11"><layers>'),
                   p.with_suffix(".bin").write_bytes(b"")) and None)
    add("magic-openvino-ir-no-weights", "OpenVINO IR .* has no weights file model.bin beside it",
        lambda p: p.write_bytes(b'<?xml version="1.0"?>\n<net name="x" version="11"></net>') and None)
    rng = np.random.default_rng(9)
    for size in (1, 7, 100, 4096):
        add(
            f"random-{size}-bytes",
            f"{UNREADABLE}|{CHECKER}",
            lambda p, s=size: p.write_bytes(rng.bytes(s)) and None,
        )
    garbage = {
        # graph (field 7, length-delimited) claiming 2**62 bytes that are not there
        "pb-length-overflow": b"\x08\x08" + b"\x3a" + _varint(2**62) + b"\x00" * 8,
        # graph field sent as a varint instead of a message (wrong wire type)
        "pb-wrong-wire-type": b"\x08\x08\x38\x01",
        # an end-group tag with no start group
        "pb-stray-end-group": b"\x08\x08\x0c",
        # a graph nested in itself far past protobuf's recursion limit (node.attribute.g.node...)
        "pb-nesting-bomb": _nesting_bomb(200),
        # only the IR version, no graph
        "pb-ir-version-only": b"\x08\x08",
        # field number 0 is invalid in protobuf
        "pb-field-zero": b"\x00\x01\x02\x03",
    }
    for name, data in garbage.items():
        add(name, f"{UNREADABLE}|{CHECKER}", lambda p, d=data: p.write_bytes(d) and None)

    # Opsets and versions.
    add("opset-0", CHECKER, lambda p: _save(_model([_relu()], opset=0), p))
    add("opset-999", "[Oo]pset 999", lambda p: _save(_model([_relu()], opset=999), p))
    add("opset-missing", CHECKER, lambda p: _save(_model([_relu()], opset=None), p))
    add(
        "unknown-domain",
        CHECKER,
        lambda p: _save(_model([helper.make_node("Evil", ["x"], ["y"], domain="com.evil")]), p),
    )
    add("unknown-op", CHECKER, lambda p: _save(_model([_relu(op="NotAnOp")]), p))
    add("ir-version-999", CHECKER, lambda p: _save(_model([_relu()], ir_version=999), p))
    add("bad-attribute", CHECKER, lambda p: _save(_model([_relu(op="Softmax", axis="not an int")]), p))

    # Graph structure.
    add("missing-input", CHECKER, lambda p: _save(_model([_relu("nowhere")]), p))
    add("cycle", CHECKER, lambda p: _save(_model([helper.make_node("Add", ["x", "b"], ["a"]), _relu("a", "b"),
                                                  _relu("b", "y", op="Identity")]), p))  # fmt: skip
    add("self-loop", CHECKER, lambda p: _save(_model([helper.make_node("Add", ["x", "y"], ["y"])]), p))
    add(
        "duplicate-output",
        CHECKER,
        lambda p: _save(_model([_relu("x", "y"), _relu("x", "y", op="Sigmoid")]), p),
    )
    add("output-never-made", CHECKER, lambda p: _save(_model([_relu("x", "z")]), p))
    add("empty-graph", UNREADABLE, lambda p: _save(_model([], inputs=[], outputs=[]), p))
    add(
        "duplicate-input",
        CHECKER,
        lambda p: _save(_model([_relu()], inputs=[_vi("x", [1, 4]), _vi("x", [1, 4])]), p),
    )
    add("subgraph-cycle", CHECKER, lambda p: _save(_if_with_cyclic_branch(), p))
    add("non-tensor-input", "not a tensor|" + CHECKER, lambda p: _save(_model(
        [helper.make_node("SequenceLength", ["x"], ["y"])],
        inputs=[helper.make_tensor_sequence_value_info("x", TensorProto.FLOAT, [4])],
        outputs=[_vi("y", [], TensorProto.INT64)]), p))  # fmt: skip
    add(
        "undefined-dtype",
        "element type 0, not an ONNX tensor type",
        lambda p: _save(_model([_relu()], inputs=[_vi("x", [1, 4], 0)]), p),
    )
    add(
        "unknown-dtype-999",
        "element type 999, not an ONNX tensor type",
        lambda p: _save(_model([_relu()], inputs=[_vi("x", [1, 4], 999)]), p),
    )
    add("no-outputs", "has no outputs", lambda p: _save(_model([_relu()], outputs=[]), p))
    add("no-inputs", "has no inputs", lambda p: _save(_model(
        [helper.make_node("Constant", [], ["y"], value=numpy_helper.from_array(np.ones((1, 4), np.float32)))],
        inputs=[]), p))  # fmt: skip

    # Absurd shapes: declared, and initializers that claim more than they hold.
    too_big = "more than half of this machine's memory"
    for name, shape, expected in [("batch-dim-2pow62", [2**62, 4], "static batch dim 4611686018427387904"),
                                  ("dim-2pow62", [1, 2**62], too_big),
                                  ("dims-huge-product", [1, 2**20, 2**20, 2**10], too_big),
                                  ("rank-9-dim-2pow40", [1] * 8 + [2**40], too_big),
                                  ("dim-negative", [1, -5], "dynamic dim . at axis 1")]:  # fmt: skip
        add(f"shape-{name}", expected,
            lambda p, s=shape: _save(_model([_relu()], inputs=[_vi("x", s)], outputs=[_vi("y", s)]), p))  # fmt: skip
    add("initializer-claims-2pow62", CHECKER, lambda p: _save(_model(
        [helper.make_node("Add", ["x", "w"], ["y"])],
        initializers=[_raw_tensor("w", [2**31, 2**31], b"\x00" * 16)]), p))  # fmt: skip
    add("initializer-size-mismatch", CHECKER, lambda p: _save(_model(
        [helper.make_node("Add", ["x", "w"], ["y"])], initializers=[_raw_tensor("w", [1, 4], b"\x00" * 3)]), p))  # fmt: skip

    # External data: outside the folder, missing, malformed.
    for name, location in {"ext-dotdot": "../weights.bin", "ext-absolute": "/etc/passwd",
                           "ext-nested-dotdot": "sub/../../weights.bin", "ext-empty-location": ""}.items():  # fmt: skip
        add(name, OUTSIDE, lambda p, loc=location: _external(p, loc))
    add("ext-missing-file", "is missing", lambda p: _external(p, "weights.bin", remove=True))
    add("ext-symlink-out", OUTSIDE, lambda p: _external(p, "link.bin", link_to=Path("/etc/hostname")))
    add(
        "ext-location-is-dir",
        "is missing|" + OUTSIDE + "|" + CHECKER,
        lambda p: _external(p, "adir", make_dir=True),
    )
    add("ext-offset-past-end", "out of bounds", lambda p: _external(p, "weights.bin", offset=10**9))

    # What the path is.
    add("path-is-directory", "not a file", lambda p: p.mkdir() and None)
    add("path-is-fifo", "not a file", lambda p: os.mkfifo(p))
    add("path-is-dev-zero", "not a file", lambda p: p.symlink_to("/dev/zero"))
    add("path-symlink-loop", "not found|not a file", lambda p: p.symlink_to(p))
    add("path-missing", "not found", lambda p: None)
    add(
        "path-rich-markup",
        re.escape("[bold red]boom[red]"),
        lambda p: p.write_bytes(b"junk") and None,
        filename="[bold red]boom[red].onnx",
    )
    non_utf8 = os.fsdecode(b"m\xff\xfe.onnx")
    add("path-non-utf8", "is not valid UTF-8", lambda p: p.write_bytes(b"junk") and None, filename=non_utf8)
    add("path-non-utf8-valid-model", "is not valid UTF-8", lambda p: mlp(p), filename=non_utf8)

    # Names that are not text, and weights that are not numbers.
    add("non-utf8-tensor-name", f"{UNREADABLE}|{CHECKER}|UTF-8", lambda p: _non_utf8_names(p))
    add(
        "nan-weights",
        "reference could not run: output.* 'logits' hold NaN or inf",
        lambda p: _mlp_weights(p, lambda w: w * np.nan),
    )
    add(
        "inf-weights",
        "reference could not run: output.* 'logits' hold NaN or inf",
        lambda p: _mlp_weights(p, lambda w: w * np.inf),
    )
    return cases


#: Cases that pass intake and run in a worker (a few seconds each): keep this list short.
REACHES_HARNESS = ("nan-weights", "inf-weights", "opset-999", "ext-offset-past-end")


def _raw_tensor(name: str, dims: list[int], raw: bytes) -> onnx.TensorProto:
    t = onnx.TensorProto()
    t.name, t.data_type = name, TensorProto.FLOAT
    t.dims.extend(dims)
    t.raw_data = raw
    return t


def _nesting_bomb(depth: int) -> bytes:
    """ModelProto.graph -> node -> attribute(g) -> node -> ... ``depth`` levels deep."""
    inner = b""
    for _ in range(depth):
        graph = b"\x0a" + _varint(len(inner)) + inner if inner else b""  # GraphProto.node (1)
        attribute = b"\x0a\x01g" + b"\x32" + _varint(len(graph)) + graph  # AttributeProto.name, .g (6)
        inner = b"\x2a" + _varint(len(attribute)) + attribute  # NodeProto.attribute (5)
    return b"\x08\x08\x3a" + _varint(len(inner) + 2) + b"\x0a" + _varint(len(inner)) + inner


def _if_with_cyclic_branch() -> onnx.ModelProto:
    branch = helper.make_graph(
        [helper.make_node("Add", ["x", "b"], ["a"]), helper.make_node("Relu", ["a"], ["b"])],
        "cyclic", [], [_vi("b", [1, 4])],
    )  # fmt: skip
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["c"])], "plain", [], [_vi("c", [1, 4])])
    cond = numpy_helper.from_array(np.array(True), "cond")
    node = helper.make_node("If", ["cond"], ["y"], then_branch=branch, else_branch=other)
    return _model([node], initializers=[cond])


def _external(
    path: Path,
    location: str,
    *,
    remove: bool = False,
    link_to: Path | None = None,
    make_dir: bool = False,
    offset: int | None = None,
) -> Path:
    with_external_data(path, location)
    weights = path.parent / "weights.bin"
    if location not in ("weights.bin", ""):
        weights.unlink()  # only the hostile location is referenced
    if remove:
        weights.unlink()
    if link_to is not None:
        (path.parent / location).symlink_to(link_to)
    if make_dir:
        (path.parent / location).mkdir()
    if offset is not None:
        model = onnx.load(str(path), load_external_data=False)
        for tensor in model.graph.initializer:
            tensor.external_data.add(key="offset", value=str(offset))
        _save(model, path)
    return path


def _non_utf8_names(path: Path) -> Path:
    """A model whose tensor name holds bytes that are not UTF-8 (patched in the serialized form)."""
    model = _model([_relu("x", "y")], inputs=[_vi("x", [1, 4])])
    model.graph.input[0].name = "x" * 8
    model.graph.node[0].input[0] = "x" * 8
    data = model.SerializeToString().replace(b"x" * 8, b"\xff\xfe\x80name")
    path.write_bytes(data)
    return path
