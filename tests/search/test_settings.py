"""A study's settings, declared once (issue 48): the API's keywords, the CLI's flags and the config's overrides all
come from ``search/settings.py``."""

from __future__ import annotations

import inspect

import pytest

import autodeploy
from autodeploy.search import config as study_config
from autodeploy.search.settings import BY_NAME, SETTINGS, given, overrides


def test_every_row_names_a_config_key_whose_default_it_reads():
    for setting in SETTINGS:
        if setting.path is not None:
            setting.default  # noqa: B018 (raises KeyError for a path the config does not have)
    assert BY_NAME["finalists"].default == study_config.Finalists().count
    assert "(default 600)" in BY_NAME["timeout_s"].help  # the config's 600.0, spelled once


def test_an_unknown_keyword_is_one_type_error_naming_the_closest():
    with pytest.raises(TypeError, match="unexpected keyword argument 'engine'; did you mean 'engines'"):
        autodeploy.tune("zoo:mlp", engine=["onnxruntime"])
    assert given("tune", {"time_budget": "10m", "name": "s"}) == {"name": "s", "time_budget": 600.0}


def test_the_overrides_are_the_config_keys_of_the_values_given():
    cfg = study_config.validate({"model": "m"}, overrides({"sla_ms": 3.0, "objective": "server", "batches": (2, 1),
                                                           "fresh": False, "resume": True, "shapes": {}}))  # fmt: skip
    assert cfg.constraints.sla_ms == 3.0 and cfg.batches == [2, 1] and not cfg.fresh and cfg.shapes == {}


def test_the_cli_has_one_flag_per_row_and_the_api_doc_lists_every_keyword():
    from autodeploy.cli.tune import tune

    flags = inspect.signature(tune).parameters
    assert all(s.option in flags for s in SETTINGS if s.flag is not None)
    assert all(f"        {s.name}" in autodeploy.tune.__doc__ for s in SETTINGS if s.name != "model")
