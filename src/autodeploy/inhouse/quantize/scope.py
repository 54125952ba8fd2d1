"""The float set of an engine's own int8 quantizer, from the same evidence as ours (:mod:`.mixed`).

NNCF (``ignored_scope``) and ONNX Runtime's ``quantize_static`` (``nodes_to_exclude``) take the names of
ONNX nodes to leave float. :func:`float_scope` judges each build they make with the in-house quantizer's
judge (the harness's verdict, on the calibration items, run where the artifact runs), traces the channels
it fails back through the ONNX graph, and asks for builds with the head of those channels float, then with
the layers ranked by their effect on them (measured on an in-house QDQ copy of the model in the engine's
placement, :func:`autodeploy.inhouse.quantize.fallback.effects`), as :func:`.mixed.find` does for ours.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import onnx

from autodeploy.inhouse.quantize import calibrate, evidence, fallback, mixed, qdq
from autodeploy.inhouse.quantize.common import QuantConfig, calibration_batches, opset_13
from autodeploy.inhouse.search_time import STOPPED_KEY


def float_scope(
    model: onnx.ModelProto,
    calibration: Mapping[str, np.ndarray],
    build: Callable[[Sequence[str]], Any],
    *,
    mode: str,
    placement: str,
    runner: Callable[[Any, list[dict[str, np.ndarray]]], Any] | None = None,
    axes: Mapping[str, int | None] | None = None,
    budget: int = mixed.MAX_TRIAL_BUILDS,
    wide: Callable[[Sequence[str]], Any] | None = None,
) -> tuple[mixed.Found, bool]:
    """The engine's build (``build(names)``: ``names`` left float) that the verdict passes with the fewest
    float nodes of ``model`` (its nodes named as the engine names them), or its all-int8 build where none does.

    Args:
        mode: ``head`` or ``search`` (:data:`.mixed.FLOAT_LAYERS`).
        placement: The in-house QDQ placement that imitates the engine (``openvino`` for NNCF): the layers
            ranked are its quantized nodes.
        runner: Runs a build on calibration batches (the judge's; default ONNX Runtime).
        axes: Each input's batch axis (default 0).
        wide: The engine's build with its activation ranges at their observed min and max, tried first where
            all-int8 fails and kept where it brings the failing channels closer (NNCF's default range is the
            mean of each item's min and max, which clips what a few items' outliers carry).

    Returns:
        What the search found, and whether ``wide`` made it.
    """
    model = opset_13(model)  # the ranking's QDQ copy needs opset 13 (its names stay)
    config = QuantConfig(placement=placement, batch=1)
    batches = calibration_batches(model, calibration, 1, axes)
    judge = fallback.Judge(model, batches, config, runner=runner)
    plan = qdq.plan(model, placement)
    first = build(())
    verdict = judge.evidence(first)
    widened = False
    if wide is not None and not verdict[0] and verdict[2]:
        int8_outputs, targets = judge.outputs, verdict[2]
        candidate = wide(())
        seen = judge.evidence(candidate)
        if seen[0] or judge.loss(targets, judge.outputs) < judge.loss(targets, int8_outputs):
            build, first, verdict, widened = wide, candidate, seen, True
        budget -= 1
    ranges: dict = {}

    def proxy(keep: Sequence[str]) -> onnx.ModelProto:
        return qdq.insert_qdq(model, plan, ranges, symmetric=False, keep_float=keep)

    def effects(layers: Sequence[tuple[str, ...]], targets: Sequence) -> dict[tuple[str, ...], float]:
        ranges.update(calibrate.collect_ranges(model, plan.tensors, batches, per_channel=plan.per_channel))
        return fallback.effects(model, plan, layers, targets, proxy, ranges, config, batches, judge)[1]

    found = mixed.find(
        model, plan.nodes, build, judge.evidence, shapes=evidence.static_shapes(model, batches[0]), mode=mode,
        effects=effects, max_float=max(1, int(len(plan.nodes) * config.max_float_fraction)), budget=budget,
        first=(first, verdict), floatable=[n.name for n in model.graph.node],
    )  # fmt: skip
    return found, widened


def record(found: mixed.Found, widened: bool = False) -> dict[str, Any]:
    """What an artifact's ``artifact.json`` keeps of a search: the nodes left float and why, the evidence,
    the builds judged (with the all-int8 one), and whether the activation ranges were widened to min/max."""
    return {
        "float_layers_met": found.passed,
        "float_nodes": dict(found.reasons) if found.kept else {},
        "float_evidence": list(found.evidence),
        "float_builds": found.builds + widened,
        **({"float_ranges": "min/max"} if widened else {}),
        **({STOPPED_KEY: found.stopped_s} if found.stopped_s is not None else {}),
    }
