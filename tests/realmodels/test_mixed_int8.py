"""Issue 41 on a real YOLOv8 (nudenet's ``320n.onnx``): the verdict's evidence, ``output0`` channels 4-21 (the 18
class probabilities beside 4 box values), traces back to the class branch alone.

The whole mixed search on nudenet takes minutes (one run of the model per layer to rank); its numbers come
from ``benchmarks/inhouse_int8.py --models nudenet`` (README, "In-house INT8 on the real-model corpus").
"""

from __future__ import annotations

import onnx
import pytest

from autodeploy.inhouse.quantize import qdq
from autodeploy.inhouse.quantize.evidence import Target, feeders, head, static_shapes
from tests.realmodels.corpus import MODELS

pytestmark = pytest.mark.slow

NUDENET = next(m for m in MODELS if m.name == "nudenet")


def test_nudenets_class_channels_trace_back_to_its_class_branch(photos, corpus_dir):
    path = NUDENET.extract(corpus_dir)
    if isinstance(path, str):
        pytest.skip(path)
    model = qdq.name_nodes(onnx.load(str(path)))
    shapes = static_shapes(model, NUDENET.make(photos, 1))
    assert shapes["output0"] == [1, 22, 2100]
    classes = Target("output0", 1, tuple(range(4, 22)))
    mine = head(model, [classes], shapes)
    convs = [n for n in mine if n.endswith("Conv")]
    # YOLOv8's cv3: three convolutions per stride (8, 16, 32) make the class logits; cv2 the box distributions
    assert len(convs) == 9 and all(n.startswith("/model.22/cv3.") for n in convs), convs
    # where class and box logits share a tensor (the per-stride Concat, the Split), and the Sigmoid
    assert {"/model.22/Concat", "/model.22/Concat_6", "/model.22/Split_1", "/model.22/Sigmoid", "/model.22/Concat_25"} <= set(mine)
    boxes = feeders(model, [Target("output0", 1, (0, 1, 2, 3))], shapes)
    assert not any(n.startswith("/model.22/cv3.") for n in boxes) and "/model.22/dfl/conv/Conv" in boxes
    trunk = feeders(model, [classes], shapes)
    assert trunk["/model.0/conv/Conv"] and "/model.0/conv/Conv" not in mine, "the backbone feeds both: not the head"
