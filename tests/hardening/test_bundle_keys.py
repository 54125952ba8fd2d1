"""Red-team cases: a key file that is not the right key gives one line and exit 2, never a traceback.

``export --sign`` and ``bundle verify --trust`` passed the path straight to model-signing, which
raised ``AttributeError`` (an RSA or Ed25519 key), ``ValueError`` (a private key given as public,
an empty file), ``IsADirectoryError`` or ``FileNotFoundError``, each a traceback with exit 1.
"""

from __future__ import annotations

import pytest

from autodeploy.bundle import loader
from tests.cli_runner import run_cli


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    """Every kind of wrong key (PEM), and the right kind: P-256."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

    folder = tmp_path_factory.mktemp("keys")

    def write(name, key, password=None):
        encryption = serialization.BestAvailableEncryption(password) if password else serialization.NoEncryption()
        (folder / f"{name}.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                               serialization.PrivateFormat.PKCS8, encryption))
        (folder / f"{name}.pub").write_bytes(key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))  # fmt: skip

    write("ec", ec.generate_private_key(ec.SECP256R1()))
    write("rsa", rsa.generate_private_key(public_exponent=65537, key_size=2048))
    write("ed25519", ed25519.Ed25519PrivateKey.generate())
    write("k1", ec.generate_private_key(ec.SECP256K1()))  # a curve model-signing does not take
    write("locked", ec.generate_private_key(ec.SECP256R1()), password=b"secret")
    (folder / "empty").write_bytes(b"")
    (folder / "text").write_text("not a key\n")
    (folder / "dir").mkdir()
    return folder


#: key file -> what the one line says, for --sign (a private key is wanted) and --trust (a public one).
SIGN = {"rsa.pem": "is an RSA key", "ed25519.pem": "is an Ed25519 key", "k1.pem": "curve secp256k1",
        "ec.pub": "is a public key; --sign takes the private key", "locked.pem": "is encrypted",
        "empty": "is empty", "text": "is not a PEM private key", "dir": "is a folder", "missing": "no such file"}  # fmt: skip
TRUST = {"rsa.pub": "is an RSA key", "ed25519.pub": "is an Ed25519 key", "k1.pub": "curve secp256k1",
         "ec.pem": "is a private key; --trust takes the publisher's public key", "empty": "is empty",
         "text": "is not a PEM public key", "dir": "is a folder", "missing": "no such file"}  # fmt: skip


def _one_line(code: int, out: str, err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "Traceback" not in out + err, (code, out, err)
    assert "fix:" in lines[0]
    return lines[0]


@pytest.mark.parametrize("name", SIGN)
def test_export_sign_with_a_wrong_key_says_so_in_one_line(stored, keys, tmp_path, capsys, name):
    out = tmp_path / "ship"
    code, stdout, err = run_cli(capsys, "export", "--trial", str(stored.trial_id), "-o", str(out), "--db", stored.db,
                                "--sign", str(keys / name))  # fmt: skip
    line = _one_line(code, stdout, err)
    assert f"--sign {keys / name}: " in line and SIGN[name] in line, line
    assert not out.exists()  # refused before anything was written


@pytest.mark.parametrize("name", TRUST)
def test_bundle_verify_trust_with_a_wrong_key_says_so_in_one_line(bundle, keys, capsys, name):
    line = _one_line(*run_cli(capsys, "bundle", "verify", str(bundle), "--trust", str(keys / name)))
    assert f"--trust {keys / name}: " in line and TRUST[name] in line, line


def test_the_right_kinds_of_key_pass_the_check(keys):
    assert loader.check_key(keys / "ec.pem", private=True) == keys / "ec.pem"
    assert loader.check_key(keys / "ec.pub", private=False) == keys / "ec.pub"


def test_bundle_verify_db_that_never_saw_the_bundle_exits_2(bundle, stored, tmp_path, capsys):
    from autodeploy.results_db import Store

    other = f"sqlite:///{tmp_path / 'other.db'}"
    Store.open(other).close()  # a real, empty store: the bundle was exported elsewhere
    for fmt in ("table", "json"):
        line = _one_line(*run_cli(capsys, "bundle", "verify", str(bundle), "--db", other, "--format", fmt))
        assert "no export with this manifest" in line
