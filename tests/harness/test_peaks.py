"""This device's peaks: measured by the microbenchmark in a child, cached by the device fingerprint, reused."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from autodeploy.device import probe_device
from autodeploy.harness import peaks as peaks_module
from autodeploy.harness.peaks import PeakSettings, device_peaks, peaks_path

TINY = PeakSettings(size=16, seconds=0.01)


def test_peaks_are_measured_once_per_device_then_read_from_its_file(tmp_path, monkeypatch):
    device = probe_device()
    first = device_peaks(device, tmp_path, settings=TINY)  # the real microbenchmark, in a child
    assert first.fingerprint == device.fingerprint and not first.failures.get("microbenchmark")
    assert {("onnxruntime", "fp32"), ("onnxruntime", "int8")} <= {(k.engine, k.precision) for k in first.kernels}
    assert all(k.gops > 0 and math.isfinite(k.gops) for k in first.kernels)
    assert {k.op.split()[0] for k in first.kernels} == {"MatMul", "Conv3x3"}
    stored = json.loads(peaks_path(tmp_path, device.fingerprint).read_text())
    assert stored["fingerprint"] == device.fingerprint and stored["settings"] == TINY.to_dict()

    measured = []

    def fake(dev, settings, progress=None):
        measured.append(dev.fingerprint)
        return replace(first, fingerprint=dev.fingerprint, measured_at="again")

    monkeypatch.setattr(peaks_module, "measure_peaks", fake)
    assert device_peaks(device, tmp_path, settings=TINY) == first  # reused: no child, the same numbers
    assert measured == []
    other = replace(device, cpu_model="another CPU")  # another fingerprint: its own file, measured
    assert device_peaks(other, tmp_path, settings=TINY).measured_at == "again"
    assert measured == [other.fingerprint] and peaks_path(tmp_path, other.fingerprint).exists()
    assert device_peaks(device, tmp_path, settings=TINY, refresh=True).measured_at == "again"  # --refresh
    newer = replace(device, engines={**device.engines, "onnxruntime": "99.0"})  # same device, new engine version
    device_peaks(newer, tmp_path, settings=TINY)
    assert measured == [other.fingerprint, device.fingerprint, device.fingerprint]


def test_peak_settings_come_from_the_environment_and_are_checked(monkeypatch):
    monkeypatch.setenv("AUTODEPLOY_PEAK_SIZE", "64")
    monkeypatch.setenv("AUTODEPLOY_PEAK_SECONDS", "0.5")
    assert PeakSettings.from_env() == PeakSettings(64, 0.5)
    with pytest.raises(ValueError, match="size must be >= 8"):
        PeakSettings(4, 0.1)
