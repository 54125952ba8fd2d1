"""A small graph builder so the zoo's builders read like the network they describe.

Every node and initializer gets a unique, readable name (``conv_3``, ``conv_3.weight``), and all
random weights come from one seeded generator, so building a model twice gives the same bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
from onnx import TensorProto, helper, numpy_helper

if TYPE_CHECKING:
    import onnx

OPSET = 17
# IR 8 is the version that introduced opset 17; staying there keeps older runtimes able to load the files.
IR_VERSION = 8


def tensor(name: str, elem_type: int, shape: Sequence[int | str]) -> onnx.ValueInfoProto:
    """A graph input/output description; string dims are symbolic (e.g. the batch dim ``"N"``)."""
    return helper.make_tensor_value_info(name, elem_type, list(shape))


def float_tensor(name: str, shape: Sequence[int | str]) -> onnx.ValueInfoProto:
    return tensor(name, TensorProto.FLOAT, shape)


class Graph:
    """Collects nodes and initializers in order; ``model()`` wraps them into an opset-17 model."""

    def __init__(self, name: str, seed: int) -> None:
        self.name = name
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._counts: dict[str, int] = {}
        self._scalars: dict[tuple[str, float | int], str] = {}

    def unique(self, hint: str) -> str:
        n = self._counts.get(hint, 0)
        self._counts[hint] = n + 1
        return f"{hint}_{n}"

    # ---- initializers -------------------------------------------------------------------------

    def weight(self, name: str, array: np.ndarray) -> str:
        """Adds ``array`` as an initializer called ``name`` (the caller makes it unique)."""
        self.initializers.append(numpy_helper.from_array(np.asarray(array, order="C"), name))
        return name

    def const(self, hint: str, value: float | int | Sequence, dtype: type = np.float32) -> str:
        """A constant initializer (scalars stay 0-d so they broadcast anywhere)."""
        return self.weight(self.unique(hint), np.asarray(value, dtype=dtype))

    def scalar(self, value: float | int, dtype: type = np.float32) -> str:
        """A 0-d constant, shared by every node that needs the same value (e.g. Clip's 0 and 6)."""
        key = (np.dtype(dtype).name, value)
        if key not in self._scalars:
            self._scalars[key] = self.const("scalar", value, dtype)
        return self._scalars[key]

    def normal(self, name: str, shape: Sequence[int], std: float, mean: float = 0.0) -> str:
        values = self.rng.standard_normal(tuple(shape), dtype=np.float32) * np.float32(std) + mean
        return self.weight(name, values.astype(np.float32))

    def uniform(self, name: str, shape: Sequence[int], low: float, high: float) -> str:
        return self.weight(name, self.rng.uniform(low, high, tuple(shape)).astype(np.float32))

    # ---- nodes --------------------------------------------------------------------------------

    def op(self, op_type: str, *inputs: str, name: str | None = None, **attrs) -> str:
        """Appends a single-output node and returns its output name."""
        node_name = name or self.unique(op_type.lower())
        self.nodes.append(helper.make_node(op_type, list(inputs), [node_name], name=node_name, **attrs))
        return node_name

    def gemm(
        self,
        x: str,
        n_in: int,
        n_out: int,
        w: np.ndarray | None = None,
        b: np.ndarray | None = None,
        name: str | None = None,
    ) -> str:
        """Fully connected layer as PyTorch exports it: Gemm with weight [out, in] and transB=1.

        Without ``w``/``b`` the weights are random with std 1/sqrt(n_in) (variance-preserving).
        """
        name = name or self.unique("gemm")
        if w is None:
            w = self.rng.standard_normal((n_out, n_in), dtype=np.float32) / np.float32(np.sqrt(n_in))
        if b is None:
            b = np.zeros(n_out, np.float32)
        self.weight(f"{name}.weight", w.astype(np.float32))
        self.weight(f"{name}.bias", b.astype(np.float32))
        return self.op("Gemm", x, f"{name}.weight", f"{name}.bias", name=name, transB=1)

    def model(
        self, inputs: list[onnx.ValueInfoProto], outputs: list[onnx.ValueInfoProto], doc: str = ""
    ) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, self.name, inputs, outputs, self.initializers, doc_string=doc)
        model = helper.make_model(
            graph,
            opset_imports=[helper.make_opsetid("", OPSET)],
            producer_name="autodeploy.zoo",
            doc_string=doc,
        )
        model.ir_version = IR_VERSION
        return model
