"""Rewrite rules on onnxscript's rewriter: each a small class with ``pattern``, ``check`` and ``rewrite``.

``check`` returns a :class:`MatchResult` that says *why* a match is refused, so a pass can
report near misses ("standard Gelu needs opset 20"). Rules never change the model's
interface: a rule that would rename a graph input or merge two outputs refuses the match.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, Literal

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import MatchResult, pattern

Target = Literal["onnx", "onnxruntime"]
FLOAT_TYPES = frozenset({ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.DOUBLE, ir.DataType.BFLOAT16})
MS_DOMAIN = "com.microsoft"


# -- helpers ------------------------------------------------------------------------------


def const(value: ir.Value | None) -> np.ndarray | None:
    """The value's constant array, or None (a graph input with a default is not a constant)."""
    if value is None or value.is_graph_input() or value.const_value is None:
        return None
    return value.const_value.numpy()


def scalar(value: ir.Value | None) -> float | None:
    array = const(value)
    return float(array.reshape(-1)[0]) if array is not None and array.size == 1 else None


def opset(context: Any) -> int:
    imports = context.model.opset_imports
    return imports.get("", imports.get("ai.onnx", 0))


def attr_int(node: ir.Node, name: str, default: int) -> int:
    attr = node.attributes.get(name)
    return default if attr is None else attr.as_int()


def rank(value: ir.Value | None) -> int | None:
    return None if value is None or value.shape is None else len(value.shape)


def fresh_name(graph: Any, base: str, suffixes: tuple[str, ...] = ("",)) -> str:
    """A name ``base_i`` such that no ``base_i + suffix`` is an initializer of ``graph`` yet.

    The rewriter silently keeps an existing initializer of the same name, so a clash would
    make a rewrite use another rewrite's constants.
    """
    taken = graph.initializers if isinstance(graph, ir.Graph) else {}
    i = 0
    while any(f"{base}_{i}{suffix}" in taken for suffix in suffixes):
        i += 1
    return f"{base}_{i}"


def can_bypass(x: ir.Value, out: ir.Value) -> MatchResult:
    """Whether ``out`` may be replaced by ``x`` without changing the model's interface."""
    result = MatchResult()
    if x.is_graph_input():
        return result.fail("its input is a graph input: bypassing it would rename the model input")
    if out.is_graph_output() and (x.is_graph_output() or x.is_initializer()):
        return result.fail("its output is a graph output and its input is an output or initializer")
    return result


def reduce_axes(node: ir.Node) -> list[int] | None:
    """ReduceMean's axes from the attribute (opset < 18) or the constant input; None if unknown."""
    attr = node.attributes.get("axes")
    if attr is not None:
        return list(attr.as_ints())
    if len(node.inputs) > 1 and node.inputs[1] is not None:
        axes = const(node.inputs[1])
        return None if axes is None else [int(a) for a in axes.reshape(-1)]
    return None


def broadcasts_to(shape: ir.Shape, target: tuple[Any, ...]) -> bool:
    """Whether ``shape`` broadcasts one way to ``target`` (each dim 1 or equal, right-aligned)."""
    if len(shape) > len(target):
        return False
    return all(d == 1 or d == t for d, t in zip(reversed(list(shape)), reversed(target), strict=False))


# -- identity and dropout -------------------------------------------------------------------


class RemoveIdentity(pattern.RewriteRuleClassBase):
    """``Identity(x)`` -> ``x``."""

    def pattern(self, op, x):
        return op.Identity(x, _outputs=["out"])

    def check(self, context, x, out, **_) -> MatchResult:
        return can_bypass(x, out)

    def rewrite(self, op, x, out):
        return x


def _dropout_is_inference(node: ir.Node) -> MatchResult:
    result = MatchResult()
    if attr_int(node, "is_test", 1) == 0:  # opset < 7: is_test=0 means training
        return result.fail("Dropout runs in training mode (is_test=0)")
    if len(node.inputs) > 2 and node.inputs[2] is not None:
        training = const(node.inputs[2])
        if training is None or bool(training.reshape(-1)[0]):
            return result.fail("training_mode is not a constant false")
    return result


class RemoveDropout(pattern.RewriteRuleClassBase):
    """Inference ``Dropout(x)`` -> ``x``."""

    def pattern(self, op, x):
        return op.Dropout(x, _allow_other_inputs=True, _outputs=["out"])

    def check(self, context, x, out, **_) -> MatchResult:
        result = _dropout_is_inference(out.producer())
        return result if not result else can_bypass(x, out)

    def rewrite(self, op, x, out):
        return x


class RemoveDropoutWithMask(RemoveDropout):
    """Inference ``Dropout(x)`` with an unused mask output -> ``x``."""

    def pattern(self, op, x):
        return op.Dropout(x, _allow_other_inputs=True, _outputs=["out", "mask"])

    def check(self, context, x, out, mask=None, **_) -> MatchResult:
        if mask is None:
            return MatchResult().fail("the Dropout has no mask output")
        if mask.uses() or mask.is_graph_output():
            return MatchResult().fail("the Dropout mask is used")
        return super().check(context, x, out)

    def rewrite(self, op, x, out, mask):
        # Replacements must cover both outputs; the mask has no users, so any value will do.
        return x, op.Shape(x)


# -- Conv + BatchNormalization ----------------------------------------------------------------


class FoldBatchNormIntoConv(pattern.RewriteRuleClassBase):
    """``BatchNormalization(Conv(x, W, B))`` -> ``Conv(x, W * s, (B - mean) * s + beta)``, s = gamma / std."""

    def pattern(self, op, x, scale, bias, mean, var):
        conv = op.Conv(x, _allow_other_inputs=True, _outputs=["conv_out"])
        return op.BatchNormalization(conv, scale, bias, mean, var, _outputs=["bn_out"])

    def check(self, context, x, scale, bias, mean, var, conv_out, bn_out, **_) -> MatchResult:
        result = MatchResult()
        conv, bn = conv_out.producer(), bn_out.producer()
        if attr_int(bn, "training_mode", 0):
            return result.fail("BatchNormalization is in training mode")
        weight = const(conv.inputs[1])
        if weight is None or weight.dtype.kind != "f":
            return result.fail("the Conv weight is not a float constant")
        conv_bias = conv.inputs[2] if len(conv.inputs) > 2 else None
        if conv_bias is not None and const(conv_bias) is None:
            return result.fail("the Conv bias is not a constant")
        params = [const(v) for v in (scale, bias, mean, var)]
        if any(p is None or p.shape != (weight.shape[0],) for p in params):
            return result.fail("BatchNormalization parameters are not constants of one value per channel")
        base = fresh_name(context.graph_or_function, f"{conv.inputs[1].name or 'conv'}_bnfold", ("_w", "_b"))
        self._names = (f"{base}_w", f"{base}_b")
        return result

    def rewrite(self, op, x, scale, bias, mean, var, conv_out, bn_out, **_):
        conv, bn = conv_out.producer(), bn_out.producer()
        weight = const(conv.inputs[1])
        eps = bn.attributes["epsilon"].as_float() if "epsilon" in bn.attributes else 1e-5
        gamma, beta, mu, sigma2 = (const(v).astype(np.float64) for v in (scale, bias, mean, var))
        s = gamma / np.sqrt(sigma2 + eps)
        old_bias = const(conv.inputs[2]) if len(conv.inputs) > 2 and conv.inputs[2] is not None else 0.0
        new_w = (weight * s.reshape(-1, *([1] * (weight.ndim - 1)))).astype(weight.dtype)
        new_b = ((old_bias - mu) * s + beta).astype(weight.dtype)
        w = op.initializer(ir.tensor(new_w), name=self._names[0])
        b = op.initializer(ir.tensor(new_b), name=self._names[1])
        return op.Conv(x, w, b, **conv.attributes)


def _channel_constant(c: np.ndarray | None, channels: int, out_rank: int | None) -> np.ndarray | None:
    """A constant that acts per output channel of an N-C-spatial Conv output, as ``[C]``; else None."""
    if c is None or c.dtype.kind != "f" or out_rank is None or c.ndim > out_rank:
        return None
    if c.size == 1:
        return np.full(channels, float(c.reshape(-1)[0]))
    shape = (1,) * (out_rank - c.ndim) + c.shape
    if shape[1] != channels or any(d != 1 for i, d in enumerate(shape) if i != 1):
        return None
    return c.reshape(-1)


class FoldAffineIntoConv(pattern.RewriteRuleClassBase):
    """``Add(Conv(x, W, B), c)`` -> ``Conv(x, W, B + c)``; ``Mul(Conv(x, W, B), s)`` -> ``Conv(x, W * s, B * s)``.

    For a per-channel or scalar constant ``c`` / ``s``. PaddlePaddle exports (PP-OCR, PP-LCNet) write
    a Conv without bias, then the bias as an Add and a learnable affine (Mul, Add by scalars) after
    it; folded, the quantizer sees one Conv instead of four quantization points.
    """

    def __init__(self, kind: str) -> None:
        super().__init__(f"FoldAffineIntoConv[{kind}]")
        self._kind = kind

    def pattern(self, op, x, c):
        conv = op.Conv(x, _allow_other_inputs=True, _outputs=["conv_out"])
        return op.Add(conv, c) if self._kind == "Add" else op.Mul(conv, c)

    def check(self, context, x, c, conv_out, **_) -> MatchResult:
        result = MatchResult()
        conv = conv_out.producer()
        weight = const(conv.inputs[1])
        if weight is None or weight.dtype.kind != "f":
            return result.fail("the Conv weight is not a float constant")
        if len(conv.inputs) > 2 and conv.inputs[2] is not None and const(conv.inputs[2]) is None:
            return result.fail("the Conv bias is not a constant")
        if len(conv_out.uses()) != 1 or conv_out.is_graph_output():
            return result.fail("the Conv output has other users")
        self._c = _channel_constant(const(c), weight.shape[0], rank(conv_out) or weight.ndim)
        if self._c is None:
            return result.fail("the operand is not a constant scalar or one value per output channel")
        base = fresh_name(context.graph_or_function, f"{conv.inputs[1].name or 'conv'}_affine", ("_w", "_b"))
        self._names = (f"{base}_w", f"{base}_b")
        return result

    def rewrite(self, op, x, c, conv_out, **_):
        conv = conv_out.producer()
        weight = const(conv.inputs[1])
        has_bias = len(conv.inputs) > 2 and conv.inputs[2] is not None
        bias = const(conv.inputs[2]).astype(np.float64) if has_bias else np.zeros(weight.shape[0])
        k = self._c.astype(np.float64)
        if self._kind == "Add":
            new_w, new_b = weight, bias + k
        else:
            new_w, new_b = weight * k.reshape(-1, *([1] * (weight.ndim - 1))), bias * k
        w = op.initializer(ir.tensor(new_w.astype(weight.dtype)), name=self._names[0])
        b = op.initializer(ir.tensor(new_b.astype(weight.dtype)), name=self._names[1])
        return op.Conv(x, w, b, **conv.attributes)


# -- MatMul + Add -> Gemm -------------------------------------------------------------------


class MatMulAddToGemm(pattern.RewriteRuleClassBase):
    """``Add(MatMul(a, b), c)`` -> ``Gemm(a, b, c)`` for 2-D ``a``, ``b`` and a ``c`` that broadcasts to the output."""

    def pattern(self, op, a, b, c):
        return op.Add(op.MatMul(a, b), c)

    def check(self, context, a, b, c, **_) -> MatchResult:
        result = MatchResult()
        if rank(a) != 2 or rank(b) != 2:
            return result.fail(f"MatMul inputs have ranks {rank(a)} and {rank(b)}; Gemm is 2-D only")
        if a.dtype not in FLOAT_TYPES or a.dtype != b.dtype:
            return result.fail(f"MatMul on {a.dtype}, Gemm here is for float types")
        if c.shape is None or not broadcasts_to(c.shape, (a.shape[0], b.shape[1])):
            return result.fail(f"the Add operand of shape {c.shape} does not broadcast to the Gemm output")
        return result

    def rewrite(self, op, a, b, c):
        return op.Gemm(a, b, c)


# -- LayerNormalization ---------------------------------------------------------------------


class LayerNormFusion(pattern.RewriteRuleClassBase):
    """Mean/variance/normalize/scale over the last axis -> ``LayerNormalization(x, scale)`` (opset 17)."""

    def pattern(self, op, x, scale, epsilon):
        mean = op.ReduceMean(x, _allow_other_inputs=True, _outputs=["mean"])
        centered = op.Sub(x, mean)
        squared = pattern.OrValue([op.Pow(centered, 2.0), op.Mul(centered, centered)])
        var = op.ReduceMean(squared, _allow_other_inputs=True, _outputs=["var"])
        std = op.Sqrt(op.Add(var, epsilon))
        normalized = pattern.OrValue([op.Div(centered, std), op.Mul(centered, op.Reciprocal(std))])
        return op.Mul(normalized, scale)

    def check(self, context, x, scale, epsilon, mean, var, **_) -> MatchResult:
        result = MatchResult()
        if opset(context) < 17:
            return result.fail(f"LayerNormalization needs opset 17, the model imports {opset(context)}")
        if x.dtype not in FLOAT_TYPES or rank(x) is None:
            return result.fail("the input is not a float tensor of known rank")
        last = {-1, rank(x) - 1}
        for node in (mean.producer(), var.producer()):
            axes = reduce_axes(node)
            if axes is None or len(axes) != 1 or axes[0] not in last or attr_int(node, "keepdims", 1) != 1:
                return result.fail(f"ReduceMean over axes {axes}, not the last axis with keepdims")
        self._epsilon = scalar(epsilon)
        if self._epsilon is None:
            return result.fail("epsilon is not a constant scalar")
        if rank(scale) != 1 or scale.dtype != x.dtype or scale.shape[0] != x.shape[-1]:
            return result.fail(f"scale of shape {scale.shape} is not one value per normalized element")
        return result

    def rewrite(self, op, x, scale, epsilon, **_):
        return op.LayerNormalization(x, scale, axis=-1, epsilon=self._epsilon)


class LayerNormBiasFusion(pattern.RewriteRuleClassBase):
    """``Add(LayerNormalization(x, scale), bias)`` -> ``LayerNormalization(x, scale, bias)``."""

    def pattern(self, op, x, scale, bias):
        return op.Add(op.LayerNormalization(x, scale, _outputs=["normalized"]), bias)

    def check(self, context, x, scale, bias, normalized, **_) -> MatchResult:
        result = MatchResult()
        if rank(bias) != 1 or bias.dtype != x.dtype or bias.shape != scale.shape:
            return result.fail(f"bias of shape {bias.shape} does not match the scale {scale.shape}")
        return result

    def rewrite(self, op, x, scale, bias, normalized):
        return op.LayerNormalization(x, scale, bias, **normalized.producer().attributes)


# -- GELU -----------------------------------------------------------------------------------


class GeluFusion(pattern.RewriteRuleClassBase):
    """``x * 0.5 * (1 + erf(x / sqrt(2)))`` in any association -> ``Gelu(x)``.

    Standard ``Gelu`` is opset 20; for older models the ``onnxruntime`` target uses its
    ``com.microsoft.Gelu`` contrib op, the ``onnx`` target refuses with that reason.
    """

    def __init__(self, target: Target, erf_op: str, form: str) -> None:
        super().__init__(name=f"GeluFusion[{erf_op},{form}]")
        self.target, self.erf_op, self.form = target, erf_op, form

    def pattern(self, op, x, c, one, half):
        erf = op.Erf(getattr(op, self.erf_op)(x, c))
        one_plus = op.Add(erf, one)
        if self.form == "(x*(1+e))*h":
            return op.Mul(op.Mul(x, one_plus), half)
        if self.form == "(x*h)*(1+e)":
            return op.Mul(op.Mul(x, half), one_plus)
        return op.Mul(x, op.Mul(one_plus, half))

    def check(self, context, x, c, one, half, **_) -> MatchResult:
        result = MatchResult()
        want = math.sqrt(2.0) if self.erf_op == "Div" else 1 / math.sqrt(2.0)
        values = (scalar(c), scalar(one), scalar(half))
        if any(v is None for v in values) or not all(
            math.isclose(v, w, rel_tol=1e-3) for v, w in zip(values, (want, 1.0, 0.5), strict=True)
        ):
            return result.fail(f"constants {values} are not GELU's ({want:.4f}, 1, 0.5)")
        if x.dtype not in FLOAT_TYPES:
            return result.fail("the input is not a float tensor")
        self._standard = opset(context) >= 20
        if not self._standard and self.target != "onnxruntime":
            return result.fail(
                f"standard Gelu needs opset 20, the model imports {opset(context)} "
                "(the onnxruntime target would use com.microsoft.Gelu)"
            )
        return result

    def rewrite(self, op, x, c, one, half):
        return op.Gelu(x) if self._standard else op.Gelu(x, _domain=MS_DOMAIN)


# -- Conv/Gemm + activation (ONNX Runtime's fused contrib ops) ---------------------------------


class _ActivationFusion(pattern.RewriteRuleClassBase):
    """``act(Conv(...))`` / ``act(Gemm(...))`` -> ONNX Runtime's ``FusedConv`` / ``FusedGemm``."""

    producer: ClassVar[str]
    fused: ClassVar[str]
    activations: ClassVar[frozenset[str]]

    def __init__(self, target: Target, activation: str) -> None:
        super().__init__(name=f"{self.producer}{activation}Fusion")
        self.target, self.activation = target, activation

    def pattern(self, op, x):
        inner = getattr(op, self.producer)(x, _allow_other_inputs=True, _outputs=["inner"])
        return getattr(op, self.activation)(inner, _allow_other_inputs=True, _outputs=["act"])

    def check(self, context, x, inner, act, **_) -> MatchResult:
        result = MatchResult()
        if self.target != "onnxruntime":
            return result.fail(
                f"target {self.target!r} has no fused {self.producer}+{self.activation} op "
                f"({self.fused} is an ONNX Runtime contrib op)"
            )
        if x.dtype != ir.DataType.FLOAT:
            return result.fail(f"{self.fused} has float32 kernels only, the input is {x.dtype}")
        self._params = _activation_params(act.producer())
        if self._params is None:
            return result.fail(f"{self.activation} bounds are not constants")
        return result

    def rewrite(self, op, x, inner, act):
        node = inner.producer()
        extra = {"activation_params": self._params} if self._params else {}
        inputs = [v for v in node.inputs]
        while inputs and inputs[-1] is None:
            inputs.pop()
        return getattr(op, self.fused)(
            *inputs, _domain=MS_DOMAIN, activation=self.activation, **node.attributes, **extra
        )


def _activation_params(node: ir.Node) -> list[float] | None:
    if node.op_type == "LeakyRelu":
        return [node.attributes["alpha"].as_float() if "alpha" in node.attributes else 0.01]
    if node.op_type != "Clip":
        return []
    if "min" in node.attributes or "max" in node.attributes:  # opset < 11
        lo, hi = node.attributes.get("min"), node.attributes.get("max")
        bounds = [lo.as_float() if lo else None, hi.as_float() if hi else None]
    else:
        bounds = [scalar(v) if v is not None else None for v in (list(node.inputs[1:]) + [None, None])[:2]]
        given = [v for v in (list(node.inputs[1:]) + [None, None])[:2]]
        if any(v is not None and b is None for v, b in zip(given, bounds, strict=True)):
            return None
    finfo = np.finfo(np.float32)
    return [
        float(finfo.min) if bounds[0] is None else bounds[0],
        float(finfo.max) if bounds[1] is None else bounds[1],
    ]


class ConvActivationFusion(_ActivationFusion):
    producer, fused = "Conv", "FusedConv"
    activations = frozenset({"Relu", "LeakyRelu", "Sigmoid", "Tanh", "Clip"})


class GemmActivationFusion(_ActivationFusion):
    producer, fused = "Gemm", "FusedGemm"
    activations = frozenset({"Relu", "Sigmoid", "Tanh"})
