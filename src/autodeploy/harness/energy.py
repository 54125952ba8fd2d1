"""What an inference costs the machine: energy from a real meter where it has one, and always the worker's CPU time.

Energy is read from a counter the hardware keeps, never estimated, and every number names its source
(:func:`find` looks for them, and says why there is none):

- Linux powercap (``/sys/class/powercap/intel-rapl:*``): Intel RAPL and AMD's RAPL domains (the same driver
  since Linux 5.8): package, core, uncore, DRAM, psys. ``energy_uj`` counts µJ and wraps at
  ``max_energy_range_uj``; since Linux 5.10 only root may read it (CVE-2020-8694).
- NVML on an NVIDIA GPU (``nvidia-ml-py``'s ``nvmlDeviceGetTotalEnergyConsumption``: mJ since the driver
  loaded, Volta and newer), imported only when looked for.
- hwmon (``/sys/class/hwmon/hwmon*``): an ``energyN_input`` counter (µJ: ``amd_energy``, some PMICs) read as it
  is, or a ``powerN_input`` sensor (µW: the INA-family sensors of a Jetson and similar boards) integrated by a
  sampler thread.

Energy per inference is the counters' rise over the timed phase, less the idle draw measured just before it
(:func:`idle_watts`, over :data:`IDLE_S`, the model loaded and not running) times the phase's wall time, over
the inferences (items: calls x batch). Only package and DRAM zones and GPUs are summed (a core or psys zone lies
inside or over a package: each is recorded, not added); a board's hwmon sensors often overlap (an input rail and
the rails it feeds), so only the first is summed, and only where nothing else measures.

CPU time per inference is the worker's own user + system CPU seconds over the timed phase
(``time.process_time()``: every thread of the worker process, so the engine's own thread pools count, their
spin-waiting included; child processes do not) over the inferences. It is measured always, costs two clock
reads, and is a cost of its own: never called energy.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

#: Seconds the idle draw is read for, before warm-up (the model loaded, nothing running): long enough for a RAPL
#: counter (updated every ~1 ms) and a hwmon sensor (every ~10-100 ms) to move many steps.
IDLE_S = 1.0
#: How often a power sensor (hwmon ``powerN_input``) is read to integrate it into energy.
POWER_SAMPLE_S = 0.05
#: Where Linux puts its meters; tests give a recorded copy instead.
SYSFS = Path("/sys/class")
#: Powercap zones summed into the energy of an inference (by the zone's ``name``): each package and its DRAM.
_WHOLE_ZONES = ("package", "dram")


@dataclass(frozen=True)
class Counter:
    """One energy counter, in joules, that only rises (wrapping at ``wrap_j`` where it does).

    ``read`` may block for a sysfs read (a few µs) or an NVML call; it is never called inside a timed call.
    """

    source: str  # what it is, in words that name it: ``powercap intel-rapl:0 package-0``
    read: Callable[[], float]
    wrap_j: float | None = None
    counted: bool = True  # summed into the energy of an inference (see the module's docstring)
    close: Callable[[], None] = lambda: None

    def since(self, before: float, after: float) -> float:
        """Joules from ``before`` to ``after``, undoing one wrap-around (a phase shorter than a wrap: a package
        RAPL counter wraps after ~262 kJ, over an hour at full load)."""
        if after >= before or self.wrap_j is None:
            return after - before
        return after + self.wrap_j - before


@dataclass(frozen=True)
class Meters:
    """The counters this machine has, and why each kind it lacks is missing (:func:`find`)."""

    counters: tuple[Counter, ...] = ()
    absent: tuple[str, ...] = ()

    @property
    def metered(self) -> bool:
        """Whether something measures energy (a counter that is summed)."""
        return any(c.counted for c in self.counters)

    def why_none(self) -> str:
        """``no energy meter here: no /sys/class/powercap; NVML: nvidia-ml-py is not installed; ...``."""
        return "no energy meter here: " + ("; ".join(self.absent) or "none found")

    def close(self) -> None:
        for counter in self.counters:
            counter.close()


def find(root: Path | None = None, *, nvml: bool = True) -> Meters:
    """Every energy counter readable here: powercap zones, NVML GPUs (``nvml``), hwmon sensors; and, for each
    kind not found, why. ``root`` is :data:`SYSFS` (a recorded copy of it in tests)."""
    root = root or SYSFS
    counters: list[Counter] = []
    absent: list[str] = []
    for found, why in (powercap(root / "powercap"), nvml_gpus() if nvml else ([], None)):
        counters += found
        absent += [why] if why else []
    sensors, why = hwmon(root / "hwmon")
    whole = any(c.counted for c in counters)  # a board's sensors are summed only where nothing else measures
    counters += [replace(s, counted=not whole and i == 0) for i, s in enumerate(sensors)]
    absent += [why] if why else []
    return Meters(tuple(counters), tuple(absent))


def powercap(folder: Path) -> tuple[list[Counter], str | None]:
    """The RAPL zones under ``folder`` (``intel-rapl:0``, ``intel-rapl:0:2``, ...; the MMIO copies of the same
    package left out), each its own counter; why none."""
    if not folder.is_dir():
        return [], f"no {folder}"
    counters, refused = [], []
    for zone in sorted(folder.glob("intel-rapl:*")):
        energy = zone / "energy_uj"
        try:
            name = (zone / "name").read_text().strip()
            int(energy.read_text())
            wrap = int((zone / "max_energy_range_uj").read_text()) / 1e6
        except PermissionError:
            refused.append(zone.name)
            continue
        except (OSError, ValueError):  # a zone without a counter (a control type's folder)
            continue
        counters.append(Counter(f"powercap {zone.name} {name}", lambda p=energy: int(p.read_text()) / 1e6, wrap,
                                counted=name.startswith(_WHOLE_ZONES)))  # fmt: skip
    if counters:
        return counters, None
    if refused:
        return [], (f"{folder}'s energy_uj is readable by root only (Linux >= 5.10, CVE-2020-8694): run as root, or "
                    f"sudo chmod o+r {folder}/intel-rapl:*/energy_uj")  # fmt: skip
    return [], f"no RAPL zone in {folder}"


def nvml_gpus() -> tuple[list[Counter], str | None]:
    """Each NVIDIA GPU's total energy counter through NVML (``nvidia-ml-py``, imported here); why none."""
    try:
        import pynvml
    except ImportError:
        return [], "NVML: nvidia-ml-py is not installed (pip install 'autodeploy[energy]' on a machine with an NVIDIA GPU)"
    try:
        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
    except pynvml.NVMLError as exc:
        return [], f"NVML: {exc} (no NVIDIA driver)"
    counters, why = [], []
    for i in range(count):
        handle = pynvml.nvmlDeviceGetHandleByIndex(i)
        name = pynvml.nvmlDeviceGetName(handle)
        name = name.decode() if isinstance(name, bytes) else name
        try:
            pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
        except pynvml.NVMLError as exc:  # NotSupported before Volta
            why.append(f"NVML GPU {i} ({name}): {exc}")
            continue
        counters.append(Counter(f"NVML GPU {i} {name}",
                                lambda h=handle: pynvml.nvmlDeviceGetTotalEnergyConsumption(h) / 1e3))  # fmt: skip
    return counters, ("; ".join(why) or None) if not counters else None


def hwmon(folder: Path) -> tuple[list[Counter], str | None]:
    """Every hwmon energy counter (``energyN_input``, µJ) and power sensor (``powerN_input``, µW, integrated)
    under ``folder``, named by the chip and the channel's label (``hwmon hwmon1 ina3221 VDD_IN``); why none."""
    if not folder.is_dir():
        return [], f"no {folder}"
    counters = []
    for chip in sorted(folder.glob("hwmon*")):
        name = _text(chip / "name") or chip.name
        for path in sorted([*chip.glob("energy*_input"), *chip.glob("power*_input")]):
            channel = path.name.removesuffix("_input")
            label = _text(chip / f"{channel}_label") or channel
            source = f"hwmon {chip.name} {name} {label}"
            if _text(path) is None:
                continue
            if channel.startswith("energy"):
                counters.append(Counter(source, lambda p=path: int(p.read_text()) / 1e6))
            else:
                power = Integrated(lambda p=path: int(p.read_text()) / 1e6)
                counters.append(Counter(source, power.joules, close=power.close))
    return counters, None if counters else f"no hwmon energy or power sensor in {folder}"


def _text(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, ValueError):
        return None


class Integrated:
    """A power sensor (watts) made an energy counter: a daemon thread reads it every :data:`POWER_SAMPLE_S`
    once :meth:`joules` is first called, and adds up trapezoids. Thread-safe."""

    def __init__(self, watts: Callable[[], float], clock: Callable[[], float] = time.monotonic,
                 interval: float = POWER_SAMPLE_S) -> None:  # fmt: skip
        self._watts, self._clock, self._interval = watts, clock, interval
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t, self._w, self._j = 0.0, 0.0, 0.0

    def joules(self) -> float:
        """The energy since the first call, integrated up to now."""
        with self._lock:
            t, w = self._clock(), self._watts()
            if self._thread is None:  # the first reading starts the sampler
                self._thread = threading.Thread(target=self._run, name="autodeploy-power", daemon=True)
                self._thread.start()
            else:
                self._j += (w + self._w) / 2 * (t - self._t)
            self._t, self._w = t, w
            return self._j

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.joules()

    def close(self) -> None:
        self._stop.set()


def idle_watts(counters: Sequence[Counter], seconds: float = IDLE_S, sleep: Callable[[float], None] = time.sleep,
               clock: Callable[[], float] = time.monotonic) -> dict[str, float]:  # fmt: skip
    """Each counter's draw over ``seconds`` with this process idle, in watts (no counter: no wait)."""
    if not counters:
        return {}
    t0, before = clock(), [c.read() for c in counters]
    sleep(seconds)
    after, wall = [c.read() for c in counters], clock() - t0
    return {c.source: c.since(b, a) / wall for c, b, a in zip(counters, before, after, strict=True)}


@dataclass(frozen=True)
class Reading:
    """One counter over the timed phase: its rise (joules, wrap-around undone) and the idle draw before it."""

    source: str
    joules: float
    idle_w: float | None = None
    counted: bool = True

    def net(self, wall_s: float) -> float:
        """Joules above idle over ``wall_s`` (0 at least: a phase cannot cost less than nothing; a reading below
        idle is noise, and the gross and the idle are kept)."""
        return max(0.0, self.joules - (self.idle_w or 0.0) * wall_s)


@dataclass(frozen=True)
class Cost:
    """What the timed phase of one measurement cost the machine: the worker's CPU time, and energy where a meter is.

    Attributes:
        calls: Timed calls (queries, with requests in flight).
        items: Inferences: the calls' items (calls x batch); every "per inference" divides by it.
        wall_s: Wall time the readings cover.
        cpu_s: The worker's user + system CPU seconds over the timed phase (every thread of the process).
        readings: Each energy counter's reading; empty where none exists.
        no_meter: Why energy was not read (:meth:`Meters.why_none`), ``None`` where it was.
    """

    calls: int
    items: int
    wall_s: float
    cpu_s: float
    readings: tuple[Reading, ...] = ()
    no_meter: str | None = None

    @property
    def cpu_ms(self) -> float | None:
        """CPU milliseconds per inference."""
        return self.cpu_s * 1e3 / self.items if self.items else None

    @property
    def counted(self) -> tuple[Reading, ...]:
        return tuple(r for r in self.readings if r.counted)

    @property
    def energy_mj(self) -> float | None:
        """Millijoules per inference above idle, over the summed counters; ``None`` without a meter."""
        if not self.counted or not self.items:
            return None
        return sum(r.net(self.wall_s) for r in self.counted) * 1e3 / self.items

    @property
    def source(self) -> str:
        """The summed counters, named: ``powercap intel-rapl:0 package-0 + powercap intel-rapl:0:2 dram``."""
        return " + ".join(r.source for r in self.counted)

    def per_item(self, batch: int) -> Cost:
        """This cost with ``batch`` items per call (the timing loops count calls; the worker knows the batch)."""
        return Cost(self.calls, self.calls * batch, self.wall_s, self.cpu_s, self.readings, self.no_meter)

    def text(self) -> str:
        """``energy 4.5 mJ per inference (powercap intel-rapl:0 package-0), CPU time 1.23 ms per inference``, or
        ``CPU time 1.23 ms per inference (no energy meter here: ...)``."""
        from autodeploy.units import fmt_mj, fmt_ms

        cpu = f"CPU time {fmt_ms(self.cpu_ms)} per inference"
        if self.energy_mj is None:
            return f"{cpu} ({self.no_meter or 'no energy meter read'})"
        return f"energy {fmt_mj(self.energy_mj)} per inference ({self.source}, idle draw subtracted), {cpu}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, with the per-inference numbers as derived now (:meth:`from_dict` derives them again)."""
        return {"calls": self.calls, "items": self.items, "wall_s": self.wall_s, "cpu_s": self.cpu_s,
                "cpu_ms_per_inference": self.cpu_ms, "energy_mj_per_inference": self.energy_mj,
                "source": self.source or None, "no_meter": self.no_meter,
                "readings": [{"source": r.source, "joules": r.joules, "idle_w": r.idle_w, "counted": r.counted}
                             for r in self.readings]}  # fmt: skip

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Cost:
        readings = tuple(Reading(str(r["source"]), float(r["joules"]), r.get("idle_w"), bool(r.get("counted", True)))
                         for r in d.get("readings") or ())  # fmt: skip
        return cls(int(d["calls"]), int(d["items"]), float(d["wall_s"]), float(d["cpu_s"]), readings,
                   d.get("no_meter"))  # fmt: skip


@dataclass
class CostMeter:
    """Reads the worker's CPU time and every energy counter at its start, and again at :meth:`stop`.

    Not thread-safe; one meter per timed phase, started after warm-up. ``idle_w`` is :func:`idle_watts` of the
    same counters, read before warm-up so the pause does not cool what warm-up warmed.
    """

    meters: Meters = field(default_factory=Meters)
    idle_w: dict[str, float] = field(default_factory=dict)
    cpu: Callable[[], float] = time.process_time
    clock: Callable[[], float] = time.monotonic

    def __post_init__(self) -> None:
        self._t0, self._cpu0 = self.clock(), self.cpu()
        self._j0 = [c.read() for c in self.meters.counters]

    def stop(self, calls: int) -> Cost:
        """The cost since the start, for ``calls`` timed calls (one item each until :meth:`Cost.per_item`)."""
        cpu, wall = self.cpu() - self._cpu0, self.clock() - self._t0
        counters = self.meters.counters
        readings = tuple(Reading(c.source, c.since(j0, c.read()), self.idle_w.get(c.source), c.counted)
                         for c, j0 in zip(counters, self._j0, strict=True))  # fmt: skip
        why = None if self.meters.metered else self.meters.why_none()
        return Cost(calls, calls, wall, cpu, readings, why)
