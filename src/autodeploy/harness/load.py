"""How busy the machine was while a measurement ran: the one place that says what "under load" means.

A timed phase is read with a :class:`LoadMeter`: the CPU time the whole machine spent busy over the
phase (``psutil.cpu_times()``) minus what our own process spent (``Process.cpu_times()``), divided by
the wall time, is how many cores other processes kept busy on average. The hypervisor's *steal* time
counts as busy: on a VM it is other tenants taking our cores. The 1-minute load average and the CPU
clock are read at the end, where the OS tells them (``None`` where it does not).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

#: Other processes kept more than this many cores busy on average over the timed phase: the measurement
#: ran *under load*. On a quiet machine the rest of the system (kernel threads, the parent autodeploy
#: process polling its worker, idle daemons) reads 0.01-0.1 of a core. A neighbour above a quarter of a
#: core takes a core from a run that uses them all a quarter of the time, and a preempted call lands in
#: the tail the p90 is read from. It is counted in cores, not as a share of the machine: one busy
#: neighbour hurts a run on 2 of 64 cores through shared caches, memory bandwidth and clock as it does
#: on a 2-core laptop.
UNDER_LOAD_CORES = 0.25
#: A config whose rounds that ran quiet read values more than this factor apart ran on an *unsteady* machine:
#: something the meter cannot see moved it. On shared VMs the host can take a vCPU from the guest for tens of
#: seconds without reporting steal; a run on every core then reads about 2x slower in the meantime (ONNX
#: Runtime's default on a 2-vCPU VM: 5 or 10 ms a call, with both threads pinned, steal 0). The same factor
#: as the speed verdicts' promise that two runs' speed-ups agree within 1.5x.
UNSTEADY_SPREAD = 1.5
#: How long :func:`sample` watches the machine before a study starts.
SAMPLE_S = 0.5


def unsteady(values: Sequence[float | None]) -> bool:
    """Whether quiet rounds' ``values`` of one config lie more than :data:`UNSTEADY_SPREAD` apart (see there)."""
    known = [v for v in values if v is not None and v > 0]
    return len(known) >= 2 and max(known) / min(known) > UNSTEADY_SPREAD


def busy(other_cores: float) -> bool:
    """Whether other processes keeping ``other_cores`` busy on average is *under load*: more than
    :data:`UNDER_LOAD_CORES` (see there for why)."""
    return other_cores > UNDER_LOAD_CORES


@dataclass(frozen=True)
class Load:
    """The machine's load over one timed phase.

    Attributes:
        other_cores: Cores other processes (and the hypervisor's steal) kept busy on average.
        cpus: Logical cores the OS counts; ``other_cores / cpus`` is the share of the machine's CPU time.
        wall_s: Wall time the reading covers.
        loadavg_1m: The 1-minute load average at the end, where the OS has one.
        cpu_mhz: The CPU clock at the end (MHz), where readable.
    """

    other_cores: float
    cpus: int
    wall_s: float
    loadavg_1m: float | None = None
    cpu_mhz: float | None = None

    @property
    def under_load(self) -> bool:
        """Whether other processes kept the machine busy: :func:`busy` of :attr:`other_cores`."""
        return busy(self.other_cores)

    @property
    def share(self) -> float:
        """Other processes' share of the machine's CPU time over the phase (0..1)."""
        return self.other_cores / self.cpus if self.cpus else 0.0

    def text(self) -> str:
        """``other processes used 0.93 of 2 cores (47%), load average 1.80, 2596 MHz``."""
        parts = [f"other processes used {self.other_cores:.2f} of {self.cpus} cores ({self.share:.0%})"]
        if self.loadavg_1m is not None:
            parts.append(f"load average {self.loadavg_1m:.2f}")
        if self.cpu_mhz is not None:
            parts.append(f"{self.cpu_mhz:.0f} MHz")
        return ", ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, with ``under_load`` as judged now (:meth:`from_dict` judges again, it is not read)."""
        return {"other_cores": self.other_cores, "cpus": self.cpus, "wall_s": self.wall_s,
                "loadavg_1m": self.loadavg_1m, "cpu_mhz": self.cpu_mhz, "under_load": self.under_load}  # fmt: skip

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Load:
        return cls(
            float(d["other_cores"]), int(d["cpus"]), float(d["wall_s"]), d.get("loadavg_1m"), d.get("cpu_mhz")
        )


#: Reads (seconds every core spent busy since boot, seconds this process spent on a CPU); injectable for tests.
Counters = Callable[[], tuple[float, float]]


class LoadMeter:
    """Reads the machine's CPU time and this process's at :meth:`start`, and again at :meth:`stop`.

    Not thread-safe; one meter per timed phase. Reads ``/proc/stat`` (or the OS's counters) twice:
    a few tens of microseconds, outside any timed call.
    """

    def __init__(self, counters: Counters | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self._counters = counters or cpu_seconds()
        self._clock = clock
        self._t0 = clock()
        self._busy0, self._own0 = self._counters()

    @classmethod
    def start(cls) -> LoadMeter:
        return cls()

    def stop(self) -> Load:
        """The load since :meth:`start`; other processes' cores are clamped to 0..cpus (the counters tick in
        10 ms steps, apart from each other and from the clock)."""
        machine, own = self._counters()
        wall = self._clock() - self._t0
        cpus = _cpus()
        other = max(0.0, (machine - self._busy0) - (own - self._own0)) / wall if wall > 0 else 0.0
        return Load(min(other, float(cpus)), cpus, wall, _loadavg(), _mhz())


def sample(seconds: float = SAMPLE_S) -> Load:
    """Watch the machine for ``seconds`` (this process idle): how busy it is before a run starts."""
    meter = LoadMeter.start()
    time.sleep(seconds)
    return meter.stop()


def cpu_seconds() -> Counters:
    """The real counters: ``psutil.cpu_times()`` summed over the busy states (``guest`` is already inside
    ``user`` on Linux; ``steal`` counts), and this process's user + system time (every thread)."""
    import psutil

    own = psutil.Process()

    def read() -> tuple[float, float]:
        times, mine = psutil.cpu_times()._asdict(), own.cpu_times()
        busy = sum(v for k, v in times.items() if k not in ("idle", "iowait", "guest", "guest_nice"))
        return busy, mine.user + mine.system

    return read


def _cpus() -> int:
    import psutil

    return psutil.cpu_count(logical=True) or os.cpu_count() or 1


def _loadavg() -> float | None:
    try:
        return round(os.getloadavg()[0], 3)
    except (AttributeError, OSError):  # Windows has none; some containers hide it
        return None


def _mhz() -> float | None:
    import psutil

    try:
        freq = psutil.cpu_freq()
    except (AttributeError, NotImplementedError, OSError):  # not every OS or VM exposes the clock
        return None
    return round(freq.current, 1) if freq is not None and freq.current else None
