"""Device fingerprint: what this machine is, so results are compared only on like hardware.

The CPU, GPU and version probes are :mod:`autodeploy.runtime.machine`, shared with the bundle
loader. :func:`probe_device` never imports an engine (versions come from installed package metadata)
and never raises on an unknown OS: what it cannot read is ``"unknown"``, 0 or empty.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
from dataclasses import asdict, dataclass, field
from typing import Any

import psutil

from autodeploy.runtime import machine

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


@dataclass(frozen=True)
class DeviceInfo:
    """One machine's identity plus the engine versions installed on it.

    ``memory_gb`` is total RAM in GiB. ``gpus`` holds one ``"name (compute X.Y)"`` entry per
    NVIDIA GPU. Only the hardware identity goes into :attr:`fingerprint`; engine versions are
    stored with each measurement instead, so upgrading an engine does not change the device.
    """

    cpu_model: str
    arch: str
    physical_cores: int
    logical_cores: int
    isa: tuple[str, ...]
    memory_gb: float
    os: str
    python: str
    engines: dict[str, str] = field(default_factory=dict)
    gpus: tuple[str, ...] = ()

    def has(self, flag: str) -> bool:
        """Whether the CPU has ISA extension ``flag`` (``"neon"`` and ``"asimd"`` are synonyms)."""
        flag = flag.lower()
        if flag in ("neon", "asimd"):
            return "neon" in self.isa or "asimd" in self.isa
        return flag in self.isa

    def cpu_line(self) -> str:
        """What every benchmark prints first: the CPU, its cores and the ISA flags it ran on."""
        return (f"CPU: {self.cpu_model}, {self.physical_cores} physical / {self.logical_cores} logical cores; "
                f"flags: {' '.join(self.isa) or '-'}")  # fmt: skip

    @property
    def fingerprint(self) -> str:
        """16 hex digits of SHA-256 over the hardware identity (not engine or Python versions)."""
        identity = {
            "cpu_model": self.cpu_model,
            "arch": self.arch,
            "physical_cores": self.physical_cores,
            "logical_cores": self.logical_cores,
            "isa": sorted(self.isa),
            "memory_gib": round(self.memory_gb),
            "os": self.os.split(" ", 1)[0],  # the system only: a kernel update is the same device
            "gpus": list(self.gpus),
        }
        blob = json.dumps(identity, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict; includes ``fingerprint`` for the store (ignored by :meth:`from_dict`)."""
        d = asdict(self)
        d["isa"], d["gpus"] = list(self.isa), list(self.gpus)
        d["fingerprint"] = self.fingerprint
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DeviceInfo:
        d = {k: v for k, v in d.items() if k != "fingerprint"}
        d["isa"] = tuple(d.get("isa", ()))
        d["gpus"] = tuple(d.get("gpus", ()))
        d["engines"] = dict(d.get("engines", {}))
        return cls(**d)


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
            found = machine.installed_version([dist])
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
