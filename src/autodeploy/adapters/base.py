"""The engine interface every adapter implements.

An engine is one module in ``autodeploy.adapters`` with one :class:`Engine` subclass. The
public methods here check inputs and state, then call a protected hook (``_probe``,
``_space``, ``_build``, ``_runtime_settings``), so each adapter stays small and cannot skip the
checks (the pattern of Polygraphy's backends). Running an artifact is not the adapter's job: :meth:`Engine.load`
opens it with the engine's module in :mod:`autodeploy.runtime`, the same code a bundle ships,
with the settings :meth:`Engine.runtime_settings` derives from the trial config.

Contract for adapters:

* Engine packages are imported only inside the hooks, never at module import time, so
  ``import autodeploy`` works with no engine installed.
* ``_probe`` may raise anything: :meth:`Engine.probe` turns it into an *unavailable* result.
* ``_build`` writes engine-native files into an empty folder it is given, for the device ``target``
  it is given (adapters never probe the device themselves); it must not time itself (timing lives in
  ``autodeploy.harness``).
* ``_runtime_settings`` turns a config into the runtime's settings, in the engine's own option
  names; they are stored in a bundle's manifest and applied by the same runtime there.
* Engines are stateless; one instance may be shared.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import json
import os
import shutil
import tempfile
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from autodeploy.errors import BuildError, UnsupportedConfigError, UsageError
from autodeploy.model import INT8_OPS
from autodeploy.runtime import machine
from autodeploy.runtime.base import IO, MAX_REQUESTS, Runner
from autodeploy.runtime.cache import file_sha256

__all__ = ["ARTIFACT_FILE", "IO", "NATIVE_ISA", "Artifact", "Availability", "Engine", "EngineSpace", "Runner",
           "TrialConfig", "TritonBackend", "TritonParameters", "int8_saturates", "io_of"]  # fmt: skip

if TYPE_CHECKING:
    from autodeploy.model import ModelInfo
    from autodeploy.runtime.device import DeviceInfo

ARTIFACT_FILE = "artifact.json"
ARTIFACT_SCHEMA = 1
#: Knobs of the harness's concurrency, the same words for every engine that has a parallel API
#: (:meth:`Runner.pool`): requests in flight (``AUTO``: the engine's optimum; a thread, a session,
#: an interpreter or an execution context each) and the dynamic batcher's max queue delay (µs;
#: batches of up to the config's batch are formed from single-item queries). The tuples are
#: what a study searches; any value in range may be benched.
SERVING_KNOBS: dict[str, tuple[Any, ...]] = {"num_requests": (1, 2, 4, "AUTO"), "max_queue_delay_us": (0, 500, 2000)}
#: The one table of the CPU features a precision needs to run natively (any one of them): a bf16 or
#: fp16 engine refuses a CPU without them, and the study looks at natively run precisions first.
NATIVE_ISA: dict[str, tuple[str, ...]] = {"bf16": ("avx512_bf16", "amx_bf16"), "fp16": ("avx512_fp16", "amx_fp16")}
#: The x86 features whose int8 dot product adds u8 x s8 products straight into int32 (VNNI's VPDPBUSD, AMX).
INT8_DOT_ISA = ("avx512_vnni", "avx_vnni", "amx_int8")
_X86 = ("x86_64", "amd64", "x86", "i686")


def int8_saturates(device: DeviceInfo) -> bool:
    """Whether u8 x s8 int8 kernels can saturate on ``device``: the one rule ORT's int8 and the in-house
    quantizer both follow (their ``reduce_range``: 7-bit weights, ORT's documented fix).

    x86 without VNNI or AMX multiplies byte pairs and adds each pair in int16 (VPMADDUBSW: ONNX Runtime's
    kernels from AVX2 on; oneDNN, OpenVINO's CPU kernels, documents the same on x86 without VNNI), which
    two large products overflow. ONNX Runtime's pre-AVX2 kernel widens to int16 first and cannot
    saturate: 7 bits there cost a little precision, never a wrong sum, so the one rule errs that way.
    Arm's int8 dot products add in int32.
    """
    return device.arch.lower() in _X86 and not any(device.has(flag) for flag in INT8_DOT_ISA)


#: Ops a "no op of kinds ..." line leaves out: they move or name values, none computes.
_PLUMBING = ("Identity", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Concat", "Cast", "Shape",
             "Gather", "Slice", "Constant", "Parameter", "Result", "Convert")  # fmt: skip


def require_quantized(engine: str, quantized: Iterable[str], source: Iterable[str]) -> None:
    """Refuse an int8 build that quantized nothing: ``quantized`` are the built artifact's op types,
    ``source`` the fp32 graph's. Without one of :data:`INT8_OPS` the artifact is the fp32 graph again,
    and a separate int8 candidate would be a second measurement of fp32 under another name.

    Raises:
        UnsupportedConfigError: none of ``quantized`` is an int8 op (the study prunes every config of it).
    """
    if any(op in INT8_OPS for op in quantized):
        return
    counts: dict[str, int] = {}
    for op in source:
        if op not in _PLUMBING:
            counts[op] = counts.get(op, 0) + 1
    kinds = sorted(counts, key=lambda op: -counts[op])
    shown = ", ".join(kinds[:6]) + (f" and {len(kinds) - 6} more" if len(kinds) > 6 else "")
    raise UnsupportedConfigError(
        f"{engine} int8 is identical to fp32: no op of kinds {shown or 'none'} has an int8 kernel here, "
        "so nothing was quantized",
        fix="use fp32: it is the same graph",
    )


#: ONNX's classical-ML domain (skl2onnx's tree ensembles, linear classifiers, ZipMap): ONNX Runtime runs
#: it; converters mostly do not.
ONNX_ML = "ai.onnx.ml"


def foreign_ops(model: ModelInfo, known: Mapping[str, Iterable[str]] | None = None) -> dict[str, list[str]]:
    """The op types of ``model``'s graph (subgraphs included) outside ONNX's default domain, per domain,
    in graph order, less those ``known`` holds for that domain: what a converter that handles only those
    has no rule for, read from the graph before any build. ``{}`` for a model run as given (not ONNX)."""
    if model.format != "onnx":
        return {}
    known = {d: set(ops) for d, ops in (known or {}).items()}
    found: dict[str, list[str]] = {}
    for domain, op in _domain_ops(str(model.path), model.sha256):
        if op not in known.get(domain, ()) and op not in found.setdefault(domain, []):
            found[domain].append(op)
    return {d: ops for d, ops in found.items() if ops}


@functools.lru_cache(maxsize=16)
def _domain_ops(path: str, sha256: str) -> tuple[tuple[str, str], ...]:
    """(domain, op type) of every node outside the default domain; cached per file and hash."""
    import onnx

    def walk(graph: Any) -> Iterable[tuple[str, str]]:
        for node in graph.node:
            if node.domain not in ("", "ai.onnx"):
                yield node.domain, node.op_type
            for attr in node.attribute:
                for sub in (*([attr.g] if attr.HasField("g") else []), *attr.graphs):
                    yield from walk(sub)

    return tuple(walk(onnx.load(path, load_external_data=False).graph))


@dataclass(frozen=True)
class TritonParameters:
    """What ``config.pbtxt`` carries of a winner in one Triton backend's own words (:meth:`TritonBackend.parameters`).

    ``values``: the backend's ``parameters`` (key -> string value); ``graph_level``: ``optimization.graph.level``
    (``None``: left out, the backend's default); ``notes``: what of the measured config the backend cannot
    carry, one sentence each.
    """

    values: Mapping[str, str] = field(default_factory=dict)
    graph_level: int | None = None
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class TritonBackend:
    """How Triton Inference Server serves an engine's artifacts (``bundle/triton.py`` writes ``config.pbtxt``).

    ``backend`` is Triton's backend name, ``platform`` the model platform where the backend wants one,
    ``kind`` the instance kind. ``max_batch_floor``: ``max_batch_size`` is at least this (a TensorRT plan's
    profile goes up to it). A backend with parameters of its own subclasses it and writes them in
    :meth:`parameters` (ONNX Runtime's in ``adapters/ort.py``, OpenVINO's in ``adapters/openvino.py``); an engine
    served by one of those declares that subclass.
    """

    backend: str
    platform: str | None = None
    kind: str = "KIND_CPU"
    max_batch_floor: int = 0

    def parameters(self, settings: Mapping[str, Any], serving: Mapping[str, Any], max_batch: int,
                   device: Mapping[str, Any]) -> TritonParameters:  # fmt: skip
        """The winner's settings in this backend's words: from the manifest's ``settings`` (engine, precision,
        batch, threads, knobs), its ``measurements.serving`` record (``{}`` when none), the ``max_batch_size``
        written and the manifest's ``device``. The base writes none (a TensorRT plan carries its own settings)."""
        return TritonParameters()


@dataclass(frozen=True)
class Availability:
    """Whether an engine can run on a target, and if not, why and how to fix it.

    An available engine may still carry a ``reason`` and ``fix``: a part of its job it cannot do here
    (tflite without its converter runs ``.tflite`` files but builds nothing from ONNX). Listings show it;
    the engine's :meth:`Engine.space` turns it into the reason of each precision it takes away.
    """

    available: bool
    version: str | None = None
    reason: str = ""
    fix: str = ""

    def __str__(self) -> str:
        fix = f"; fix: {self.fix}" if self.fix else ""
        if self.available:
            return f"available ({self.version})" + (f", but {self.reason}{fix}" if self.reason else "")
        return f"unavailable: {self.reason}{fix}"


@dataclass(frozen=True)
class EngineSpace:
    """What an engine offers on one target for one model.

    ``precisions`` are the ones it can run; ``unsupported`` maps the others it knows to the
    reason (the search prunes them with that reason). ``knobs`` maps each engine knob, in the
    engine's own words, to its choices. An engine that offers no precision for the model says the
    fix in those reasons (a study skips it with them; :meth:`Engine.check` has no other to offer).
    """

    precisions: tuple[str, ...]
    unsupported: Mapping[str, str] = field(default_factory=dict)
    knobs: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)
    #: Whether the thread count changes anything (False for a GPU engine: the search keeps the default).
    threads: bool = True


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
            raise UsageError(f"batch must be >= 1, got {self.batch}", fix="pass --batch 1 or more")
        if self.threads is not None and self.threads < 1:
            raise UsageError(f"threads must be >= 1, got {self.threads}", fix="pass --threads 1 or more")
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

    @classmethod
    def from_label(cls, text: str) -> TrialConfig:
        """The config a :meth:`label` names: ``openvino/int8/b1/t2`` or ``onnxruntime/fp32/b4/tdefault/NAME=VALUE,...``
        (knob values read by :func:`knob_value`). Raises: UsageError."""
        parts = text.split("/", 4)
        batch, threads = (parts + ["", ""])[2:4]
        if len(parts) < 4 or not (batch[:1] == "b" and batch[1:].isdigit()) or not (
                threads == "tdefault" or (threads[:1] == "t" and threads[1:].isdigit())):  # fmt: skip
            raise UsageError(f"config {text[:120]!r} is not ENGINE/PRECISION/bBATCH/tTHREADS[/KNOB=VALUE,...]",
                             fix="e.g. openvino/int8/b1/t2 (as fleet status and tune name a config)")  # fmt: skip
        knobs = {}
        for pair in filter(None, (parts[4] if len(parts) == 5 else "").split(",")):
            name, sep, value = pair.partition("=")
            if not (sep and name):
                raise UsageError(f"config {text[:120]!r}: knob {pair[:60]!r} is not NAME=VALUE", fix="e.g. .../t2/num_streams=2")
            knobs[name] = knob_value(value)
        return cls(parts[0], parts[1], int(batch[1:]), None if threads == "tdefault" else int(threads[1:]), knobs)


def knob_value(text: str) -> object:
    """A knob's value as the engines expect it from text (``--knob``, a config label): integers, booleans
    (true/false), else the text."""
    if text.lstrip("-").isdigit():
        return int(text)
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    return text


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
    #: SHA-256 of each file as built (``artifact.json`` itself excluded: it holds these).
    sha256: Mapping[str, str] = field(default_factory=dict)
    #: SHA-256 of the source model it was built from (``""`` in artifacts built before it was recorded).
    model_sha256: str = ""
    #: Taken from the cache by :meth:`Engine.build`, not built just now (not written to ``artifact.json``).
    reused: bool = field(default=False, compare=False)

    def size_bytes(self) -> int:
        return sum((self.path / f).stat().st_size for f in self.files)

    def digests(self) -> dict[str, str]:
        """SHA-256 of every file as it is now, ``artifact.json`` included: what a measurement records."""
        return {name: file_sha256(self.path / name) for name in (ARTIFACT_FILE, *self.files)}

    def changed(self) -> list[str]:
        """The files whose content is not what the build wrote (empty for an intact artifact)."""
        return [name for name in self.files if self.sha256.get(name) != file_sha256(self.path / name)]

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": ARTIFACT_SCHEMA,
            "engine": self.engine,
            "engine_version": self.engine_version,
            "precision": self.precision,
            "key": self.key,
            "model_sha256": self.model_sha256,
            "files": list(self.files),
            "meta": dict(self.meta),
            "sha256": dict(self.sha256),
        }

    @classmethod
    def read(cls, path: Path) -> Artifact:
        """The artifact described by ``path/artifact.json``; its files must lie inside ``path``."""
        data = json.loads((path / ARTIFACT_FILE).read_text())
        for name in data["files"]:
            if not isinstance(name, str) or Path(name).is_absolute() or ".." in Path(name).parts or not name:
                raise BuildError(f"{path / ARTIFACT_FILE} lists {name!r}, which is outside the artifact folder",
                                 fix="delete the artifact folder; the next run rebuilds it")  # fmt: skip
        return cls(
            path=path,
            engine=data["engine"],
            engine_version=data["engine_version"],
            precision=data["precision"],
            key=data["key"],
            files=tuple(data["files"]),
            meta=data.get("meta", {}),
            sha256=data.get("sha256", {}),
            model_sha256=data.get("model_sha256", ""),
        )


def io_of(model: ModelInfo) -> IO:
    """The runtime's view of a model: input and output names, dtypes and shapes."""
    return IO.from_dict({"inputs": [t.to_dict() for t in model.inputs],
                         "outputs": [t.to_dict() for t in model.outputs]})  # fmt: skip


class Engine(ABC):
    """One inference engine behind the common interface. See the module docstring."""

    #: Name used on the CLI, in configs and in the store.
    name: ClassVar[str]
    #: The pip extra that installs the engine: ``pip install 'autodeploy[<extra>]'``.
    extra: ClassVar[str | None] = None
    #: The module in :mod:`autodeploy.runtime` (or a plug-in's) that opens and runs this engine's artifacts.
    runtime: ClassVar[str]
    #: Distributions whose installed version is the engine version (first found wins): the runtime's ``PACKAGES``.
    packages: ClassVar[tuple[str, ...]] = ()
    #: Distributions that only build artifacts (converters, quantizers); their versions are recorded per device.
    build_packages: ClassVar[tuple[str, ...]] = ()
    #: Knobs that change the built artifact (others only change how it is run).
    build_knobs: ClassVar[frozenset[str]] = frozenset()
    #: Knobs a study searches by default (others keep the engine's default unless the study lists them).
    search_knobs: ClassVar[frozenset[str]] = frozenset()
    #: Knobs a ``throughput`` or ``server`` study searches by default too (README, "Throughput knobs").
    throughput_knobs: ClassVar[frozenset[str]] = frozenset({"num_requests"})
    #: Knobs that change only some precisions' artifacts: knob -> those precisions. The search asks for them
    #: there alone (``float_layers``: int8's float layers mean nothing to fp32).
    precision_knobs: ClassVar[Mapping[str, frozenset[str]]] = {}
    #: Builds take minutes (onnx2tf): a study looks at this engine after the cheap ones.
    slow_build: ClassVar[bool] = False
    #: Top-level modules that :attr:`extra` installs: a missing one's error names the extra to install.
    modules: ClassVar[tuple[str, ...]] = ()
    #: Distributions the runtime imports besides the engine's own: pinned in a bundle's requirements.txt.
    runner_extras: ClassVar[tuple[str, ...]] = ()
    #: How Triton serves this engine's artifacts; ``None`` when Triton has no backend for them.
    #: (Whether artifacts run only under the engine version that built them is the runtime module's
    #: ``VERSION_LOCKED``: a bundle's loader reads it without the adapters.)
    triton: ClassVar[TritonBackend | None] = None
    #: The model formats this engine takes: ``onnx``, and a format it runs as given (a ``.tflite``
    #: for tflite, an IR for openvino; :mod:`autodeploy.formats`). Others are pruned (:meth:`unreadable`).
    formats: ClassVar[tuple[str, ...]] = ("onnx",)
    #: Runs on a GPU: this device's CPU peaks (``harness/peaks.py``) say nothing about it, so its measurements
    #: get their GOP/s and no share of a peak (:mod:`autodeploy.roofline`).
    gpu: ClassVar[bool] = False
    #: Runs an ONNX graph on CPU kernels of its own: the peaks microbenchmark measures them, through
    #: :meth:`peak_call`. The others leave it False: the in-house engine runs on these, TensorRT on a GPU, and
    #: LiteRT would need an onnx2tf conversion of each kernel.
    peak_kernels: ClassVar[bool] = False
    #: Its int8 quantizes the model (calibrating on the user's data), so a model that is int8 already
    #: (:meth:`ModelInfo.already_int8 <autodeploy.model.ModelInfo.already_int8>`) is offered none. False for
    #: TensorRT, whose int8 is the flag that runs a model quantized already (QDQ) in int8.
    int8_quantizes: ClassVar[bool] = True

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
        """Precisions and knobs this engine supports on ``target`` for ``model`` (with :data:`SERVING_KNOBS`)."""
        offered = self._space(target, model)
        already = model.already_int8() if "int8" in offered.precisions and self.int8_quantizes else None
        if already:  # nothing left to quantize: one reason for every engine, before any build
            offered = replace(offered, precisions=tuple(p for p in offered.precisions if p != "int8"),
                              unsupported={**offered.unsupported, "int8": f"{already}; int8 would quantize nothing more"})  # fmt: skip
        return replace(offered, knobs={**SERVING_KNOBS, **offered.knobs})

    def unreadable(self, model: ModelInfo) -> str | None:
        """Why this engine cannot take ``model`` at all (its format), or ``None``: the one-line reason
        a study and a bench prune it with. An engine that reads ONNX takes a format with a converter to
        ONNX (a ``.tflite``: tf2onnx, :mod:`autodeploy.tflite_onnx`) where that converter is installed."""
        if model.format in self.formats:
            return None
        from autodeploy.formats import FORMATS

        fmt = FORMATS[model.format]
        takes = " or ".join("ONNX" if f == "onnx" else FORMATS[f].what for f in self.formats)
        said = f"{self.name}: the model is {fmt.what}; this engine reads {takes}"
        if fmt.to_onnx and "onnx" in self.formats:
            from autodeploy import tflite_onnx

            why = tflite_onnx.missing()
            return None if why is None else f"{said}, and {why}"
        return said

    def check(self, target: DeviceInfo, model: ModelInfo, config: TrialConfig) -> None:
        """Raise :class:`UnsupportedConfigError` with the reason if ``config`` cannot run here."""
        if config.engine != self.name:
            raise ValueError(f"config for engine {config.engine!r} given to {self.name!r}")
        unreadable = self.unreadable(model)
        if unreadable:
            from autodeploy.formats import FORMATS

            raise UnsupportedConfigError(unreadable, fix=f"run it on {FORMATS[model.format].engine} "
                                         "(--engine), or pass the ONNX model it was exported from")  # fmt: skip
        space = self.space(target, model)
        if config.precision not in space.precisions:
            reason = space.unsupported.get(config.precision, "not a precision this engine knows")
            raise UnsupportedConfigError(  # no precision offered: the reason carries its own fix
                f"{self.name} cannot run precision {config.precision!r} here: {reason}",
                fix=f"choose one of {', '.join(space.precisions)}" if space.precisions else None,
            )
        for knob, value in config.knobs.items():
            if knob in SERVING_KNOBS:
                _check_serving_knob(knob, value)
                continue
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
        self._check(target, model, config)

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
        target: DeviceInfo,
        calibration_hash: str = "",
        version: str | None = None,
    ) -> Artifact:
        """Convert/compile once; return the cached artifact (``reused``) when the key was built before.

        The artifact is built in a temporary folder and renamed into place, so a crash
        mid-build never leaves a half-written artifact that later looks cached. A cached one
        is reused only when its ``artifact.json`` records this build (key and source model) and
        its files match their recorded SHA-256; else it is built again. Anyone who can write the
        cache can also rewrite ``artifact.json`` consistently: the harness checks a reused artifact
        against the files a store recorded when it was measured (:func:`autodeploy.harness.run.prepare`).
        ``target`` is the device it is built for: the caller's (a study's device, or
        :func:`autodeploy.device.probe_device` for this machine), since adapters never probe the device.
        """
        version = version or self.probe_version()
        model = self._readable(model, Path(workdir))
        key = self.build_key(model, config, version, calibration_hash)
        final = Path(workdir) / f"{self.name}-{config.precision}-{key}"
        if (final / ARTIFACT_FILE).is_file():
            cached = Artifact.read(final)
            if (cached.key, cached.model_sha256) == (key, model.sha256) and not cached.changed():
                return replace(cached, reused=True)
            discard(final)  # damaged, replaced or built from something else: build it again

        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
        try:
            meta = self._build(model, config, calibration, tmp, target) or {}
            if model.source:  # exported or converted by autodeploy (PyTorch, tf2onnx): the tool and its version, shipped
                meta = {**meta, "source": dict(model.source)}
            files = tuple(sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*") if p.is_file()))
            if not files:
                raise BuildError(f"{self.name} build wrote no files for {config.label()}")
            digests = {name: file_sha256(tmp / name) for name in files}
            artifact = Artifact(final, self.name, version, config.precision, key, files, meta, digests, model.sha256)
            (tmp / ARTIFACT_FILE).write_text(json.dumps(artifact.to_dict(), indent=2))
            try:
                os.rename(tmp, final)
            except OSError:  # another process built the same key first: use theirs
                shutil.rmtree(tmp, ignore_errors=True)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return Artifact.read(final)

    def _readable(self, model: ModelInfo, workdir: Path) -> ModelInfo:
        """``model`` as this engine builds from it: itself, or for a format this engine does not read, the ONNX
        its converter makes (a ``.tflite`` through tf2onnx, cached in ``workdir/tf2onnx``; :meth:`unreadable`)."""
        if model.format in self.formats or "onnx" not in self.formats:
            return model
        from autodeploy import tflite_onnx

        return tflite_onnx.as_onnx(model, workdir / tflite_onnx.CONVERTER)

    def runtime_settings(self, artifact: Artifact, config: TrialConfig, model: ModelInfo) -> dict[str, Any]:
        """The runtime's settings for ``config``, in the engine's own option names.

        JSON-ready: a bundle's manifest stores them and its loader applies them unchanged.
        """
        if artifact.engine != self.name:
            raise ValueError(f"artifact of {artifact.engine!r} given to {self.name!r}")
        return self._runtime_settings(artifact, config, model)

    def runtime_module(self, config: TrialConfig) -> str:
        """The module that runs ``config``'s artifact (an engine may run on another's runtime)."""
        return self.runtime

    def serving_engine(self, config: TrialConfig) -> Engine:
        """The engine whose runtime runs ``config``'s artifact: its Triton backend and runner extras apply
        (this engine, unless it runs on another's runtime)."""
        return self

    def runtime_packages(self, config: TrialConfig) -> tuple[str, ...]:
        """The distributions of the runtime that runs ``config``'s artifact (what a bundle pins)."""
        return tuple(importlib.import_module(self.runtime_module(config)).PACKAGES)

    def runtime_version(self, engine_version: str, config: TrialConfig) -> str:
        """The version of :meth:`runtime_packages` that a trial measured under ``engine_version`` ran on."""
        return engine_version

    def load(self, artifact: Artifact, config: TrialConfig, model: ModelInfo) -> Runner:
        """Open a built artifact with the runtime settings of ``config`` (threads, knobs)."""
        settings = self.runtime_settings(artifact, config, model)
        runtime = importlib.import_module(self.runtime_module(config))
        return runtime.open(artifact.path, settings, io_of(model))

    def peak_call(self, graph: bytes, precision: str, shapes: Mapping[str, tuple[int, ...]]) -> Callable[[Any], Any]:
        """One call of the serialized ONNX ``graph`` at ``precision`` on this engine's own kernels, opened through
        its runtime on its default threads (every core), at static input ``shapes``: what the peaks
        microbenchmark times (``harness/peaks.py``), for an engine that declares :attr:`peak_kernels`.
        The call takes the feeds (input name -> array)."""
        raise NotImplementedError(f"{self.name} declares no kernels of its own for the peaks microbenchmark")

    def requirements(self, artifact: Artifact, config: TrialConfig, device: Mapping[str, Any]) -> dict[str, Any]:
        """What a target must have for the artifact to run at all (not merely fast); ``{}`` if nothing.

        ``device`` is the stored description of the device it was measured on (``DeviceInfo.to_dict()``).

        ``{"isa_any_of": [...], "why": ...}`` or ``{"gpu_compute_capability": "9.0", "why": ...}``:
        a bundle's loader refuses a machine that lacks them.
        """
        return {}

    def oversubscription(self, config: TrialConfig, logical_cores: int) -> str | None:
        """Why ``config`` asks for more threads than the device has (a study prunes it), or ``None``.

        The default fits engines that run each request in flight on a thread of its own with
        ``threads`` threads each (ONNX Runtime, LiteRT): requests × threads must fit the cores.
        ``AUTO`` requests are sized by the runtime to fit; ``threads=None`` is the engine's default (every core).
        """
        requests = config.knobs.get("num_requests", "AUTO")
        if requests == "AUTO":
            return None
        parallel = config.knobs.get("execution_mode") == "ORT_PARALLEL"  # ORT's inter-op pool runs only then
        threads = (config.threads or logical_cores) * (int(config.knobs.get("inter_op_num_threads") or 1) if parallel else 1)
        if int(requests) * threads <= logical_cores:
            return None
        return (f"oversubscribes the cores: num_requests={requests} × {threads} thread(s) each = "
                f"{int(requests) * threads} threads on {logical_cores} logical cores")  # fmt: skip

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
        target: DeviceInfo,
    ) -> Mapping[str, Any] | None: ...

    @abstractmethod
    def _runtime_settings(self, artifact: Artifact, config: TrialConfig, model: ModelInfo) -> dict[str, Any]: ...

    def _check(self, target: DeviceInfo, model: ModelInfo, config: TrialConfig) -> None:
        """Raise :class:`UnsupportedConfigError` for a combination of valid settings this engine cannot run
        (called by :meth:`check` after the precision and every knob value are known to be offered)."""
        return None  # most engines run every combination of what they offer

    def _version(self) -> str | None:
        """The first installed distribution of :attr:`packages`, from metadata (nothing is imported)."""
        return machine.installed_version(self.packages)


def _check_serving_knob(knob: str, value: Any) -> None:
    """``num_requests`` 1..MAX_REQUESTS or AUTO; ``max_queue_delay_us`` >= 0 (an integer)."""
    if knob == "num_requests":
        if value == "AUTO" or (isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_REQUESTS):
            return
        raise UnsupportedConfigError(f"num_requests={value!r}: requests in flight must be 1 to {MAX_REQUESTS}, or AUTO",
                                     fix=f"pass --knob num_requests=N with N <= {MAX_REQUESTS}")  # fmt: skip
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise UnsupportedConfigError(f"max_queue_delay_us={value!r}: the queue delay must be an integer >= 0 µs",
                                     fix="pass --knob max_queue_delay_us=0 or more")  # fmt: skip


def discard(folder: Path) -> None:
    """Move a cached artifact out of the way (atomically, so no reader sees half of it), then delete it."""
    stale = folder.with_name(f".{folder.name}.stale-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        os.rename(folder, stale)
    except FileNotFoundError:  # another process discarded it first
        return
    shutil.rmtree(stale, ignore_errors=True)
