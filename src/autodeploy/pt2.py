"""A ``.pt2`` read by allowlist: the program built from its raw payloads, never by ``torch.export.load``.

``torch.export.load`` is code on untrusted bytes in several ways (PyTorch's documentation says so):

- weights and constants marked ``use_pickle``, opaque and custom objects, sample inputs, the legacy
  ``data/weights/<m>.pt`` layout and the pre-2.7 archive (a root-level ``archive_format``): each is unpickled,
  after a ``weights_only=True`` try, with ``weights_only=False``;
- a shared library under ``data/aotinductor/`` is extracted and ``dlopen``-ed;
- the graph's JSON is not inert either: every symbolic size (``expr_str``) goes through ``sympy.sympify``,
  which is ``eval``; a node's target is any attribute chain under ``torch`` (``torch.os.system``); and the
  program's ``guards_code`` is Python source compiled into a guard that ``program.module()`` runs.

So this module reads the zip itself and accepts exactly the entries ``torch.export.save`` writes in today's
format (:data:`ENTRIES`), under one root, stored uncompressed as torch stores them (so no entry can claim more
bytes than the file holds: a zip bomb is refused by its declared sizes, and reading is bounded by them), and
refuses every other name. It builds the state dict and the constants from their raw bytes (``use_pickle``
refused), never reads the sample inputs, checks every symbolic expression against a small grammar
(:func:`check_expression`) and every call target against torch's operators (:func:`check_target`), drops the
guards, and hands the checked JSON to torch's graph deserializer. torch is imported inside the functions.
"""

from __future__ import annotations

import json
import re
import sys
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autodeploy.errors import ModelError

FIX = "re-save it with torch.export.save from a program of plain tensors (no custom objects), and load only files you trust"
SAVE_FIX = "save the model with torch.export.save(program, PATH)"
#: Every entry ``torch.export.save`` writes for one program (named ``model``), under the archive's root folder.
ENTRIES = (
    re.compile(r"archive_format"),
    re.compile(r"archive_version"),
    re.compile(r"byteorder"),
    re.compile(r"\.data/version"),
    re.compile(r"\.data/serialization_id"),
    re.compile(r"models/model\.json"),
    re.compile(r"data/sample_inputs/model\.pt"),  # a pickle: never read
    re.compile(r"data/weights/model_weights_config\.json"),
    re.compile(r"data/weights/weight_[0-9]{1,9}"),
    re.compile(r"data/constants/model_constants_config\.json"),
    re.compile(r"data/constants/tensor_[0-9]{1,9}"),
)
#: The root folder: torch names it after the file's stem (never extracted: entries are read from the zip).
ROOT = re.compile(r"(?!\.{1,2}$)[^/\\\x00-\x1f\x7f]{1,255}")
#: The format and version this reader knows (torch 2.7 and later write these).
ARCHIVE_FORMAT, ARCHIVE_VERSION = b"pt2", b"0"
#: The JSON files are read whole; a graph larger than this is no graph torch wrote for a model here.
MAX_JSON_BYTES = 256 * 2**20

#: Names a symbolic size may use besides its own symbols (``s0``, ``u3``): sympy's constructors and assumptions,
#: and torch's sympy functions (added at check time from ``torch.utils._sympy.functions``).
SYMPY_NAMES = frozenset(
    "Symbol Integer Float Rational Max Min Eq Ne Lt Le Gt Ge And Or Not Abs Pow Mul Add Mod floor ceiling sqrt "
    "Piecewise oo zoo nan True False None positive negative integer real nonnegative nonpositive finite zero "
    "nonzero even odd commutative rational".split()
)
_TOKEN = re.compile(r"\s+|\d+(?:\.\d+)?(?:[eE][-+]?\d+)?|'[A-Za-z_][A-Za-z0-9_]*'|[A-Za-z_][A-Za-z0-9_]*"
                    r"|\*\*|//|==|!=|<=|>=|[-+*/%(),<>=&|~]")  # fmt: skip
_SYMBOL = re.compile(r"[a-z]{1,8}[0-9]{1,9}")
#: ``_operator`` functions a graph may call (symbolic-size arithmetic and ``getitem``).
OPERATORS = frozenset(
    "getitem add sub mul truediv floordiv mod pow neg pos abs eq ne lt le gt ge and_ or_ xor not_ invert "
    "lshift rshift".split()
)
_OP_TARGET = re.compile(r"torch\.ops(?:\.[A-Za-z_][A-Za-z0-9_]*){2,3}")
_SYM_TARGET = re.compile(r"torch\._?sym_[A-Za-z0-9_]+")
_MATH_TARGET = re.compile(r"math\.[a-z][a-z0-9]*")


@dataclass(frozen=True)
class Archive:
    """The checked entries of one ``.pt2``: its root folder and ``{name below the root: zip entry}``, read from
    the zip opened once (:meth:`close` it, or use it as a context manager)."""

    path: Path
    root: str
    entries: dict[str, zipfile.ZipInfo]
    zip: zipfile.ZipFile = field(repr=False, compare=False)

    def read(self, name: str, limit: int | None = None) -> bytearray:
        """The bytes of entry ``name`` (below the root), at most ``limit``, read into one buffer of its declared
        size (checked in :func:`check`; a tensor is built on this buffer, not on a copy)."""
        info = self.entries[name]
        if limit is not None and info.file_size > limit:
            raise ModelError(
                f"{self.path}: {name} claims {info.file_size:,} bytes, more than {limit:,}", fix=FIX
            )
        data = bytearray(info.file_size)
        with self.zip.open(info) as f:
            got = f.readinto(data)
        if got != info.file_size:
            raise ModelError(f"{self.path}: {name} is cut short ({got:,} of {info.file_size:,} bytes)", fix=SAVE_FIX)
        return data

    def close(self) -> None:
        self.zip.close()

    def __enter__(self) -> Archive:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def check(pt2: Path) -> Archive:
    """The archive's entries when every one is an entry ``torch.export.save`` writes today (:data:`ENTRIES`),
    under one root, stored uncompressed, their sizes adding up to no more than the file.

    Raises:
        ModelError: not a zip, another layout (legacy ``.pt`` weights, the pre-2.7 format, AOTInductor
            libraries, extra files, ...), a compressed or oversized entry, a duplicate name, another version.
    """
    try:
        archive = zipfile.ZipFile(pt2)
    except (zipfile.BadZipFile, OSError):
        raise ModelError(f"{pt2} is not a .pt2 archive (not a zip file)", fix=SAVE_FIX) from None
    try:
        found = _checked(pt2, archive)
        _check_header(found)
    except BaseException:
        archive.close()
        raise
    return found


def _checked(pt2: Path, archive: zipfile.ZipFile) -> Archive:
    infos = archive.infolist()
    roots = {info.filename.partition("/")[0] for info in infos}
    if len(roots) != 1 or not ROOT.fullmatch(root := next(iter(roots))):
        shown = ", ".join(sorted(roots)[:3])
        raise ModelError(f"{pt2} is not a .pt2 as torch.export.save writes it: its entries lie under {shown or 'nothing'}, "
                         "not one folder", fix=FIX)  # fmt: skip
    entries: dict[str, zipfile.ZipInfo] = {}
    for info in infos:
        name = info.filename[len(root) + 1 :]
        if not any(p.fullmatch(name) for p in ENTRIES):
            raise ModelError(f"{pt2} holds {info.filename[:120]!r}, which torch.export.save does not write "
                             f"({_what(name)}); the file is not loaded", fix=FIX)  # fmt: skip
        if name in entries:
            raise ModelError(f"{pt2} holds {info.filename[:120]!r} twice; the file is not loaded", fix=FIX)
        if info.compress_type != zipfile.ZIP_STORED or info.compress_size != info.file_size:
            raise ModelError(f"{pt2}: {info.filename[:120]!r} is compressed ({info.file_size:,} bytes from "
                             f"{info.compress_size:,}), which torch.export.save never does; the file is not loaded",
                             fix=FIX)  # fmt: skip
        entries[name] = info
    if sum(i.file_size for i in infos) > pt2.stat().st_size:
        raise ModelError(
            f"{pt2}: its entries claim more bytes than the file holds; the file is not loaded", fix=FIX
        )
    return Archive(pt2, root, entries, archive)


def _what(name: str) -> str:
    """Why a name is refused, in words, for the names a hostile or old file uses."""
    if name.startswith("data/aotinductor/"):
        return "an AOTInductor package: native code torch would load"
    if name.endswith(".pt") or name.startswith(("data/constants/custom_obj", "data/constants/opaque_obj")):
        return "a pickle torch would load"
    if "/" not in name and name:
        return (
            "the pre-2.7 format, which torch loads with pickle"
            if name == "archive_format"
            else "an entry outside the archive's folder"
        )
    return "not part of today's format"


def _check_header(archive: Archive) -> None:
    for name, want in (("archive_format", ARCHIVE_FORMAT), ("archive_version", ARCHIVE_VERSION)):
        if name not in archive.entries or archive.read(name, 64).strip() != want:
            raise ModelError(f"{archive.path} is not a .pt2 of today's format ({name} is not {want.decode()})",
                             fix=f"save it again with torch.export.save under torch 2.7 or later; {FIX}")  # fmt: skip
    if (
        "byteorder" in archive.entries
        and archive.read("byteorder", 64).strip().decode(errors="replace") != sys.byteorder
    ):
        raise ModelError(
            f"{archive.path} was saved on a machine of the other byte order",
            fix="save it on this kind of machine",
        )
    for name in (
        "models/model.json",
        "data/weights/model_weights_config.json",
        "data/constants/model_constants_config.json",
    ):
        if name not in archive.entries:
            raise ModelError(f"{archive.path} lacks {name}; it is not a whole .pt2", fix=SAVE_FIX)


# -- the graph's JSON --------------------------------------------------------------------------------------


def check_expression(text: str, allowed: frozenset[str]) -> None:
    """A symbolic size as torch writes it (``Symbol('s77', positive=True, integer=True)``, ``2*s0 + 1``):
    numbers, operators, the names in ``allowed``, symbols and quoted symbol names. sympy's ``sympify`` is
    ``eval``; nothing else reaches it.

    Raises:
        ModelError: any other token (an attribute, a subscript, a builtin, a string that is no name).
    """
    pos = 0
    while pos < len(text):
        token = _TOKEN.match(text, pos)
        if token is None:
            raise ModelError(f"a symbolic size in the .pt2 holds {text[pos:pos + 20]!r}, which no size has; "
                             "the file is not loaded", fix=FIX)  # fmt: skip
        word = token.group()
        if word[0].isalpha() or word[0] == "_":
            if word not in allowed and not _SYMBOL.fullmatch(word):
                raise ModelError(f"a symbolic size in the .pt2 names {word[:40]!r}, which no size uses; "
                                 "the file is not loaded", fix=FIX)  # fmt: skip
        pos = token.end()


def check_target(target: str) -> None:
    """A call target as torch writes it: ``torch.ops.NS.OP[.OVERLOAD]``, a symbolic helper (``torch.sym_max``),
    ``_operator.getitem`` and its arithmetic kin, or ``math.FUNC``.

    Raises:
        ModelError: anything else (``torch.os.system`` would be called when the program runs).
    """
    name = target.partition(".")[2]
    ok = (_OP_TARGET.fullmatch(target) or _SYM_TARGET.fullmatch(target) or _MATH_TARGET.fullmatch(target)
          or (target.startswith("_operator.") and name in OPERATORS))  # fmt: skip
    if not ok or "__" in target:
        raise ModelError(
            f"the .pt2's graph calls {target[:80]!r}, which is no operator; the file is not loaded", fix=FIX
        )


def _nodes(value: Any) -> Iterator[tuple[str, Any]]:
    """Every ``(key, value)`` pair of a JSON tree, depth first."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for key, inner in item.items():
                yield key, inner
                stack.append(inner)
        elif isinstance(item, list):
            stack.extend(item)


def check_graph(program: dict[str, Any], allowed: frozenset[str]) -> dict[str, Any]:
    """The program's JSON with every expression and call target checked and its guards dropped (Python source
    that ``program.module()`` would compile and run; the engines check the shapes they are fed themselves).

    Raises:
        ModelError: an expression, a target or a custom object torch's deserializer would turn into code.
    """
    for key, value in _nodes(program):
        if key == "expr_str" and isinstance(value, str):
            check_expression(value, allowed)
        elif key in ("target", "as_operator") and isinstance(value, str):
            check_target(value)
        elif key in ("custom_obj_values", "as_custom_obj") and value:
            raise ModelError("the .pt2 holds a custom object (a pickle); the file is not loaded", fix=FIX)
    return {**program, "guards_code": []}


# -- payloads and the program ------------------------------------------------------------------------------


def _payloads(archive: Archive, folder: str, config_name: str, prefix: str) -> dict[str, Any]:
    """The tensors of one payload config (weights or constants), built from their raw bytes."""
    import torch
    from torch._export.serde import schema
    from torch._export.serde.serialize import (
        _dict_to_dataclass,
        deserialize_device,
        deserialize_scalar_type,
        deserialize_size,
        deserialize_storage_offset,
        deserialize_stride,
    )

    config = _dict_to_dataclass(schema.PayloadConfig, _json(archive, f"{folder}/{config_name}"))
    flat: dict[str, torch.Tensor] = {}
    out: dict[str, Any] = {}
    for fqn, meta in config.config.items():
        if meta.use_pickle or meta.tensor_meta is None or not meta.path_name.startswith(prefix):
            raise ModelError(
                f"{archive.path} stores {fqn[:80]!r} as a pickle or an object; it is not loaded", fix=FIX
            )
        tm = meta.tensor_meta
        dtype = deserialize_scalar_type(tm.dtype)
        if deserialize_device(tm.device).type != "cpu":
            raise ModelError(
                f"{archive.path} keeps {fqn[:80]!r} on {tm.device.type}",
                fix="save the program from CPU tensors",
            )
        name = f"{folder}/{meta.path_name}"
        if name not in archive.entries:
            raise ModelError(f"{archive.path} lacks {name}, which its config names", fix=SAVE_FIX)
        if meta.path_name not in flat:
            raw = archive.read(name)
            size = torch.empty((), dtype=dtype).element_size()
            if len(raw) % size:
                raise ModelError(
                    f"{archive.path}: {name} has {len(raw)} bytes, no whole number of {dtype}", fix=SAVE_FIX
                )
            flat[meta.path_name] = torch.frombuffer(raw, dtype=dtype) if raw else torch.empty(0, dtype=dtype)
        base = flat[meta.path_name]
        try:
            if base.numel() == 0:
                tensor = torch.zeros(deserialize_size(tm.sizes), dtype=dtype)
            else:
                tensor = torch.as_strided(base, deserialize_size(tm.sizes), deserialize_stride(tm.strides),
                                          deserialize_storage_offset(tm.storage_offset))  # fmt: skip
        except RuntimeError as exc:  # a view reaching past its bytes
            raise ModelError(f"{archive.path}: {fqn[:80]!r} does not fit its bytes ({str(exc).splitlines()[0][:120]})",
                             fix=SAVE_FIX) from None  # fmt: skip
        out[fqn] = torch.nn.Parameter(tensor, requires_grad=tm.requires_grad) if meta.is_param else tensor
    return out


def _json(archive: Archive, name: str) -> Any:
    try:
        return json.loads(archive.read(name, MAX_JSON_BYTES))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelError(f"{archive.path}: {name} is not JSON ({exc})", fix=SAVE_FIX) from None


def allowed_names() -> frozenset[str]:
    """:data:`SYMPY_NAMES` and torch's sympy functions (``FloorDiv``, ``CeilToInt``, ...)."""
    import torch.utils._sympy.functions as functions

    return SYMPY_NAMES | {n for n in dir(functions) if n[:1].isupper() and not n.startswith("_")}


def load(pt2: Path) -> Any:
    """The ``ExportedProgram`` of a checked archive, built from its raw payloads (module docstring).

    Raises:
        ModelError: the archive fails :func:`check` or the graph fails :func:`check_graph`, or torch's graph
            deserializer refuses it (one line).
    """
    import torch
    from torch._export.serde import schema
    from torch._export.serde.serialize import ExportedProgramDeserializer, _dict_to_dataclass

    with check(Path(pt2)) as archive:
        program = check_graph(_json(archive, "models/model.json"), allowed_names())
        state_dict = _payloads(archive, "data/weights", "model_weights_config.json", "weight_")
        constants = _payloads(archive, "data/constants", "model_constants_config.json", "tensor_")
    try:
        serialized = _dict_to_dataclass(schema.ExportedProgram, program)
        return ExportedProgramDeserializer().deserialize(serialized, state_dict, constants, None)
    # torch's deserializer raises many kinds (SerializeError, KeyError, ...): each becomes one line
    except Exception as exc:
        line = next((s.strip() for s in str(exc).splitlines() if s.strip()), type(exc).__name__)
        raise ModelError(f"torch cannot read the program in {pt2}: {type(exc).__name__}: {line[:200]}",
                         fix=f"save it again with torch.export.save under this torch ({torch.__version__})") from None  # fmt: skip
