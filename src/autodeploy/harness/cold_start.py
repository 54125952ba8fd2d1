"""Cold start: the time from a new process to a config's first result, measured in fresh processes.

What a serverless function, a camera that boots or an autoscaled replica pays on every start. Each start is a
real ``python -m autodeploy.harness.cold_child`` (:mod:`autodeploy.harness.cold_child`), which imports only what
a bundle imports; it is split into the engine's import, the load (the runtime module's ``open``: read and compile
or deserialize) and the first call, and the time from starting the process to the first result holds them all
(and the interpreter's own start). A config is started :data:`DEFAULT_STARTS` times without the engine's compiled
cache and, where its runtime declares one (:mod:`autodeploy.runtime.cache`), as often again from it: the first
start with the cache makes it (:attr:`ColdStart.made`, kept apart), the later ones use it; the two kinds of
start alternate, so a drift of the machine touches both alike. Each part is given as the median of the starts
with its order-statistic interval (:func:`autodeploy.harness.stats.median_interval`: min..max for 5 starts).

The files a start reads are in the page cache after the first one: these are starts of a warm machine, not of a
first boot reading from disk.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from autodeploy.child import ChildFailed, run_module
from autodeploy.harness.stats import median_interval
from autodeploy.runtime.cache import USED, Declared

#: Fresh processes per kind of start (without the cache, and from it) where none is asked for.
DEFAULT_STARTS = 5
#: The child module that makes one start.
CHILD = "autodeploy.harness.cold_child"
#: Seconds one start may take before it counts as failed.
START_TIMEOUT_S = 300.0
#: Where compiled caches are kept, in ``HarnessSettings.workdir``: a folder per artifact and settings.
COMPILED_DIR = "compiled"
#: The parts of a start, each a field ``<part>_ms`` of :class:`Start`.
PARTS = ("process", "import", "load", "first")


@dataclass(frozen=True)
class Start:
    """One fresh process, in ms: from starting it to its first result (``process_ms``), of which importing the
    engine, the load (the runtime's ``open``) and the first call; ``cache`` is what the open did with the
    compiled cache (``used``, ``made``, ``remade: WHY``; ``None``: started without one)."""

    process_ms: float
    import_ms: float
    load_ms: float
    first_ms: float
    cache: str | None = None


@dataclass(frozen=True)
class Spread:
    """The median of several starts' values (ms) and its order-statistic interval, with the coverage it has."""

    median: float
    low: float
    high: float
    coverage: float | None  # None: one start, no interval


def spread(values: list[float]) -> Spread:
    """The median of ``values`` and its interval (:func:`~autodeploy.harness.stats.median_interval`)."""
    median = float(np.median(values))
    found = median_interval(values)
    if found is None:
        return Spread(median, median, median, None)
    return Spread(median, found[0], found[1], found[2])


@dataclass(frozen=True)
class Starts:
    """Several fresh starts of one kind (without the cache, or from it)."""

    runs: tuple[Start, ...]

    def of(self, part: str) -> Spread:
        """The spread of one part (:data:`PARTS`) over the starts."""
        return spread([getattr(r, f"{part}_ms") for r in self.runs])

    def to_dict(self) -> dict[str, Any]:
        """Every start, and each part's median and interval (``process_ms``: ``{median, low, high, coverage}``)."""
        return {"runs": [asdict(r) for r in self.runs], **{f"{p}_ms": asdict(self.of(p)) for p in PARTS}}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Starts:
        return cls(tuple(Start(**r) for r in d["runs"]))


@dataclass(frozen=True)
class ColdStart:
    """A config's cold start (``Measurement.cold_start``): ``without`` its engine's compiled cache and, where its
    runtime declares one, ``cached`` (each start from the cache that ``made``, the first, wrote). ``cache`` names
    the engine's cache, or why it has none."""

    cache: str
    without: Starts
    made: Start | None = None
    cached: Starts | None = None

    @property
    def used(self) -> bool:
        """Every start with the cache ran from it."""
        return self.cached is not None and all(r.cache == USED for r in self.cached.runs)

    @property
    def best(self) -> Starts:
        """The starts a deployment on this machine makes: from the cache where every start used it, else without."""
        return self.cached if self.cached is not None and self.used else self.without

    @property
    def value_ms(self) -> float:
        """The cold start the objective ``cold-start`` minimizes: the median time from a new process to its first
        result, from the cache where it is used (:attr:`best`)."""
        return self.best.of("process").median

    def to_dict(self) -> dict[str, Any]:
        return {"cache": self.cache, "starts": len(self.without.runs), "value_ms": self.value_ms,
                "without": self.without.to_dict(), "made": None if self.made is None else asdict(self.made),
                "cached": None if self.cached is None else self.cached.to_dict()}  # fmt: skip

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ColdStart:
        return cls(d["cache"], Starts.from_dict(d["without"]), None if d.get("made") is None else Start(**d["made"]),
                   None if d.get("cached") is None else Starts.from_dict(d["cached"]))  # fmt: skip


def measure(module: str, model_dir: Path, settings: Mapping[str, Any], io: Mapping[str, Any],
            feeds: Mapping[str, np.ndarray], *, declared: Declared, key: Mapping[str, Any], cache_dir: Path,
            starts: int = DEFAULT_STARTS) -> ColdStart:  # fmt: skip
    """Start the artifact in ``model_dir`` with the runtime ``module`` and ``settings`` ``starts`` times in fresh
    processes, each running ``feeds`` once; and, where the runtime ``declared`` a compiled cache, one start that
    makes it in ``cache_dir`` (emptied first) under ``key`` and ``starts`` from it, alternating with the others.

    Raises:
        RuntimeError: a start failed (its child's one-line reason).
    """
    with tempfile.TemporaryDirectory(prefix="autodeploy-cold-start-") as tmp:
        feeds_path = Path(tmp, "feeds.npz")
        np.savez(feeds_path, **feeds)
        base = {"module": module, "model_dir": str(model_dir), "io": dict(io), "feeds": str(feeds_path)}
        plain = _write(Path(tmp, "plain.json"), {**base, "settings": dict(settings)})
        if not declared.exists:
            return ColdStart(str(declared), Starts(tuple(_start(plain) for _ in range(starts))))
        shutil.rmtree(cache_dir, ignore_errors=True)  # the first start with the cache makes it
        asked = {"dir": str(cache_dir), "key": dict(key)}
        cached = _write(Path(tmp, "cached.json"), {**base, "settings": {**settings, "compiled_cache": asked}})
        made = _start(cached)
        without, used = [], []
        for _ in range(starts):
            without.append(_start(plain))
            used.append(_start(cached))
        return ColdStart(str(declared), Starts(tuple(without)), made, Starts(tuple(used)))


def _write(path: Path, spec: Mapping[str, Any]) -> Path:
    path.write_text(json.dumps(spec))
    return path


def _start(spec: Path) -> Start:
    """One start in a fresh process (:mod:`autodeploy.harness.cold_child`), timed from just before it is started."""
    started_at = time.time()  # the child says when its first result was ready on the same clock
    try:
        said = json.loads(run_module(CHILD, str(spec), timeout_s=START_TIMEOUT_S))
    except ChildFailed as failed:
        raise RuntimeError(f"a cold start in a fresh process failed: {failed.reason}") from None
    return Start((said["ready_at"] - started_at) * 1e3, said["import_ms"], said["load_ms"], said["first_ms"],
                 said["cache"])  # fmt: skip


def text(cold: ColdStart) -> list[str]:
    """The cold start in words, one line per kind of start (what ``bench --cold-start`` prints)."""

    def line(name: str, starts: Starts) -> str:
        process, load, first = (starts.of(p) for p in ("process", "load", "first"))
        return (f"{name}: {_ms(process)} from a new process to the first result (load {_ms(load)}, first "
                f"inference {_ms(first)}; median of {len(starts.runs)} starts [min..max])")  # fmt: skip

    lines = [line("cold start without the compiled cache", cold.without)]
    if cold.cached is None:
        return [*lines, f"compiled cache: none ({cold.cache.removeprefix('no compiled cache: ')})"]
    used = sum(r.cache == USED for r in cold.cached.runs)
    made = "" if cold.made is None else f"; the first start made it: load {cold.made.load_ms:.1f} ms"
    return [*lines, line("cold start from the compiled cache", cold.cached),
            f"compiled cache: {cold.cache}; used by {used} of {len(cold.cached.runs)} starts{made}"]  # fmt: skip


def _ms(s: Spread) -> str:
    return f"{s.median:.1f} ms [{s.low:.1f}..{s.high:.1f}]"
