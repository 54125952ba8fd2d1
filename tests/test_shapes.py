"""Shapes as a dimension: parsing shape sets, bench at several shapes (one trial and one stored
measurement per shape, each compiled for its shape), the weighted objective, TensorRT profiles
spanning the shapes, the onnx2tf input graph per shape, bundles that know their shapes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

import autodeploy
from autodeploy.errors import ShapeError, UsageError
from autodeploy.harness.timing import TimingPolicy
from autodeploy.model import load_model
from autodeploy.objectives import of as objective_of
from autodeploy.results_db import Store, TrialFilter
from autodeploy.search import config as study_config
from autodeploy.search.objective import Metrics
from autodeploy.search.rounds import _mix
from autodeploy.search.screening import combine
from autodeploy.shapes import ShapeCase, ShapeSet, from_config, parse_flags, parse_key
from tests.models import paddle_like

FAST = TimingPolicy(warmup_min_calls=2, warmup_max_s=0.2, min_samples=16, min_duration_s=0.05, max_duration_s=5)
NARROW, WIDE = (1, 3, 16, 24), (1, 3, 16, 48)


@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTODEPLOY_CACHE", str(tmp_path / "cache"))
    return tmp_path, f"sqlite:///{tmp_path / 'r.db'}"


# -- the shape set --------------------------------------------------------------------------


def test_repeated_flags_make_one_case_per_shape_and_inputs_given_once_join_every_case():
    shapes = parse_flags(["ids=1x8", "ids=1x16@3", "mask=1x8", "mask=1x16", "table=4x2"])
    assert [c.key() for c in shapes.cases] == ["ids=1x8;mask=1x8;table=4x2", "ids=1x16;mask=1x16;table=4x2"]
    assert [c.weight for c in shapes.cases] == [1.0, 3.0] and shapes.share(shapes.cases[1]) == 0.75
    assert shapes.ranges()["ids"] == ((1, 8), (1, 16))
    assert parse_key(shapes.cases[1].key()) == {"ids": (1, 16), "mask": (1, 16), "table": (4, 2)}


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["x=1x3", "x=1x4", "y=1x2", "y=1x3", "y=1x4"], "inputs given several shapes must be given as many each"),
        (["x=1x3@0"], "cannot parse the weight"),
        (["x=1x3", "x=1x3"], "shape x=1x3 is given twice"),
        (["x=1xW"], "cannot parse --shape 'x=1xW'"),
    ],
)
def test_bad_shape_flags_say_what_and_how(flags, message):
    with pytest.raises(ShapeError, match=message):
        parse_flags(flags)


def test_a_config_gives_one_shape_a_list_or_a_weighted_mix_and_stores_a_canonical_form():
    mix = {"x": [{"shape": "1x3x48x320", "weight": 3}, {"shape": [1, 3, 48, 640]}]}
    cfg = study_config.validate({"model": "m", "shapes": mix}, {})
    assert cfg.shapes == {"x": [{"shape": [1, 3, 48, 320], "weight": 3.0}, {"shape": [1, 3, 48, 640], "weight": 1.0}]}
    assert cfg.shape_set() == ShapeSet((ShapeCase({"x": (1, 3, 48, 320)}, 3.0), ShapeCase({"x": (1, 3, 48, 640)})))
    # one shape keeps the form studies stored before shape sets (a resume reads them unchanged)
    assert study_config.validate({"model": "m", "shapes": {"x": "1x3x8x8"}}, {}).shapes == {"x": [1, 3, 8, 8]}
    assert from_config({"x": [[1, 2], [1, 4]]}).several
    with pytest.raises(UsageError, match=r"invalid study config: shapes: .*weight"):
        study_config.validate({"model": "m", "shapes": {"x": [{"shape": "1x2", "weight": "heavy"}]}}, {})


def test_a_shape_that_contradicts_a_fixed_dim_names_the_input_the_ask_and_the_declaration(tmp_path):
    model = load_model(paddle_like(tmp_path / "p.onnx"))
    with pytest.raises(ShapeError) as caught:
        model.at_shapes({"x": (1, 4, 16, 24)})
    text = str(caught.value)
    assert "\n" not in text and "'x'" in text and "1x4x16x24" in text and "?x3x?x?" in text and "fixed at 3" in text


# -- the weighted objective ------------------------------------------------------------------


def test_the_mix_is_the_expected_latency_the_harmonic_throughput_and_the_worst_accuracy():
    narrow = Metrics("a", median_ms=1.0, p90_ms=2.0, throughput=1000.0, peak_rss_mb=10, accuracy_drop=0.0)
    wide = Metrics("b", median_ms=4.0, p90_ms=8.0, throughput=250.0, peak_rss_mb=30, accuracy_drop=0.02)
    mixed = combine([(3.0, narrow), (1.0, wide)])
    assert mixed.p90_ms == pytest.approx((3 * 2 + 8) / 4) and mixed.median_ms == pytest.approx(7 / 4)
    assert mixed.throughput == pytest.approx(4 / (3 / 1000 + 1 / 250))  # items/s of the mix
    assert mixed.peak_rss_mb == 30 and mixed.accuracy_drop == 0.02  # the worst shape decides
    # the mix decides the winner: fast at the frequent shape beats even, and the other way round
    fast_narrow = (Metrics("a", 1, 1.0, None, None, 0.0), Metrics("b", 8, 8.0, None, None, 0.0))
    even = (Metrics("c", 3, 3.0, None, None, 0.0), Metrics("d", 3, 3.0, None, None, 0.0))

    def p90(pair, weights):
        return combine(list(zip(weights, pair, strict=True))).p90_ms

    assert p90(fast_narrow, (3, 1)) == pytest.approx(2.75) and p90(even, (3, 1)) == pytest.approx(3.0)
    assert p90(fast_narrow, (1, 3)) == pytest.approx(6.25) and p90(even, (1, 3)) == pytest.approx(3.0)
    stat, ci = _mix([(3.0, 2.0, (1.5, 2.5)), (1.0, 8.0, (7.0, 9.0))], objective_of("latency"))
    assert stat == pytest.approx(3.5) and ci == pytest.approx((2.875, 4.125))


# -- TensorRT profile (pure: no TensorRT needed) ----------------------------------------------


def test_a_tensorrt_profile_spans_every_shape_and_is_tuned_for_the_trials_own(tmp_path):
    from autodeploy.adapters.base import TrialConfig
    from autodeploy.adapters.tensorrt import TensorRTEngine, profile_shapes
    from autodeploy.runtime.tensorrt import check_profile

    model = load_model(paddle_like(tmp_path / "p.onnx"))
    shapes = ShapeSet((ShapeCase({"x": NARROW}), ShapeCase({"x": WIDE})))
    at_narrow = model.at_shapes(dict(shapes.cases[0].shapes), shapes.ranges())
    low, opt, high = profile_shapes(at_narrow, batch=2)["x"]
    assert (low, opt, high) == ((1, 3, 16, 24), (2, 3, 16, 24), (8, 3, 16, 48))
    alone = model.at_shapes({"x": NARROW})
    assert profile_shapes(alone, batch=1)["x"] == ((1, 3, 16, 24), (1, 3, 16, 24), (8, 3, 16, 24))
    engine, config = TensorRTEngine(), TrialConfig("tensorrt", "fp16", 1, None)
    assert engine.build_key(at_narrow, config, "10", "") != engine.build_key(alone, config, "10", "")
    profile = {"x": {"min": list(low), "opt": list(opt), "max": list(high)}}
    check_profile(profile, {"x": (1, 3, 16, 40)})  # inside: no error
    with pytest.raises(ShapeError, match=r"input 'x' of shape 1x3x16x64 is outside .* \(1x3x16x24 \.\. 8x3x16x48\)"):
        check_profile(profile, {"x": (1, 3, 16, 64)})


def test_tensorrt_builds_a_plan_per_shape_with_the_spanning_profile(tmp_path):
    from autodeploy.adapters import registry
    from autodeploy.adapters.base import TrialConfig
    from autodeploy.device import probe_device

    engine = registry.get("tensorrt")
    available = engine.probe(probe_device())
    if not available.available:
        pytest.skip(f"tensorrt: {available}")
    model = load_model(paddle_like(tmp_path / "p.onnx"))
    shapes = ShapeSet((ShapeCase({"x": NARROW}), ShapeCase({"x": WIDE})))
    artifact = engine.build(model.at_shapes({"x": WIDE}, shapes.ranges()), TrialConfig("tensorrt", "fp32", 1, None),
                            None, tmp_path / "work", target=probe_device())  # fmt: skip
    assert artifact.meta["profile"]["x"] == {"min": [1, 3, 16, 24], "opt": [1, 3, 16, 48], "max": [8, 3, 16, 48]}


# -- TFLite: the fixed shape written into the graph onnx2tf converts ---------------------------


def test_the_onnx2tf_input_graph_has_each_cases_fixed_shape(tmp_path):
    pytest.importorskip("onnx")
    from autodeploy.adapters.tflite import _fixed_graph

    model = load_model(paddle_like(tmp_path / "p.onnx"))
    for i, shape in enumerate((NARROW, WIDE)):
        scratch = tmp_path / f"case{i}"
        scratch.mkdir()
        fixed = onnx.load(str(_fixed_graph(model.at_shapes({"x": shape}), scratch)))
        dims = [d.dim_value for d in fixed.graph.input[0].type.tensor_type.shape.dim]
        out = [d.dim_value for d in fixed.graph.output[0].type.tensor_type.shape.dim]
        assert dims == list(shape) and out == [1, 4, *shape[2:]]


# -- bench at several shapes, stored per shape --------------------------------------------------


@pytest.mark.parametrize("engine", ["onnxruntime", "openvino"])
def test_bench_at_two_shapes_measures_and_stores_each_compiled_for_its_shape(env, engine):
    from autodeploy.adapters import registry
    from autodeploy.adapters.base import Artifact
    from autodeploy.device import probe_device

    available = registry.get(engine).probe(probe_device())
    if not available.available:
        pytest.skip(f"{engine}: {available}")
    tmp_path, db = env
    model = paddle_like(tmp_path / "p.onnx")
    shapes = parse_flags([f"x={'x'.join(map(str, NARROW))}", f"x={'x'.join(map(str, WIDE))}@3"])
    with pytest.raises(UsageError, match="bench measures one shape; 2 were given"):
        autodeploy.bench(model, engine=engine, shapes=shapes, db=db)
    stored = autodeploy.bench_shapes(model, engine=engine, threads=1, shapes=shapes, timing=FAST, db=db)
    assert [s.shape_key for s in stored] == ["x=1x3x16x24", "x=1x3x16x48"]
    assert all(s.ok and s.result.measurement is not None for s in stored), [s.result.failure_message for s in stored]
    assert stored[0].result.artifact_path != stored[1].result.artifact_path  # one artifact per shape
    with Store.open(db, readonly=True) as store:
        rows = [store.trial(TrialFilter(id=s.id)) for s in stored]
        assert [r.shape_key for r in rows] == ["x=1x3x16x24", "x=1x3x16x48"]
        assert [r.shapes for r in rows] == [{"x": list(NARROW)}, {"x": list(WIDE)}]
        assert all(r.measurement is not None and r.measurement.latency.n >= 16 for r in rows)
        # a repeat is found at its own shape, never at the other
        found = store.trial(TrialFilter(model_sha256=rows[1].model_sha256, device=rows[1].device_fingerprint,
                                        config_key=rows[1].config_key, engine_version=rows[1].engine_version,
                                        shape_key="x=1x3x16x48", measured_only=True, newest_first=True))  # fmt: skip
        assert found is not None and found.id == stored[1].id
    for s, shape in zip(stored, (NARROW, WIDE), strict=True):
        artifact = Artifact.read(Path(s.result.artifact_path))
        adapter = registry.get(engine)
        settings = adapter.runtime_settings(artifact, s.config, s.model)
        if engine == "openvino":
            assert settings["shapes"] == {"x": list(shape)}
            with adapter.load(artifact, s.config, s.model) as runner:  # compiled statically at this shape
                assert list(runner.compiled_model.input("x").get_shape()) == list(shape)
        x = np.ones(shape, np.float32)
        with adapter.load(artifact, s.config, s.model) as runner:
            assert runner.run({"x": x})["y"].shape == (1, 4, *shape[2:])


@pytest.mark.slow  # onnx2tf converts through TensorFlow: about a minute per shape on a loaded machine
def test_tflite_converts_one_artifact_per_shape_each_with_its_shape_written_in(env):
    from autodeploy.adapters import registry
    from autodeploy.device import probe_device

    available = registry.get("tflite").probe(probe_device())
    if not available.available or available.reason:  # the runtime without onnx2tf converts nothing
        pytest.skip(f"tflite: {available}")
    tmp_path, db = env
    model = paddle_like(tmp_path / "p.onnx")
    stored = autodeploy.bench_shapes(model, engine="tflite", threads=1, shapes=parse_flags(["x=1x3x16x24", "x=1x3x16x48"]),
                                     timing=FAST, db=db)  # fmt: skip
    assert all(s.ok for s in stored), [s.result.failure_message for s in stored]
    assert stored[0].result.artifact_path != stored[1].result.artifact_path
    assert all(s.result.accuracy.outputs[0].cosine > 0.999 for s in stored)  # each shape's outputs match ORT's


def test_bench_checks_every_shape_before_any_work(env):
    tmp_path, db = env
    model = paddle_like(tmp_path / "p.onnx")
    with pytest.raises(ShapeError, match=r"x=1x4x16x48 does not fit input 'x' \(\?x3x\?x\?\): axis 1 is fixed at 3"):
        autodeploy.bench_shapes(model, shapes=parse_flags(["x=1x3x16x24", "x=1x4x16x48"]), db=db)
    assert not (tmp_path / "r.db").exists()  # refused before the store was even opened


# -- a study over a weighted mix, and per shape -------------------------------------------------


@pytest.mark.slow  # about 25 s on a loaded 2-core machine: screening, finalists and the baseline at two shapes
def test_a_study_over_two_shapes_picks_one_config_by_the_mix_and_reports_each_shape(env, capsys, monkeypatch):
    tmp_path, db = env
    model = paddle_like(tmp_path / "p.onnx")
    mix = {"x": [{"shape": "1x3x16x24", "weight": 3}, {"shape": "1x3x16x48", "weight": 1}]}
    summary = autodeploy.tune(model, name="mix", engines=["onnxruntime"], precisions=["fp32"], threads=[1],
                              trials=1, shapes=mix, min_samples=16, min_duration_s=0.05, db=db,
                              config={"finalists": {"count": 1, "rounds": 1, "min_samples": 16, "min_duration_s": 0.05}})  # fmt: skip
    assert summary.winner is not None and set(summary.winner.per_shape) == {"x=1x3x16x24", "x=1x3x16x48"}
    per = summary.winner.per_shape
    assert summary.winner.statistic == pytest.approx(_mix([(3.0, per["x=1x3x16x24"], (0, 0)),
                                                           (1.0, per["x=1x3x16x48"], (0, 0))], objective_of("latency"))[0])  # fmt: skip
    with Store.open(db, readonly=True) as store:
        rows = store.trials(TrialFilter(study="mix"))
        assert {r.shape_key for r in rows} == {"x=1x3x16x24", "x=1x3x16x48"}
        assert store.get_study("mix").settings["shapes"] == {"x": [{"shape": [1, 3, 16, 24], "weight": 3.0},
                                                                   {"shape": [1, 3, 16, 48], "weight": 1.0}]}  # fmt: skip
    # the bundle records the shapes it was measured on, and warns at a shape it was not
    path = autodeploy.export("mix", tmp_path / "ship", db=db)
    manifest = json.loads((path / "manifest.json").read_text())
    assert [c["shape"] for c in manifest["shapes"]["measured"]] == [{"x": list(NARROW)}, {"x": list(WIDE)}]
    assert [c["weight"] for c in manifest["shapes"]["measured"]] == [3.0, 1.0]
    with autodeploy.bundle.load(path) as predictor:
        with pytest.warns(UserWarning, match=r"input 'x' of shape 1x3x16x40 was not measured"):
            predictor.run({"x": np.ones((1, 3, 16, 40), np.float32)})
        predictor.run({"x": np.ones(WIDE, np.float32)})  # measured: no new warning
        assert len(predictor.warnings) == 1

    # Every number names its shape (issue 39): the winner line, the shipped trial's, each shape's, the selection's.
    assert summary.shapes == [{"shape": "x=1x3x16x24", "weight": 3.0}, {"shape": "x=1x3x16x48", "weight": 1.0}]
    assert " over shapes x=1x3x16x24 and x=1x3x16x48 (their mean, weighted 3:1)" in summary.headline()
    shipped = {**manifest["measurements"], "trial_id": manifest["source"]["trial_id"]}
    assert manifest["shapes"]["shipped"] == "x=1x3x16x48" and manifest["shapes"]["fed"] == {"x": list(WIDE)}  # last
    by_shape = {o["shape"]: o for o in manifest["by_shape"]}
    assert list(by_shape) == ["x=1x3x16x24", "x=1x3x16x48"] and by_shape["x=1x3x16x48"]["trial_id"] == shipped["trial_id"]
    narrow = by_shape["x=1x3x16x24"]
    assert narrow["fed"] == {"x": list(NARROW)} and narrow["weight"] == 3.0 and narrow["trial_id"] < shipped["trial_id"]
    assert narrow["median_ms"] > 0 and narrow["scenario"] == "single-stream"
    with Store.open(db, readonly=True) as store:  # the same config, at the other shape
        assert store.trial(TrialFilter(id=narrow["trial_id"])).config_key == store.trial(
            TrialFilter(id=shipped["trial_id"])).config_key  # fmt: skip
    selection = manifest["selection"]
    assert selection["statistic"] in ("p90", "median") and selection["rounds"] == 1
    assert [c["shape"] for c in selection["shapes"]] == ["x=1x3x16x24", "x=1x3x16x48"]
    assert "over shapes x=1x3x16x24 and x=1x3x16x48" in selection["headline"]

    # bundle run --shape measures another shape, beside the manifest's numbers at that shape; a shape the study
    # never measured stands alone, and says so.
    from autodeploy.cli import _common
    from tests.cli_runner import run_cli

    monkeypatch.setattr(_common.out, "width", 200)  # wide tables, so cells are not wrapped
    code, out, err = run_cli(capsys, "bundle", "run", str(path), "--shape", "x=1x3x16x24", "--min-samples", "16",
                             "--min-duration", "0.05")  # fmt: skip
    assert code == 0, err
    assert "at x=1x3x16x24" in out and f"one run, trial {narrow['trial_id']}" in out, out
    with pytest.warns(UserWarning, match=r"input 'x' of shape 1x3x16x40 was not measured"):
        code, out, err = run_cli(capsys, "bundle", "run", str(path), "--shape", "x=1x3x16x40", "--min-samples", "16",
                                 "--min-duration", "0.05")  # fmt: skip
    assert code == 0 and "at x=1x3x16x40" in out, err
    assert "never measured at x=1x3x16x40: its manifest has numbers at x=1x3x16x24, x=1x3x16x48" in " ".join(err.split())
    code, _, err = run_cli(capsys, "bundle", "run", str(path), "--shape", "x=1x4x16x24")
    assert code != 0 and "does not fit input 'x'" in err


@pytest.mark.slow  # three small studies: about 30 s on a loaded 2-core machine
def test_per_shape_runs_one_study_per_shape(env):
    tmp_path, db = env
    model = paddle_like(tmp_path / "p.onnx")
    summaries = autodeploy.tune_per_shape(model, name="each", shapes=parse_flags(["x=1x3x16x24", "x=1x3x16x48"]),
                                          engines=["onnxruntime"], precisions=["fp32"], threads=[1], trials=1,
                                          finalists=0, min_samples=16, min_duration_s=0.05, db=db)  # fmt: skip
    assert [s.name for s in summaries] == ["each@x=1x3x16x24", "each@x=1x3x16x48"]
    assert all(not s.winner.per_shape for s in summaries if s.winner)  # one shape each: nothing to split
    assert all(s.winner is not None for s in summaries)
    with Store.open(db, readonly=True) as store:
        assert {r.shape_key for r in store.trials(TrialFilter(study="each@x=1x3x16x48"))} == {"x=1x3x16x48"}
    # a mix screened without finalists still reports the winner at each shape
    mix = autodeploy.tune(model, name="mix0", shapes=parse_flags(["x=1x3x16x24@3", "x=1x3x16x48"]),
                          engines=["onnxruntime"], precisions=["fp32"], threads=[1], trials=1, finalists=0,
                          min_samples=64, min_duration_s=0.05, db=db, fresh=True)  # 64: a p90 at both shapes  # fmt: skip
    per = mix.winner.per_shape
    assert set(per) == {"x=1x3x16x24", "x=1x3x16x48"}
    assert mix.winner.statistic == pytest.approx((3 * per["x=1x3x16x24"] + per["x=1x3x16x48"]) / 4)
    with pytest.raises(UsageError, match="per_shape"):
        autodeploy.tune(model, name="x", per_shape=True, shapes=parse_flags(["x=1x3x16x24", "x=1x3x16x48"]), db=db)


# -- bundles: refuse outside a TensorRT profile, warn elsewhere -------------------------------------


def test_the_loader_refuses_a_shape_outside_a_tensorrt_profile_and_warns_for_other_engines():
    from autodeploy.bundle.loader import BundleError, check_shapes

    record = {"measured": [{"shape": {"x": list(NARROW)}, "weight": 1.0}, {"shape": {"x": list(WIDE)}, "weight": 1.0}],
              "fed": {"x": list(NARROW)}, "batch_axes": {"x": 0}}  # fmt: skip
    ort = {"runtime": {}, "shapes": record}
    assert check_shapes(ort, {"x": (4, 3, 16, 48)}) == []  # another batch of a measured shape
    assert check_shapes(ort, {"x": (1, 3, 16, 40)}) == [
        "input 'x' of shape 1x3x16x40 was not measured (measured: 1x3x16x24, 1x3x16x48); speed and accuracy at it are unknown"
    ]
    trt = {"runtime": {"profile": {"x": {"min": [1, 3, 16, 24], "opt": [1, 3, 16, 24], "max": [8, 3, 16, 48]}}},
           "shapes": record}  # fmt: skip
    assert check_shapes(trt, {"x": (1, 3, 16, 40)})  # inside the profile: a warning, not a refusal
    with pytest.raises(BundleError, match=r"outside the TensorRT plan's optimization profile \(1x3x16x24 \.\. 8x3x16x48\)"):
        check_shapes(trt, {"x": (1, 3, 16, 64)})
    assert check_shapes({"runtime": {}}, {"x": (1, 3, 16, 64)}) == []  # a bundle from before shapes were recorded


# -- data at several shapes: images resized to each, arrays one source per shape -------------------


def _pngs(folder: Path, n: int = 6) -> Path:
    """A folder of small PNG crops of scikit-learn's sample photos."""
    PIL = pytest.importorskip("PIL.Image")
    from autodeploy.images import sample_crops

    folder.mkdir(parents=True)
    for i, crop in enumerate(sample_crops(n, 40, 50, seed=3)):
        PIL.fromarray(crop).save(folder / f"{i}.png")
    return folder


def test_an_image_folder_is_resized_to_each_shape(env):
    tmp_path, db = env
    model = paddle_like(tmp_path / "p.onnx")
    folder = _pngs(tmp_path / "imgs")
    from autodeploy.api._common import with_data
    from autodeploy.intake import resolve_model

    shapes = parse_flags(["x=1x3x16x24", "x=1x3x16x48"])
    resolved = resolve_model(str(model), None)
    loaded = [with_data(resolved, None, str(folder), case, shapes) for case in shapes.cases]
    assert [d.inputs["x"].shape for _, d in loaded] == [(6, 3, 16, 24), (6, 3, 16, 48)]
    assert all(d.inputs["x"].max() > 1 for _, d in loaded)  # pixels 0..255, not noise
    stored = autodeploy.bench_shapes(model, threads=1, shapes=shapes, data=folder, timing=FAST, db=db)
    assert all(s.ok for s in stored), [s.result.failure_message for s in stored]
    assert not any("inputs" in s.result.extra for s in stored)  # no "judged on synthetic inputs" note


def test_arrays_come_one_source_per_shape_in_the_order_of_the_shapes(env, capsys):
    from autodeploy.errors import DataError
    from tests.cli_runner import run_cli

    tmp_path, db = env
    model = paddle_like(tmp_path / "p.onnx")
    rng = np.random.default_rng(0)
    for name, shape in (("narrow", NARROW), ("wide", WIDE)):
        np.savez(tmp_path / f"{name}.npz", x=rng.standard_normal((4, *shape[1:])).astype(np.float32))
    narrow, wide = str(tmp_path / "narrow.npz"), str(tmp_path / "wide.npz")
    shapes = parse_flags(["x=1x3x16x24", "x=1x3x16x48"])
    with pytest.raises(DataError, match=r"^shape x=1x3x16x48 has no matching data: input data 'x' has items of "
                                        r"shape \(3, 16, 24\), the model wants \(3, 16, 48\); fix: give arrays of each shape"):  # fmt: skip
        autodeploy.bench_shapes(model, shapes=shapes, data=narrow, db=db)
    with pytest.raises(DataError, match=r"^shape x=1x3x16x24 has no matching data"):
        autodeploy.bench_shapes(model, shapes=shapes, data=[wide, narrow], db=db)
    with pytest.raises(UsageError, match=r"3 data sources for 2 shapes \(x=1x3x16x24, x=1x3x16x48\)"):
        autodeploy.bench_shapes(model, shapes=shapes, data=[narrow, wide, wide], db=db)
    assert not (tmp_path / "r.db").exists()  # refused before the store was opened
    code, out, err = run_cli(capsys, "bench", str(model), "--threads", "1", "--min-samples", "16", "--min-duration", "0.05",
                             "--shape", "x=1x3x16x24", "--shape", "x=1x3x16x48", "--data", narrow, "--data", wide,
                             "--db", db, "--format", "json")  # fmt: skip
    assert code == 0, err
    records = json.loads(out)
    assert [r["shape"] for r in records] == ["x=1x3x16x24", "x=1x3x16x48"]
    assert not any(r["inputs"] for r in records)  # measured on the user's arrays, not synthetic ones
    with Store.open(db, readonly=True) as store:
        trials = [store.trial(TrialFilter(id=r["id"])) for r in records]
    assert all(t.measurement is not None for t in trials)
    code, _, err = run_cli(capsys, "bench", str(model), "--shape", "x=1x3x16x24", "--shape", "x=1x3x16x48",
                           "--data", narrow, "--db", db)  # fmt: skip
    assert code == 2 and "shape x=1x3x16x48 has no matching data" in err and "Traceback" not in err
    # without --shape, each --data's arrays fix one shape
    stored = autodeploy.bench_shapes(model, threads=1, data=[Path(narrow), Path(wide)], timing=FAST, db=db)
    assert [s.shape_key for s in stored] == ["x=1x3x16x24", "x=1x3x16x48"] and all(s.ok for s in stored)
    with Store.open(db, readonly=True) as store:
        assert [store.trial(TrialFilter(id=s.id)).inputs["data"] for s in stored] == [narrow, wide]  # the files, as given
    code, out, err = run_cli(capsys, "bench", str(model), "--threads", "1", "--min-samples", "16", "--min-duration",
                             "0.05", "--data", narrow, "--data", wide, "--db", db)  # fmt: skip
    assert code == 0 and "per shape" in out and "x=1x3x16x48" in out, err


def test_several_data_sources_without_shapes_need_dims_the_data_can_fix(env):
    from tests.models import mlp

    tmp_path, db = env
    model = mlp(tmp_path / "m.onnx")
    for name in ("a", "b"):
        np.savez(tmp_path / f"{name}.npz", x=np.zeros((4, 8), np.float32))
    with pytest.raises(UsageError, match=r"2 data sources and no --shape, but the model's inputs \['x.*'\] have no "
                                         r"dynamic dims for data to fix; fix: give one --data"):  # fmt: skip
        autodeploy.bench_shapes(model, data=[tmp_path / "a.npz", tmp_path / "b.npz"], db=db)
