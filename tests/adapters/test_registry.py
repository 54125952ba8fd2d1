import subprocess
import sys

import pytest

from autodeploy.adapters import registry
from autodeploy.adapters.registry import MissingEngine
from autodeploy.device import probe_device
from autodeploy.errors import UnknownEngineError


def test_unknown_engine_names_the_available_ones():
    with pytest.raises(UnknownEngineError, match="unknown engine 'nope'.*onnxruntime"):
        registry.get("nope")


def test_register_and_unregister():
    registry.register("faulty", "tests.adapters.faulty:FaultyEngine")
    try:
        assert registry.get("faulty").name == "faulty"
        assert "faulty" in registry.targets()
    finally:
        registry.unregister("faulty")
    assert "faulty" not in registry.targets()
    with pytest.raises(ValueError, match="module:Class"):
        registry.register("bad", "no_colon")


def test_an_engine_that_cannot_import_is_missing_not_fatal():
    registry.register("ghost", "autodeploy.adapters.does_not_exist:Ghost")
    try:
        engine = registry.get("ghost")
        assert isinstance(engine, MissingEngine)
        availability = engine.probe(probe_device())
        assert not availability.available and "does_not_exist" in availability.reason
        assert "ghost" in [e.name for e in registry.all_engines()]
    finally:
        registry.unregister("ghost")


def test_import_autodeploy_and_cli_import_no_engine():
    code = (
        "import sys, autodeploy, autodeploy.cli.app, autodeploy.adapters.registry;"
        "heavy = [m for m in ('onnxruntime', 'openvino', 'tensorrt', 'tensorflow', 'torch', 'streamlit', 'optuna')"
        " if m in sys.modules]; print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("module, extra", [("nncf", "openvino"), ("tf_keras", "tflite"), ("cuda", "tensorrt"),
                                           ("sklearn", "zoo")])  # fmt: skip
def test_a_missing_module_names_the_extra_its_engine_declares(module, extra):
    error = registry.missing_extra(ModuleNotFoundError(f"No module named {module!r}", name=f"{module}.sub"))
    assert error is not None and f"pip install 'autodeploy[{extra}]'" in str(error)
