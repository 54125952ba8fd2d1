"""Convolutional zoo models: tiny-cnn (random weights), resnet50 and mobilenetv2 (random convolutions
with BatchNormalization statistics and a head fitted to real photographs, see :mod:`autodeploy.zoo.photos`).

Batch normalization stays as separate ``BatchNormalization`` nodes after each bias-free Conv, the
way a training framework exports it, so that our fusion passes have something to fold.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from autodeploy.zoo._graph import Graph, float_tensor

if TYPE_CHECKING:
    import onnx

NUM_CLASSES_IMAGENET = 1000


def conv_bn(
    g: Graph,
    x: str,
    c_in: int,
    c_out: int,
    k: int,
    stride: int = 1,
    group: int = 1,
    act: str | None = "relu",
    gamma: tuple[float, float] = (0.9, 1.1),
    random_stats: bool = False,
) -> str:
    """Conv (He init, no bias) -> BatchNormalization -> optional Relu / ReLU6.

    ``gamma`` is the range of the BN scale; the last BN of a residual branch uses a small one so
    the variance added per block stays small and deep networks do not blow up.
    ``random_stats`` gives BN a non-trivial running mean/variance, which makes folding visible.
    """
    name = g.unique("conv")
    fan_in = c_in // group * k * k
    w = g.normal(f"{name}.weight", (c_out, c_in // group, k, k), std=np.sqrt(2.0 / fan_in))
    y = g.op(
        "Conv", x, w, name=name, kernel_shape=[k, k], strides=[stride, stride], pads=[k // 2] * 4, group=group
    )
    bn = f"{name}.bn"
    scale = g.uniform(f"{bn}.scale", (c_out,), *gamma)
    bias = g.normal(f"{bn}.bias", (c_out,), std=0.02)
    if random_stats:
        mean = g.normal(f"{bn}.mean", (c_out,), std=0.1)
        var = g.uniform(f"{bn}.var", (c_out,), 0.5, 1.5)
    else:
        mean = g.weight(f"{bn}.mean", np.zeros(c_out, np.float32))
        var = g.weight(f"{bn}.var", np.ones(c_out, np.float32))
    y = g.op("BatchNormalization", y, scale, bias, mean, var, name=bn, epsilon=1e-5)
    if act == "relu":
        return g.op("Relu", y)
    if act == "relu6":
        # Clip with min/max as inputs (opset >= 11), the form PyTorch exports for ReLU6.
        return g.op("Clip", y, g.scalar(0.0), g.scalar(6.0))
    return y


def classifier_head(g: Graph, x: str, channels: int, classes: int) -> str:
    """GlobalAveragePool -> Flatten -> Gemm named ``logits``."""
    pooled = g.op("Flatten", g.op("GlobalAveragePool", x), axis=1)
    return g.gemm(pooled, channels, classes, name="logits")


def image_model(g: Graph, size: int, classes: int, doc: str) -> onnx.ModelProto:
    model = g.model(
        [float_tensor("input", ["N", 3, size, size])], [float_tensor("logits", ["N", classes])], doc=doc
    )
    return center_logits(model, size)


def fitted_model(g: Graph, doc: str, **fit: float) -> onnx.ModelProto:
    """A 224x224 ImageNet-shaped classifier whose BatchNormalization statistics and head are fitted to
    real photographs (:func:`autodeploy.zoo.photos.fit`), so its logits have a trained model's margins."""
    from autodeploy.zoo import photos

    model = g.model([float_tensor("input", ["N", 3, 224, 224])],
                    [float_tensor("logits", ["N", NUM_CLASSES_IMAGENET])], doc=doc)  # fmt: skip
    return photos.fit(model, **fit)  # type: ignore[arg-type]


def center_logits(model: onnx.ModelProto, size: int) -> onnx.ModelProto:
    """Shifts the head bias so the mean logits over a fixed random batch are zero.

    A deep network with random weights maps every input to nearly the same logits: the
    input-independent part (positive ReLU means pooled by GAP) dwarfs the rest, so argmax would be
    one class for all inputs and top-1 agreement would be meaningless. A trained head's bias cancels
    that common part; subtracting the mean logits does the same here.
    """
    from onnx import numpy_helper

    from autodeploy.runtime.onnxruntime import session as ort_session

    # one thread: the same summation order, the same bytes, every build
    session = ort_session(model.SerializeToString(), {"intra_op_num_threads": 1})
    batch = np.random.default_rng(0).standard_normal((8, 3, size, size), dtype=np.float32)
    mean_logits = session.run(None, {"input": batch})[0].mean(axis=0)
    bias = next(t for t in model.graph.initializer if t.name == "logits.bias")
    bias.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(bias) - mean_logits, bias.name))
    return model


def tiny_cnn() -> onnx.ModelProto:
    """[N,3,32,32] -> Conv-BN-Relu, one residual block, MaxPool, Conv-BN-Relu, head -> [N,10]."""
    g = Graph("tiny-cnn", seed=1)
    x = conv_bn(g, "input", 3, 16, 3, random_stats=True)
    branch = conv_bn(g, x, 16, 16, 3, random_stats=True)
    branch = conv_bn(g, branch, 16, 16, 3, act=None, gamma=(0.2, 0.5), random_stats=True)
    x = g.op("Relu", g.op("Add", x, branch))
    x = g.op("MaxPool", x, kernel_shape=[2, 2], strides=[2, 2])
    x = conv_bn(g, x, 16, 32, 3, stride=2, random_stats=True)
    classifier_head(g, x, 32, 10)
    return image_model(g, 32, 10, "tiny CNN: Conv-BN-Relu, residual Add, MaxPool, GAP, Gemm")


def bottleneck(g: Graph, x: str, c_in: int, width: int, stride: int) -> str:
    """ResNet v1.5 bottleneck: 1x1 -> 3x3 (carries the stride) -> 1x1 x4, plus identity or projection."""
    c_out = width * 4
    y = conv_bn(g, x, c_in, width, 1)
    y = conv_bn(g, y, width, width, 3, stride=stride)
    y = conv_bn(g, y, width, c_out, 1, act=None, gamma=(0.2, 0.5))
    if stride != 1 or c_in != c_out:
        x = conv_bn(g, x, c_in, c_out, 1, stride=stride, act=None)
    return g.op("Relu", g.op("Add", x, y))


def resnet50() -> onnx.ModelProto:
    """ResNet-50 (v1.5): stem, bottleneck stages of 3, 4, 6, 3 blocks, GAP, Gemm to 1000 classes."""
    g = Graph("resnet50", seed=50)
    x = conv_bn(g, "input", 3, 64, 7, stride=2)
    x = g.op("MaxPool", x, kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    c_in = 64
    for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for i in range(blocks):
            x = bottleneck(g, x, c_in, width, stride if i == 0 else 1)
            c_in = width * 4
    classifier_head(g, x, c_in, NUM_CLASSES_IMAGENET)
    return fitted_model(g, "ResNet-50 v1.5 topology, BN statistics and head fitted to sklearn's sample photos")


def inverted_residual(g: Graph, x: str, c_in: int, c_out: int, expand: int, stride: int) -> str:
    """MobileNetV2 block: expand 1x1 -> depthwise 3x3 -> linear project 1x1, residual where shapes match."""
    hidden = c_in * expand
    y = conv_bn(g, x, c_in, hidden, 1, act="relu6") if expand != 1 else x
    y = conv_bn(g, y, hidden, hidden, 3, stride=stride, group=hidden, act="relu6")
    if stride == 1 and c_in == c_out:
        y = conv_bn(g, y, hidden, c_out, 1, act=None, gamma=(0.2, 0.5))
        return g.op("Add", x, y)
    return conv_bn(g, y, hidden, c_out, 1, act=None)


# (expand ratio t, output channels c, repeats n, first stride s), width multiplier 1.0.
MOBILENETV2_STAGES = (
    (1, 16, 1, 1),
    (6, 24, 2, 2),
    (6, 32, 3, 2),
    (6, 64, 4, 2),
    (6, 96, 3, 1),
    (6, 160, 3, 2),
    (6, 320, 1, 1),
)


def mobilenetv2() -> onnx.ModelProto:
    """MobileNetV2 (width 1.0): inverted residuals with ReLU6 as Clip(0, 6), 1000 classes."""
    g = Graph("mobilenetv2", seed=2)
    x = conv_bn(g, "input", 3, 32, 3, stride=2, act="relu6")
    c_in = 32
    for t, c, n, s in MOBILENETV2_STAGES:
        for i in range(n):
            x = inverted_residual(g, x, c_in, c, t, s if i == 0 else 1)
            c_in = c
    x = conv_bn(g, x, c_in, 1280, 1, act="relu6")
    classifier_head(g, x, 1280, NUM_CLASSES_IMAGENET)
    # Its random features separate the photos' windows less well: more crops give it a trained model's
    # margins (16 crops with ridge 1.0 left a median top-1 margin of 1.3 logits and 87.5% task accuracy).
    doc = "MobileNetV2 topology (width 1.0), BN statistics and head fitted to sklearn's sample photos"
    return fitted_model(g, doc, per_class=64, ridge=0.1)
