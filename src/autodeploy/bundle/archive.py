"""Bundles as ``.tar.gz``: written with plain members only, read back refusing anything unsafe.

Extraction checks every member *before* writing anything: absolute paths, ``..``, symbolic
and hard links, devices and FIFOs, duplicate names, and archives over the size or member
caps are refused with a message naming the member. What passes is extracted with tarfile's
``data`` filter as a second line of defence, into a temporary folder renamed into place, so
nothing is ever written outside the destination and a failed extraction leaves nothing.
"""

from __future__ import annotations

import os
import posixpath
import re
import shutil
import tarfile
import uuid
import zlib
from pathlib import Path

from autodeploy.bundle.loader import MANIFEST, BundleError

MAX_BYTES = 4 * 2**30
MAX_MEMBERS = 10_000
SUFFIXES = (".tar.gz", ".tgz", ".tar")


class UnsafeArchiveError(BundleError):
    """An archive member could escape the destination or exhaust the disk; nothing was extracted."""


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
            raise UnsafeArchiveError(f"refusing archive {name}: more than {max_members} members (at {member.name!r})",
                                     fix="raise max_members only for an archive you trust")  # fmt: skip
        reason = _unsafe(member)
        if reason:
            raise UnsafeArchiveError(f"refusing archive {name}: member {member.name!r} {reason}",
                                     fix="export the bundle again; never extract this archive by hand")  # fmt: skip
        key = posixpath.normpath(member.name).casefold()  # casefold: one file on case-insensitive disks
        if key in seen:
            raise UnsafeArchiveError(f"refusing archive {name}: member {member.name!r} appears more than once",
                                     fix="export the bundle again")  # fmt: skip
        seen.add(key)
        total += member.size
        if total > max_bytes:
            raise UnsafeArchiveError(
                f"refusing archive {name}: member {member.name!r} takes it past the {max_bytes:,}-byte cap",
                fix="raise max_bytes only for an archive you trust",
            )
        members.append(member)
    return members


def _unsafe(member: tarfile.TarInfo) -> str | None:
    """Why a member is unsafe to extract, or ``None``."""
    name = member.name
    if not name or "\x00" in name:
        return "has an empty or malformed name"
    if name.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", name):
        return "has an absolute path"
    if ".." in re.split(r"[\\/]", name):
        return "has a '..' path component (it would land outside the destination)"
    if member.issym():
        return f"is a symbolic link (to {member.linkname!r})"
    if member.islnk():
        return f"is a hard link (to {member.linkname!r})"
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
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.parent / f".{dest.name}.partial-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        with tarfile.open(archive, "r:*") as tar:
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
        raise BundleError(f"cannot extract archive {archive}: {type(exc).__name__}: {exc}",
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
