"""The routes from a framework's file to ONNX, each a row of one record (:class:`Converter`).

A route converts a file in a child process (:func:`autodeploy.child.run_module`) and caches the ONNX per file
content and converter version: a ``.tflite`` by tf2onnx (:data:`autodeploy.tflite_onnx.TF2ONNX`), a ``.pt2`` by
``torch.onnx.export`` (:data:`autodeploy.pytorch.TORCH`). What every route does alike is written here once: the
cache folder's name (the file's SHA-256 and the converter's version), the record sealed beside the ONNX and bound
to the file and the installed versions (:mod:`autodeploy.sealed`: a record that does not match is converted
again), and the ``source`` record a converted model carries (``ModelInfo.source``, shipped in a bundle). Each row
lives beside its route, which reads the installed versions; the next framework is one more row. Stdlib only.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autodeploy import sealed

#: The converted model's file name in its cache folder.
ONNX_FILE = "model.onnx"


@dataclass(frozen=True)
class Converter:
    """One route to ONNX: what its records and its cache folder are named, and what they are bound to."""

    framework: str  # the file's framework, as ``source["framework"]`` names it: "tflite", "pytorch"
    tool: str  # the package whose version names the cache folder: "tf2onnx", "torch"
    #: What converted it, as ``source`` names it: ``("converter", "tf2onnx.convert.from_tflite")``.
    how: tuple[str, str]
    record: str  # the sealed record beside the ONNX: "convert.json"
    #: The installed versions (and settings) every record is bound to, read from the packages (never from a
    #: record), ``tool``'s among them: ``{"tf2onnx": "1.16.1", "tensorflow": "2.17.0", "opset": 17}``.
    installed: Callable[[], dict[str, Any]]
    under: str = ""  # a folder of its own in the cache ("pytorch"), or the cache itself

    def bound(self, sha256: str) -> dict[str, Any]:
        """What every record of the conversion of the file with this SHA-256 must name: the file, and the
        installed versions."""
        return {"source_sha256": sha256, **self.installed()}

    def folder(self, cache: Path, bound: Mapping[str, Any]) -> Path:
        """The cache folder of one file's conversion (:meth:`bound`): per file content and ``tool`` version
        (another converter, another ONNX)."""
        version = re.sub(r"[^0-9A-Za-z.]+", "_", str(bound[self.tool]))
        return Path(cache) / self.under / f"{bound['source_sha256'][:24]}-{self.tool}{version}"

    def cached(self, folder: Path, bound: Mapping[str, Any]) -> bool:
        """Whether ``folder`` holds this file's ONNX as converted here: its record sealed, bound to the file and
        the installed converter, and naming the ONNX's SHA-256 (a planted or damaged entry is converted again)."""
        record = sealed.read(folder / self.record, dict(bound))
        return record is not None and sealed.holds(folder / ONNX_FILE, record.get("model_sha256"))

    def seal(self, folder: Path, bound: Mapping[str, Any]) -> None:
        """Seal the record of the ONNX just converted into ``folder``: ``bound`` and the ONNX's SHA-256."""
        sealed.seal(folder / self.record, {**bound, "model_sha256": sealed.file_sha256(folder / ONNX_FILE)})

    def source(self, bound: Mapping[str, Any], file: str, **more: Any) -> dict[str, Any]:
        """The conversion as ``ModelInfo.source`` records it (and a bundle ships): the framework, what converted
        it and the installed versions, the file (named ``file``) and its SHA-256, and ``more``."""
        versions = {k: v for k, v in bound.items() if k != "source_sha256"}
        return {"framework": self.framework, self.how[0]: self.how[1], **versions, "file": file,
                "sha256": bound["source_sha256"], **more}  # fmt: skip
