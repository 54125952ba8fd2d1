"""A bundle's requirements.txt holds ``name==version`` pins only (issue 28, case 2).

``pip install -r requirements.txt`` runs before any check the bundle's own code could make: a
``./evil`` line (an in-tree build backend) runs code at install. The loader and ``bundle verify``
refuse every other line, whether or not the attacker resealed the manifest.
"""

import hashlib
import json
import re
import subprocess
import sys

import pytest

from autodeploy.bundle import BundleError, loader
from tests.cli.test_cli import run as run_cli

TAMPERED = ["./evil", "evil @ file:///tmp/evil", "https://evil.example/evil-1.0-py3-none-any.whl", "-e ./evil",
            "--index-url https://evil.example/simple", "--extra-index-url=https://evil.example/simple",
            "git+https://evil.example/evil.git", "-r ../other.txt", "numpy>=1.24", "numpy", "numpy==1.0 --hash=x"]  # fmt: skip


def _tamper(bundle, line, *, reseal):
    path = bundle / "requirements.txt"
    path.write_text(path.read_text() + line + "\n")
    if reseal:  # an attacker with write access updates the checksums and the manifest's digest
        manifest = json.loads((bundle / "manifest.json").read_text())
        data = path.read_bytes()
        manifest["files"]["requirements.txt"] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
        raw = (json.dumps(manifest, indent=2) + "\n").encode()
        (bundle / "manifest.json").write_bytes(raw)
        (bundle / "manifest.sha256").write_text(loader.digest_line(raw))


@pytest.mark.parametrize("reseal", [False, True], ids=["checksums-stale", "resealed"])
@pytest.mark.parametrize("line", TAMPERED)
def test_a_requirement_that_is_not_a_pin_is_refused(bundle, line, reseal):
    _tamper(bundle, line, reseal=reseal)
    with pytest.raises(BundleError, match=r"requirements.txt line \d+ .* is not a name==version pin") as info:
        loader.verify(bundle)
    assert "\n" not in str(info.value)


def test_the_shipped_loader_and_the_cli_refuse_it_too(bundle, tmp_path, capsys):
    _tamper(bundle, "./evil", reseal=True)
    proc = subprocess.run([sys.executable, "-I", str(bundle / "loader.py")], capture_output=True, text=True,
                          cwd=tmp_path, timeout=120)  # fmt: skip
    assert proc.returncode != 0 and "'./evil' is not a name==version pin" in proc.stderr
    code, _, err = run_cli(capsys, "bundle", "verify", str(bundle))
    assert code == 1 and "'./evil' is not a name==version pin" in err
    assert len([line for line in err.splitlines() if line.strip()]) == 1, err


def test_an_exported_bundle_holds_only_pins_and_says_to_verify_before_installing(bundle):
    lines = [line for line in (bundle / "requirements.txt").read_text().splitlines() if not line.startswith("#")]
    assert lines and all(re.fullmatch(r"[A-Za-z0-9._-]+==[0-9][A-Za-z0-9.+!]*", line) for line in lines), lines
    loader.verify(bundle)
    readme = (bundle / "README.md").read_text()
    assert readme.index("autodeploy bundle verify") < readme.index(f"pip install --only-binary=:all: {' '.join(lines)}")
    assert "pip install -r" not in readme and "-r requirements.txt" not in readme  # issue 37: pins, never the file


def test_the_main_readme_verifies_before_installing():
    from pathlib import Path

    text = (Path(__file__).parents[2] / "README.md").read_text()
    assert "pip install -r ship/requirements.txt" not in text and "-r ship/requirements.txt" not in text
    assert text.index("autodeploy bundle verify ship") < text.index("pip install --only-binary=:all: numpy==")
