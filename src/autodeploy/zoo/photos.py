"""Real weights for the zoo's large classifiers, fitted to the photographs inside scikit-learn.

A deep network with random weights maps every input to nearly the same logits, so its top-1 is a
tie broken by noise and every reduced precision "fails". Two steps give ``zoo:resnet50`` and
``zoo:mobilenetv2`` the decision margins of a trained model, deterministically and in seconds:

1. **Data-dependent initialisation** (LSUV-style): each BatchNormalization's running mean and
   variance are set to its input's statistics on real image crops, so every layer's activations are
   centred and scaled on real data as in a trained network (a few passes, as each layer's statistics
   depend on the layers before it).
2. **A fitted head**: the classes are ``CLASSES`` windows of the two photographs; a ridge regression
   from the pooled features of jittered crops of each window to its class sets the first rows of the
   ``logits`` Gemm. The other classes are mixtures of those (like similar ImageNet classes), a margin
   lower, so the 1000 logits keep ImageNet's shape.

The evaluation and calibration data (:func:`dataset_arrays`) are fresh crops of the same windows,
preprocessed the ImageNet way, labelled with their window: task accuracy is measured on real pixels.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from autodeploy.images import Preprocess, resize, sample_photos
from autodeploy.zoo import IMAGENET as zoo_imagenet

if TYPE_CHECKING:
    import onnx

#: ImageNet preprocessing (torchvision's), in benchmark_app's words.
IMAGENET = Preprocess.from_dict(zoo_imagenet)
SIZE = 224
#: Windows (centre row, centre column) of 200x200 pixels in each 427x640 photograph: a 2x3 grid.
WINDOW = 200
CENTRES = tuple((r, c) for r in (110, 317) for c in (110, 320, 530))
CLASSES = 2 * len(CENTRES)
EVAL_PER_CLASS = 6  # 72 evaluation items
CALIBRATION_ITEMS = 64
INIT_ITEMS = 32
LOGIT_SCALE = 10.0  # the true class's target logit; trained ImageNet models reach 10-20


def labelled_crops(per_class: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``[n, 224, 224, 3]`` uint8 crops jittered around each window (shift, scale, mirror) and their class."""
    photos = sample_photos()
    rng = np.random.default_rng(seed)
    images, labels = [], []
    for label in range(CLASSES):
        photo = photos[label // len(CENTRES)]
        row, col = CENTRES[label % len(CENTRES)]
        for _ in range(per_class):
            side = WINDOW * rng.uniform(0.85, 1.15)
            r = int(np.clip(row + rng.uniform(-20, 20) - side / 2, 0, photo.shape[0] - side))
            c = int(np.clip(col + rng.uniform(-20, 20) - side / 2, 0, photo.shape[1] - side))
            crop = photo[r : r + int(side), c : c + int(side)]
            images.append(resize(crop[:, ::-1] if rng.random() < 0.5 else crop, SIZE, SIZE))
            labels.append(label)
    order = rng.permutation(len(labels))  # classes interleaved: any prefix has them all
    return np.stack(images)[order], np.asarray(labels, np.int64)[order]


def preprocess(rgb: np.ndarray) -> np.ndarray:
    return IMAGENET.apply(rgb, "NCHW")


def fit(model: onnx.ModelProto, *, per_class: int = 8, ridge: float = 1e-2) -> onnx.ModelProto:
    """``model`` (an image classifier with BatchNormalization and a ``logits`` Gemm) fitted in place.

    ``per_class`` crops of each window fit the head; ``ridge`` (relative to the features' mean
    square) keeps its weights small where features say little, so they do not amplify noise.
    """
    init, _ = labelled_crops(max(1, INIT_ITEMS // CLASSES), seed=10)
    _set_bn_statistics(model, preprocess(init))
    images, labels = labelled_crops(per_class, seed=11)
    features = _run(model, preprocess(images), [_head(model).input[0]])[0]
    _fit_head(model, features, labels, ridge)
    return model


def dataset_arrays() -> dict[str, np.ndarray]:
    """Evaluation: labelled crops of the windows; calibration: other crops (unlabelled), apart from both."""
    images, labels = labelled_crops(EVAL_PER_CLASS, seed=12)
    calibration, _ = labelled_crops(-(-CALIBRATION_ITEMS // CLASSES), seed=13)
    return {"inputs/input": preprocess(images), "labels": labels,
            "calibration/input": preprocess(calibration[:CALIBRATION_ITEMS])}  # fmt: skip


def _head(model: onnx.ModelProto) -> onnx.NodeProto:
    return next(n for n in model.graph.node if n.op_type == "Gemm" and n.output[0] == "logits")


def _run(model: onnx.ModelProto, x: np.ndarray, names: list[str], chunk: int = 8) -> list[np.ndarray]:
    """The values of tensors ``names`` on inputs ``x``, computed by ONNX Runtime in chunks (one thread:
    the same summation order, the same bytes, on every build)."""
    import onnx

    from autodeploy.runtime.onnxruntime import session as ort_session

    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    del probe.graph.output[:]
    probe.graph.output.extend(onnx.helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, None) for n in names)
    # ORT_DISABLE_ALL keeps every BatchNormalization input (the probe's outputs)
    session = ort_session(probe.SerializeToString(),
                          {"intra_op_num_threads": 1, "graph_optimization_level": "ORT_DISABLE_ALL"})  # fmt: skip
    parts = [session.run(names, {"input": x[i : i + chunk]}) for i in range(0, len(x), chunk)]
    return [np.concatenate([p[k] for p in parts]) for k in range(len(names))]


def _set_bn_statistics(model: onnx.ModelProto, x: np.ndarray) -> None:
    """Every BatchNormalization's running mean and variance := its input's, per channel, on ``x``.

    One pass in which every BatchNormalization normalizes by the statistics of the batch itself
    (as in training) gives each layer the statistics it will see once the layers before it are set:
    the same as setting them one layer after another, at the cost of one forward pass.
    """
    import onnx
    from onnx import helper, numpy_helper

    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    nodes, outputs = [], []
    flat = numpy_helper.from_array(np.array([-1], np.int64), "bn_stats.flat")
    for node in probe.graph.node:
        if node.op_type != "BatchNormalization":
            nodes.append(node)
            continue
        x_, name = node.input[0], node.name
        mean, var = f"{name}.batch_mean", f"{name}.batch_var"
        nodes += [helper.make_node("ReduceMean", [x_], [f"{mean}4"], axes=[0, 2, 3], keepdims=1),
                  helper.make_node("Sub", [x_, f"{mean}4"], [f"{name}.centred"]),
                  helper.make_node("Mul", [f"{name}.centred", f"{name}.centred"], [f"{name}.squares"]),
                  helper.make_node("ReduceMean", [f"{name}.squares"], [f"{var}4"], axes=[0, 2, 3], keepdims=1),
                  helper.make_node("Reshape", [f"{mean}4", flat.name], [mean]),
                  helper.make_node("Reshape", [f"{var}4", flat.name], [var]),
                  helper.make_node("BatchNormalization", [x_, node.input[1], node.input[2], mean, var],
                                   list(node.output), name=name, epsilon=1e-5)]  # fmt: skip
        outputs += [(node.input[3], mean), (node.input[4], var)]
    del probe.graph.node[:]
    probe.graph.node.extend(nodes)
    probe.graph.initializer.append(flat)
    values = _run(probe, x, [stat for _, stat in outputs], chunk=len(x))  # one batch: its own statistics
    weights = {t.name: t for t in model.graph.initializer}
    for (name, _), value in zip(outputs, values, strict=True):
        weights[name].CopyFrom(numpy_helper.from_array(value.astype(np.float32), name))


def _fit_head(model: onnx.ModelProto, features: np.ndarray, labels: np.ndarray, ridge: float) -> None:
    """Ridge regression from pooled features to ``LOGIT_SCALE`` on the true class; other classes are
    mixtures of the fitted ones, a margin lower."""
    from onnx import numpy_helper

    weights = {t.name: t for t in model.graph.initializer}
    head = _head(model)
    w_old = numpy_helper.to_array(weights[head.input[1]])
    classes, _ = w_old.shape
    x = features.astype(np.float64)
    mu = x.mean(axis=0)
    xc = x - mu
    target = np.eye(CLASSES)[labels] * LOGIT_SCALE
    t_mean = target.mean(axis=0)
    gram = xc @ xc.T
    penalty = ridge * np.trace(gram) / len(gram)
    w_fit = xc.T @ np.linalg.solve(gram + penalty * np.eye(len(gram)), target - t_mean)  # [features, CLASSES]
    rng = np.random.default_rng(0)
    mix = rng.dirichlet(np.full(CLASSES, 0.5), size=classes - CLASSES)  # [others, CLASSES]
    w = np.concatenate([w_fit.T, mix @ w_fit.T])  # [classes, features]
    fitted_bias = t_mean - mu @ w_fit
    b = np.concatenate([fitted_bias, mix @ fitted_bias - 0.3 * LOGIT_SCALE])
    weights[head.input[1]].CopyFrom(numpy_helper.from_array(w.astype(np.float32), head.input[1]))
    weights[head.input[2]].CopyFrom(numpy_helper.from_array(b.astype(np.float32), head.input[2]))
