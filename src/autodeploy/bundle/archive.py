"""Bundles as ``.tar.gz``: written with plain members only, read back refusing anything unsafe.

Extraction checks every member *before* writing anything: absolute paths, ``..``, symbolic
and hard links, devices and FIFOs, duplicate names, and archives over the size or member
caps are refused with a message naming the member. What passes is extracted with tarfile's
``data`` filter as a second line of defence, into a temporary folder renamed into place, so
nothing is ever written outside the destination and a failed extraction leaves nothing.

Headers are bounded before tarfile parses them: an extended header (pax ``x``/``g``, GNU long
name ``L``/``K``) is read whole into memory, and before CPython 3.12.6, 3.11.10 and 3.10.15
(CVE-2024-6232) tarfile searched it with a regex that backtracks quadratically on a run of
digits (a 344-byte archive stalled it for minutes). So each one is refused over
:data:`MAX_EXTENDED_HEADER`, a pax header's records are checked in linear time before tarfile
reads the same bytes, names are refused over :data:`MAX_NAME` characters, and all extended
headers together over :data:`MAX_EXTENDED_TOTAL` bytes (member data is bounded by ``max_bytes``).
"""

from __future__ import annotations

import os
import posixpath
import re
import shutil
import tarfile
import uuid
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from autodeploy.bundle.loader import MANIFEST, BundleError
from autodeploy.errors import WriteError, excerpt

MAX_BYTES = 4 * 2**30
MAX_MEMBERS = 10_000
SUFFIXES = (".tar.gz", ".tgz", ".tar")
#: The largest pax or GNU long-name header read (a bundle's are well under 1 KiB).
MAX_EXTENDED_HEADER = 64 * 2**10
#: The longest member name accepted (a bundle's are a few dozen characters).
MAX_NAME = 1024
#: Extended headers in a row before one member (pax global + pax + GNU long name and link is 4).
MAX_EXTENDED_RUN = 8
#: All extended headers of an archive together: the decompression budget of everything but file data
#: (which ``max_bytes`` bounds). A bundle's take about 100 bytes a member.
MAX_EXTENDED_TOTAL = 16 * 2**20
_EXTENDED = (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE, tarfile.GNUTYPE_LONGNAME,
             tarfile.GNUTYPE_LONGLINK)  # fmt: skip
_REFUSE_FIX = "export the bundle again; never extract this archive by hand"


class UnsafeArchiveError(BundleError):
    """An archive member could escape the destination or exhaust the disk; nothing was extracted."""


class _Refused(Exception):
    """A header refused while tarfile parses it; not a ``TarError``, so tarfile lets it through."""


class _BoundedTarInfo(tarfile.TarInfo):
    """tarfile's header reader with bounds, through ``_proc_member``: the hook tarfile documents
    for subclasses (the ``tarinfo`` class of :func:`tarfile.open`)."""

    def _proc_member(self, tar: tarfile.TarFile) -> tarfile.TarInfo:
        if self.type not in _EXTENDED:
            tar._autodeploy_run = 0  # type: ignore[attr-defined]
            if self.type == tarfile.GNUTYPE_SPARSE:
                raise _Refused(f"member {excerpt(self.name, 120, quote=True)} is a GNU sparse file")
            return super()._proc_member(tar)
        run = tar._autodeploy_run = getattr(tar, "_autodeploy_run", 0) + 1  # type: ignore[attr-defined]
        kind = f"{'pax' if self.type in b'xgX' else 'GNU long-name'} header (tar type {self.type!r})"
        if run > MAX_EXTENDED_RUN:
            raise _Refused(f"more than {MAX_EXTENDED_RUN} extended headers in a row (at a {kind})")
        if not 0 <= self.size <= MAX_EXTENDED_HEADER:
            raise _Refused(
                f"a {kind} declares {self.size:,} bytes, over the {MAX_EXTENDED_HEADER:,}-byte cap"
            )
        total = tar._autodeploy_total = getattr(tar, "_autodeploy_total", 0) + self.size  # type: ignore[attr-defined]
        if total > MAX_EXTENDED_TOTAL:
            raise _Refused(f"its extended headers take more than {MAX_EXTENDED_TOTAL:,} bytes together")
        return super()._proc_member(tar)

    def _proc_pax(self, tar: tarfile.TarFile) -> tarfile.TarInfo:
        inner = tar.fileobj
        data = inner.read(-(-self.size // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE)
        problem = _pax_problem(data, self.size)
        if problem:
            raise _Refused(f"a pax header (tar type {self.type!r}) {problem}")
        tar.fileobj = _Replay(data, inner)  # tarfile parses exactly the bytes just checked
        try:
            return super()._proc_pax(tar)  # type: ignore[misc]
        finally:
            tar.fileobj = inner


def _pax_problem(data: bytes, size: int) -> str | None:
    """Why the pax records in ``data[:size]`` (and its padding) are unsafe to parse, or ``None``; linear time."""
    if re.search(rb"\d{33}", data):  # the quadratic case of CVE-2024-6232: no record needs 33 digits
        return "holds a run of more than 32 digits"
    if b"GNU.sparse" in data:
        return "describes a sparse file"
    pos = 0
    while pos < size:  # records: "<length> <keyword>=<value>\n", length counting the whole record
        space = data.find(b" ", pos, min(pos + 21, size))
        end = pos + int(data[pos:space]) if space > pos and data[pos:space].isdigit() else -1
        if (
            not space + 3 <= end <= size
            or data[end - 1 : end] != b"\n"
            or data.find(b"=", space + 2, end) < 0
        ):
            return f"has a malformed record at byte {pos}"
        pos = end
    return None


class _Replay:
    """``inner`` with ``data`` put back in front of it: what tarfile reads next after a header was checked."""

    def __init__(self, data: bytes, inner: object) -> None:
        self.data, self.inner = data, inner

    def read(self, size: int = -1) -> bytes:
        if size < 0:
            head, self.data = self.data, b""
            return head + self.inner.read()  # type: ignore[attr-defined]
        head, self.data = self.data[:size], self.data[size:]
        return head + self.inner.read(size - len(head)) if len(head) < size else head  # type: ignore[attr-defined]

    def tell(self) -> int:
        return self.inner.tell() - len(self.data)  # type: ignore[attr-defined]

    def seek(self, pos: int, whence: int = 0) -> int:
        self.data = b""
        return self.inner.seek(pos, whence)  # type: ignore[attr-defined]


@contextmanager
def open_archive(path: str | Path) -> Iterator[tarfile.TarFile]:
    """``path`` opened for reading with bounded headers (see the module docstring).

    Raises:
        UnsafeArchiveError: a header is over a cap or malformed; nothing was extracted.
    """
    try:
        with tarfile.open(path, "r:*", tarinfo=_BoundedTarInfo) as tar:
            yield tar
    except _Refused as exc:
        raise UnsafeArchiveError(f"refusing archive {Path(path).name}: {exc}", fix=_REFUSE_FIX) from None


def is_archive(path: str | Path) -> bool:
    return Path(path).is_file() and str(path).endswith(SUFFIXES)


def write_tar(folder: Path, dest: Path, arcroot: str) -> None:
    """Write ``folder`` as a gzipped tar whose one top-level folder is ``arcroot``.

    Owners are dropped and modes normalized, so the archive says nothing about the machine.
    """

    def clean(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        info.mode = 0o755 if info.isdir() else 0o644
        return info

    with tarfile.open(dest, "w:gz", format=tarfile.PAX_FORMAT) as tar:
        tar.add(folder, arcname=arcroot, recursive=False, filter=clean)
        for path in sorted(folder.rglob("*")):
            if path.is_symlink() or not (path.is_file() or path.is_dir()):
                raise BundleError(f"cannot archive {path}: only plain files and folders go into a bundle")
            tar.add(
                path,
                arcname=f"{arcroot}/{path.relative_to(folder).as_posix()}",
                recursive=False,
                filter=clean,
            )


def check_members(
    tar: tarfile.TarFile, name: str, *, max_bytes: int = MAX_BYTES, max_members: int = MAX_MEMBERS
) -> list[tarfile.TarInfo]:
    """Every member of ``tar``, after refusing the first unsafe one (see the module docstring)."""
    members: list[tarfile.TarInfo] = []
    seen: set[str] = set()
    total = 0
    for member in tar:  # headers are read one by one, so a huge archive stops at the cap
        if len(members) >= max_members:
            raise UnsafeArchiveError(f"refusing archive {name}: more than {max_members} members (at {_q(member.name)})",
                                     fix="raise max_members only for an archive you trust")  # fmt: skip
        reason = _unsafe(member)
        if reason:
            raise UnsafeArchiveError(
                f"refusing archive {name}: member {_q(member.name)} {reason}", fix=_REFUSE_FIX
            )
        key = posixpath.normpath(member.name).casefold()  # casefold: one file on case-insensitive disks
        if key in seen:
            raise UnsafeArchiveError(f"refusing archive {name}: member {_q(member.name)} appears more than once",
                                     fix="export the bundle again")  # fmt: skip
        seen.add(key)
        total += member.size
        if total > max_bytes:
            raise UnsafeArchiveError(
                f"refusing archive {name}: member {_q(member.name)} takes it past the {max_bytes:,}-byte cap",
                fix="raise max_bytes only for an archive you trust",
            )
        members.append(member)
    return members


def _q(name: str) -> str:
    return excerpt(name, 120, quote=True)


def _unsafe(member: tarfile.TarInfo) -> str | None:
    """Why a member is unsafe to extract, or ``None``."""
    name = member.name
    if not name or "\x00" in name:
        return "has an empty or malformed name"
    if len(name) > MAX_NAME:
        return f"has a name of {len(name):,} characters, over {MAX_NAME:,}"
    if name.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", name):
        return "has an absolute path"
    if ".." in re.split(r"[\\/]", name):
        return "has a '..' path component (it would land outside the destination)"
    if member.issym():
        return f"is a symbolic link (to {_q(member.linkname)})"
    if member.islnk():
        return f"is a hard link (to {_q(member.linkname)})"
    if member.ischr() or member.isblk():
        return "is a device file"
    if member.isfifo():
        return "is a FIFO"
    if not (member.isfile() or member.isdir()):
        return f"is not a plain file or folder (tar type {member.type!r})"
    if member.size < 0:
        return f"declares a negative size ({member.size})"
    return None


def safe_extract(
    archive: str | Path, dest: str | Path, *, max_bytes: int = MAX_BYTES, max_members: int = MAX_MEMBERS
) -> Path:
    """Extract ``archive`` into the new folder ``dest``; return the bundle root inside it.

    Raises:
        UnsafeArchiveError: a member is unsafe (named in the message); nothing was written.
        BundleError: the archive is unreadable, ``dest`` exists, or it holds no bundle.
    """
    archive, dest = Path(archive), Path(dest)
    if dest.exists():
        raise BundleError(
            f"cannot extract {archive} into {dest}: it already exists", fix="choose a new folder"
        )
    tmp = dest.parent / f".{dest.name}.partial-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        with open_archive(archive) as tar:
            members = check_members(tar, archive.name, max_bytes=max_bytes, max_members=max_members)
            tmp.mkdir()
            if hasattr(tarfile, "data_filter"):  # Python 3.12, and 3.8.17+/3.9.17+/3.10.12+/3.11.4+
                tar.extractall(tmp, members=members, filter="data")
            else:  # every member was checked above
                tar.extractall(tmp, members=members)  # noqa: S202
        _check_written(tmp, archive.name, max_bytes)
        os.rename(tmp, dest)
    except (tarfile.TarError, EOFError, OSError, ValueError, zlib.error) as exc:  # damaged gzip streams
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, OSError) and str(exc.filename) != str(archive):  # the destination's fault, maybe
            full = WriteError.of(exc, f"the files of {archive.name}", dest.parent,
                                 instead="extract it elsewhere (TMPDIR for a temporary folder)")  # fmt: skip
            if full is not None:
                raise full from None
        raise BundleError(f"cannot extract archive {archive}: {type(exc).__name__}: {excerpt(exc)}",
                          fix="the file is damaged or not a .tar.gz; copy or export it again") from None  # fmt: skip
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return bundle_root(dest)


def _check_written(folder: Path, name: str, max_bytes: int) -> None:
    """The cap counts the bytes on disk too, not only what the headers declare."""
    written = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())
    if written > max_bytes:
        raise UnsafeArchiveError(f"refusing archive {name}: it extracts to {written:,} bytes, over the "
                                 f"{max_bytes:,}-byte cap", fix="raise max_bytes only for an archive you trust")  # fmt: skip


def bundle_root(folder: Path) -> Path:
    """The bundle inside an extracted archive: ``folder`` itself or its one top-level folder."""
    if (folder / MANIFEST).is_file():
        return folder
    entries = list(folder.iterdir())
    if len(entries) == 1 and entries[0].is_dir() and (entries[0] / MANIFEST).is_file():
        return entries[0]
    raise BundleError(f"{folder} holds no bundle: no {MANIFEST} at its top or in its one top-level folder",
                      fix="pass an archive made by `autodeploy export --tar`")  # fmt: skip
