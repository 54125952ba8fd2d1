"""The ``digits`` zoo model: an MLP trained on scikit-learn's bundled 8x8 digits, exported to ONNX.

It is the one zoo model with real labelled data, so quantization accuracy can be measured as task
accuracy, not just agreement with FP32. Needs scikit-learn (``pip install 'autodeploy[zoo]'``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from autodeploy.zoo._graph import Graph, float_tensor

if TYPE_CHECKING:
    import onnx
    from sklearn.neural_network import MLPClassifier

INPUT = "pixels"
CALIBRATION_SIZE = 200
HIDDEN_LAYERS = (64, 32)


def split() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The fixed stratified 70/30 split: (x_train, x_test, y_train, y_test), pixels scaled to [0, 1]."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    data = load_digits()
    x = (data.data / 16.0).astype(np.float32)
    y = data.target.astype(np.int64)
    return train_test_split(x, y, test_size=0.3, random_state=0, stratify=y)


def train() -> tuple[MLPClassifier, float]:
    """Trains the classifier; returns it and its accuracy on the test split (sklearn's ``score``)."""
    from sklearn.neural_network import MLPClassifier

    x_train, x_test, y_train, y_test = split()
    # tol=1e-3 stops after ~100 epochs (under a second) at ~97.8% test accuracy; sklearn's default
    # tol trains 2x longer for no accuracy gain. max_iter is only a ceiling that is never reached.
    clf = MLPClassifier(hidden_layer_sizes=HIDDEN_LAYERS, random_state=0, max_iter=300, tol=1e-3)
    clf.fit(x_train, y_train)
    return clf, float(clf.score(x_test, y_test))


def build() -> onnx.ModelProto:
    """[N,64] pixels -> (Gemm -> Relu) x 2 -> Gemm ``logits`` [N,10], weights from the trained MLP.

    No Softmax: argmax of the logits is the prediction, and a softmax would hide logit errors.
    """
    clf, _ = train()
    g = Graph("digits", seed=0)
    x = INPUT
    last = len(clf.coefs_) - 1
    for i, (w, b) in enumerate(zip(clf.coefs_, clf.intercepts_, strict=True)):
        # sklearn stores weights as [in, out]; Gemm with transB=1 wants [out, in].
        y = g.gemm(x, w.shape[0], w.shape[1], w=w.T, b=b, name="logits" if i == last else None)
        x = y if i == last else g.op("Relu", y)
    return g.model(
        [float_tensor(INPUT, ["N", 64])],
        [float_tensor("logits", ["N", 10])],
        doc="MLP trained on sklearn digits (test split accuracy in zoo.dataset)",
    )


def dataset_arrays() -> dict[str, np.ndarray]:
    """Evaluation = the test split; calibration = the first 200 training samples (already shuffled)."""
    x_train, x_test, _, y_test = split()
    return {f"inputs/{INPUT}": x_test, "labels": y_test, f"calibration/{INPUT}": x_train[:CALIBRATION_SIZE]}
