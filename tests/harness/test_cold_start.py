"""Cold start in fresh processes and the engines' compiled caches (``harness/cold_start.py``, ``runtime/cache.py``).

Nothing here depends on this CPU's speed: the tests check structure (the cache's files exist, a start from it says
``used``, one made by another engine version or tampered with is remade and says why) and, at most, a loose
direction (a start from the cache loads no slower than several times a start without it).
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest

from autodeploy import objectives
from autodeploy.adapters import registry
from autodeploy.adapters.base import TrialConfig, io_of
from autodeploy.data import synthetic
from autodeploy.device import probe_device
from autodeploy.harness import cold_start
from autodeploy.harness.cold_start import ColdStart, Start, Starts
from autodeploy.harness.result import Measurement
from autodeploy.model import load_model
from autodeploy.results_db import Store, TrialFilter
from autodeploy.runtime import cache
from autodeploy.search.objective import Metrics, values
from tests.models import mlp
from tests.results_db.factories import DEVICE, MODEL, ok_result

KEY = {"device": "d1", "artifact": "a1", "settings": "s1"}


# -- the cache record (no engine) ------------------------------------------------------------------


def _sealed(folder: Path) -> Path:
    assert cache.begin(folder, "eng", "1.0", KEY) == cache.MADE
    (folder / "blob.bin").write_bytes(b"compiled")
    cache.seal(folder, "eng", "1.0", KEY)
    return folder


def test_a_sealed_cache_is_used_under_the_same_engine_version_and_key(tmp_path):
    folder = _sealed(tmp_path / "c")
    assert cache.begin(folder, "eng", "1.0", KEY) == cache.USED
    assert (folder / "blob.bin").read_bytes() == b"compiled"  # used, not emptied


def test_a_cache_of_another_engine_version_is_remade_and_says_so(tmp_path):
    folder = _sealed(tmp_path / "c")
    record = json.loads((folder / cache.RECORD).read_text())
    (folder / cache.RECORD).write_text(json.dumps({**record, "version": "0.9"}))  # made by another version
    said = cache.begin(folder, "eng", "1.0", KEY)
    assert said == "remade: made by eng 0.9, this is eng 1.0"
    assert not (folder / "blob.bin").exists()  # emptied for the engine to build into


def test_a_cache_for_another_device_is_remade(tmp_path):
    folder = _sealed(tmp_path / "c")
    said = cache.begin(folder, "eng", "1.0", {**KEY, "device": "d2"})
    assert said == "remade: made for device d1, this start is for d2"


def test_a_tampered_cache_file_is_detected(tmp_path):
    folder = _sealed(tmp_path / "c")
    (folder / "blob.bin").write_bytes(b"compiled, then changed")
    said = cache.begin(folder, "eng", "1.0", KEY)
    assert said == "remade: cache file blob.bin changed since it was made (SHA-256 differs)"


def test_every_runtime_declares_its_compiled_cache_and_what_it_imports():
    for name in registry.ENGINES:
        engine = registry.get(name)
        runtime = importlib.import_module(engine.runtime_module(TrialConfig(name)))
        declared = getattr(runtime, "CACHE", None)
        assert isinstance(declared, cache.Declared), f"{runtime.__name__} declares no CACHE"
        assert declared.exists or declared.why, f"{runtime.__name__}: a runtime without a cache says why"
        assert getattr(runtime, "IMPORTS", None), f"{runtime.__name__} declares no IMPORTS"


# -- each engine here, with and without its cache ---------------------------------------------------


def _cached_engines() -> list[str]:
    """One engine per runtime that declares a cache (the in-house engine runs on the others' runtimes)."""
    by_runtime: dict[str, str] = {}
    for name in registry.ENGINES:
        module = registry.get(name).runtime_module(TrialConfig(name))
        if importlib.import_module(module).CACHE.exists:
            by_runtime.setdefault(module, name)
    return list(by_runtime.values())


@pytest.fixture(params=_cached_engines())
def built(request, tmp_path):
    engine = registry.get(request.param)
    availability = engine.probe(probe_device())
    if not availability.available:
        pytest.skip(f"{request.param}: {availability}")
    model = load_model(mlp(tmp_path / "m.onnx", in_features=16, classes=8))
    config = TrialConfig(engine.name, "fp32", batch=2, threads=1)
    artifact = engine.build(model, config, None, tmp_path / "artifacts", target=probe_device())
    return engine, model, config, artifact


def test_a_runtime_makes_its_cache_then_starts_from_it(built, tmp_path):
    engine, model, config, artifact = built
    runtime = importlib.import_module(engine.runtime_module(config))
    settings = engine.runtime_settings(artifact, config, model)
    folder = tmp_path / "compiled"
    asked = {**settings, "compiled_cache": {"dir": str(folder), "key": KEY}}
    feeds = {"x": synthetic(model, 2).inputs["x"]}
    with runtime.open(artifact.path, settings, io_of(model)) as plain:
        expected = plain.run(feeds)["logits"]
        assert plain.cache is None  # no cache asked for
    with runtime.open(artifact.path, asked, io_of(model)) as first:
        assert first.cache == cache.MADE
        first.run(feeds)
    record = cache.read(folder)
    assert record["engine"] == engine.name and record["files"], "the cache's files exist and are recorded"
    assert all((folder / name).is_file() for name in record["files"])
    with runtime.open(artifact.path, asked, io_of(model)) as second:
        assert second.cache == cache.USED
        assert second.run(feeds)["logits"] == pytest.approx(expected, rel=1e-4, abs=1e-5)
    (folder / cache.RECORD).write_text(json.dumps({**record, "version": "0.0.0"}))  # another engine version made it
    with runtime.open(artifact.path, asked, io_of(model)) as third:
        assert third.cache.startswith("remade: made by") and "0.0.0" in third.cache
    tampered = next(folder / name for name in cache.read(folder)["files"])
    tampered.write_bytes(tampered.read_bytes() + b"\0")
    with runtime.open(artifact.path, asked, io_of(model)) as fourth:
        assert fourth.cache.startswith("remade: cache file") and "changed" in fourth.cache
        assert fourth.run(feeds)["logits"] == pytest.approx(expected, rel=1e-4, abs=1e-5)


def test_cold_start_in_fresh_processes_with_and_without_the_cache(built, tmp_path):
    engine, model, config, artifact = built
    module = engine.runtime_module(config)
    settings = engine.runtime_settings(artifact, config, model)
    interface = {part: model.to_dict()[part] for part in ("inputs", "outputs")}
    cold = cold_start.measure(module, artifact.path, settings, interface, {"x": synthetic(model, 2).inputs["x"]},
                              declared=importlib.import_module(module).CACHE, key=KEY, cache_dir=tmp_path / "c",
                              starts=2)  # fmt: skip
    assert len(cold.without.runs) == len(cold.cached.runs) == 2
    assert cold.made.cache == cache.MADE and all(r.cache is None for r in cold.without.runs)
    assert cold.used and cold.best is cold.cached, [r.cache for r in cold.cached.runs]
    for run in (*cold.without.runs, *cold.cached.runs):  # the parts lie inside the process's time
        assert 0 < run.load_ms and 0 < run.first_ms and run.import_ms + run.load_ms + run.first_ms < run.process_ms
    # a loose direction only: from the cache, the load is not several times slower than without it
    assert cold.cached.of("load").median <= 3 * cold.without.of("load").median + 100
    assert ColdStart.from_dict(json.loads(json.dumps(cold.to_dict()))) == cold
    lines = cold_start.text(cold)
    assert lines[0].startswith("cold start without the compiled cache: ") and "load " in lines[0]
    assert lines[1].startswith("cold start from the compiled cache: ") and "used by 2 of 2 starts" in lines[2]


def test_a_runtime_without_a_cache_is_started_without_one_and_says_why(tmp_path):
    model = load_model(mlp(tmp_path / "m.onnx", in_features=16, classes=8))
    engine, config = registry.get(registry.BASELINE_ENGINE), TrialConfig(registry.BASELINE_ENGINE, threads=1)
    if not engine.probe(probe_device()).available:
        pytest.skip(f"{engine.name} is not installed")
    artifact = engine.build(model, config, None, tmp_path / "artifacts", target=probe_device())
    interface = {part: model.to_dict()[part] for part in ("inputs", "outputs")}
    cold = cold_start.measure(engine.runtime_module(config), artifact.path, engine.runtime_settings(artifact, config, model),
                              interface, {"x": synthetic(model, 1).inputs["x"]}, key=KEY, cache_dir=tmp_path / "c",
                              declared=cache.Declared(None, "none here"), starts=1)  # fmt: skip
    assert cold.cached is None and cold.made is None and not (tmp_path / "c").exists()
    assert cold.best is cold.without and cold.value_ms == cold.without.runs[0].process_ms
    assert cold_start.text(cold)[-1] == "compiled cache: none (none here)"


# -- the record, stored and read back, and the objective ------------------------------------------------


def _cold(process_ms: float = 300.0) -> ColdStart:
    run = Start(process_ms=process_ms, import_ms=100.0, load_ms=80.0, first_ms=5.0, cache=cache.USED)
    plain = Start(process_ms=process_ms + 50, import_ms=100.0, load_ms=130.0, first_ms=5.0)
    made = Start(process_ms=process_ms + 60, import_ms=100.0, load_ms=140.0, first_ms=5.0, cache=cache.MADE)
    return ColdStart("model cache", Starts((plain, plain)), made, Starts((run, run)))


def test_the_cold_start_value_is_from_the_cache_only_where_every_start_used_it():
    assert _cold(300.0).value_ms == 300.0
    half = _cold(300.0)
    remade = Start(310.0, 100.0, 130.0, 5.0, cache="remade: made by x 1, this is x 2")
    partly = ColdStart(half.cache, half.without, half.made, Starts((half.cached.runs[0], remade)))
    assert not partly.used and partly.value_ms == 350.0  # the starts without the cache


def test_a_measurement_keeps_its_cold_start_in_the_store_and_in_json(tmp_path):
    result = ok_result("cold", cold_start=_cold())
    assert Measurement.from_dict(json.loads(json.dumps(result.measurement.to_dict()))).cold_start == _cold()
    with Store.open(f"sqlite:///{tmp_path / 'r.db'}") as store:
        store.add_trial(result, model=MODEL, device=DEVICE)
        row = store.trial(TrialFilter(uid="cold"))
        plain = store.add_trial(ok_result("plain"), model=MODEL, device=DEVICE)
        assert store.trial(TrialFilter(id=plain)).measurement.cold_start is None
    assert row.measurement.cold_start == _cold()


def test_the_cold_start_objective_minimizes_the_measured_cold_start():
    objective = objectives.of("cold-start")
    assert objective.cold_start and objective.directions == ("minimize",) and not objective.remeasured
    metrics = Metrics.of_result(ok_result("cold", cold_start=_cold(250.0)))
    assert metrics.cold_start_ms == 250.0 and values(metrics, objective) == [250.0]
    assert Metrics.of_result(ok_result("plain")).cold_start_ms is None


def test_bench_measures_the_cold_start_only_when_asked(tmp_path, monkeypatch):
    import autodeploy
    from autodeploy.harness.timing import TimingPolicy

    monkeypatch.setenv("AUTODEPLOY_CACHE", str(tmp_path / "cache"))
    fast = TimingPolicy(warmup_min_calls=2, warmup_max_s=0.2, min_samples=64, min_duration_s=0.1, max_duration_s=5)
    db = f"sqlite:///{tmp_path / 'r.db'}"
    record = autodeploy.bench("zoo:tiny-cnn", engine="onnxruntime", threads=1, timing=fast, db=db, cold_start=2)
    cold = record.result.measurement.cold_start
    assert record.ok and cold is not None and len(cold.without.runs) == 2 and cold.used, cold
    assert (tmp_path / "cache" / "work" / cold_start.COMPILED_DIR).is_dir()  # kept beside the artifacts
    with Store.open(db, readonly=True) as store:
        assert store.trial(TrialFilter(id=record.id)).measurement.cold_start == cold
    plain = autodeploy.bench("zoo:tiny-cnn", engine="onnxruntime", threads=1, timing=fast, db=db)
    assert plain.result.measurement.cold_start is None
    # its bundle ships the cache made here, verified like every file, used only where engine and device match
    from autodeploy.bundle import BundleError, loader

    shipped = autodeploy.export(trial=record.id, output=tmp_path / "ship", db=db)
    manifest = json.loads((shipped / "manifest.json").read_text())
    assert manifest["compiled_cache"]["key"]["device"] == cache.device_key()
    assert any(name.startswith(f"{loader.COMPILED_DIR}/") for name in manifest["files"])
    with autodeploy.bundle.load(shipped) as predictor:
        assert predictor.cache == cache.USED and not predictor.warnings
    monkeypatch.setattr(cache, "device_key", lambda: "another-device")
    with autodeploy.bundle.load(shipped) as predictor:
        assert predictor.cache.startswith("remade: made for device ")
        assert predictor.warnings[-1].startswith("the bundle's compiled cache was not used (remade: made for device")
    assert (shipped / loader.COMPILED_DIR / cache.RECORD).is_file()  # the bundle itself is left as verified
    blob = next(p for p in (shipped / loader.COMPILED_DIR).iterdir() if p.name != cache.RECORD)
    blob.write_bytes(blob.read_bytes() + b"\0")
    with pytest.raises(BundleError, match="does not match its SHA-256|has .* bytes"):
        autodeploy.bundle.load(shipped)
