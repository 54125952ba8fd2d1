"""Red-team round 4 (issue 37): a bundle's pins are read as pip reads them, a signature is never silently
unchecked, and a key file is read with a cap.

pip decodes ``requirements.txt`` by a byte-order mark or a PEP 263 cookie in its first two lines; the
check decoded it as UTF-8 and skipped ``#`` lines, so ``# coding: utf-7`` followed by the comment
``#+AAoALgAvAGUAdgBpAGw-`` passed ``bundle verify`` while pip reads a line ``./evil`` (an in-tree build
backend that runs at install). Now the file must be plain ASCII without a cookie, and ``bundle verify``
prints the pins as one ``pip install`` line, so pip never reads a file from the bundle.
"""

from __future__ import annotations

import hashlib
import json
import re
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from autodeploy.bundle import BundleError, loader
from tests.cli_runner import run_cli

#: ``# coding: utf-7`` and the comment that pip decodes to a newline and ``./evil``.
HIDDEN = b"#+AAoALgAvAGUAdgBpAGw-\n"
COOKIES = [b"# coding: utf-7\n", b"# -*- coding: utf_7 -*-\n", b"# vim: set fileencoding=utf-7 :\n"]


def _write_requirements(bundle: Path, data: bytes) -> None:
    """Replace requirements.txt and reseal the manifest, as an attacker with write access would."""
    path = bundle / loader.REQUIREMENTS
    path.write_bytes(data)
    manifest = json.loads((bundle / loader.MANIFEST).read_text())
    manifest["files"][loader.REQUIREMENTS] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    raw = (json.dumps(manifest, indent=2) + "\n").encode()
    (bundle / loader.MANIFEST).write_bytes(raw)
    (bundle / loader.MANIFEST_DIGEST).write_text(loader.digest_line(raw))


def _pip_reads(path: Path) -> list[str]:
    """The requirement lines pip itself parses from ``path`` (its own decoder and parser; no network)."""
    try:
        from pip._internal.network.session import PipSession
        from pip._internal.req.req_file import parse_requirements
    except ImportError:  # pip's internals move between releases: then the attack is taken as shown by hand
        pytest.skip("pip's requirements parser cannot be imported here")
    return [r.requirement for r in parse_requirements(str(path), session=PipSession())]


def _pins(bundle: Path) -> list[str]:
    return [line for line in (bundle / loader.REQUIREMENTS).read_text().splitlines() if line and line[0] != "#"]


@pytest.mark.parametrize("cookie", COOKIES, ids=["coding", "emacs", "vim"])
def test_a_coding_cookie_that_hides_a_path_from_the_check_is_refused(bundle, cookie, capsys):
    _write_requirements(bundle, cookie + HIDDEN + (bundle / loader.REQUIREMENTS).read_bytes())
    assert "./evil" in _pip_reads(bundle / loader.REQUIREMENTS)  # the attack is real: pip reads this line
    with pytest.raises(BundleError, match=r"requirements.txt line 1 .* declares an encoding") as info:
        loader.verify(bundle)
    assert "\n" not in str(info.value)
    code, out, err = run_cli(capsys, "bundle", "verify", str(bundle))
    assert code == 1 and "declares an encoding" in err and "ok" not in out
    assert len([line for line in err.splitlines() if line.strip()]) == 1, err


@pytest.mark.parametrize("junk", [b"\xef\xbb\xbf", b"# caf\xc3\xa9\n", b"# a\x0bb\n", b"# tab\there\n", b"#\x00\n"],
                         ids=["utf8-bom", "non-ascii", "vertical-tab", "tab", "nul"])  # fmt: skip
def test_anything_but_printable_ascii_is_refused(bundle, junk):
    _write_requirements(bundle, junk + (bundle / loader.REQUIREMENTS).read_bytes())
    with pytest.raises(BundleError, match=r"requirements.txt line 1 holds byte .*not printable ASCII"):
        loader.verify(bundle)


def test_bundle_verify_prints_the_pins_as_one_pip_line(bundle, capsys):
    pins = _pins(bundle)
    assert any(p.startswith("numpy==") for p in pins) and any(p.startswith("onnxruntime==") for p in pins)
    line = f"pip install --only-binary=:all: {' '.join(pins)}"
    code, out, err = run_cli(capsys, "bundle", "verify", str(bundle))
    assert code == 0, err
    assert line in out.replace("\n", " ") and "-r requirements.txt" not in re.sub(r"\(not -r \S+\)", "", out)
    code, out, err = run_cli(capsys, "bundle", "verify", str(bundle), "--format", "json")
    record = json.loads(out)
    assert code == 0 and record["install"] == line and record["signature"] == "absent"


def test_the_readmes_install_the_pins_and_never_the_file(bundle):
    readme = (bundle / "README.md").read_text()
    pins = " ".join(_pins(bundle))
    assert f"pip install --only-binary=:all: {pins}" in readme
    assert readme.index("autodeploy bundle verify") < readme.index(f"pip install --only-binary=:all: {pins}")
    assert not re.search(r"pip install[^\n`]* -r", readme), readme
    main = (Path(__file__).parents[2] / "README.md").read_text()
    assert not re.search(r"pip install[^\n`]* -r \S*requirements", main)
    assert main.index("autodeploy bundle verify ship") < main.index("pip install --only-binary=:all: numpy==")


@pytest.fixture(scope="module")
def key_pair(tmp_path_factory):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    folder = tmp_path_factory.mktemp("keys")
    key = ec.generate_private_key(ec.SECP256R1())
    (folder / "k.pem").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    (folder / "k.pub").write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))  # fmt: skip
    return folder / "k.pem", folder / "k.pub"


def test_a_signature_verified_without_trust_is_said_to_be_unchecked(stored, key_pair, tmp_path, capsys):
    from autodeploy.bundle import export

    signed = export.write_bundle(stored.source(), tmp_path / "signed", sign_key=key_pair[0])
    code, out, err = run_cli(capsys, "bundle", "verify", str(signed))
    assert code == 0, err
    assert "bundle.sig is present and unchecked" in err and "--trust" in err
    code, out, _ = run_cli(capsys, "bundle", "verify", str(signed), "--format", "json")
    assert code == 0 and json.loads(out)["signature"] == "unchecked"
    code, out, err = run_cli(capsys, "bundle", "verify", str(signed), "--trust", str(key_pair[1]))
    assert code == 0 and "unchecked" not in out + err and "signed: the signature" in out


@pytest.fixture
def big_key(tmp_path):
    """A 2 MiB file that starts like a PEM key: read whole before, it is a key file to model-signing."""
    path = tmp_path / "big.pub"
    path.write_bytes(b"-----BEGIN PUBLIC KEY-----\n" + b"A" * (2 << 20))
    return path


@pytest.mark.parametrize("flag", ["--trust", "--sign"])
def test_an_oversized_key_file_is_refused_in_one_line(bundle, stored, big_key, tmp_path, capsys, flag):
    with pytest.raises(loader.KeyFileError, match=r"is over 1 MiB, not a key file"):
        loader.check_key(big_key, private=flag == "--sign")
    argv = (["bundle", "verify", str(bundle), "--trust", str(big_key)] if flag == "--trust" else
            ["export", "--trial", str(stored.trial_id), "--db", stored.db, "-o", str(tmp_path / "out"),
             "--sign", str(big_key)])  # fmt: skip
    code, out, err = run_cli(capsys, *argv)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "is over 1 MiB" in lines[0] and "Traceback" not in out + err, err


@pytest.mark.parametrize("flag", ["--trust", "--sign"])
def test_dev_zero_as_a_key_ends_at_the_cap(bundle, stored, tmp_path, flag):
    """Uncapped, ``/dev/zero`` is read until memory runs out: here the child gets 2 GiB of address space
    and 60 s, and must answer in one line."""
    argv = (["bundle", "verify", str(bundle), "--trust", "/dev/zero"] if flag == "--trust" else
            ["export", "--trial", str(stored.trial_id), "--db", stored.db, "-o", str(tmp_path / "out"),
             "--sign", "/dev/zero"])  # fmt: skip

    def cap_memory() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))

    proc = subprocess.run([sys.executable, "-m", "autodeploy", *argv], capture_output=True, text=True, timeout=60,
                          preexec_fn=cap_memory)  # fmt: skip
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and "/dev/zero: is over 1 MiB" in lines[0], proc.stderr
