"""Device keys: who measured a fleet result, told apart from whoever can write the fleet's database.

An agent makes a P-256 key pair the first time it registers a device name on this machine, in its own folder
(``<cache>/fleet/keys/NAME.key``, mode 0600, the PEM that ``autodeploy export --sign`` takes, and ``NAME.pub``
beside it). The public key goes into the device's row and is the device's identity: a name registered with
another public key is refused (:func:`autodeploy.fleet.ledger.check_binding`). The agent signs each bundle it
stores with the bundles' own signing (OpenSSF model-signing: :func:`autodeploy.bundle.export.sign`) and each
result it writes (job, run, device, model, winner, bundle SHA-256: :func:`result_record`) with ECDSA, so
``fleet export --trust NAME.pub`` refuses a bundle swapped in the database, or a result planted there.

A database writer can still replace a row's public key: the trust is the key the user passes, taken from the
device itself (the agent prints where it is when it starts), never the one the database holds.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autodeploy.errors import UsageError

#: Under the agent's folder (``<cache>/fleet``): one key pair per device name this machine registered.
KEYS = "keys"
#: What a signed result says it is (a signature over another kind of record never verifies as one).
RESULT_KIND = "autodeploy.fleet.result"
#: The winner's fields a result signs: what ``fleet status`` and a bundle's choice rest on.
WINNER_FIELDS = ("config", "uid", "statistic", "value", "speedup", "baseline", "screening_only")
NEW_NAME = "give this machine its own --name (a device whose key file is lost registers again under a new name)"  # fmt: skip


@dataclass(frozen=True)
class DeviceKey:
    """This machine's key pair of one device name: the private key's file, the public key's file and PEM."""

    name: str
    private: Path
    public: Path
    pem: str

    @property
    def id(self) -> str:
        return key_id(self.pem)


def key_id(pem: str) -> str:
    """A short name of a public key: ``sha256:`` and the first 16 hex digits of its PEM's digest."""
    return "sha256:" + hashlib.sha256(pem.strip().encode()).hexdigest()[:16]


def device_key(folder: Path, name: str) -> DeviceKey:
    """The key pair of device ``name`` in ``folder/keys``, made the first time (P-256; the private file 0600).

    Two agents of one name starting at once make one pair: the second to publish its file takes the first's.

    Raises:
        UsageError: the private key file is readable by others, or is not an unencrypted PEM P-256 key.
        MissingExtraError: cryptography is not installed (the ``sign`` extra).
    """
    serialization, ec = _crypto()
    keys = folder / KEYS
    private = keys / f"{name}.key"
    if not private.exists():
        keys.mkdir(parents=True, exist_ok=True, mode=0o700)
        pem = ec.generate_private_key(ec.SECP256R1()).private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())  # fmt: skip
        _publish(private, pem, 0o600)
    key = _load_private(private)
    public_pem = key.public_key().public_bytes(serialization.Encoding.PEM,
                                               serialization.PublicFormat.SubjectPublicKeyInfo)  # fmt: skip
    public = keys / f"{name}.pub"
    # derived from the private key each time: a .pub found here is never trusted as read
    if not public.is_file() or public.read_bytes() != public_pem:
        public.unlink(missing_ok=True)
        _publish(public, public_pem, 0o644)
    return DeviceKey(name, private, public, public_pem.decode())


def _publish(path: Path, data: bytes, mode: int) -> None:
    """Write ``data`` to a new file beside ``path`` with ``mode`` from the start, then link it as ``path``
    (never replacing one another process published first)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(tmp, path)
    except FileExistsError:  # another agent of this name made its pair first: that one counts
        pass
    finally:
        tmp.unlink()


def _load_private(path: Path) -> Any:
    serialization, ec = _crypto()
    fix = f"remove {path} (and its .pub) to make a new pair; then {NEW_NAME}"
    if stat.S_IMODE(path.stat().st_mode) & 0o077:
        raise UsageError(f"device key {path} is readable by other users (mode {stat.S_IMODE(path.stat().st_mode):o})",
                         fix=f"chmod 600 {path}")  # fmt: skip
    try:
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except (ValueError, TypeError, OSError) as error:
        raise UsageError(f"device key {path} is not an unencrypted PEM private key ({error})", fix=fix) from None  # fmt: skip
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.curve.name != "secp256r1":
        raise UsageError(f"device key {path} is not a P-256 key", fix=fix)
    return key


def _crypto() -> tuple[Any, Any]:
    try:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ec
    except ModuleNotFoundError as error:
        from autodeploy.errors import MissingExtraError

        raise MissingExtraError(f"device keys need cryptography, which is not installed ({error})",
                                fix="pip install 'autodeploy[fleet]'") from None  # fmt: skip
    return serialization, ec


# -- signed results ---------------------------------------------------------------------------------------


def result_record(*, job: int, run: int, device: str, model_sha256: str, winner: dict[str, Any] | None,
                  bundle_sha256: str | None) -> bytes:  # fmt: skip
    """The bytes a run's result is signed over: canonical JSON of what the run claims (numbers as floats, so
    the record reads the same after a round trip through the database)."""
    picked = None
    if winner is not None:
        picked = {k: winner.get(k) for k in WINNER_FIELDS}
        picked.update({k: None if picked[k] is None else float(picked[k]) for k in ("value", "speedup")})
    record = {"kind": RESULT_KIND, "job": job, "run": run, "device": device, "model_sha256": model_sha256,
              "winner": picked, "bundle_sha256": bundle_sha256}  # fmt: skip
    return json.dumps(record, sort_keys=True, separators=(",", ":")).encode()


def sign_result(key: DeviceKey, record: bytes) -> str:
    """The device's signature over ``record`` (ECDSA P-256, SHA-256), base64."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    signature = _load_private(key.private).sign(record, ec.ECDSA(hashes.SHA256()))
    return base64.b64encode(signature).decode()


def result_fault(public_key: Path, record: bytes, signature: str | None) -> str | None:
    """Why ``signature`` is not the signature of ``record`` by the key at ``public_key`` (checked with
    :func:`autodeploy.bundle.loader.check_key` first), or ``None`` when it is."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    if not signature:
        return "it carries no signature"
    try:
        raw = base64.b64decode(signature, validate=True)
    except (binascii.Error, ValueError):
        return "its signature is not base64"
    public = serialization.load_pem_public_key(public_key.read_bytes())
    try:
        public.verify(raw, record, ec.ECDSA(hashes.SHA256()))  # type: ignore[call-arg, union-attr]
    except InvalidSignature:
        return "its signature does not verify (the result was changed, or another key signed it)"
    return None


def trusted_key(devices_file: Path, device: str) -> Path:
    """The public key file ``devices_file`` names for ``device``: one ``NAME PUBLIC-KEY-FILE`` per line
    (``#`` comments; a relative path is taken from the file's folder).

    Raises:
        UsageError: the file cannot be read, a line is not two fields, or it names no key for ``device``.
    """
    try:
        text = devices_file.read_text()
    except (OSError, UnicodeDecodeError) as error:
        raise UsageError(f"--trusted-devices {devices_file}: cannot be read ({error})",
                         fix="give a text file of 'NAME PUBLIC-KEY-FILE' lines") from None  # fmt: skip
    for number, line in enumerate(text.splitlines(), 1):
        fields = line.split("#", 1)[0].split()
        if not fields:
            continue
        if len(fields) != 2:
            raise UsageError(f"--trusted-devices {devices_file} line {number} is not 'NAME PUBLIC-KEY-FILE'",
                             fix="one device per line: its name, then the path of its .pub")  # fmt: skip
        if fields[0] == device:
            return devices_file.parent / fields[1]
    raise UsageError(f"--trusted-devices {devices_file} names no key for device {device!r}",
                     fix=f"add a line '{device} PATH/{device}.pub' (the key its agent printed when it started)")  # fmt: skip
