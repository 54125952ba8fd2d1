"""Cache records that say what they describe: a JSON body bound to its inputs, with the digest of its content.

A conversion cache (``.tflite`` -> ONNX, ``.pt2`` -> ONNX) keeps, beside its output, a record naming the
input's SHA-256, the installed converter's versions and the output's SHA-256. Before a record is used it
must be whole (its digest matches its content), bound to what the caller expects now (:func:`read`'s
``bound``) and hold the output it names (:func:`holds`); anything else is converted again. The limit: the
cache folder is the user's own, and whoever can write it can write a matching record; the digest guards
against damage, half-written and stale records and planted ones that do not match their content, not
against a writer who recomputes it. Callers therefore never take versions from a record: they ship what
is installed. Stdlib only.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any


def file_sha256(path: Path) -> str | None:
    """The SHA-256 of the file at ``path``, or ``None`` when it cannot be read (none yet)."""
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    except OSError:  # none: nothing to match
        return None
    return digest.hexdigest()


def holds(path: Path, sha256: object) -> bool:
    """``path`` is a file whose SHA-256 is ``sha256``."""
    digest = file_sha256(path)
    return digest is not None and digest == sha256


def _digest(body: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def seal(path: Path, body: dict[str, Any]) -> None:
    """Write ``body`` and the digest of its content to ``path``, whole (renamed into place)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps({**body, "digest": _digest(body)}))
    os.replace(tmp, path)


def read(path: Path, bound: dict[str, Any]) -> dict[str, Any] | None:
    """The record at ``path`` if it is whole (its digest matches its content) and names every item of
    ``bound`` as given (the input, the installed converter); ``None`` for none, or one that does not match."""
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):  # none yet, unreadable or not JSON: converted again
        return None
    if not isinstance(record, dict) or record.pop("digest", None) != _digest(record):
        return None
    return record if all(record.get(k) == v for k, v in bound.items()) else None
