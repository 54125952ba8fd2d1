"""Mixed precision from the verdict's evidence: which layers to keep float when int8 fails some outputs.

The judge (:class:`.fallback.Judge`) says which outputs, and which channel groups of them, int8 broke
(:func:`failing`). The layers to keep float are looked for there (:func:`find`), in this order:

1. **The head** of the failing channels (:func:`.evidence.head`): the layers only they need and those their
   channels pass through beside others' (a detector's class branch, and the Concat that puts its logits
   beside the box logits under one int8 scale). Kept float together: the config "int8, head float"
   (``float_layers=head`` stops here, passing or not).
2. **Layers ranked by their effect** on the failing channels (``float_layers=search``): every layer that
   feeds them, alone int8 in an otherwise float model, measured on those channels by the verdict's own
   measure (:func:`.fallback.effects`); the most harmful first. The fewest that pass are found by doubling,
   then bisection, as many as the build budget (:data:`MAX_TRIAL_BUILDS`) allows; where the head passed, only
   the head's layers are ranked, so its fewest are kept.

A layer here is a unit (:func:`units`): a weighted op with the quantized ops that read only its output (its
activation: a SiLU's Mul, a folded Relu), so a layer kept float is float wholly; every other quantized op
is a unit of its own. The search stops at the first passing config of each step; it returns the best it
found within the budget and every layer's reason for staying float (:class:`Found`).

The engines' own quantizers take the same sets: NNCF's ``ignored_scope`` (``adapters/openvino.py``) and ONNX
Runtime's ``nodes_to_exclude`` (``adapters/ort.py``) are built by :func:`find` with their own build and judge,
the ranking measured on an in-house QDQ copy of the model in their placement (:func:`.scope.float_scope`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx

from autodeploy.inhouse.quantize import evidence, qdq
from autodeploy.inhouse.quantize.evidence import Target
from autodeploy.inhouse.search_time import out_of_time

if TYPE_CHECKING:
    from autodeploy.accuracy.records import OutputAccuracy

#: The most candidate builds one search judges (the all-int8 build included): a count, not a clock, so the
#: float set is the same on every machine. Enough for the head, the cap and a doubling and bisection over
#: 64 layers (1 + 1 + 1 + 6 + 3); the search keeps the best passing config it found when it runs out.
MAX_TRIAL_BUILDS = 12
#: ``float_layers`` values: ``search`` (the head, then layers ranked by their effect, until the verdict
#: passes), ``head`` (int8 with the failing channels' head float), ``none`` (every quantizable layer int8).
FLOAT_LAYERS = ("search", "head", "none")

#: Builds a candidate with the given nodes (op names) float.
Build = Callable[[Sequence[str]], Any]
#: Judges a candidate: (passed, score, the channels it fails).
Judged = tuple[bool, dict[str, float], tuple[Target, ...]]


@dataclass(frozen=True)
class Found:
    """A search's outcome: the candidate it chose (its ``kept`` nodes float), whether it passes, its score,
    each kept node's reason, the failing channels of the all-int8 build (``evidence``) and the builds judged."""

    candidate: Any
    kept: tuple[str, ...]
    passed: bool
    score: dict[str, float]
    reasons: dict[str, str] = field(default_factory=dict)
    evidence: tuple[str, ...] = ()
    builds: int = 0
    ranking: dict[str, float] = field(default_factory=dict)
    #: The time limit (:func:`autodeploy.inhouse.search_time.time_limit`) that stopped the search; ``None``: it finished.
    stopped_s: float | None = None


def failing(
    results: Sequence[OutputAccuracy],
    outputs: Mapping[str, np.ndarray],
    reference: Mapping[str, np.ndarray],
    *,
    max_accuracy_drop: float,
    min_cosine: float,
) -> tuple[Target, ...]:
    """The channels a judged candidate fails: every failing channel group of an output judged per group
    (``sqnr``, ``regression``: groups below the limit, as :mod:`autodeploy.accuracy.measure` forms them),
    else the whole failing output."""
    from autodeploy.accuracy import measure
    from autodeploy.accuracy.records import sqnr_for_drop, within
    from autodeploy.accuracy.rules import output_drop, output_measure

    found: list[Target] = []
    for o in results:
        if within(output_drop(o, max_accuracy_drop=max_accuracy_drop, min_cosine=min_cosine), max_accuracy_drop):
            continue
        got, ref = np.asarray(outputs[o.name]), np.asarray(reference[o.name])
        judged = output_measure(o)
        axis = measure.channel_axis(ref) if judged.db and o.channels else None
        if axis is None:
            found.append(Target(o.name))
            continue
        centred = judged.centred
        groups = measure.range_groups(ref, axis) if centred else \
            [list(range(a, b + 1)) for a, b in measure.channel_groups(ref, axis)]  # fmt: skip
        limit = o.min_sqnr_db if o.min_sqnr_db is not None else sqnr_for_drop(max_accuracy_drop)
        for channels in groups:
            part = (slice(None),) * axis + (np.array(channels),)
            db = measure.sqnr_db(got[part], ref[part], centred)
            if math.isnan(db) or db < limit:
                found.append(Target(o.name, axis, tuple(channels), centred))
    return tuple(found)


def loss(targets: Sequence[Target], outputs: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray],
         whole: Callable[[str], float]) -> float:  # fmt: skip
    """How far ``outputs`` fall from ``reference`` on ``targets``, the worst counting: a channel group's
    SQNR as a drop (:func:`autodeploy.accuracy.records.sqnr_drop`), a whole output by ``whole(name)`` (its verdict drop)."""
    from autodeploy.accuracy.measure import sqnr_db
    from autodeploy.accuracy.records import sqnr_drop

    worst = 0.0
    for t in targets:
        if t.axis is None:
            value = whole(t.output)
        else:
            part = (slice(None),) * t.axis + (np.array(t.channels),)
            value = sqnr_drop(sqnr_db(outputs[t.output][part], reference[t.output][part], t.centred))
        worst = max(worst, value if math.isfinite(value) else math.inf)
    return worst


def units(model: onnx.ModelProto, nodes: Sequence[str]) -> list[tuple[str, ...]]:
    """The quantized ``nodes`` as layers, in graph order: each weighted op with the quantized ops that read
    only its output (directly or through float ops of one input, as a SiLU's Mul reads ``x`` and
    ``Sigmoid(x)``); every other node alone."""
    chosen = set(nodes)
    consts = qdq.constants(model.graph)
    producer = {o: n for n in model.graph.node for o in n.output}
    unit_of: dict[str, str] = {}
    members: dict[str, list[str]] = {}
    for node in model.graph.node:
        if node.name not in chosen:
            continue
        lead = None
        if node.op_type not in qdq.WEIGHTED_OPS:
            sources = {_source(i, producer, chosen, consts) for i in node.input if i and i not in consts}
            if len(sources) == 1 and None not in sources:
                lead = unit_of.get(sources.pop())
        lead = lead or node.name
        unit_of[node.name] = lead
        members.setdefault(lead, []).append(node.name)
    return [tuple(m) for m in members.values()]


def _source(tensor: str, producer: Mapping[str, onnx.NodeProto], chosen: set[str], consts: Mapping) -> str | None:
    """The quantized node ``tensor`` comes from, through float ops of one activation input; None if none."""
    for _ in range(8):
        node = producer.get(tensor)
        if node is None:
            return None
        if node.name in chosen:
            return node.name
        inputs = [i for i in node.input if i and i not in consts]
        if len(inputs) != 1:
            return None
        tensor = inputs[0]
    return None


def find(
    model: onnx.ModelProto,
    nodes: Sequence[str],
    build: Build,
    judge: Callable[[Any], Judged],
    *,
    shapes: Mapping[str, Sequence[int]],
    mode: str = "search",
    effects: Callable[[Sequence[tuple[str, ...]], Sequence[Target]], dict[tuple[str, ...], float]] | None = None,
    max_float: int | None = None,
    budget: int = MAX_TRIAL_BUILDS,
    first: tuple[Any, Judged] | None = None,
    floatable: Collection[str] | None = None,
) -> Found:
    """The fewest ``nodes`` (quantized ops of ``model``) to keep float for ``judge`` to pass, from its evidence.

    Args:
        build: A candidate with the given nodes float (``()``: every node int8).
        judge: Whether a candidate passes, its score, and the channels it fails (:func:`failing`).
        shapes: ``model``'s tensor shapes at the calibration items' (:func:`.evidence.static_shapes`).
        mode: ``head`` or ``search`` (:data:`FLOAT_LAYERS`; ``none`` is never searched).
        effects: Each unit's harm to the failing channels when alone int8 (higher: worse), for ``search``.
        max_float: At most this many nodes float (default: all).
        budget: The most candidates judged, the all-int8 one included.
        first: The all-int8 candidate and its verdict where the caller judged it already.
        floatable: The nodes the head may keep float (default ``nodes``): an engine's quantizer takes any op
            (ONNX Runtime quantizes a ``Split``, which the in-house placements never do).
    """
    calls, stopped = 0, None

    def judged(keep: Sequence[str]) -> tuple[Any, Judged]:
        nonlocal calls
        calls += 1
        candidate = build(tuple(keep))
        return candidate, judge(candidate)

    if first is None:
        first = judged(())
    else:
        calls += 1
    candidate, (passed, score, targets) = first
    if passed or not targets or mode not in ("head", "search"):
        return Found(candidate, (), passed, score, builds=calls)
    told = tuple(t.text() for t in targets)
    int8 = Found(candidate, (), False, score, evidence=told)
    layers = units(model, nodes)
    # each failing group's own head (against every other channel, failing or not): where every channel of an
    # output fails (YOLOX's boxes and scores), the heads of its groups, not the whole model that feeds them all
    mine = {n for t in targets for n in evidence.head(model, [t], shapes)}
    cap = len(nodes) if max_float is None else max_float
    layered = set(nodes)
    kept_ok = layered if floatable is None else set(floatable)
    head = units(model, [n.name for n in model.graph.node if n.name in mine and n.name in kept_ok])
    head_nodes = tuple(n for u in head for n in u)
    found_head, stopped = None, out_of_time()
    if head and sum(n in layered for n in head_nodes) <= cap and stopped is None:  # the cap counts quantizable ops only
        got, (ok, got_score, _) = judged(head_nodes)
        why = f"the head of {_joined(told)}, which all-int8 failed ({_worst(score)})"
        found_head = Found(got, head_nodes, ok, got_score, dict.fromkeys(head_nodes, why), told, calls)
    if mode == "head":
        return _counted(found_head or int8, calls, stopped_s=stopped)
    if found_head is not None and found_head.passed and len(head) == 1:
        return _counted(found_head, calls)
    feeding = evidence.feeders(model, targets, shapes)
    pool = head if found_head is not None and found_head.passed else [u for u in layers if any(n in feeding for n in u)]
    stopped = stopped or out_of_time()
    if effects is None or not pool or stopped is not None:
        best = found_head if found_head is not None and found_head.passed else int8
        return _counted(best, calls, stopped_s=stopped if pool else None)
    harm = effects(pool, targets)
    ranked = sorted(pool, key=lambda u: -harm[u])
    why = {u: f"rank {i + 1} of {len(ranked)} by its effect on {_joined(told)}" + (" (its head)" if u in head else "")
              + f": alone int8 it loses {harm[u]:.3g}" for i, u in enumerate(ranked)}  # fmt: skip
    tried: dict[int, Found] = {}
    if found_head is not None and found_head.passed:
        tried[len(ranked)] = found_head  # the whole head passes: its fewest layers are looked for

    def holds(k: int) -> bool | None:
        """Whether the ``k`` most harmful layers float pass; None once the budget (builds or time) is spent."""
        nonlocal stopped
        if k not in tried:
            stopped = out_of_time()
            if calls >= budget or stopped is not None:
                return None
            keep = tuple(n for u in ranked[:k] for n in u)
            got, (ok, got_score, _) = judged(keep)
            tried[k] = Found(got, keep, ok, got_score, {n: why[u] for u in ranked[:k] for n in u}, told, calls)
        return tried[k].passed

    limit = len(ranked)
    while limit > 1 and sum(len(u) for u in ranked[:limit]) > cap:
        limit -= 1
    if not holds(limit):  # even the cap fails (or no build is left): floats would cost speed and not pass
        return _counted(int8, calls, harm, ranked, stopped)
    k = 1
    while k < limit and holds(k) is False:
        k *= 2
    lo, hi = (k // 2 + 1 if k > 1 else 1), min(k, limit)
    while lo < hi:
        mid = (lo + hi) // 2
        held = holds(mid)
        if held is None:
            break
        lo, hi = (lo, mid) if held else (mid + 1, hi)
    fewest = min(k for k, f in tried.items() if f.passed)
    return _counted(tried[fewest], calls, harm, ranked, stopped)


def _counted(f: Found, calls: int, harm: Mapping[tuple[str, ...], float] | None = None,
             ranked: Sequence[tuple[str, ...]] = (), stopped_s: float | None = None) -> Found:  # fmt: skip
    """``f`` with the builds judged, the ranking (node -> its layer's harm) and the time limit that stopped it."""
    ranking = {n: round(float(harm[u]), 6) for u in ranked for n in u} if harm else {}
    return replace(f, builds=calls, ranking=ranking, stopped_s=stopped_s)


def _joined(parts: Sequence[str]) -> str:
    return parts[0] if len(parts) == 1 else f"{parts[0]} and {len(parts) - 1} more"


def _worst(score: Mapping[str, float]) -> str:
    shown = [f"{k} {v:g}" for k, v in score.items() if k.endswith(("SQNR", "F1", "agreement"))]
    return ", ".join(shown[:2]) or "its verdict failed"
