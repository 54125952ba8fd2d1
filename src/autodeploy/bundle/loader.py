"""Load an autodeploy bundle with nothing installed but numpy and the engine's own package.

Every bundle ships a copy of this file at its root, next to ``runtime/``: the engine runtime
of :mod:`autodeploy.runtime` that the harness measured with, copied verbatim. So this works
in a bare environment, without putting the bundle folder on ``sys.path`` (where a file planted
next to the loader could shadow a module it imports) and without cached bytecode::

    autodeploy bundle verify BUNDLE        # first, with code that is not in the bundle; it prints the line below
    pip install --only-binary=:all: numpy==X ENGINE==Y   # the pins of requirements.txt, wheels only
    python -I BUNDLE/loader.py             # verify every file and check this machine can run it

    import runpy
    loader = runpy.run_path("BUNDLE/loader.py")   # compiled from source; sys.path unchanged
    predictor = loader["load"]("BUNDLE")
    outputs = predictor.run({"x": batch})

That is why this module imports only the standard library and numpy at module level, and
never the rest of autodeploy (only its exception base, when it happens to be installed).
:func:`load` first verifies every file against the manifest's SHA-256 and size, then checks
that the engine version and this machine fit (CPU features a bf16 winner needs, the GPU
architecture a TensorRT plan was built for), then opens the artifact with the engine's
runtime and the tuned settings recorded in the manifest (``runtime``: the engine's own option
names, exactly as the benchmark applied them). Inside autodeploy that runtime is
:mod:`autodeploy.runtime`; shipped, it is the bundle's ``runtime/`` folder, whose files are
executed from the bytes checked against the manifest (never from cached bytecode).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.abc
import importlib.util
import json
import re
import shutil
import sys
import tempfile
import types
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

SCHEMA = 1
KIND = "autodeploy-bundle"
MANIFEST = "manifest.json"
#: ``"<sha256 of manifest.json>  manifest.json"``: the manifest cannot hold its own digest.
MANIFEST_DIGEST = "manifest.sha256"
#: The signature over every other file (OpenSSF model-signing, a Sigstore bundle); present only when signed.
SIGNATURE = "bundle.sig"
SIGN_INSTALL = "pip install model-signing pyopenssl (or 'autodeploy[sign]')"
MODEL_DIR = "model"
#: The folder of the engine's compiled cache made where the bundle was measured (``runtime/cache.py``), when shipped.
COMPILED_DIR = "compiled"
LOADER = "loader.py"
REQUIREMENTS = "requirements.txt"
#: The only requirement line a bundle may hold: ``name==version``. A path, URL, VCS link or pip option
#: (``./pkg``, ``-e``, ``--index-url``, ``git+https://``) would run code from anywhere at ``pip install``.
_PIN = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?==[0-9][A-Za-z0-9.+!]*")
#: pip decodes a requirements file by its byte-order mark, else by a PEP 263 cookie in its first two lines
#: (``# coding: utf-7`` turns the comment ``#+AAoALgAvAGUAdgBpAGw-`` into a line ``./evil``), else by the locale.
#: Only a file pip cannot read otherwise passes: printable ASCII lines, no cookie (so no BOM, no control character).
_NOT_PLAIN = re.compile(rb"[^\x20-\x7e\n]")
_COOKIE = re.compile(rb"coding[:=]", re.IGNORECASE)
#: An exported requirements.txt is a few hundred bytes.
MAX_REQUIREMENTS_BYTES = 64 << 10
#: How the pins are installed: wheels only, named on the command line (pip reads no file from the bundle).
PIP_INSTALL = "pip install --only-binary=:all:"
RUNTIME_DIR = "runtime"
REEXPORT = "export the bundle again from the results store (autodeploy export)"
_CHUNK = 1 << 20

try:  # inside autodeploy, bundle errors belong to its one exception tree
    from autodeploy.errors import AutodeployError as _ErrorBase
except ImportError:  # shipped alone: a stand-in with the same message format

    class _ErrorBase(Exception):  # type: ignore[no-redef]
        exit_code = 1

        def __init__(self, message: str, *, fix: str | None = None) -> None:
            self.message, self.fix = message, fix
            super().__init__(message if fix is None else f"{message}; fix: {fix}")


class BundleError(_ErrorBase):
    """A bundle is damaged, incomplete or unsafe, or cannot run on this machine."""


class KeyFileError(BundleError):
    """The key given to sign (``--sign``) or to check a signature (``--trust``) is not one: bad input, exit 2."""

    exit_code = 2


# -- integrity -------------------------------------------------------------------------------


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def digest_line(manifest_bytes: bytes) -> str:
    """The exact content of ``manifest.sha256`` for these manifest bytes."""
    return f"{hashlib.sha256(manifest_bytes).hexdigest()}  {MANIFEST}\n"


def read_manifest(root: str | Path) -> dict[str, Any]:
    """The manifest of the bundle at ``root``, after checking it against ``manifest.sha256``."""
    root = Path(root)
    path, digest_path = root / MANIFEST, root / MANIFEST_DIGEST
    for p in (path, digest_path):
        if p.is_symlink() or not p.is_file():
            raise BundleError(f"{root} is not a complete bundle: {p.name} is missing", fix=REEXPORT)
    data = path.read_bytes()
    if digest_path.read_bytes() != digest_line(data).encode():
        raise BundleError(
            f"bundle {root}: {MANIFEST} does not match {MANIFEST_DIGEST} (one of them was changed or corrupted)",
            fix=REEXPORT,
        )
    try:
        manifest = json.loads(data)
    except ValueError as exc:
        raise BundleError(f"bundle {root}: {MANIFEST} is not valid JSON ({exc})", fix=REEXPORT) from None
    if not isinstance(manifest, dict) or manifest.get("kind") != KIND:
        raise BundleError(f"{root}/{MANIFEST} is not an autodeploy bundle manifest", fix=REEXPORT)
    if manifest.get("schema") != SCHEMA:
        raise BundleError(
            f"bundle {root} has manifest schema {manifest.get('schema')}, this loader reads schema {SCHEMA}",
            fix="use the autodeploy version that exported it, or export it again",
        )
    return manifest


def verify(root: str | Path, *, trust: str | Path | None = None) -> dict[str, Any]:
    """Check every file of the bundle against the manifest (SHA-256 and size); return the manifest.

    Without ``trust`` this checks integrity only: the files are the ones the manifest lists,
    but anyone can write a consistent manifest. With ``trust`` (a PEM public key) the bundle
    must also carry a valid signature by its private key (``autodeploy export --sign``) over
    every file, checked first.

    Raises:
        BundleError: naming the first file that is missing, changed, or not in the manifest,
            or a signature that is missing or does not verify with ``trust``.
    """
    root = Path(root)
    check_requirements(root)  # whatever the checksums say: a resealed manifest can list any content
    if trust is not None:
        verify_signature(root, trust)
    manifest = read_manifest(root)
    files: Mapping[str, Mapping[str, Any]] = manifest.get("files") or {}
    for rel, entry in sorted(files.items()):
        path = root / rel
        if Path(rel).is_absolute() or ".." in Path(rel).parts:
            raise BundleError(
                f"bundle {root}: the manifest lists {rel!r}, which is outside the bundle", fix=REEXPORT
            )
        if path.is_symlink() or not path.is_file():
            raise BundleError(f"bundle {root}: {rel} is missing", fix=REEXPORT)
        size = path.stat().st_size
        if size != entry["size"]:
            raise BundleError(
                f"bundle {root}: {rel} has {size} bytes, the manifest says {entry['size']} (changed or truncated)",
                fix=REEXPORT,
            )
        if sha256_file(path) != entry["sha256"]:
            raise BundleError(
                f"bundle {root}: {rel} does not match its SHA-256 in the manifest (changed or corrupted)",
                fix=REEXPORT,
            )
    expected = set(files) | {MANIFEST, MANIFEST_DIGEST} | ({SIGNATURE} if (root / SIGNATURE).is_file() else set())
    for path in sorted(root.rglob("*")):  # __pycache__ too: bytecode could stand in for a verified source
        rel = path.relative_to(root)
        if path.is_dir() and not path.is_symlink():
            continue
        if rel.as_posix() not in expected:
            raise BundleError(f"bundle {root}: {rel.as_posix()} is not listed in the manifest", fix=REEXPORT)
    return manifest


def check_requirements(root: str | Path) -> list[str]:
    """Refuse a ``requirements.txt`` holding anything but ``name==version`` lines (and comments), in plain
    ASCII as pip would read it too; return its pins (none when the file is missing).

    Raises:
        BundleError: naming the first line that is a path, URL, VCS link, pip option or unpinned name, or
            the first byte or encoding cookie that could make pip read other lines than these.
    """
    path = Path(root) / REQUIREMENTS
    if path.is_symlink() or not path.is_file():
        return []  # the file check says it is missing when the manifest lists it
    fix = "do not install this bundle's requirements; " + REEXPORT
    with open(path, "rb") as f:
        data = f.read(MAX_REQUIREMENTS_BYTES + 1)
    if len(data) > MAX_REQUIREMENTS_BYTES:
        raise BundleError(f"bundle {root}: {REQUIREMENTS} is over {MAX_REQUIREMENTS_BYTES >> 10} KiB "
                          "(an exported one holds a few pins)", fix=fix)  # fmt: skip
    lines = data.split(b"\n")
    for number, line in enumerate(lines, 1):
        if bad := _NOT_PLAIN.search(line):
            raise BundleError(f"bundle {root}: {REQUIREMENTS} line {number} holds byte {bad[0]!r}, not printable "
                              "ASCII (a byte-order mark or control character changes what pip reads)", fix=fix)  # fmt: skip
        if _COOKIE.search(line):
            raise BundleError(f"bundle {root}: {REQUIREMENTS} line {number} {line[:80].decode()!r} declares an "
                              "encoding (pip decodes the file with it and reads other lines than these)", fix=fix)  # fmt: skip
    pins = []
    for number, line in enumerate(lines, 1):
        text = line.decode().strip()
        if text and not text.startswith("#") and not _PIN.fullmatch(text):
            raise BundleError(
                f"bundle {root}: {REQUIREMENTS} line {number} {text[:80]!r} is not a name==version pin "
                "(a path, URL or pip option there runs code at pip install)",
                fix=fix,
            )
        if text and not text.startswith("#"):
            pins.append(text)
    return pins


def install_command(root: str | Path) -> str:
    """The ``pip install`` line of the bundle's pins, to run instead of ``pip install -r requirements.txt``:
    pip then reads no file from the bundle. Call it on a verified bundle.

    Raises:
        BundleError: as :func:`check_requirements`, or when the bundle pins nothing.
    """
    pins = check_requirements(root)
    if not pins:
        raise BundleError(f"bundle {root}: {REQUIREMENTS} pins nothing to install", fix=REEXPORT)
    return " ".join([PIP_INSTALL, *pins])


def verify_signature(root: Path, public_key: str | Path) -> None:
    """Check the bundle's signature (OpenSSF model-signing, elliptic-curve key) over every file.

    model-signing hashes every file of the folder, refuses files it did not sign, and checks
    the DSSE signature of that list with ``public_key``; nothing from the bundle is imported.
    """
    check_key(public_key, private=False)
    if not (root / SIGNATURE).is_file() or (root / SIGNATURE).is_symlink():
        raise BundleError(f"bundle {root} is not signed ({SIGNATURE} is missing), but a trust key was given",
                          fix="export it again with --sign KEY, or verify without --trust (integrity only)")  # fmt: skip
    try:
        from model_signing import hashing, verifying
    except ImportError as exc:
        raise BundleError(f"checking a signature needs model-signing, which cannot be imported ({exc})",
                          fix=SIGN_INSTALL) from None  # fmt: skip
    config = verifying.Config().use_elliptic_key_verifier(public_key=Path(public_key))
    config.set_hashing_config(hashing.Config().set_ignored_paths(paths=[SIGNATURE], ignore_git_paths=False))
    try:
        config.verify(root, root / SIGNATURE)
    except Exception as exc:  # model-signing raises ValueError and others; every one means "not trusted"
        reason = _signature_reason(str(exc))
        raise BundleError(f"bundle {root}: the signature does not verify with {public_key}: {reason}",
                          fix="get the bundle again from its publisher; never run a bundle that fails this") from None  # fmt: skip


#: The elliptic curves model-signing signs and verifies with.
CURVES = ("secp256r1", "secp384r1", "secp521r1")
NEW_KEY = ("make a P-256 key pair: openssl ecparam -genkey -name prime256v1 -noout -out key.pem && "
           "openssl ec -in key.pem -pubout -out key.pub")  # fmt: skip
TRUST_KEY = "give the publisher's PEM elliptic-curve public key (the .pub of the key the bundle was signed with)"
#: A PEM elliptic-curve key is a few hundred bytes: more is not a key (``/dev/zero`` would never end).
MAX_KEY_BYTES = 1 << 20


def check_key(path: str | Path, *, private: bool) -> Path:
    """The PEM elliptic-curve key at ``path`` (``private`` for signing, else public for ``--trust``), checked
    before model-signing reads it: it fails on an RSA key with a bare ``AttributeError``, on a missing file
    with ``FileNotFoundError``.

    Raises:
        KeyFileError: missing, a folder, unreadable, empty, not PEM, encrypted, the other half of the
            pair, or not a key on one of :data:`CURVES`.
    """
    path, flag, want = Path(path), "--sign" if private else "--trust", "private" if private else "public"

    def bad(what: str, fix: str | None = None) -> KeyFileError:
        return KeyFileError(f"{flag} {path}: {what}", fix=fix or (NEW_KEY if private else TRUST_KEY))

    if not path.exists():
        raise bad("no such file", fix=f"give the path of a PEM {want} key")
    if path.is_dir():
        raise bad("is a folder, not a key file", fix=f"give the path of a PEM {want} key")
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_KEY_BYTES + 1)
    except OSError as exc:
        raise bad(f"cannot be read ({exc.strerror or exc})", fix="check its permissions") from None
    if len(data) > MAX_KEY_BYTES:
        raise bad(f"is over {MAX_KEY_BYTES >> 20} MiB, not a key file (a PEM key is a few hundred bytes)")
    if not data.strip():
        raise bad("is empty")
    if not private and b"PRIVATE KEY" in data:
        raise bad("is a private key; --trust takes the publisher's public key",
                  fix="give the .pub that goes with it (openssl ec -in KEY -pubout -out KEY.pub); never hand out the private key")  # fmt: skip
    if private and b"PUBLIC KEY" in data and b"PRIVATE KEY" not in data:
        raise bad("is a public key; --sign takes the private key", fix="give the private key the .pub was made from")
    try:
        from cryptography.exceptions import UnsupportedAlgorithm
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ec
    except ImportError as exc:
        raise KeyFileError(f"{flag} needs model-signing, which cannot be imported ({exc})", fix=SIGN_INSTALL) from None
    try:
        key = (serialization.load_pem_private_key(data, password=None) if private
               else serialization.load_pem_public_key(data))  # fmt: skip
    except TypeError:  # the only TypeError here: a password-protected key
        raise bad("is encrypted; model-signing reads unencrypted keys only",
                  fix=f"decrypt a copy: openssl pkey -in {path} -out plain.pem") from None  # fmt: skip
    except (ValueError, UnsupportedAlgorithm):
        raise bad(f"is not a PEM {want} key") from None
    public = key.public_key() if private else key  # type: ignore[union-attr]
    if not isinstance(public, ec.EllipticCurvePublicKey):
        kind = type(public).__module__.rsplit(".", 1)[-1].upper().replace("ED", "Ed")
        raise bad(f"is {'an' if kind[:1] in 'AEIOR' else 'a'} {kind} key; model-signing takes elliptic-curve keys "
                  f"({', '.join(CURVES)})")  # fmt: skip
    if public.curve.name not in CURVES:
        raise bad(f"is a key on curve {public.curve.name}; model-signing takes {', '.join(CURVES)}")
    return path


def _signature_reason(text: str) -> str:
    """model-signing's mismatch report, shortened to the files it names."""
    changed = re.findall(r"Hash mismatch for \\?'([^'\\]+)\\?'", text)  # a list's repr may escape the quotes
    extra = re.findall(r"Extra files found in model '[^']*': ([^\"\]]+)", text)
    missing = re.findall(r"Missing files in model '[^']*': ([^\"\]]+)", text)
    parts = [f"changed: {', '.join(changed)}"] if changed else []
    parts += [f"not signed: {e.strip()}" for e in extra] + [f"missing: {m.strip()}" for m in missing]
    return "; ".join(parts) or " ".join(text.split())[:300]


# -- compatibility -------------------------------------------------------------------------


def installed_version(packages: Sequence[str]) -> str | None:
    """The installed version of the first of ``packages`` (an engine's runtime), from metadata."""
    return _runtime("machine").installed_version(packages)


def cpu_info() -> tuple[str, frozenset[str]] | None:
    """This CPU's model name and feature flags; ``None`` when they cannot be read."""
    model, flags = _runtime("machine").cpu()
    return (model, flags) if flags else None


def gpu_capabilities() -> list[str] | None:
    """Compute capability (``"8.9"``) of each NVIDIA GPU from nvidia-smi; ``None`` without nvidia-smi."""
    gpus = _runtime("machine").nvidia_gpus()
    return None if gpus is None else [capability for _, capability in gpus]


def check_compatible(
    manifest: Mapping[str, Any],
    *,
    allow_other_version: bool = False,
    cpu: tuple[str, frozenset[str]] | None | bool = True,
    gpus: list[str] | None | bool = True,
) -> list[str]:
    """Refuse when this machine cannot run the bundle; return warnings for what only changes speed.

    Refused: the engine package missing, another engine version (a warning instead with
    ``allow_other_version``, except for engines whose artifacts are version-locked), CPU
    features the precision needs, the GPU architecture a plan was built for. ``cpu`` and
    ``gpus`` default to probing this machine; tests pass fixed values.
    """
    record = manifest["engine"]
    engine = record.get("runtime", record["name"])  # an in-house winner runs on onnxruntime or openvino
    want = record.get("runtime_version", record["version"])
    precision = manifest["settings"]["precision"]
    fix_install = (f"{PIP_INSTALL} {record.get('package') or engine}=={want} "
                   f"(autodeploy bundle verify prints every pin of {REQUIREMENTS})")  # fmt: skip
    have = installed_version(record.get("packages") or [record.get("package", engine)])
    if have is None:
        raise BundleError(f"this bundle runs on {engine} {want}, which is not installed", fix=fix_install)
    warnings: list[str] = []
    if have != want:
        message = f"this bundle was benchmarked with {engine} {want}, this machine has {have}"
        locked = getattr(_runtime(engine, manifest), "VERSION_LOCKED", False)  # declared by the engine's runtime
        if locked or not allow_other_version:
            raise BundleError(message, fix=fix_install + ("" if locked else ", or allow_other_version=True"))
        warnings.append(message + "; outputs and speed may differ")
    requires = manifest.get("requires") or {}
    cpu = cpu_info() if cpu is True else cpu
    if requires.get("isa_any_of"):
        needed = list(requires["isa_any_of"])
        if not cpu:
            warnings.append(f"cannot read this CPU's features to check for {' or '.join(needed)}")
        elif not set(needed) & cpu[1]:
            raise BundleError(
                f"this {engine} {precision} bundle needs a CPU with {' or '.join(needed)} "
                f"({requires.get('why', 'for its precision')}); this CPU ({cpu[0]}) has none of them",
                fix="run it on such a CPU, or tune on this machine and export that winner",
            )
    if cpu and manifest["device"].get("cpu") and cpu[0] != manifest["device"]["cpu"]:
        warnings.append(
            f"benchmarked on {manifest['device']['cpu']}, this CPU is {cpu[0]}: latency will differ"
        )
    if requires.get("gpu_compute_capability"):
        cc = str(requires["gpu_compute_capability"])
        found = gpu_capabilities() if gpus is True else gpus
        if not found:
            raise BundleError(f"this {engine} bundle needs an NVIDIA GPU of compute capability {cc}; none found",
                              fix="run it on a machine with such a GPU and its driver (nvidia-smi must list it)")  # fmt: skip
        if cc not in found:
            raise BundleError(
                f"this {engine} plan was built for compute capability {cc}, this machine's GPUs are {', '.join(found)}",
                fix="re-tune on a GPU of this architecture and export that winner",
            )
    return warnings


# -- the predictor -------------------------------------------------------------------------


class Predictor:
    """A verified bundle opened with its tuned settings. ``run(feeds)`` -> ``{output name: array}``."""

    def __init__(self, root: Path, manifest: dict[str, Any], warnings: list[str]) -> None:
        self.root, self.manifest, self.warnings = root, manifest, warnings
        _check_runtime_files(root, manifest)
        runtime = _runtime(manifest["engine"].get("runtime", manifest["engine"]["name"]), manifest)
        io = _runtime("base", manifest).IO.from_dict(manifest["model"])
        self._copy: Path | None = None  # where the shipped compiled cache is used from (the bundle stays as verified)
        self._runner = runtime.open(root / MODEL_DIR, self._settings(), io)
        #: What the open did with the bundle's compiled cache: ``used``, or ``remade: WHY`` (made by another engine
        #: version or for another device: the engine compiled the model here); ``None``: the bundle ships none.
        self.cache = self._runner.cache
        if self.cache is not None and self.cache != _runtime("cache", manifest).USED:
            self.warnings.append(f"the bundle's compiled cache was not used ({self.cache}); the engine compiled "
                                 "the model on this machine")  # fmt: skip
        self.input_dtypes, self.output_names = self._runner.input_dtypes, self._runner.output_names
        self._checked: set[tuple[Any, ...]] = set()  # feed shapes already checked against the measured ones

    def _settings(self) -> dict[str, Any]:
        """The runtime's settings, with the shipped compiled cache (a private copy of it) where there is one: the
        runtime uses it only where this machine's engine version and device match the ones it was made under."""
        settings = dict(self.manifest["runtime"])
        if not self.manifest.get("compiled_cache") or not (self.root / COMPILED_DIR).is_dir():
            return settings
        self._copy = Path(tempfile.mkdtemp(prefix="autodeploy-bundle-cache-"))
        shutil.copytree(self.root / COMPILED_DIR, self._copy / COMPILED_DIR)
        key = _runtime("cache", self.manifest).cache_key(self.manifest["artifact"]["key"], settings)
        return {**settings, "compiled_cache": {"dir": str(self._copy / COMPILED_DIR), "key": key}}

    @property
    def settings(self) -> dict[str, Any]:
        """The tuned config (engine, precision, batch, threads, knobs) this bundle applies."""
        return dict(self.manifest["settings"])

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run one batch; feeds must match the model's input names and dtypes.

        A shape the bundle was not measured on is refused outside a TensorRT plan's profile,
        and warned about once (``warnings.warn``, and :attr:`warnings`) for other engines.
        """
        feeds = {k: np.asarray(v) for k, v in feeds.items()}
        signature = tuple(sorted((k, v.shape) for k, v in feeds.items()))
        if signature not in self._checked:
            for warning in check_shapes(self.manifest, {k: v.shape for k, v in feeds.items()}):
                self.warnings.append(warning)
                warnings.warn(warning, stacklevel=2)
            self._checked.add(signature)
        try:
            return self._runner.run(feeds)
        except _runtime("base", self.manifest).FeedError as exc:
            raise BundleError(exc.message, fix=exc.fix) from None

    def close(self) -> None:
        self._runner.close()
        if self._copy is not None:
            shutil.rmtree(self._copy, ignore_errors=True)

    def __enter__(self) -> Predictor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def load(path: str | Path, *, allow_other_version: bool = False, trust: str | Path | None = None) -> Predictor:
    """Verify the bundle folder at ``path`` (and its signature with ``trust``), check it fits this machine, and open it.

    Raises:
        BundleError: a file is missing or changed, or this machine cannot run the bundle.
    """
    root = Path(path)
    if not root.is_dir():
        raise BundleError(f"{root} is not a bundle folder",
                          fix="pass the exported folder (autodeploy.bundle.load also opens .tar.gz)")  # fmt: skip
    manifest = verify(root, trust=trust)
    _runtime("machine", manifest)  # the shipped probe, from the bytes just verified
    warnings = check_compatible(manifest, allow_other_version=allow_other_version)
    return Predictor(root, manifest, warnings)


def check_shapes(manifest: Mapping[str, Any], shapes: Mapping[str, Sequence[int]]) -> list[str]:
    """Feed ``shapes`` against the shapes the bundle was measured on (its manifest's ``shapes``).

    Returns one warning per input whose shape (its batch axis aside) was not measured; a
    TensorRT plan refuses a shape outside its optimization profile. Bundles made before shapes
    were recorded say nothing.

    Raises:
        BundleError: a TensorRT bundle fed a shape outside its profile.
    """
    profile = (manifest.get("runtime") or {}).get("profile") or {}
    for name, shape in shapes.items():
        bounds = profile.get(name)
        if bounds and not (len(shape) == len(bounds["min"]) and
                           all(lo <= d <= hi for d, lo, hi in zip(shape, bounds["min"], bounds["max"], strict=True))):  # fmt: skip
            raise BundleError(f"input {name!r} of shape {_dims(shape)} is outside the TensorRT plan's optimization "
                              f"profile ({_dims(bounds['min'])} .. {_dims(bounds['max'])})",
                              fix="feed a shape inside the profile, or tune with this shape too (--shape) and export again")  # fmt: skip
    record = manifest.get("shapes") or {}
    axes, fed = record.get("batch_axes") or {}, record.get("fed") or {}
    measured: dict[str, set[tuple[int, ...]]] = {}
    for case in record.get("measured") or ():
        for name in set(case.get("shape") or {}) | set(fed):
            measured.setdefault(name, set()).add(tuple((case.get("shape") or {}).get(name) or fed[name]))
    found = []
    for name, shape in shapes.items():
        seen = measured.get(name)
        if not seen:
            continue
        axis = axes.get(name)
        if not any(_same_item(shape, s, axis) for s in seen):
            found.append(f"input {name!r} of shape {_dims(shape)} was not measured (measured: "
                         f"{', '.join(sorted(_dims(s) for s in seen))}); speed and accuracy at it are unknown")  # fmt: skip
    return found


def _same_item(a: Sequence[int], b: Sequence[int], batch_axis: int | None) -> bool:
    return len(a) == len(b) and all(x == y for i, (x, y) in enumerate(zip(a, b, strict=True)) if i != batch_axis)


def _dims(shape: Sequence[int]) -> str:
    return "x".join(map(str, shape))


# -- the engine runtime ----------------------------------------------------------------------

#: Runtime settings that name a file: each must be a file of ``model/`` listed in the manifest.
FILE_SETTINGS = ("model_file", "layout_file")


def _check_runtime_files(root: Path, manifest: Mapping[str, Any]) -> None:
    """Refuse runtime settings that point at anything but a verified file of the artifact."""
    listed = manifest.get("files") or {}
    for key in FILE_SETTINGS:
        name = (manifest.get("runtime") or {}).get(key)
        if name is None:
            continue
        if not isinstance(name, str) or f"{MODEL_DIR}/{name}" not in listed or ".." in Path(name).parts:
            raise BundleError(f"bundle {root}: runtime.{key} {name!r} is not a file of {MODEL_DIR}/ listed in the "
                              "manifest", fix=REEXPORT)  # fmt: skip


def _runtime(name: str, manifest: Mapping[str, Any] | None = None) -> types.ModuleType:
    """Module ``name`` of the engine runtime: :mod:`autodeploy.runtime` inside autodeploy, else the
    ``runtime/`` folder next to this file, executed from bytes that match ``manifest`` when given."""
    if not re.fullmatch(r"[a-z][a-z0-9_]*", name):
        raise BundleError(f"the manifest names runtime {name!r}, which is not a runtime module name", fix=REEXPORT)
    if __name__.startswith("autodeploy."):
        try:
            return importlib.import_module(f"autodeploy.runtime.{name}")
        except ModuleNotFoundError:
            raise BundleError(f"this autodeploy has no runtime for {name!r}", fix="use a newer autodeploy") from None
    folder = Path(__file__).resolve().parent / RUNTIME_DIR
    package = f"_autodeploy_runtime_{hashlib.sha256(str(folder).encode()).hexdigest()[:12]}"
    if package not in sys.modules:
        _exec_source(package, folder / "__init__.py", manifest, is_package=True)
    for module in ("base", "machine", "cache", name):  # the shared modules first: the engine's imports them
        if f"{package}.{module}" not in sys.modules:
            _exec_source(f"{package}.{module}", folder / f"{module}.py", manifest)
    return sys.modules[f"{package}.{name}"]


def _exec_source(qualname: str, path: Path, manifest: Mapping[str, Any] | None, *, is_package: bool = False) -> None:
    """Import one shipped source file as module ``qualname``; with ``manifest``, only if its bytes match."""
    if not path.is_file() or path.is_symlink():
        raise BundleError(f"bundle {path.parent.parent}: {RUNTIME_DIR}/{path.name} is missing", fix=REEXPORT)
    entry = (manifest.get("files") or {}).get(f"{RUNTIME_DIR}/{path.name}") or {} if manifest else None
    loader = _VerifiedSource(path, None if entry is None else entry.get("sha256", ""))
    spec = importlib.util.spec_from_file_location(
        qualname, path, loader=loader, submodule_search_locations=[str(path.parent)] if is_package else None
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[qualname] = module
    try:
        loader.exec_module(module)
    except BaseException:
        del sys.modules[qualname]
        raise


class _VerifiedSource(importlib.abc.SourceLoader):
    """Loads one file from its source bytes, checked against ``sha256`` when given.

    A ``SourceLoader`` without ``path_stats`` never reads or writes cached bytecode, so a
    ``__pycache__`` planted in the bundle cannot replace the verified source.
    """

    def __init__(self, path: Path, sha256: str | None) -> None:
        self.path, self.sha256 = path, sha256

    def get_filename(self, fullname: str) -> str:
        return str(self.path)

    def get_data(self, path: str) -> bytes:
        data = Path(path).read_bytes()
        if self.sha256 is not None and hashlib.sha256(data).hexdigest() != self.sha256:
            raise BundleError(f"bundle {self.path.parent.parent}: {RUNTIME_DIR}/{self.path.name} does not match "
                              "its SHA-256 in the manifest (changed or corrupted)", fix=REEXPORT)  # fmt: skip
        return data


if __name__ == "__main__":  # `python loader.py` inside a bundle: verify it and say whether it runs here
    here = Path(__file__).resolve().parent
    verified = verify(here)
    _runtime("machine", verified)
    found = check_compatible(verified)
    print(f"{here}: every file verified; runs here" + "".join(f"\nwarning: {w}" for w in found))
