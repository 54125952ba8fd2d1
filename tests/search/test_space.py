import optuna
import pytest

from autodeploy.adapters.base import TrialConfig
from autodeploy.device import probe_device
from autodeploy.errors import UnknownEngineError, UsageError
from autodeploy.model import load_model
from autodeploy.search.config import StudyConfig
from autodeploy.search.space import build_space, default_threads, suggest, unsupported_reason
from tests.models import mlp


@pytest.fixture
def model(tmp_path):
    return load_model(mlp(tmp_path / "m.onnx"))


def test_default_threads():
    assert default_threads(2) == (1, 2)
    assert default_threads(12) == (1, 2, 4, 8, 12)
    assert default_threads(1) == (1,)


def test_space_from_the_engines_offer(model):
    space = build_space(
        StudyConfig(model="m", engines=["onnxruntime"], threads=[1, 2]), probe_device(), model
    )
    ort = space.engines["onnxruntime"]
    assert ort.precisions == ("fp32", "int8") and "execution_mode" in ort.knobs
    assert space.batches == (1,) and space.threads == (1, 2)
    assert space.size() == 2 * 2 * 1 * 2 == len(space.grid())
    assert len({tuple(sorted(p.items())) for p in space.grid()}) == space.size()


def test_unknown_and_unavailable_engines(model):
    with pytest.raises(UnknownEngineError, match="unknown engine 'warp'"):
        build_space(StudyConfig(model="m", engines=["warp"]), probe_device(), model)
    from autodeploy.adapters import registry

    registry.register("ghost", "autodeploy.adapters.nowhere:Ghost")
    try:
        with pytest.raises(UsageError, match="no engine to search.*ghost"):
            build_space(StudyConfig(model="m", engines=["ghost"]), probe_device(), model)
    finally:
        registry.unregister("ghost")


def test_suggest_is_define_by_run(model):
    space = build_space(
        StudyConfig(model="m", engines=["onnxruntime"], knobs={"onnxruntime": {}}), probe_device(), model
    )
    params = {"engine": "onnxruntime", "onnxruntime.precision": "int8", "batch": 1, "threads": 2}
    config = suggest(optuna.trial.FixedTrial(params), space)
    assert (config.engine, config.precision, config.batch, config.threads, dict(config.knobs)) == (
        "onnxruntime",
        "int8",
        1,
        2,
        {},
    )


def test_unsupported_combinations_have_a_reason(tmp_path, model):
    space = build_space(
        StudyConfig(model="m", engines=["onnxruntime"], precisions=["fp16"]), probe_device(), model
    )
    params = {"engine": "onnxruntime", "onnxruntime.precision": "fp16", "batch": 1, "threads": 1,
              "onnxruntime.execution_mode": "ORT_SEQUENTIAL"}  # fmt: skip
    config = suggest(optuna.trial.FixedTrial(params), space)
    assert "fp16" in unsupported_reason(config, probe_device(), model)
    static = load_model(mlp(tmp_path / "static.onnx", batch=1))
    assert unsupported_reason(TrialConfig("onnxruntime", batch=1), probe_device(), static) is None
    assert "static batch dim 1" in unsupported_reason(
        TrialConfig("onnxruntime", batch=4), probe_device(), static
    )
