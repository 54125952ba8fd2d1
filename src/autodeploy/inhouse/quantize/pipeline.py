"""The quantizer's pipeline: :func:`quantize`, post-training INT8 to QDQ ONNX with an accuracy-aware fallback.

Steps of :func:`quantize`:

1. name every node and plan what to quantize (:func:`qdq.plan`);
2. calibrate activation ranges on the calibration data (:mod:`.calibrate`);
3. optionally correct the Conv/Gemm biases for int8's mean output shift (:mod:`.bias`);
4. insert QDQ everywhere the plan allows and compare with FP32 on the calibration data, under
   the harness's own accuracy constraint (:class:`.fallback.Judge`);
5. if that breaks the budget, find the float set from the verdict's own evidence (:mod:`.mixed`): the
   channels the judge failed (a detector's class channels, ``output0, axis 1, channels 4-21``) are traced
   back through the graph (:mod:`.evidence`); where the calibration clipped ranges, the tensors feeding those
   channels get their observed min/max first (kept when that helps them); then the head of those channels
   stays float (``float_layers=head`` stops there), then the layers that feed them, ranked by their
   effect on them - each alone int8, measured by the model outputs where those runs cost at most
   :data:`.fallback.MAX_RANKING_MACS` (or :data:`.fallback.MAX_RANKED_BY_OUTPUT` layers), else each
   weighted layer's own output error on its FP32 inputs - the fewest that pass (doubling, then bisection),
   within :data:`.mixed.MAX_TRIAL_BUILDS` candidate builds; the report says which layers stayed float and
   why. When even ``max_float_fraction`` of the layers in float misses the budget, the all-int8 model is
   kept and the report says the budget was not met.

Models run on ONNX Runtime or OpenVINO through :mod:`.run`.
The evaluation inputs of a trial never reach this module: the budget is checked on calibration
data, so the trial's accuracy numbers stay an independent measurement.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from autodeploy.errors import BuildError
from autodeploy.inhouse.quantize import bias, calibrate, evidence, fallback, mixed, qdq
from autodeploy.inhouse.quantize.common import QuantConfig, calibration_batches, opset_13


@dataclass(frozen=True)
class QuantReport:
    """What the quantizer did and how close it stayed to FP32 on the calibration data."""

    config: QuantConfig
    quantized_nodes: int
    quantized_tensors: int
    weighted_layers: int
    kept_float: tuple[str, ...]
    sensitivity: Mapping[str, float] = field(default_factory=dict)
    calibration_items: int = 0
    agreement_all_int8: Mapping[str, float] = field(default_factory=dict)
    agreement_final: Mapping[str, float] = field(default_factory=dict)
    budget_met: bool = True
    evaluations: int = 0
    #: When nothing could be quantized: op type -> why it stays float (every tensor stays float).
    not_quantized: Mapping[str, str] = field(default_factory=dict)
    biases_corrected: int = 0
    smoothed: int = 0
    #: How the fallback ranked layers: ``output`` (each node alone int8, the model's outputs judged),
    #: ``layer`` (each weighted layer alone on its FP32 inputs: :data:`.fallback.MAX_RANKING_MACS`), ``""`` (no fallback).
    ranking: str = ""
    #: Why each node in ``kept_float`` stayed float (:class:`.mixed.Found`).
    reasons: Mapping[str, str] = field(default_factory=dict)
    #: The channels the all-int8 model failed on the calibration data (the evidence the float set is found from).
    evidence: tuple[str, ...] = ()
    #: Tensors whose clipped range the fallback widened to the observed min/max (they feed the failing channels).
    unclipped: int = 0
    #: The time limit that stopped the float-layer search before it was done (:func:`autodeploy.inhouse.search_time.time_limit`).
    search_stopped_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "calibration": self.config.calibration,
            "activation_symmetric": self.config.activation_symmetric,
            "per_channel": self.config.per_channel,
            "reduce_range": self.config.reduce_range,
            "placement": self.config.placement,
            "float_precision": self.config.float_precision,
            "bias_correction": self.config.bias_correction,
            "biases_corrected": self.biases_corrected,
            "smoothquant": self.config.smoothquant,
            "smoothed": self.smoothed,
            # the stored key keeps its old name, so reports in artifacts built before still read alike
            "accuracy_budget": self.config.max_accuracy_drop,
            "quantized_nodes": self.quantized_nodes,
            "quantized_tensors": self.quantized_tensors,
            "weighted_layers": self.weighted_layers,
            "kept_float": list(self.kept_float),
            "float_layers": self.config.float_layers,
            "kept_float_why": dict(self.reasons),
            "evidence": list(self.evidence),
            "unclipped": self.unclipped,
            "ranking": self.ranking,
            "sensitivity": {k: round(v, 6) for k, v in self.sensitivity.items()},
            "calibration_items": self.calibration_items,
            "agreement_all_int8": dict(self.agreement_all_int8),
            "agreement_final": dict(self.agreement_final),
            "budget_met": self.budget_met,
            "evaluations": self.evaluations,
            **({"not_quantized": dict(self.not_quantized)} if self.not_quantized else {}),
            **({"search_stopped_s": self.search_stopped_s} if self.search_stopped_s is not None else {}),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], config: QuantConfig) -> QuantReport:
        """The report :meth:`to_dict` wrote (e.g. a worker's) of a run with ``config``."""
        return cls(
            config=config, quantized_nodes=d["quantized_nodes"], quantized_tensors=d["quantized_tensors"],
            weighted_layers=d["weighted_layers"], kept_float=tuple(d["kept_float"]), sensitivity=d["sensitivity"],
            calibration_items=d["calibration_items"], agreement_all_int8=d["agreement_all_int8"],
            agreement_final=d["agreement_final"], budget_met=d["budget_met"], evaluations=d["evaluations"],
            not_quantized=d.get("not_quantized", {}), biases_corrected=d["biases_corrected"], smoothed=d["smoothed"],
            ranking=d.get("ranking", ""), reasons=d.get("kept_float_why", {}), evidence=tuple(d.get("evidence", ())),
            unclipped=d.get("unclipped", 0), search_stopped_s=d.get("search_stopped_s"),
        )  # fmt: skip


def quantize(
    model: onnx.ModelProto,
    calibration: Mapping[str, np.ndarray],
    config: QuantConfig | None = None,
    axes: Mapping[str, int | None] | None = None,
) -> tuple[onnx.ModelProto, QuantReport]:
    """Quantize ``model`` to QDQ INT8 using ``calibration`` (arrays with a leading item axis),
    batched on each input's batch axis (``axes``, :meth:`ModelInfo.batch_axis`; default 0).

    Raises:
        BuildError: no calibration data, or the model's opset cannot be raised to 13.
    """
    config = config or QuantConfig()
    if not calibration or not len(next(iter(calibration.values()))):
        raise BuildError("int8 quantization needs calibration data", fix="give --data or use synthetic data")
    _check_calibration(model, calibration, axes)
    model = qdq.name_nodes(opset_13(model))
    batches = calibration_batches(model, calibration, config.batch, axes)
    smoothed = 0
    if config.smoothquant is not None:
        from autodeploy.inhouse.quantize.smooth import smooth

        model, smoothed = smooth(model, batches, config.smoothquant)
    the_plan = qdq.plan(model, config.placement)
    if not the_plan.tensors:  # nothing a runtime runs in int8: the model stays float, and we say why
        return model, QuantReport(
            config=config, quantized_nodes=0, quantized_tensors=0, weighted_layers=0, kept_float=(),
            calibration_items=len(next(iter(calibration.values()))), budget_met=True,
            not_quantized=qdq.why_float(model, config.placement),
        )  # fmt: skip
    ranges = calibrate.collect_ranges(
        model,
        the_plan.tensors,
        batches,
        method=config.calibration,
        percentile=config.percentile,
        symmetric=config.activation_symmetric,
        per_channel=the_plan.per_channel,
    )
    judge = fallback.Judge(model, batches, config)
    uncorrected = model
    model, corrected = _corrected(uncorrected, the_plan, ranges, config, batches)
    build = _builder(uncorrected, model, the_plan, ranges, corrected, config)
    full = build(())
    ok, first = judge(full)
    found, unclipped, ranking = mixed.Found(full, (), ok, first), 0, ""
    if not ok and config.max_accuracy_drop is not None and the_plan.nodes and judge.failing:
        verdict, targets = (ok, first, judge.failing), judge.failing
        shapes = evidence.static_shapes(model, batches[0])
        int8_outputs = judge.outputs
        if config.calibration != "minmax":  # the failing channels may read outliers the calibration clipped
            wide, names = _unclipped(uncorrected, the_plan, ranges, batches, evidence.feeders(model, targets, shapes))
            if names:
                wide_model, wide_corrected = _corrected(uncorrected, the_plan, wide, config, batches)
                wide_build = _builder(uncorrected, wide_model, the_plan, wide, wide_corrected, config)
                candidate = wide_build(())
                seen = judge.evidence(candidate)
                if seen[0] or judge.loss(targets, judge.outputs) < judge.loss(targets, int8_outputs):
                    model, ranges, corrected, build, full, verdict = wide_model, wide, wide_corrected, wide_build, candidate, seen
                    unclipped = len(names)

        def effects(layers: Sequence[tuple[str, ...]], targets: Sequence) -> dict[tuple[str, ...], float]:
            nonlocal ranking
            ranking, harm = fallback.effects(model, the_plan, layers, targets, build, ranges, config, batches, judge)
            return harm

        found = mixed.find(
            model, the_plan.nodes, build, judge.evidence, shapes=shapes, mode=config.float_layers, effects=effects,
            max_float=max(1, int(len(the_plan.nodes) * config.max_float_fraction)),
            budget=mixed.MAX_TRIAL_BUILDS - (config.calibration != "minmax"), first=(full, verdict),
        )  # fmt: skip
    final, final_score, kept, ok = found.candidate, found.score, found.kept, found.passed
    sensitivity = found.ranking
    report = QuantReport(
        config=config,
        quantized_nodes=len(the_plan.nodes) - len(kept),
        quantized_tensors=sum(1 for n in final.graph.node if n.op_type == "QuantizeLinear"),
        weighted_layers=len(the_plan.weighted),
        kept_float=kept,
        sensitivity=sensitivity,
        calibration_items=len(next(iter(calibration.values()))),
        agreement_all_int8=first,
        agreement_final=final_score,
        budget_met=ok,
        evaluations=judge.calls,
        biases_corrected=corrected,
        smoothed=smoothed,
        ranking=ranking,
        reasons=found.reasons,
        evidence=found.evidence,
        unclipped=unclipped,
        search_stopped_s=found.stopped_s,
    )
    return final, report


def _corrected(
    model: onnx.ModelProto, the_plan: qdq.Plan, ranges: Mapping, config: QuantConfig, batches: list
) -> tuple[onnx.ModelProto, int]:
    """``model`` with bias correction (:mod:`.bias`) where the config asks for it, and how many biases changed."""
    if config.bias_correction and the_plan.weighted:
        return bias.correct(model, the_plan, ranges, config, batches)
    return model, 0


def _builder(
    uncorrected: onnx.ModelProto, model: onnx.ModelProto, the_plan: qdq.Plan, ranges: Mapping, corrected: int,
    config: QuantConfig,
) -> Callable[[Sequence[str]], onnx.ModelProto]:  # fmt: skip
    """The QDQ model with the given nodes float; those float on their own biases where ``model``'s are corrected."""

    def build(keep_float: Sequence[str]) -> onnx.ModelProto:
        return qdq.insert_qdq(
            bias.original_biases(model, uncorrected, keep_float) if corrected else model,
            the_plan,
            ranges,
            symmetric=config.activation_symmetric,
            per_channel=config.per_channel,
            reduce_range=config.reduce_range,
            keep_float=keep_float,
        )

    return build


def _unclipped(
    model: onnx.ModelProto, the_plan: qdq.Plan, ranges: Mapping, batches: list, feeding: Collection[str]
) -> tuple[dict, list[str]]:
    """``ranges`` with every quantized tensor that a node in ``feeding`` reads or writes at its observed
    min/max (percentile and entropy clip outliers; the failing channels may be made of them), and those tensors."""
    touched = {t for n in model.graph.node if n.name in feeding for t in (*n.input, *n.output)}
    names = [t for t in the_plan.tensors if t in touched and t in ranges and t not in the_plan.per_channel]
    observed = calibrate.collect_ranges(model, names, batches, method="minmax") if names else {}
    wider = [t for t in names if t in observed and tuple(observed[t]) != tuple(ranges[t])]
    return {**ranges, **{t: observed[t] for t in wider}}, wider


# -- helpers ----------------------------------------------------------------------------------


def _check_calibration(
    model: onnx.ModelProto, calibration: Mapping[str, np.ndarray], axes: Mapping[str, int | None] | None
) -> None:
    """One line naming the first calibration input whose name, dtype or item shape the model refuses."""
    from onnx import helper

    inits = {t.name for t in model.graph.initializer}
    inputs = {i.name: i for i in model.graph.input if i.name not in inits}
    for name, array in calibration.items():
        if name not in inputs:
            raise BuildError(f"calibration input {name!r} is not a model input (inputs: {', '.join(inputs)})",
                             fix="name the calibration arrays after the model's inputs")  # fmt: skip
        tensor = inputs[name].type.tensor_type
        want = helper.tensor_dtype_to_np_dtype(tensor.elem_type) if tensor.elem_type else None
        if want is not None and np.asarray(array).dtype != want:
            raise BuildError(f"calibration input {name!r} is {np.asarray(array).dtype}, the model wants {want}",
                             fix=f"convert it with .astype(np.{np.dtype(want).name})")  # fmt: skip
        axis = 0 if axes is None else axes.get(name, 0)
        dims = [d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim]
        item = list(np.shape(array)[1:])
        if axis is not None and tensor.HasField("shape"):
            expected = dims[:axis] + dims[axis + 1 :]
            bad = len(item) != len(expected) or any(
                e is not None and e != i for e, i in zip(expected, item, strict=False)
            )
            if bad:
                shown = ["?" if e is None else e for e in expected]
                raise BuildError(f"calibration input {name!r} has items of shape {tuple(item)}, the model wants {shown}",
                                 fix="give one array per input with a leading item axis and the model's other dims")  # fmt: skip
