
import pytest

from autodeploy.errors import UsageError
from autodeploy.search import config as study_config
from autodeploy.search.config import EXAMPLES, StudyConfig, load

CONFIGS = sorted(EXAMPLES.glob("*.yaml"))  # installed with the package (package data)


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_example_config_validates(path):
    config = load(path, {})
    assert config.model.startswith("zoo:")


def test_there_are_example_configs():
    assert len(CONFIGS) >= 4


def test_flags_override_yaml_and_defaults(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(
        "model: zoo:mlp\ntrials: 5\nconstraints:\n  max_accuracy_drop: 0.05\n  max_memory_mb: 100\n"
    )
    config = load(path, {"trials": 7, "constraints.max_memory_mb": 50, "sampler": None})
    assert config.trials == 7 and config.sampler == "tpe"
    assert config.constraints.max_memory_mb == 50 and config.constraints.max_accuracy_drop == 0.05


@pytest.mark.parametrize(
    "text, message",
    [
        ("model: m\ntrails: 5\n", "trails: Extra inputs are not permitted"),
        ("model: m\nobjective: fastest\n", "objective: Input should be"),
        ("model: m\nobjective: server\n", "needs constraints.sla_ms"),
        ("model: m\nbatches: []\n", "batches must be a non-empty list"),
        ("- a list\n", "must be a mapping"),
        ("model: [unclosed\n", "cannot read study config"),
    ],
)
def test_bad_configs_name_the_problem(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(UsageError, match=message):
        load(path, {})


def test_default_batches_follow_the_objective():
    assert StudyConfig(model="m").default_batches() == [1]
    assert StudyConfig(model="m", objective="throughput").default_batches() == [1, 2, 4, 8, 16, 32]
    assert StudyConfig(model="m", batches=[4, 1, 4]).default_batches() == [1, 4]


def test_the_examples_ship_with_the_package_and_resolve_by_name():
    assert len(CONFIGS) >= 5 and all(p.parent.parent.name == "autodeploy" for p in CONFIGS)
    assert load("latency-mobilenetv2.yaml", {}).model == "zoo:mobilenetv2"


def test_timeout_means_the_workers_timeout_and_the_old_study_key_keeps_its_meaning():
    # `tune --timeout` meant "start no new trial" while `bench --timeout` kills a worker: one word, one meaning.
    from autodeploy.search.settings import overrides as _study_overrides

    arguments = dict.fromkeys(("model", "engines", "precisions", "batches", "threads", "shapes", "data"))
    arguments.update(shapes={}, timeout_s=30.0, build_timeout_s=90.0, screening_time_s=120.0)
    cfg = study_config.validate({"model": "zoo:mlp"}, _study_overrides(arguments))
    assert (cfg.screening.timeout_s, cfg.screening.build_timeout_s, cfg.screening_time_s) == (30.0, 90.0, 120.0)
    old = study_config.validate({"model": "zoo:mlp", "timeout_s": 45}, {})  # a config (or stored study) of before
    assert old.screening_time_s == 45 and old.screening.timeout_s == 600.0
