"""The engine interface every adapter implements.

An engine is one module in ``autodeploy.adapters`` with one :class:`Engine` subclass. The
public methods here check inputs and state, then call a protected hook (``_probe``,
``_space``, ``_build``, ``_load``, ``Runner._run``), so each adapter stays small and cannot
skip the checks (the pattern of Polygraphy's backends).

Contract for adapters:

* Engine packages are imported only inside the hooks, never at module import time, so
  ``import autodeploy`` works with no engine installed.
* ``_probe`` may raise anything: :meth:`Engine.probe` turns it into an *unavailable* result.
* ``_build`` writes engine-native files into an empty folder it is given; it must not time
  itself (timing lives in ``autodeploy.harness``).
* ``Runner._run`` gets feeds already checked for names, dtypes and rank, and returns one
  array per model output, in the model's output order.
* Engines are stateless; one instance may be shared.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from autodeploy.errors import BuildError, ShapeError, UnsupportedConfigError

if TYPE_CHECKING:
    from autodeploy.device import DeviceInfo
    from autodeploy.model import ModelInfo

ARTIFACT_FILE = "artifact.json"
ARTIFACT_SCHEMA = 1


@dataclass(frozen=True)
class Availability:
    """Whether an engine can run on a target, and if not, why and how to fix it."""

    available: bool
    version: str | None = None
    reason: str = ""
    fix: str = ""

    def __str__(self) -> str:
        if self.available:
            return f"available ({self.version})"
        return f"unavailable: {self.reason}" + (f"; fix: {self.fix}" if self.fix else "")


@dataclass(frozen=True)
class EngineSpace:
    """What an engine offers on one target for one model.

    ``precisions`` are the ones it can run; ``unsupported`` maps the others it knows to the
    reason (the search prunes them with that reason). ``knobs`` maps each engine knob, in the
    engine's own words, to its choices.
    """

    precisions: tuple[str, ...]
    unsupported: Mapping[str, str] = field(default_factory=dict)
    knobs: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)
    max_threads: int | None = None


@dataclass(frozen=True)
class TrialConfig:
    """One point of the search space: what to build and how to run it.

    ``threads`` of ``None`` means the engine's default. ``knobs`` uses the engine's own
    option names (e.g. ORT ``graph_optimization_level``).
    """

    engine: str
    precision: str = "fp32"
    batch: int = 1
    threads: int | None = None
    knobs: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.batch < 1:
            raise ShapeError(f"batch must be >= 1, got {self.batch}")
        if self.threads is not None and self.threads < 1:
            raise ShapeError(f"threads must be >= 1, got {self.threads}")
        # Freeze the knobs so the config is hashable and cannot change under a running trial.
        object.__setattr__(self, "knobs", dict(sorted(self.knobs.items())))

    def to_dict(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "precision": self.precision,
            "batch": self.batch,
            "threads": self.threads,
            "knobs": dict(self.knobs),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TrialConfig:
        return cls(
            engine=data["engine"],
            precision=data.get("precision", "fp32"),
            batch=int(data.get("batch", 1)),
            threads=data.get("threads"),
            knobs=data.get("knobs") or {},
        )

    def key(self) -> str:
        """A stable identity of the config, for the store and caches."""
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()[:16]

    def label(self) -> str:
        knobs = ",".join(f"{k}={v}" for k, v in self.knobs.items())
        threads = "default" if self.threads is None else str(self.threads)
        return f"{self.engine}/{self.precision}/b{self.batch}/t{threads}" + (f"/{knobs}" if knobs else "")


@dataclass(frozen=True)
class Artifact:
    """A built model: a folder of engine-native files plus ``artifact.json``.

    The folder is what the harness loads and what a bundle ships unchanged.
    """

    path: Path
    engine: str
    engine_version: str
    precision: str
    key: str
    files: tuple[str, ...]
    meta: Mapping[str, Any] = field(default_factory=dict)

    def size_bytes(self) -> int:
        return sum((self.path / f).stat().st_size for f in self.files)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": ARTIFACT_SCHEMA,
            "engine": self.engine,
            "engine_version": self.engine_version,
            "precision": self.precision,
            "key": self.key,
            "files": list(self.files),
            "meta": dict(self.meta),
        }

    @classmethod
    def read(cls, path: Path) -> Artifact:
        data = json.loads((path / ARTIFACT_FILE).read_text())
        return cls(
            path=path,
            engine=data["engine"],
            engine_version=data["engine_version"],
            precision=data["precision"],
            key=data["key"],
            files=tuple(data["files"]),
            meta=data.get("meta", {}),
        )


class Runner(ABC):
    """A loaded model ready to run. Used by the harness worker and the bundle loader."""

    def __init__(self, inputs: Mapping[str, np.dtype], output_names: tuple[str, ...]) -> None:
        self.input_dtypes = dict(inputs)
        self.output_names = output_names
        self._closed = False

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run one batch. Checks input names and dtypes, then calls :meth:`_run`."""
        if self._closed:
            raise RuntimeError("Runner.run called after close()")
        missing = set(self.input_dtypes) - set(feeds)
        extra = set(feeds) - set(self.input_dtypes)
        if missing or extra:
            raise ShapeError(
                f"feeds do not match the model inputs: missing {sorted(missing)}, unexpected {sorted(extra)}; "
                f"expected {sorted(self.input_dtypes)}"
            )
        for name, array in feeds.items():
            if array.dtype != self.input_dtypes[name]:
                raise ShapeError(
                    f"input '{name}' has dtype {array.dtype}, the model wants {self.input_dtypes[name]}"
                )
        outputs = self._run(feeds)
        return dict(zip(self.output_names, outputs, strict=True))

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._close()

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @abstractmethod
    def _run(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]: ...

    def _close(self) -> None:  # noqa: B027 - optional hook
        pass


class Engine(ABC):
    """One inference engine behind the common interface. See the module docstring."""

    #: Name used on the CLI, in configs and in the store.
    name: ClassVar[str]
    #: The pip extra that installs the engine: ``pip install 'autodeploy[<extra>]'``.
    extra: ClassVar[str | None] = None
    #: Distributions whose installed version is the engine version (first found wins).
    packages: ClassVar[tuple[str, ...]] = ()
    #: Knobs that change the built artifact (others only change how it is run).
    build_knobs: ClassVar[frozenset[str]] = frozenset()
    #: Knobs a study searches by default (others keep the engine's default unless the study lists them).
    search_knobs: ClassVar[frozenset[str]] = frozenset()

    # -- public API: checks, then hooks -------------------------------------------------

    def probe(self, target: DeviceInfo) -> Availability:
        """Say whether this engine can run on ``target``. Never raises."""
        try:
            return self._probe(target)
        except ImportError as exc:
            hint = f"pip install 'autodeploy[{self.extra}]'" if self.extra else "reinstall autodeploy"
            return Availability(False, reason=f"cannot import {exc.name or exc}", fix=hint)
        except Exception as exc:  # probe is documented to never raise; the reason is kept
            return Availability(False, reason=f"{type(exc).__name__}: {exc}")

    def space(self, target: DeviceInfo, model: ModelInfo) -> EngineSpace:
        """Precisions and knobs this engine supports on ``target`` for ``model``."""
        return self._space(target, model)

    def check(self, target: DeviceInfo, model: ModelInfo, config: TrialConfig) -> None:
        """Raise :class:`UnsupportedConfigError` with the reason if ``config`` cannot run here."""
        if config.engine != self.name:
            raise ValueError(f"config for engine {config.engine!r} given to {self.name!r}")
        space = self.space(target, model)
        if config.precision not in space.precisions:
            reason = space.unsupported.get(config.precision, "not a precision this engine knows")
            raise UnsupportedConfigError(
                f"{self.name} cannot run precision {config.precision!r} here: {reason}",
                fix=f"choose one of {', '.join(space.precisions)}",
            )
        for knob, value in config.knobs.items():
            choices = space.knobs.get(knob)
            if choices is None:
                raise UnsupportedConfigError(
                    f"{self.name} has no knob {knob!r}",
                    fix=f"known knobs: {', '.join(space.knobs) or 'none'}",
                )
            if value not in choices:
                raise UnsupportedConfigError(
                    f"{self.name} knob {knob}={value!r} is not supported",
                    fix=f"choose one of {', '.join(map(str, choices))}",
                )

    def build_key(self, model: ModelInfo, config: TrialConfig, version: str, calibration_hash: str) -> str:
        """Cache key of an artifact: model, the config fields that change the build, engine version, data."""
        build_knobs = {k: v for k, v in config.knobs.items() if k in self.build_knobs}
        payload = {
            "model": model.sha256,
            "engine": self.name,
            "version": version,
            "precision": config.precision,
            "knobs": build_knobs,
            # Calibration data only changes quantized builds.
            "calibration": calibration_hash if config.precision == "int8" else None,
            "shapes": model.shape_overrides_key(),
        }
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:24]

    def build(
        self,
        model: ModelInfo,
        config: TrialConfig,
        calibration: Mapping[str, np.ndarray] | None,
        workdir: Path,
        *,
        calibration_hash: str = "",
        version: str | None = None,
    ) -> Artifact:
        """Convert/compile once; return the cached artifact when the key was built before.

        The artifact is built in a temporary folder and renamed into place, so a crash
        mid-build never leaves a half-written artifact that later looks cached.
        """
        version = version or self.probe_version()
        key = self.build_key(model, config, version, calibration_hash)
        final = Path(workdir) / f"{self.name}-{config.precision}-{key}"
        if (final / ARTIFACT_FILE).is_file():
            return Artifact.read(final)
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
        try:
            meta = self._build(model, config, calibration, tmp) or {}
            files = tuple(sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*") if p.is_file()))
            if not files:
                raise BuildError(f"{self.name} build wrote no files for {config.label()}")
            artifact = Artifact(final, self.name, version, config.precision, key, files, meta)
            (tmp / ARTIFACT_FILE).write_text(json.dumps(artifact.to_dict(), indent=2))
            try:
                os.rename(tmp, final)
            except OSError:  # another process built the same key first: use theirs
                shutil.rmtree(tmp, ignore_errors=True)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return Artifact.read(final)

    def load(self, artifact: Artifact, config: TrialConfig, model: ModelInfo) -> Runner:
        """Load a built artifact with the runtime settings of ``config`` (threads, knobs)."""
        if artifact.engine != self.name:
            raise ValueError(f"artifact of {artifact.engine!r} given to {self.name!r}")
        return self._load(artifact, config, model)

    def probe_version(self) -> str:
        """The installed engine version, from package metadata (imports nothing)."""
        return self._version() or "unknown"

    # -- hooks --------------------------------------------------------------------------

    @abstractmethod
    def _probe(self, target: DeviceInfo) -> Availability: ...

    @abstractmethod
    def _space(self, target: DeviceInfo, model: ModelInfo) -> EngineSpace: ...

    @abstractmethod
    def _build(
        self,
        model: ModelInfo,
        config: TrialConfig,
        calibration: Mapping[str, np.ndarray] | None,
        outdir: Path,
    ) -> Mapping[str, Any] | None: ...

    @abstractmethod
    def _load(self, artifact: Artifact, config: TrialConfig, model: ModelInfo) -> Runner: ...

    def _version(self) -> str | None:
        """The first installed distribution of :attr:`packages`, from metadata (nothing is imported)."""
        from importlib.metadata import PackageNotFoundError, version

        for dist in self.packages:
            try:
                return version(dist)
            except PackageNotFoundError:
                continue
        return None
