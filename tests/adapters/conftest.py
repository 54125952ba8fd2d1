"""One fixture per engine: every engine runs the conformance suite, unavailable ones skip with their reason."""

import pytest

from autodeploy.adapters import registry
from autodeploy.device import probe_device

ENGINES = list(registry.ENGINES)


@pytest.fixture(params=ENGINES)
def engine(request):
    engine = registry.get(request.param)
    availability = engine.probe(probe_device())
    if not availability.available or availability.reason:  # limited (tflite without onnx2tf): builds no ONNX model
        pytest.skip(f"{request.param}: {availability}")
    return engine
