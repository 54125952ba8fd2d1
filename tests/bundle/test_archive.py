"""Every malicious archive shape is refused naming its member, and nothing is written anywhere."""

import io
import tarfile

import pytest

import autodeploy.bundle
from autodeploy.bundle import BundleError, UnsafeArchiveError, export
from autodeploy.bundle.archive import safe_extract


def _file(name, data=b"x"):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, io.BytesIO(data)


def _special(name, kind, linkname=""):
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, linkname
    return info, None


def make_archive(path, members, fmt=tarfile.GNU_FORMAT):
    with tarfile.open(path, "w:gz", format=fmt) as tar:
        tar.addfile(*_file("bundle/manifest.json", b"{}"))
        for info, data in members:
            tar.addfile(info, data)
    return path


MALICIOUS = {
    "absolute path": ([_file("/tmp/autodeploy-evil")], "'/tmp/autodeploy-evil' has an absolute path"),
    "dot-dot": ([_file("bundle/../../evil")], "'bundle/../../evil' has a '..' path component"),
    "leading dot-dot": ([_file("../evil")], "'../evil' has a '..' path component"),
    "windows drive": ([_file("C:/evil")], "'C:/evil' has an absolute path"),
    "backslash dot-dot": ([_file("bundle\\..\\..\\evil")], "'bundle.*evil' has a '..' path component"),
    "symlink": ([_special("bundle/link", tarfile.SYMTYPE, "/etc/passwd")], "'bundle/link' is a symbolic link \\(to '/etc/passwd'\\)"),
    "symlink then write through it": ([_special("bundle/d", tarfile.SYMTYPE, "/tmp"), _file("bundle/d/evil")],
                                      "'bundle/d' is a symbolic link"),
    "hardlink": ([_special("bundle/hard", tarfile.LNKTYPE, "/etc/passwd")], "'bundle/hard' is a hard link"),
    "char device": ([_special("bundle/null", tarfile.CHRTYPE)], "'bundle/null' is a device file"),
    "block device": ([_special("bundle/sda", tarfile.BLKTYPE)], "'bundle/sda' is a device file"),
    "fifo": ([_special("bundle/pipe", tarfile.FIFOTYPE)], "'bundle/pipe' is a FIFO"),
    "duplicate": ([_file("bundle/a"), _file("bundle/a", b"second")], "'bundle/a' appears more than once"),
    "duplicate after normalizing": ([_file("bundle/a"), _file("bundle/./a")], "'bundle/./a' appears more than once"),
    "duplicate by case": ([_file("bundle/Model"), _file("bundle/model")], "'bundle/model' appears more than once"),
}  # fmt: skip


@pytest.mark.parametrize("shape", MALICIOUS)
def test_malicious_archive_is_refused_naming_the_member(tmp_path, shape):
    members, message = MALICIOUS[shape]
    archive = make_archive(tmp_path / "evil.tar.gz", members)
    dest = tmp_path / "out" / "bundle"
    with pytest.raises(UnsafeArchiveError, match=f"refusing archive evil.tar.gz: member {message}"):
        safe_extract(archive, dest)
    assert not dest.exists() and list((tmp_path / "out").iterdir()) == []  # no partial folder either
    assert sorted(p.name for p in tmp_path.iterdir()) == ["evil.tar.gz", "out"]
    with pytest.raises(UnsafeArchiveError, match="refusing archive"):
        autodeploy.bundle.load(archive)


def test_archive_over_the_size_cap_is_refused_naming_the_member(tmp_path):
    archive = make_archive(
        tmp_path / "big.tar.gz", [_file("bundle/a", b"a" * 600), _file("bundle/b", b"b" * 600)]
    )
    with pytest.raises(UnsafeArchiveError, match="member 'bundle/b' takes it past the 1,000-byte cap"):
        safe_extract(archive, tmp_path / "out", max_bytes=1000)
    assert not (tmp_path / "out").exists()


def test_archive_over_the_member_cap_is_refused_naming_the_member(tmp_path):
    archive = make_archive(tmp_path / "many.tar.gz", [_file(f"bundle/f{i}") for i in range(10)])
    with pytest.raises(UnsafeArchiveError, match="more than 5 members \\(at 'bundle/f4'\\)"):
        safe_extract(archive, tmp_path / "out", max_members=5)


def test_declared_size_counts_even_for_sparse_tricks(tmp_path):
    # A header claiming 5 GB with no data behind it must hit the cap, not the disk.
    info = tarfile.TarInfo("bundle/huge")
    info.size = 5 * 2**30
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.GNU_FORMAT) as tar:
        tar.addfile(*_file("bundle/manifest.json", b"{}"))
        tar.fileobj.write(info.tobuf(tarfile.GNU_FORMAT))  # header only
    (tmp_path / "huge.tar").write_bytes(buffer.getvalue())
    with pytest.raises(UnsafeArchiveError, match="'bundle/huge' takes it past the"):
        safe_extract(tmp_path / "huge.tar", tmp_path / "out")


def test_damaged_or_foreign_archives_are_clear_errors(stored, tmp_path):
    good = export.write_bundle(stored.source(), tmp_path / "b.tar.gz", tar=True)
    data = bytearray(good.read_bytes())
    data[len(data) // 2] ^= 0xFF
    (tmp_path / "bad.tar.gz").write_bytes(bytes(data))
    # Where the flip lands decides which check catches it; each must be a clear BundleError.
    with pytest.raises(BundleError, match="cannot extract archive|refusing archive|does not match|is missing|not listed|holds no bundle"):
        autodeploy.bundle.load(tmp_path / "bad.tar.gz")
    (tmp_path / "text.tar.gz").write_text("not an archive")
    with pytest.raises(BundleError, match="cannot extract archive .*text.tar.gz"):
        safe_extract(tmp_path / "text.tar.gz", tmp_path / "out")
    no_manifest = tmp_path / "empty.tar.gz"
    with tarfile.open(no_manifest, "w:gz") as tar:
        tar.addfile(*_file("readme.txt"))
    with pytest.raises(BundleError, match="holds no bundle"):
        safe_extract(no_manifest, tmp_path / "out2")


def test_exported_archive_round_trips(stored, tmp_path):
    archive = export.write_bundle(stored.source(), tmp_path / "b.tar.gz", tar=True)
    with tarfile.open(archive) as tar:
        members = tar.getmembers()
    assert all(m.name.startswith("b/") or m.name == "b" for m in members)
    assert all(m.isfile() or m.isdir() for m in members) and all(
        m.uid == 0 and m.uname == "" for m in members
    )
    root = safe_extract(archive, tmp_path / "out")
    assert root == tmp_path / "out" / "b"
    autodeploy.bundle.verify(root)
