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
    assert ort.knobs["intra_op_thread_affinities"] == ("none", "one_cpu_each")  # tried by the search, off first
    assert space.batches == (1,) and space.threads == (1, 2)
    # int8's float layers (issue 41: "int8, head float" is a config like any other) are asked of int8 alone
    assert ort.knobs["float_layers"] == ("none", "head", "search") and ort.only == {"float_layers": ("int8",)}
    assert space.size() == (1 + 3) * 1 * 2 * 2 * 2 == len(space.grid())
    assert len({tuple(sorted(p.items())) for p in space.grid()}) == space.size()
    assert all(("onnxruntime.float_layers" in p) == (p["onnxruntime.precision"] == "int8") for p in space.grid())


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
              "onnxruntime.execution_mode": "ORT_SEQUENTIAL", "onnxruntime.intra_op_thread_affinities": "none"}  # fmt: skip
    config = suggest(optuna.trial.FixedTrial(params), space)
    assert "fp16" in unsupported_reason(config, probe_device(), model)
    static = load_model(mlp(tmp_path / "static.onnx", batch=1))
    assert unsupported_reason(TrialConfig("onnxruntime", batch=1), probe_device(), static) is None
    assert "static batch dim 1" in unsupported_reason(
        TrialConfig("onnxruntime", batch=4), probe_device(), static
    )


def test_thread_affinity_is_searched_and_pinning_one_thread_is_pruned_with_its_reason(model):
    device = probe_device()
    space = build_space(StudyConfig(model="m", engines=["onnxruntime", "openvino"], threads=[1, 2]), device, model)
    if "openvino" in space.engines:
        assert space.engines["openvino"].knobs["ENABLE_CPU_PINNING"] == (False, True)
    pinned_one = TrialConfig("onnxruntime", threads=1, knobs={"intra_op_thread_affinities": "one_cpu_each"})
    assert "needs 2 or more threads, got 1" in unsupported_reason(pinned_one, device, model)
    if device.logical_cores >= 2:
        pinned_two = TrialConfig("onnxruntime", threads=2, knobs={"intra_op_thread_affinities": "one_cpu_each"})
        assert unsupported_reason(pinned_two, device, model) is None


def test_throughput_and_server_search_their_knobs_by_default(model):
    device = probe_device()
    engines = ["onnxruntime", "openvino"]
    latency = build_space(StudyConfig(model="m", engines=engines), device, model)
    throughput = build_space(StudyConfig(model="m", engines=engines, objective="throughput"), device, model)
    server = build_space(StudyConfig(model="m", engines=engines, objective="server",
                                     constraints={"sla_ms": 5}), device, model)  # fmt: skip
    assert "num_requests" not in latency.engines["onnxruntime"].knobs
    ort = throughput.engines["onnxruntime"].knobs
    assert {"num_requests", "sessions", "inter_op_num_threads", "execution_mode"} <= set(ort)
    assert "max_queue_delay_us" not in ort and throughput.batches == (1, 2, 4, 8, 16, 32)
    if "openvino" in throughput.engines:
        assert {"PERFORMANCE_HINT", "NUM_STREAMS", "num_requests"} <= set(throughput.engines["openvino"].knobs)
    assert "max_queue_delay_us" in server.engines["onnxruntime"].knobs and server.batches == (1, 2, 4, 8)
    assert "AUTO" in ort["num_requests"]


def test_configs_that_oversubscribe_the_cores_are_pruned_with_that_reason(model):
    import dataclasses

    two = dataclasses.replace(probe_device(), logical_cores=2, physical_cores=2)
    fits = TrialConfig("onnxruntime", threads=1, knobs={"num_requests": 2})
    over = TrialConfig("onnxruntime", threads=2, knobs={"num_requests": 2})
    default_threads_over = TrialConfig("onnxruntime", knobs={"num_requests": 2})  # ORT's default: every core
    assert unsupported_reason(fits, two, model) is None
    assert "num_requests=2 × 2 thread(s) each = 4 threads on 2 logical cores" in unsupported_reason(over, two, model)
    assert "oversubscribes" in unsupported_reason(default_threads_over, two, model)
    assert unsupported_reason(TrialConfig("onnxruntime", knobs={"num_requests": "AUTO"}), two, model) is None
    parallel = TrialConfig("onnxruntime", threads=1, knobs={"num_requests": 2, "execution_mode": "ORT_PARALLEL",
                                                             "inter_op_num_threads": 2})  # fmt: skip
    assert "oversubscribes" in unsupported_reason(parallel, two, model)


def test_openvino_streams_beyond_its_threads_are_pruned(model):
    from autodeploy.adapters.openvino import OpenVinoEngine

    engine = OpenVinoEngine()
    one_thread = TrialConfig("openvino", threads=1, knobs={"NUM_STREAMS": 2, "num_requests": 4})
    assert "would silently compile 1 stream" in engine.oversubscription(one_thread, 2)
    assert engine.oversubscription(TrialConfig("openvino", threads=2, knobs={"NUM_STREAMS": 2}), 2) is None
    assert "INFERENCE_NUM_THREADS=4 on 2" in engine.oversubscription(TrialConfig("openvino", threads=4), 2)
    # requests queue onto OpenVINO's streams: they are never oversubscription on their own
    assert engine.oversubscription(TrialConfig("openvino", knobs={"num_requests": 8}), 2) is None


def test_a_queue_delay_at_batch_one_is_pruned_as_a_no_op(model):
    device = probe_device()
    reason = unsupported_reason(TrialConfig("onnxruntime", threads=1, knobs={"max_queue_delay_us": 500}), device, model)
    assert "changes nothing at batch 1" in reason
    assert unsupported_reason(TrialConfig("onnxruntime", batch=4, threads=1, knobs={"max_queue_delay_us": 500}),
                              device, model) is None  # fmt: skip
