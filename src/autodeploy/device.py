"""Device fingerprint: what this machine is, so results are compared only on like hardware.

The record, :class:`~autodeploy.runtime.device.DeviceInfo`, lives below the engines (:mod:`autodeploy.runtime.device`);
this module makes it. The CPU, GPU and version probes are :mod:`autodeploy.runtime.machine`, shared with the bundle
loader. :func:`probe_device` never imports an engine (versions come from installed package metadata)
and never raises on an unknown OS: what it cannot read is ``"unknown"``, 0 or empty.
"""

from __future__ import annotations

import functools
import os
import platform

import psutil

from autodeploy.runtime import machine
from autodeploy.runtime.device import DeviceInfo

#: ISA extensions that decide which engines and precisions pay off (VNNI/AMX for INT8,
#: AVX512-BF16/AMX-BF16 for bf16, NEON/ASIMD and SVE on Arm).
RELEVANT_ISA = (
    "avx2",
    "avx512f",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
    "avx_vnni",
    "neon",
    "asimd",
    "sve",
)
_UNKNOWN = "unknown"


@functools.lru_cache(maxsize=1)
def probe_device() -> DeviceInfo:
    """Describe this machine (cached for the process). Never raises, never imports an engine."""
    cpu_model, flags = machine.cpu()
    logical = os.cpu_count() or 0
    gpus = machine.nvidia_gpus() or []
    return DeviceInfo(
        cpu_model=cpu_model,
        arch=platform.machine() or _UNKNOWN,
        physical_cores=_physical_cores(logical),
        logical_cores=logical,
        isa=tuple(sorted(f for f in RELEVANT_ISA if f in flags)),
        memory_gb=_memory_gb(),
        os=f"{platform.system() or _UNKNOWN} {platform.release()}".strip(),
        python=platform.python_version(),
        engines=engine_versions(),
        gpus=tuple(f"{name} (compute {cc})" if cc else name for name, cc in gpus),
    )


def engine_versions() -> dict[str, str]:
    """Installed versions of every registered engine's runtime and build tools, by distribution."""
    from autodeploy.adapters import registry

    versions = {}
    for engine in registry.all_engines():
        for dist in (*engine.packages, *engine.build_packages):
            found = machine.version(dist)
            if found is not None:
                versions[dist] = found
    return versions


def _physical_cores(logical: int) -> int:
    try:
        return psutil.cpu_count(logical=False) or logical
    except (OSError, RuntimeError, NotImplementedError):  # topology unreadable: logical is the best guess
        return logical


def _memory_gb() -> float:
    try:
        return round(psutil.virtual_memory().total / 2**30, 1)
    except (OSError, RuntimeError, NotImplementedError):  # unknown platform: 0.0, never a crash
        return 0.0
