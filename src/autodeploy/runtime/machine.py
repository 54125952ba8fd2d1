"""This machine, as the engines care about it: CPU model and features, NVIDIA GPUs, installed versions.

The one probe shared by :mod:`autodeploy.device` (the fingerprint stored with every
measurement) and the bundle loader (the checks before a bundle runs). Standard library only;
nothing is imported from an engine, and nothing here raises on an unknown OS: what cannot be
read is ``"unknown"`` or empty.
"""

from __future__ import annotations

import platform
import shutil
import subprocess
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path

UNKNOWN = "unknown"
_CPUINFO = Path("/proc/cpuinfo")


def cpu() -> tuple[str, frozenset[str]]:
    """This CPU's model name and its feature flags, lower case (x86 ``flags``, Arm ``Features``)."""
    system = platform.system()
    if system == "Linux" and _CPUINFO.is_file():
        try:
            return parse_cpuinfo(_CPUINFO.read_text(errors="replace"))
        except OSError:
            pass
    if system == "Darwin":
        model = _sysctl("machdep.cpu.brand_string") or platform.processor() or UNKNOWN
        features = " ".join(_sysctl(k) for k in ("machdep.cpu.features", "machdep.cpu.leaf7_features"))
        flags = set(features.lower().split())
        if platform.machine() == "arm64":
            flags.add("asimd")  # every Apple Silicon core has Advanced SIMD
        return model, frozenset(flags)
    return platform.processor() or UNKNOWN, frozenset()


def parse_cpuinfo(text: str) -> tuple[str, frozenset[str]]:
    """CPU model and feature flags from the text of /proc/cpuinfo (the first processor is enough)."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        key = key.strip()
        if sep and key not in fields:
            fields[key] = value.strip()
    model = (
        fields.get("model name")
        or fields.get("Model")
        or fields.get("Hardware")
        or fields.get("cpu model")
        or platform.processor()
        or UNKNOWN
    )
    return model, frozenset((fields.get("flags") or fields.get("Features") or "").lower().split())


def nvidia_gpus() -> list[tuple[str, str]] | None:
    """``(name, compute capability)`` of each NVIDIA GPU from nvidia-smi; ``None`` without nvidia-smi.

    An empty list means nvidia-smi is there but lists no GPU (e.g. a driver without a device).
    """
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    cmd = [exe, "--query-gpu=name,compute_cap", "--format=csv,noheader"]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return []
    gpus = []
    for line in out.stdout.splitlines():
        name, _, capability = (part.strip() for part in line.partition(","))
        if name:
            gpus.append((name, capability))
    return gpus


def version(dist: str) -> str | None:
    """The installed version of the distribution ``dist`` (``"onnxruntime"``, ``"autodeploy"``), read from its
    metadata without importing it; ``None`` when it is not installed. The one reader of a version in the package:
    every module above asks here (this one, standard library only, ships in bundles too)."""
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def installed_version(dists: Iterable[str]) -> str | None:
    """The version of the first of ``dists`` that is installed (:func:`version`)."""
    return next((found for dist in dists if (found := version(dist)) is not None), None)


def _sysctl(key: str) -> str:
    if shutil.which("sysctl") is None:
        return ""
    try:
        out = subprocess.run(["sysctl", "-n", key], capture_output=True, text=True, timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""
