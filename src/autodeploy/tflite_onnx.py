"""A ``.tflite`` turned into ONNX by tf2onnx, for the engines that read ONNX only (ONNX Runtime, the in-house
engine, TensorRT): ``bench face.tflite --engine onnxruntime``.

The model stays the ``.tflite``: LiteRT fp32 on the file as given is its baseline and its accuracy
reference (:mod:`autodeploy.formats`), so a conversion that changes the outputs fails its fp32 verdict
as a broken conversion. The ONNX is a step of those engines' build (:meth:`Engine.build
<autodeploy.adapters.base.Engine.build>`): converted with ``tf2onnx.convert.from_tflite`` in a child
process (TensorFlow's import is heavy, and a hostile file may crash the converter), once per file
content and tf2onnx version (cached beside the artifacts), and recorded as a conversion, the converter
and its version, in the ONNX model's :attr:`ModelInfo.source <autodeploy.model.ModelInfo.source>`
and so in each artifact's ``meta["source"]``, which a bundle ships. A refusal is cached too: the
converter's own reason, or a timeout with the time it ran under (a larger :data:`CONVERT_TIMEOUT_S` tries
again); the same file then fails at once with the same one line.

The cache's records: ``convert.json`` beside ``model.onnx`` holds the ONNX's SHA-256, ``refused.json``
the one-line reason; each is bound to the ``.tflite``'s SHA-256 and the installed tf2onnx, TensorFlow and
opset, and carries the SHA-256 of its own content (:mod:`autodeploy.sealed`). A record that does not match (damaged,
half-written, from another converter, an ONNX swapped beside it, a refusal planted in an earlier layout) is
discarded and the file converted again. The limit: the cache folder is the user's own, and whoever can
write it can also write a record whose digest matches; the digest guards against damage and against
stale or planted records that do not match their content, not against a writer who recomputes it. What
this module trusts less than that it never reads from a record: the versions shipped in ``source`` are
always the installed packages', and a reason is printed only as one line, control characters escaped
and its length bounded (:func:`autodeploy.errors.one_line`), whether the converter said it in this run or
a record kept it.

tf2onnx comes with the ``[tflite]`` extra; without it the route says so in one line
(:func:`missing`). tf2onnx and TensorFlow are imported only in the child.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from autodeploy import sealed
from autodeploy.child import ChildFailed, child_main, last_line, run_module
from autodeploy.converters import ONNX_FILE, Converter
from autodeploy.errors import ConversionError, one_line
from autodeploy.formats import FORMATS
from autodeploy.runtime import machine

if TYPE_CHECKING:
    from autodeploy.model import ModelInfo

CONVERTER = "tf2onnx"
INSTALL = "pip install 'autodeploy[tflite]'"
#: The ONNX opset written: 13 or later for ORT's per-channel int8, 17 for LayerNormalization.
OPSET = 17
#: Where a .tflite goes when tf2onnx cannot take it: the engine that reads the file as given. Not OpenVINO, whose
#: own TFLite frontend stops on the same custom ops (MediaPipe's Convolution2DTransposeBias), so the two fixes
#: would point at each other.
GIVEN_FIX = f"run it on {FORMATS['tflite'].engine}, the engine that reads the file as given"
#: A large model converts in tens of seconds; a hostile file may hang the converter.
CONVERT_TIMEOUT_S = 600.0
#: ONNX domains the engines that take the converted model run; an op outside them (or unknown to
#: ONNX's schemas) is one tf2onnx left unconverted.
_KNOWN_DOMAINS = ("", "ai.onnx", "ai.onnx.ml", "com.microsoft")
_RECORD = "convert.json"  # the ONNX's SHA-256, bound to the file and the converter
_REFUSED = "refused.json"  # the converter's reason or its timeout, kept: the same file fails the same way
_UNSEALED = ("failed.txt",)  # an earlier layout's refusal, with no digest: never read, removed
#: A reason is shown as one line of at most this many characters.
REASON_CHARS = 500


def missing() -> str | None:
    """Why a ``.tflite`` cannot be turned into ONNX here (tf2onnx or TensorFlow not installed), or ``None``."""
    lacking = [m for m in ("tf2onnx", "tensorflow") if importlib.util.find_spec(m) is None]
    if not lacking:
        return None
    return f"{' and '.join(lacking)}, which turn{'s' * (len(lacking) == 1)} it into ONNX, {'is' if len(lacking) == 1 else 'are'} not installed ({INSTALL})"


def version() -> str:
    """The installed tf2onnx's version, read without importing it.

    Raises:
        ConversionError: tf2onnx is not installed.
    """
    found = machine.version(CONVERTER)
    if found is None:
        raise ConversionError(f"{CONVERTER}, which turns a .tflite into ONNX, is not installed ({INSTALL})")
    return found


def _installed() -> dict[str, Any]:
    """What every record of a conversion is bound to besides the file: the installed tf2onnx and TensorFlow (read
    from the packages, never from a record) and the opset."""
    return {CONVERTER: version(), "tensorflow": _tensorflow_version(), "opset": OPSET}


#: The route's row: its cache folder, its sealed record and the ``source`` it writes (:mod:`autodeploy.converters`).
TF2ONNX = Converter(
    "tflite", CONVERTER, ("converter", f"{CONVERTER}.convert.from_tflite"), _RECORD, _installed
)
_bound = TF2ONNX.bound  # what every record of the conversion of one file names: its SHA-256 and _installed()


def as_onnx(model: ModelInfo, cache: Path) -> ModelInfo:
    """``model`` (a ``.tflite``) as the ONNX tf2onnx makes of it: the same interface (names, shapes,
    the user's fixed shapes and batch axes), the ONNX file and its SHA-256, ``format="onnx"`` and the
    conversion in ``source``.

    Raises:
        ConversionError: tf2onnx is missing, failed, left an op unconverted (one line naming it), or
            renamed an input or output.
    """
    from autodeploy.model import load_model

    why = missing()
    if why is not None:
        raise ConversionError(f"{model.path.name} needs a conversion to ONNX for this engine, and {why}")
    onnx_path, record = to_onnx(model.path, model.sha256, cache)
    converted = load_model(onnx_path, name=model.name)
    theirs = (set(converted.input_names), set(converted.output_names))
    if theirs != (set(model.input_names), set(model.output_names)):
        raise ConversionError(f"{CONVERTER} renamed the tensors of {model.path.name}: inputs "
                              f"{sorted(theirs[0])}, outputs {sorted(theirs[1])} in its ONNX, "
                              f"{list(model.input_names)} and {list(model.output_names)} in the file; "
                              f"fix: {GIVEN_FIX}")  # fmt: skip
    note = f"{model.path.name} converted to ONNX by {CONVERTER} {record[CONVERTER]} (opset {record['opset']})"
    return replace(model, path=converted.path, sha256=converted.sha256, opset=converted.opset,
                   external_files=(), format="onnx", source=record, notes=(*model.notes, note))  # fmt: skip


def to_onnx(tflite: Path, sha256: str, cache: Path) -> tuple[Path, dict[str, Any]]:
    """The ONNX of ``tflite`` (whose SHA-256 is ``sha256``), converted in a child process on first use and
    cached under ``cache`` per file content and tf2onnx version, and its record:
    ``{"framework", "converter", "tf2onnx", "tensorflow", "opset", "file", "sha256"}``, the versions read
    from the installed packages. A cache entry whose record does not match is converted again (module
    docstring).

    Raises:
        ConversionError: the conversion failed or timed out (the converter's reason, kept for the next call
            too), or the converter crashed.
    """
    bound = _bound(sha256)
    folder = TF2ONNX.folder(cache, bound)
    refused = sealed.read(folder / _REFUSED, bound)
    if refused is not None and _still_refused(refused):
        raise ConversionError(one_line(refused.get("reason"), REASON_CHARS))
    if refused is not None or not TF2ONNX.cached(folder, bound):
        _discard(folder)
        folder.mkdir(parents=True, exist_ok=True)
        _convert_in_child(tflite, folder, bound)
    return folder / ONNX_FILE, TF2ONNX.source(bound, tflite.name)


def _convert_in_child(tflite: Path, folder: Path, bound: dict[str, Any]) -> None:
    """Convert into ``folder`` and seal its record (``bound`` and the ONNX's SHA-256), or seal the refusal."""
    try:
        run_module(__name__, str(tflite), str(folder), timeout_s=CONVERT_TIMEOUT_S,
                   env_extra={"TF_CPP_MIN_LOG_LEVEL": "3"})  # fmt: skip
    except ChildFailed as failed:
        if failed.timed_out:  # kept with its timeout: a hostile file hangs again, every run
            _refuse(folder, bound, f"{CONVERTER} did not convert {tflite.name} within {CONVERT_TIMEOUT_S:g} s; it "
                    f"was stopped; fix: {GIVEN_FIX}", timeout_s=CONVERT_TIMEOUT_S)  # fmt: skip
        if failed.reported:  # the converter's own reason: this file fails so with this tf2onnx
            _refuse(folder, bound, failed.reason)
        raise ConversionError(f"{CONVERTER} could not convert {tflite.name}: {one_line(failed.reason)}; "
                              f"fix: {GIVEN_FIX}") from None  # fmt: skip
    TF2ONNX.seal(folder, bound)


def _still_refused(refused: dict[str, Any]) -> bool:
    """A kept refusal holds, but a timeout shorter than :data:`CONVERT_TIMEOUT_S` is tried again."""
    timeout = refused.get("timeout_s")
    return timeout is None or (isinstance(timeout, (int, float)) and timeout >= CONVERT_TIMEOUT_S)


def _refuse(folder: Path, bound: dict[str, Any], reason: str, *, timeout_s: float | None = None) -> NoReturn:
    """Keep the refusal, one line, sealed, and raise it."""
    reason = one_line(reason, REASON_CHARS)
    sealed.seal(folder / _REFUSED, {**bound, "reason": reason, "timeout_s": timeout_s})
    raise ConversionError(reason) from None


# -- the cache's records: bound to what they describe, with the digest of their own content ------------


def _discard(folder: Path) -> None:
    """Remove a cache entry's files: the conversion starts from nothing, and no record outlives what it describes."""
    for name in (ONNX_FILE, _RECORD, _REFUSED, *_UNSEALED):
        (folder / name).unlink(missing_ok=True)


def _tensorflow_version() -> str | None:
    """The installed TensorFlow's version (the distribution that provides ``tensorflow``), read without importing it."""
    from importlib.metadata import packages_distributions

    found = machine.version("tensorflow")
    if found is None:  # tensorflow-cpu, tf-nightly, ...: whichever provides the module
        dists = packages_distributions().get("tensorflow")
        found = machine.version(dists[0]) if dists else None
    return found


# -- the child ---------------------------------------------------------------------------------


def convert(tflite: Path, folder: Path) -> dict[str, Any]:
    """``tf2onnx.convert.from_tflite`` into ``folder/model.onnx``, written whole and renamed into place, and
    its record (the parent seals its own, from the installed versions: :func:`to_onnx`).

    Raises:
        ConversionError: tf2onnx raised, or left ops unconverted (named).
    """
    import onnx
    import tensorflow as tf
    import tf2onnx
    from tf2onnx import convert as tf2onnx_convert

    try:
        proto, _ = tf2onnx_convert.from_tflite(str(tflite), opset=OPSET)
    except Exception as exc:
        raise ConversionError(f"{CONVERTER} could not convert {tflite.name}: {last_line(exc)[:300]}; "
                              f"fix: {GIVEN_FIX}") from None  # fmt: skip
    left = unconverted(proto)
    if left:
        raise ConversionError(f"{CONVERTER} has no ONNX conversion for TFLite op{'s' * (len(left) > 1)} "
                              f"{', '.join(left)} of {tflite.name}; fix: {GIVEN_FIX}")  # fmt: skip
    record = {"framework": "tflite", "converter": f"{CONVERTER}.convert.from_tflite", CONVERTER: tf2onnx.__version__,
              "tensorflow": tf.__version__, "opset": OPSET}  # fmt: skip
    tmp = folder / f".model.{os.getpid()}.onnx"
    onnx.save(proto, str(tmp))
    os.replace(tmp, folder / ONNX_FILE)
    return record


def unconverted(proto: Any) -> list[str]:
    """The op types of ``proto`` that ONNX's schemas do not know in their domain: those tf2onnx kept as
    TFLite ops (it converts with ``continue_on_error``), in graph order, once each."""
    from onnx import defs

    left: list[str] = []
    for node in proto.graph.node:
        domain = "" if node.domain == "ai.onnx" else node.domain
        known = domain in _KNOWN_DOMAINS and (domain == "com.microsoft" or defs.has(node.op_type, domain))
        if not known and node.op_type not in left:
            left.append(node.op_type)
    return left


def main(argv: list[str]) -> int:
    """``python -m autodeploy.tflite_onnx TFLITE FOLDER``: convert, print the record or one line why not (for
    to_onnx to keep and raise)."""
    return child_main(lambda: convert(Path(argv[0]), Path(argv[1])), reported=ConversionError)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
