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


def test_peaks_measured_under_load_are_measured_again_later_and_each_kernel_keeps_its_faster_reading(tmp_path, monkeypatch):
    from autodeploy.roofline import Kernel, Peaks

    device = probe_device()
    kernels = (Kernel("onnxruntime", "int8", "MatMul 16x16x16", 186.0, 2, True),
               Kernel("onnxruntime", "fp32", "MatMul 16x16x16", 90.0, 2, True))  # fmt: skip
    loaded = Peaks(device.fingerprint, kernels, {}, peaks_module._versions(device), TINY.to_dict(), peaks_module._now())
    path = peaks_path(tmp_path, device.fingerprint)
    path.write_text(json.dumps(loaded.to_dict()))
    again = replace(loaded, kernels=(replace(kernels[0], gops=600.0, under_load=False),
                                     replace(kernels[1], gops=40.0, under_load=False)))  # fmt: skip
    monkeypatch.setattr(peaks_module, "measure_peaks", lambda dev, settings, progress=None: again)
    assert device_peaks(device, tmp_path, settings=TINY) == loaded  # loaded but fresh: used as it is
    aged = replace(loaded, measured_at="2020-01-01T00:00:00+00:00")
    path.write_text(json.dumps(aged.to_dict()))
    merged = device_peaks(device, tmp_path, settings=TINY)  # loaded and old: measured again
    assert merged.peak("int8") == 600.0 and not merged.best("int8").under_load  # the new reading is faster
    assert merged.peak("fp32") == 90.0  # the old one was faster: a peak is the most a kernel reached
    assert json.loads(path.read_text())["kernels"][0]["gops"] == 600.0


def test_a_config_faster_than_its_peak_claims_no_share_and_no_what_if():
    from autodeploy.roofline import Kernel, Peaks, Roofline, distance, distance_text, share_text

    peaks = Peaks("f", (Kernel("onnxruntime", "int8", "MatMul 1024x1024x1024", 186.0, 2, True),))
    line = Roofline("int8", 8.2, 595.0, 186.0, "onnxruntime MatMul 1024x1024x1024")
    assert "320%" not in share_text(line) and "read low" in share_text(line) and "--refresh" in share_text(line)
    d = distance([line], peaks, label="x", engine="onnxruntime", batch=1)
    assert "what_if" not in d
    text = distance_text(d)
    assert "595 GOP/s" in text and "read low" in text and "%" not in text
    within = Roofline("int8", 8.2, 93.0, 186.0, "onnxruntime MatMul 1024x1024x1024")
    assert "50% of this device's int8 peak" in distance_text(distance([within], peaks, label="x", engine="onnxruntime",
                                                                      batch=1))  # fmt: skip
