"""The record of one machine: :class:`DeviceInfo`, its identity and the engine versions installed on it.

Below the engines that build for a device and the registry that reads their versions, so both import it
without a circle: :func:`autodeploy.device.probe_device` makes it (asking the registry for the engines'
versions), the adapters are given it. Standard library only, like the rest of this package; a bundle
does not ship it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any


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
