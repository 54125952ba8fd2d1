"""An engine's compiled cache: what each runtime declares it keeps, and the record that says whether a cache folder
may be used.

Each runtime module declares its engine's own cache as ``CACHE`` (:class:`Declared`): OpenVINO's model cache
(``CACHE_DIR``, the compiled blob), ONNX Runtime's optimized model file (``SessionOptions.optimized_model_filepath``),
or, where the engine has none a runtime can use, why (a TensorRT artifact is its serialized engine already; this
LiteRT's Python interpreter takes no XNNPACK weight cache path). A runtime asked to start from a cache
(``settings["compiled_cache"]``: ``{"dir": FOLDER, "key": {...}}``, given at open time, never stored with the
settings) calls :func:`begin` first: the folder's record (:data:`RECORD`) must name this engine, its installed
version and the caller's key (:func:`cache_key`: the device, the artifact, the settings), and every file must
still have the SHA-256 it was sealed with; else the folder is emptied and the engine builds into it, and
:func:`seal` records it. The runner says what happened (:attr:`autodeploy.runtime.base.Runner.cache`): :data:`USED`, :data:`MADE`, or
``remade: WHY`` in one line.

Standard library only, like every module of this package.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import machine

#: The record beside a cache's files: the engine, its version, the caller's key and each file's SHA-256.
RECORD = "cache.json"
#: A start that ran from the cache as recorded.
USED = "used"
#: A start that found no cache and made it.
MADE = "made"
#: How a start that found a cache it may not use begins its one line (``remade: made by openvino 2025.1, ...``).
REMADE = "remade"


@dataclass(frozen=True)
class Declared:
    """An engine's compiled cache as its runtime declares it: ``what`` it keeps, in words, or ``None`` and ``why``
    there is none a runtime can use."""

    what: str | None
    why: str = ""

    @property
    def exists(self) -> bool:
        return self.what is not None

    def __str__(self) -> str:
        return self.what or f"no compiled cache: {self.why}"


def cache_key(artifact_key: str, settings: Mapping[str, Any], device: str | None = None) -> dict[str, str]:
    """The key a cache is made under: the device (:func:`device_key`, this machine's by default), the artifact
    (its build key) and the runtime's settings (:func:`settings_key`). The harness and a bundle's loader both
    make it here, so a cache shipped in a bundle is used exactly where it would have been made the same."""
    return {"device": device or device_key(), "artifact": artifact_key, "settings": settings_key(settings)}


def device_key() -> str:
    """16 hex digits of this machine as compiled code depends on it: CPU model, ISA flags and NVIDIA GPUs
    (:mod:`.machine`; what a compiled blob or an optimized graph was specialized for)."""
    model, flags = machine.cpu()
    gpus = machine.nvidia_gpus() or []
    blob = json.dumps({"cpu": model, "isa": sorted(flags), "gpus": sorted(map(list, gpus))}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def settings_key(settings: Mapping[str, Any]) -> str:
    """16 hex digits of a runtime's settings (``compiled_cache`` left out): a cache is made for one set of them."""
    kept = {k: v for k, v in settings.items() if k != "compiled_cache"}
    return hashlib.sha256(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()[:16]


def settings_of(settings: Mapping[str, Any]) -> tuple[Path, dict[str, Any]] | None:
    """The cache folder and key a runtime was asked to start from (``settings["compiled_cache"]``), or ``None``."""
    asked = settings.get("compiled_cache")
    return None if not asked else (Path(asked["dir"]), dict(asked.get("key") or {}))


def begin(folder: Path, engine: str, version: str | None, key: Mapping[str, Any]) -> str:
    """Whether the cache in ``folder`` may be used by ``engine`` at ``version`` under ``key``: :data:`USED`, or,
    with the folder emptied for the engine to build into, :data:`MADE` (there was none) or ``remade: WHY`` (one
    made by another engine version or for another key, or a file changed since it was sealed)."""
    folder = Path(folder)
    why = why_not(folder, engine, version, key)
    if why is None:
        return USED
    had = folder.exists() and any(folder.iterdir())
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True, exist_ok=True)
    return f"{REMADE}: {why}" if had else MADE


def seal(folder: Path, engine: str, version: str | None, key: Mapping[str, Any]) -> None:
    """Record the files the engine wrote into ``folder`` (their SHA-256), with ``engine``, ``version`` and ``key``:
    what :func:`begin` checks before the next start uses them. Written atomically."""
    folder = Path(folder)
    files = {str(p.relative_to(folder)): file_sha256(p) for p in sorted(folder.rglob("*"))
             if p.is_file() and p.name != RECORD and not p.name.startswith(".")}  # fmt: skip
    record = {"engine": engine, "version": version, "key": dict(key), "files": files}
    tmp = folder / f".{RECORD}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(record, indent=1, sort_keys=True))
    os.replace(tmp, folder / RECORD)


def read(folder: Path) -> dict[str, Any] | None:
    """The record of the cache in ``folder`` (:func:`seal`'s), ``None`` where there is none or it does not parse."""
    try:
        record = json.loads((Path(folder) / RECORD).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def why_not(folder: Path, engine: str, version: str | None, key: Mapping[str, Any]) -> str | None:
    """Why the cache in ``folder`` may not be used by ``engine`` at ``version`` under ``key``, in words; ``None``
    where it may (what :func:`begin` checks, and what an export checks before it ships a cache)."""
    record = read(folder)
    if record is None:
        return "no cache record" if folder.exists() else "no cache"
    if (record.get("engine"), record.get("version")) != (engine, version):
        return f"made by {record.get('engine')} {record.get('version')}, this is {engine} {version}"
    theirs = record.get("key") or {}
    for name in sorted(set(theirs) | set(key)):
        if theirs.get(name) != key.get(name):
            return f"made for {name} {theirs.get(name)}, this start is for {key.get(name)}"
    files = record.get("files")
    if not isinstance(files, dict) or not files:
        return "the record lists no files"
    for name, digest in sorted(files.items()):
        path = folder / name
        if ".." in Path(name).parts or not path.is_file():
            return f"cache file {name} is missing"
        if file_sha256(path) != digest:
            return f"cache file {name} changed since it was made (SHA-256 differs)"
    return None


def file_sha256(path: Path) -> str:
    """The SHA-256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()
