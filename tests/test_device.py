import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from autodeploy.device import RELEVANT_ISA, probe_device
from autodeploy.runtime.device import DeviceInfo
from autodeploy.runtime.machine import parse_cpuinfo as _parse_cpuinfo

CPUINFO = Path("/proc/cpuinfo")


def test_probe_describes_this_machine():
    d = probe_device()
    assert d.cpu_model and d.arch and d.python and d.os
    assert d.logical_cores >= d.physical_cores >= 1
    assert d.memory_gb > 0 and d.memory_gb == round(d.memory_gb, 1)
    assert list(d.isa) == sorted(d.isa) and set(d.isa) <= set(RELEVANT_ISA)
    assert all(isinstance(v, str) for v in d.engines.values())
    assert probe_device() is d  # cached


@pytest.mark.skipif(not CPUINFO.is_file(), reason="needs Linux /proc/cpuinfo")
def test_isa_flags_match_proc_cpuinfo():
    text = CPUINFO.read_text()
    line = re.search(r"^(?:flags|Features)\s*:(.*)$", text, re.M)
    flags = set(line.group(1).split()) if line else set()
    d = probe_device()
    for flag in RELEVANT_ISA:
        assert d.has(flag) == (
            flag in flags or (flag in ("neon", "asimd") and bool({"neon", "asimd"} & flags))
        )
    model = re.search(r"^model name\s*:(.*)$", text, re.M)
    if model:
        assert d.cpu_model == model.group(1).strip()


def test_parse_arm_cpuinfo():
    model, flags = _parse_cpuinfo("processor\t: 0\nFeatures\t: fp asimd sve\nModel\t: Raspberry Pi 5\n")
    assert model == "Raspberry Pi 5" and {"asimd", "sve"} <= flags


def test_fingerprint_is_stable_and_hardware_only():
    d = probe_device()
    assert re.fullmatch(r"[0-9a-f]{16}", d.fingerprint)
    assert d.fingerprint == probe_device().fingerprint
    other = DeviceInfo.from_dict({**d.to_dict(), "engines": {"openvino": "0.0"}, "python": "0.0"})
    assert other.fingerprint == d.fingerprint  # engine/Python versions are stored separately
    more_cores = DeviceInfo.from_dict({**d.to_dict(), "logical_cores": d.logical_cores + 1})
    assert more_cores.fingerprint != d.fingerprint


def test_round_trip_through_json():
    d = probe_device()
    data = json.loads(json.dumps(d.to_dict()))
    assert data["fingerprint"] == d.fingerprint
    assert DeviceInfo.from_dict(data) == d


def test_probe_does_not_import_engines():
    code = (
        "import sys; from autodeploy.device import probe_device; probe_device(); "
        "print([m for m in ('onnxruntime', 'openvino', 'tensorflow', 'tensorrt', 'nncf', 'ai_edge_litert') "
        "if m in sys.modules])"
    )
    src = str(Path(__file__).resolve().parents[1] / "src")
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env={"PYTHONPATH": src}
    )
    assert out.stdout.strip() == "[]"


def test_the_benchmarks_cpu_line_names_the_cpu_its_cores_and_flags():
    device = probe_device()
    line = device.cpu_line()
    assert line.startswith(f"CPU: {device.cpu_model}, ") and f"{device.logical_cores} logical cores" in line
    assert all(flag in line for flag in device.isa) and "\n" not in line
