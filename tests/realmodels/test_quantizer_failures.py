"""Issue 52 item 15, first half: ONNX Runtime's static int8 failed on a pitch model's graph with numpy's bare "the
truth value of an array ... is ambiguous": no op named, no fix. The build's line now names the tensor or node ORT's
quantizer was working on (read from its own traceback) and the int8 routes that do not go through it.

The graph that tripped ORT is not in the corpus (nothing here reproduces it), so the fault is put into ORT's own
scale computation on a real model: basic-pitch's calibration range of one tensor arrives as two values instead of
one, and numpy raises its genuine error inside ``compute_scale_zp``, as it did for the user."""

from __future__ import annotations

import numpy as np
import pytest

from autodeploy.adapters import registry
from autodeploy.adapters.base import TrialConfig
from autodeploy.device import probe_device
from autodeploy.errors import BuildError
from autodeploy.model import load_model
from tests.realmodels.corpus import MODELS, pitch_windows

pytestmark = pytest.mark.slow


def test_ort_static_int8_crash_names_the_tensor_and_a_route_around(monkeypatch, corpus_dir, tmp_path):
    from onnxruntime.quantization import qdq_quantizer

    path = next(m for m in MODELS if m.name == "basic-pitch").extract(corpus_dir)
    if isinstance(path, str):
        pytest.skip(path)
    original, hit = qdq_quantizer.compute_scale_zp, []

    def two_valued_range(rmin, rmax, *args, **kwargs):
        if not hit:  # the first activation's range, as a non-scalar: numpy refuses `scale >= 0` itself
            hit.append(True)
            rmin, rmax = np.stack([rmin, rmin]), np.stack([rmax, rmax])
        return original(rmin, rmax, *args, **kwargs)

    monkeypatch.setattr(qdq_quantizer, "compute_scale_zp", two_valued_range)
    with pytest.raises(BuildError) as caught:
        registry.get("onnxruntime").build(load_model(path), TrialConfig("onnxruntime", "int8"), pitch_windows(4),
                                          tmp_path / "work", target=probe_device())  # fmt: skip
    line = str(caught.value)
    assert hit and "ambiguous" in line and "\n" not in line, line
    assert "quantization failed at tensor " in line, line  # what ORT was quantizing, by name
    assert "fix: try another int8 (--engine inhouse or openvino" in line and "quant_method=dynamic" in line, line
