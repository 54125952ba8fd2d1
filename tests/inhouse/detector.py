"""A YOLOv8-shaped detector head in a few nodes, whose class channels int8 breaks (issue 41's test case).

``x[N, 3, 16, 16]`` -> trunk Conv + Relu -> a box branch (Conv, 16 box logits ranging over +-40) and a class
branch (Conv, 3 class logits around -6), concatenated per anchor as YOLOv8 does (``Concat`` on channels,
``Reshape`` to ``[N, 19, 256]``, ``Split`` back): one int8 scale for both ranges rounds the class logits by
about 0.3. The box logits go through a 1x1 "DFL" Conv (a weighted op after the Concat, as in YOLOv8, so ONNX
Runtime's structural head rule does not cover it), the class logits through a Sigmoid; the output concatenates
4 box values (pixels, 0-320) and 3 class probabilities (0.002-0.05): ``y[N, 7, 256]``, judged per channel group.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

#: The output's class channels: what int8 breaks and the mixed config must bring back.
CLASS_CHANNELS = (4, 5, 6)
#: The head of the class channels (the nodes only they need, or that their channels pass through with the box's).
CLASS_HEAD = ("cls_conv", "concat_k", "reshape_k", "split", "sigmoid", "concat_out")
TRUNK = "trunk_conv"
#: How much larger the trunk's first channel is than the others.
OUTLIER = 30.0


def detector(path: Path | None = None, seed: int = 0, outlier: bool = False) -> onnx.ModelProto:
    """The detector; ``outlier``: its trunk's first channel is :data:`OUTLIER` times larger than the others
    and read by the box branch alone, so one per-tensor int8 scale on the trunk's output rounds the class
    branch's inputs away (what breaks NNCF's int8 here; without it, NNCF's int8 passes)."""
    rng = np.random.default_rng(seed)

    def const(name: str, value: np.ndarray) -> onnx.TensorProto:
        return numpy_helper.from_array(np.asarray(value, np.float32), name)

    w_trunk = rng.standard_normal((8, 3, 3, 3)) * 0.4
    w_cls = rng.standard_normal((3, 8, 1, 1)) * 0.4
    w_box = rng.standard_normal((16, 8, 1, 1)) * 20.0
    if outlier:  # one trunk channel 30x the others': the box branch reads it alone
        w_trunk[0] = np.abs(w_trunk[0]) * OUTLIER
        w_cls[:, 0] = 0.0
        w_box = np.pad(rng.standard_normal((16, 1, 1, 1)), ((0, 0), (0, 7), (0, 0), (0, 0)))
    inits = [
        const("w_trunk", w_trunk), const("b_trunk", rng.standard_normal(8) * 0.1),
        const("w_box", w_box),
        const("b_box", rng.standard_normal(16)),
        const("w_cls", w_cls), const("b_cls", np.full(3, -6.0)),
        const("w_dfl", np.abs(rng.standard_normal((4, 16, 1, 1))) * 0.5), const("b_dfl", np.full(4, 160.0)),
    ]  # fmt: skip
    shape = numpy_helper.from_array(np.array([0, 19, -1], np.int64), "flat")
    split = numpy_helper.from_array(np.array([16, 3], np.int64), "sizes")
    box4 = numpy_helper.from_array(np.array([0, 16, 256, 1], np.int64), "as_map")
    back = numpy_helper.from_array(np.array([0, 4, 256], np.int64), "boxes_flat")
    nodes = [
        helper.make_node("Conv", ["x", "w_trunk", "b_trunk"], ["t"], "trunk_conv", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["t"], ["tr"], "trunk_relu"),
        helper.make_node("Conv", ["tr", "w_box", "b_box"], ["box"], "box_conv"),
        helper.make_node("Conv", ["tr", "w_cls", "b_cls"], ["cls"], "cls_conv"),
        helper.make_node("Concat", ["box", "cls"], ["bc"], "concat_k", axis=1),
        helper.make_node("Reshape", ["bc", "flat"], ["bcf"], "reshape_k"),
        helper.make_node("Split", ["bcf", "sizes"], ["box_f", "cls_f"], "split", axis=1),
        helper.make_node("Reshape", ["box_f", "as_map"], ["box_m"], "box_map"),
        helper.make_node("Conv", ["box_m", "w_dfl", "b_dfl"], ["dfl"], "dfl_conv"),
        helper.make_node("Reshape", ["dfl", "boxes_flat"], ["boxes"], "box_out"),
        helper.make_node("Sigmoid", ["cls_f"], ["probs"], "sigmoid"),
        helper.make_node("Concat", ["boxes", "probs"], ["y"], "concat_out", axis=1),
    ]
    graph = helper.make_graph(
        nodes, "detector",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 7, 256])],
        [*inits, shape, split, box4, back],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    if path is not None:
        onnx.save(model, str(path))
    return model


def images(n: int, seed: int = 1) -> np.ndarray:
    """Smooth random images in [0, 1] (what a detector sees is never white noise, nor unbounded)."""
    rng = np.random.default_rng(seed)
    coarse = rng.uniform(0.0, 1.0, (n, 3, 4, 4))
    fine = np.repeat(np.repeat(coarse, 4, axis=2), 4, axis=3) + rng.uniform(-0.05, 0.05, (n, 3, 16, 16))
    return np.clip(fine, 0.0, 1.0).astype(np.float32)
