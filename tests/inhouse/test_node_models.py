"""The default pipeline over every node test model of the ``onnx`` package.

The models are ``onnx/backend/test/data/node/*/model.onnx`` with their ``test_data_set_0``
inputs; wheels that leave that folder out still carry the generator that writes it
(``onnx.backend.test.case.node``), which builds the same models and inputs in memory.

For each model: the pipeline either changes nothing (the very same object comes back) or its
output passes ``onnx.checker`` and, run on the test's own inputs, agrees with the original's
outputs within tolerance (ONNX Runtime for both, or ``onnx.reference`` where ORT cannot load
the original). Counts are printed with ``-s``.
"""

from __future__ import annotations

import collections
import functools
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from autodeploy.inhouse.passes import optimize

NODE_DIR = Path(onnx.__file__).parent / "backend" / "test" / "data" / "node"


@functools.cache
def node_models() -> list[tuple[str, onnx.ModelProto, dict[str, np.ndarray] | None]]:
    """(name, model, inputs or None) for every node test; inputs are None when not plain tensors."""
    files = sorted(NODE_DIR.glob("*/model.onnx"))
    if files:
        return [(f.parent.name, onnx.load(str(f)), None) for f in files]
    import warnings

    from onnx.backend.test.case import node

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        cases = node.collect_testcases(None)
    out = []
    for case in cases:
        inputs = case.data_sets[0][0] if case.data_sets else None
        names = [i.name for i in case.model.graph.input]
        plain = (
            inputs is not None
            and len(inputs) == len(names)
            and all(isinstance(a, np.ndarray) for a in inputs)
        )
        out.append((case.name, case.model, dict(zip(names, inputs, strict=True)) if plain else None))
    return out


def _inputs(name: str, model: onnx.ModelProto) -> dict[str, np.ndarray] | None:
    folder = NODE_DIR / name
    data = folder / "test_data_set_0"
    files = sorted(data.glob("input_*.pb"), key=lambda p: int(p.stem.split("_")[1]))
    names = [i.name for i in model.graph.input if i.name not in {t.name for t in model.graph.initializer}]
    if len(files) != len(names):
        return None
    feeds = {}
    for name, file in zip(names, files, strict=True):
        tensor = onnx.TensorProto()
        try:
            tensor.ParseFromString(file.read_bytes())
            feeds[name] = numpy_helper.to_array(tensor)
        except Exception:  # sequences/optionals: not plain tensors, compared only structurally
            return None
    return feeds


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray] | None:
    import onnxruntime as ort

    try:
        options = ort.SessionOptions()
        options.log_severity_level = 4
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        return session.run(None, feeds)
    except Exception:
        return None


def _reference(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray] | None:
    from onnx.reference import ReferenceEvaluator

    try:
        return ReferenceEvaluator(model).run(None, feeds)
    except Exception:
        return None


def _close(a: object, b: object) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype.kind in "fc":
        return bool(np.allclose(a, b, rtol=1e-3, atol=1e-4, equal_nan=True))
    return bool(np.array_equal(a, b))


@pytest.mark.slow
def test_pipeline_keeps_every_node_test_model_correct():
    # The onnxruntime target enables every rule (the onnx target only refuses some of them).
    target = "onnxruntime"
    models = node_models()
    assert len(models) > 1000, f"expected the onnx node test models, found {len(models)}"
    counts: collections.Counter[str] = collections.Counter()
    failures = []
    for name, model, generated in models:
        out, report = optimize(model, target=target)
        counts["models"] += 1
        counts["rolled back passes"] += len(report.rolled_back)
        if out is model:
            assert not report.changed
            counts["unchanged"] += 1
            continue
        counts["changed"] += 1
        onnx.checker.check_model(out)
        assert [i.name for i in out.graph.input] == [i.name for i in model.graph.input]
        assert [o.name for o in out.graph.output] == [o.name for o in model.graph.output]
        feeds = generated if generated is not None else _inputs(name, model)
        if feeds is None:
            counts["changed, inputs not loadable"] += 1
            continue
        before, after = _run(model, feeds), _run(out, feeds)
        if before is None:  # ORT cannot run the original: the reference evaluator judges both
            before, after = _reference(model, feeds), _reference(out, feeds)
        if before is None:
            counts["changed, no runtime runs the original"] += 1
            continue
        counts["compared"] += 1
        if after is None or not all(_close(a, b) for a, b in zip(after, before, strict=True)):
            failures.append(name)
    print(f"\n{target}: {dict(counts)}")
    assert not failures, f"outputs changed for {len(failures)} models: {failures[:20]}"
