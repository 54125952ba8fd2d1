"""Red-team cases against archive headers (issue 28): an extended header is read whole and, before
CPython 3.11.10 / 3.12.6 (CVE-2024-6232), parsed by a backtracking regex, so a 344-byte archive
stalled ``bundle verify`` for minutes and a GNU long name took gigabytes and printed a 300 MB
"line". Each is refused from its header, at once, in one short line, before anything is written.

The archives are built here byte by byte; each command runs in a subprocess with a timeout, so
a regression fails instead of hanging the suite.
"""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
import tarfile

import pytest

from autodeploy.bundle.archive import MAX_EXTENDED_HEADER, UnsafeArchiveError, safe_extract


def _header(name: str, type: bytes, size: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.type, info.size = type, size
    return info.tobuf(format=tarfile.USTAR_FORMAT)


def _member(name: str, type: bytes, data: bytes) -> bytes:
    return _header(name, type, len(data)) + data + b"\0" * (-len(data) % tarfile.BLOCKSIZE)


def _pax(records: dict[str, str]) -> bytes:
    """One pax record block the way tarfile writes it (``"<length> <key>=<value>\\n"``)."""
    out = b""
    for key, value in records.items():
        body = f" {key}={value}\n".encode()
        length = len(body) + 1
        while length != len(body) + len(str(length)):  # the length counts its own digits
            length = len(body) + len(str(length))
        out += str(length).encode() + body
    return out


def _write(path, *members: bytes) -> None:
    manifest = _member("bundle/manifest.json", tarfile.REGTYPE, b"{}")
    with gzip.open(path, "wb", compresslevel=9) as f:
        for block in (*members, manifest, b"\0" * 2 * tarfile.BLOCKSIZE):
            f.write(block)


def _verify(path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "autodeploy", "bundle", "verify", str(path)],
                          capture_output=True, text=True, timeout=90, env=env)  # fmt: skip


def _refused_in_one_short_line(proc: subprocess.CompletedProcess[str], reason: str) -> None:
    assert proc.returncode == 1, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert len(lines[0]) < 400 and reason in lines[0], lines[0][:2000]


def test_a_pax_header_of_200000_digits_is_refused_at_once(tmp_path):
    """The red team's 344-byte archive: 40 s+ in tarfile's pax regex on an unpatched Python."""
    path = tmp_path / "digits.tar.gz"
    _write(path, _member("././@PaxHeader", tarfile.XHDTYPE, b"9" * 200_000))
    assert path.stat().st_size < 1024
    _refused_in_one_short_line(_verify(path), "declares 200,000 bytes, over the 65,536-byte cap")


def test_a_pax_header_of_digits_under_the_size_cap_is_refused_at_once(tmp_path):
    """Under the size cap the regex still backtracks quadratically (60,000 digits: 10 s+); the
    records are checked in linear time before tarfile parses them."""
    path = tmp_path / "digits.tar.gz"
    _write(path, _member("././@PaxHeader", tarfile.XHDTYPE, b"9" * (MAX_EXTENDED_HEADER - 5_000)))
    _refused_in_one_short_line(_verify(path), "holds a run of more than 32 digits")


def test_a_gnu_long_name_of_20_mb_is_refused_from_its_header(tmp_path):
    """The red team's was 300 MB (2.7 GB of memory, 29 s and a 300 MB error); 20 MB shows the same."""
    path = tmp_path / "longname.tar.gz"
    _write(
        path,
        _member("././@LongLink", tarfile.GNUTYPE_LONGNAME, b"a" * 20_000_000),
        _member("x", tarfile.REGTYPE, b""),
    )
    _refused_in_one_short_line(
        _verify(path), "GNU long-name header (tar type b'L') declares 20,000,000 bytes"
    )


@pytest.mark.parametrize(
    ("members", "reason"),
    [
        (
            [
                _member("././@LongLink", tarfile.GNUTYPE_LONGNAME, b"a" * 50_000),
                _member("x", tarfile.REGTYPE, b""),
            ],
            "has a name of 50,000 characters, over 1,024",
        ),
        (
            [
                _member("././@PaxHeader", tarfile.XHDTYPE, _pax({"path": "b/" * 20_000})),
                _member("x", tarfile.REGTYPE, b""),
            ],
            r"has a name of 39,999 characters, over 1,024",
        ),
        (
            [_member("././@PaxHeader", tarfile.XHDTYPE, _pax({"mtime": "1"}))] * 9
            + [_member("x", tarfile.REGTYPE, b"")],
            "more than 8 extended headers in a row",
        ),
        (
            [m for i in range(300) for m in (_member("././@PaxHeader", tarfile.XHDTYPE, _pax({"comment": "c" * 60_000})),
                                              _member(f"bundle/{i}", tarfile.REGTYPE, b""))],
            "its extended headers take more than 16,777,216 bytes together",
        ),  # fmt: skip
        ([_member("././@PaxHeader", tarfile.XHDTYPE, b"99 path=x\n")], "has a malformed record at byte 0"),
        (
            [_member("././@PaxHeader", tarfile.XHDTYPE, _pax({"GNU.sparse.size": "9"}))],
            "describes a sparse file",
        ),
    ],
    ids=["gnu-name-under-cap", "pax-path", "header-run", "header-total", "bad-record-length", "pax-sparse"],
)
def test_malformed_or_overlong_headers_are_refused_with_a_short_message(tmp_path, members, reason):
    path = tmp_path / "hostile.tar.gz"
    _write(path, *members)
    with pytest.raises(UnsafeArchiveError, match=reason) as caught:
        safe_extract(path, tmp_path / "out")
    assert len(str(caught.value)) < 400
    assert not (tmp_path / "out").exists() and list(tmp_path.iterdir()) == [path]


def test_pax_headers_tarfile_writes_still_extract(tmp_path):
    """Our own bundles carry a pax header per member (float mtime), and a non-ASCII name needs one."""
    path = tmp_path / "ok.tar.gz"
    _write(path, _member("././@PaxHeader", tarfile.XHDTYPE, _pax({"mtime": "1733264567.25", "path": "bundle/é.txt"})),
           _member("ignored", tarfile.REGTYPE, b"hi"))  # fmt: skip
    root = safe_extract(path, tmp_path / "out")
    assert (root / "é.txt").read_bytes() == b"hi" and (root / "manifest.json").read_bytes() == b"{}"
