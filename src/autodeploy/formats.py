"""Model files in the formats users have besides ONNX: a TFLite flatbuffer, an OpenVINO IR.

Such a file is a model for the engine that runs it as given (no conversion), its baseline and its
fp32 reference; other engines that read the format themselves take it too (OpenVINO converts a
``.tflite`` with its own frontend: ``Engine.formats``), and the engines that read ONNX only take a
format with a converter to ONNX (``Format.to_onnx``: tf2onnx for a ``.tflite``, :mod:`autodeploy.tflite_onnx`)
as that converter's ONNX, still judged against the format's own engine. It is what
:func:`autodeploy.model.load_model` takes in through :func:`detect` and :func:`describe`. Its
interface (input and output names, dtypes, shapes) comes from that engine itself: its runtime module
(``Format.module``: ``autodeploy.runtime.tflite``, ``autodeploy.runtime.openvino``) reads it with its
``describe(path)``, in a child process (``python -m autodeploy.formats KIND PATH``), because a hostile file may
crash or hang the engine's reader; the child prints JSON, never pickle.

An OpenVINO IR is two files: ``NAME.xml`` (the graph) and ``NAME.bin`` (the weights) beside it,
the pair ``openvino.save_model`` writes. The weights are taken only from that plain file in the
same folder (never a link, never another path), and hashed with the ``.xml``.
"""

from __future__ import annotations

import importlib
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autodeploy.errors import ModelError, one_line

ONNX = "onnx"


@dataclass(frozen=True)
class Format:
    """A model format other than ONNX: what it is called, the engine that runs it, that engine's reader."""

    what: str  # "a TFLite flatbuffer"
    engine: str  # the engine that runs it as given: the baseline and the fp32 reference
    reader: str  # the engine's part that reads it, named in errors
    export: str  # how a user makes one, named in the fix
    baseline: str  # what the baseline (``engine`` at fp32) is called wherever a speed-up or a reference is named
    #: The engine's runtime module that reads it: its ``describe(path)`` gives the interface (:func:`describe`).
    module: str
    #: What turns it into ONNX for the engines that read ONNX only (:mod:`autodeploy.tflite_onnx`), or ``""``.
    to_onnx: str = ""
    #: Its weights are a file of their own beside it (an IR's ``NAME.bin``: :func:`weights_of`), hashed and
    #: copied with it.
    weights: bool = False


#: The formats taken as given, by kind (``ModelInfo.format``); ONNX is every other file.
FORMATS: dict[str, Format] = {
    "tflite": Format(
        "a TFLite flatbuffer", "tflite", "LiteRT's interpreter", "re-export it with the TFLite converter",
        "LiteRT fp32, the file as given", "autodeploy.runtime.tflite", to_onnx="tf2onnx",
    ),
    "openvino": Format(
        "an OpenVINO IR", "openvino", "OpenVINO's read_model", "re-save it with openvino.save_model",
        "OpenVINO fp32, the IR as given", "autodeploy.runtime.openvino", weights=True,
    ),
}
#: Reading a model's interface in the engine takes its own process, bounded in time.
DESCRIBE_TIMEOUT_S = 120.0


def detect(path: Path) -> str:
    """``"tflite"`` (file identifier ``TFL3`` at byte 4), ``"openvino"`` (an XML document whose root is
    ``<net``) or ``"onnx"`` for every other file (ONNX intake refuses what is not ONNX).

    Raises:
        ModelError: a ``.tflite`` or ``.xml`` file that is not what its suffix says.
    """
    with open(path, "rb") as f:
        head = f.read(4096)
    torch_file = _torch_file(path, head)
    if torch_file == "torchscript":
        raise ModelError(f"{path} is a TorchScript archive (torch.jit.save): its program is TorchScript, with pickles, "
                         "which autodeploy never loads", fix=TORCHSCRIPT_FIX)  # fmt: skip
    if torch_file == "checkpoint":
        raise ModelError(f"{path} is a PyTorch checkpoint (torch.save): weights without the code that runs them, "
                         "in a pickle, which autodeploy never loads", fix=CHECKPOINT_FIX)  # fmt: skip
    if head[4:8] == b"TFL3":
        return "tflite"
    text = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if text.startswith((b"<?xml", b"<net ", b"<net>")) and b"<net" in text:
        return "openvino"
    suffix = path.suffix.lower()
    if suffix == ".tflite":
        raise ModelError(f"{path} is not a TFLite flatbuffer (no TFL3 file identifier at byte 4); "
                         "the file may be truncated or something else", fix=FORMATS["tflite"].export)  # fmt: skip
    if suffix == ".xml":
        raise ModelError(
            f"{path} is not an OpenVINO IR (no <net> root element)", fix=FORMATS["openvino"].export
        )
    return ONNX


#: What a user with a ``torch.save`` checkpoint does instead: the two PyTorch routes autodeploy takes.
CHECKPOINT_FIX = ("load it into its nn.Module in your code, then either give autodeploy that module "
                  "(autodeploy.tune(module, example_inputs=(x,)), README: Python API) or save it as a .pt2 "
                  "(torch.export.save(torch.export.export(module, (x,)), 'model.pt2')) and give the .pt2")


#: ... and with a TorchScript archive: ONNX from its own exporter, which reads TorchScript.
TORCHSCRIPT_FIX = ("export it to ONNX in your code: torch.onnx.export(torch.jit.load(PATH), (x,), 'model.onnx', "
                   "dynamo=False), and give the .onnx")


def _torch_file(path: Path, head: bytes) -> str | None:
    """``"checkpoint"`` for ``torch.save``'s file (a zip archive holding ``data.pkl``, its format since torch 1.6,
    or a bare pickle, protocol 2+, under a ``.pt``/``.pth``/``.ckpt`` name), ``"torchscript"`` for
    ``torch.jit.save``'s (the same archive with ``code/`` and ``constants.pkl``), else ``None``. Only the zip's
    directory is read, nothing in it. A ``.pt2`` (also a zip) is PyTorch's program format: never either."""
    suffix = path.suffix.lower()
    if suffix == ".pt2":
        return None
    if head.startswith(b"PK\x03\x04"):
        import zipfile

        try:
            with zipfile.ZipFile(path) as archive:
                names = archive.namelist()
        except (zipfile.BadZipFile, OSError, ValueError):
            return None
        if not any(n.endswith("/data.pkl") or n == "data.pkl" for n in names):
            return None
        script = any("/code/" in n or n.endswith("/constants.pkl") for n in names)
        return "torchscript" if script else "checkpoint"
    return "checkpoint" if suffix in (".pt", ".pth", ".ckpt") and head[:1] == b"\x80" else None


def weights_of(xml: Path) -> str:
    """The name of an IR's weights file: ``NAME.bin`` beside ``NAME.xml``, a plain file (not a link).

    Raises:
        ModelError: it is missing, or a link or a folder.
    """
    name = xml.with_suffix(".bin").name
    target = xml.parent / name
    if target.is_symlink() or (target.exists() and not target.is_file()):
        raise ModelError(f"the weights {name} of OpenVINO IR {xml} are a link or not a plain file",
                         fix=f"copy the .bin saved with {xml.name} next to it as a plain file")  # fmt: skip
    if not target.exists():
        raise ModelError(f"OpenVINO IR {xml} has no weights file {name} beside it",
                         fix=f"copy the {name} saved with {xml.name} into the same folder")  # fmt: skip
    return name


def files_beside(path: Path, kind: str) -> tuple[str, ...]:
    """The files a model in format ``kind`` at ``path`` reads besides itself (``Format.weights``: an IR's
    :func:`weights_of`), by name, in the same folder.

    Raises:
        ModelError: one is missing, or a link or a folder.
    """
    return (weights_of(path),) if FORMATS[kind].weights else ()


def describe(path: Path, kind: str) -> dict[str, Any]:
    """The model's inputs and outputs as its engine reads them: ``{"inputs": [...], "outputs": [...]}``,
    each ``{"name", "dtype", "shape"}`` with ``None`` for a dynamic dim.

    Raises:
        ModelError: the engine cannot read the file (corrupt, truncated), or hangs on it.
    """
    fmt = FORMATS[kind]
    from autodeploy.child import ChildFailed, run_module

    try:
        line = run_module(__name__, kind, str(path), timeout_s=DESCRIBE_TIMEOUT_S,
                          env_extra={"TF_CPP_MIN_LOG_LEVEL": "3"})  # fmt: skip
    except ChildFailed as failed:
        if failed.timed_out:
            raise ModelError(f"{fmt.reader} did not read {path} within {DESCRIBE_TIMEOUT_S:g} s ({fmt.what})",
                             fix=fmt.export) from None  # fmt: skip
        why = f"it crashed reading it ({failed.signal})" if failed.signal else failed.reason
    else:
        if line:
            return json.loads(line)
        why = "it printed nothing"
    raise ModelError(f"{path} looks like {fmt.what}, but {fmt.reader} cannot read it: {one_line(why)}",
                     fix=f"the file may be truncated or corrupt; {fmt.export}")  # fmt: skip


# -- the child ---------------------------------------------------------------------------------

#: An OpenVINO error's lines that name its own source files (``Exception from src/...cpp:84:``, ``Check '...'
#: failed at src/...``): the line that says what is wrong comes after them.
_ENGINE_SOURCE = re.compile(r"^(Exception from \S+:\d+:|Check '.*' failed at \S+:\d+:)$")


def main(argv: list[str]) -> int:
    """The child of :func:`describe`: the interface of the file at ``path``, read by its format's engine, or the
    reader's reason, one line, for describe() to quote."""
    from autodeploy.child import child_main, last_line

    kind, path = argv

    def read() -> dict[str, Any]:
        # an IR's NAME.bin beside it, a plain file: what its engine reads with it
        files_beside(Path(path), kind)
        return importlib.import_module(FORMATS[kind].module).describe(Path(path))

    return child_main(read, reason=lambda exc: last_line(exc, noise=_ENGINE_SOURCE))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
