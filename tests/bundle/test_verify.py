"""A one-byte change anywhere makes verify and load fail naming the file; the loader runs alone."""

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import autodeploy.bundle
from autodeploy.bundle import BundleError, export, loader
from tests.bundle.conftest import feeds, fresh_venv
from tests.cli.test_cli import run as run_cli

FILES = ["model/model.onnx", "model/artifact.json", "loader.py", "requirements.txt", "README.md",
         "runtime/onnxruntime.py", "runtime/base.py", "runtime/machine.py",
         "manifest.json", "manifest.sha256"]  # fmt: skip


def flip_one_byte(path, offset=None):
    data = bytearray(path.read_bytes())
    i = len(data) // 2 if offset is None else offset
    data[i] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("name", FILES)
def test_one_byte_changed_in_any_file_fails_verify_and_load_naming_it(bundle, name):
    flip_one_byte(bundle / name)
    # The manifest and its digest vouch for each other; every other file is named itself.
    named = (
        "manifest.json does not match manifest.sha256"
        if name.startswith("manifest")
        else f"{name} does not match its SHA-256"
    )
    with pytest.raises(BundleError, match=named):
        loader.verify(bundle)
    with pytest.raises(BundleError, match=named):
        autodeploy.bundle.load(bundle)


def test_a_valid_json_edit_of_the_manifest_is_caught(bundle):
    path = bundle / "manifest.json"
    m = json.loads(path.read_text())
    m["measurements"]["median_ms"] = 0.001  # a flattering number, still valid JSON
    path.write_text(json.dumps(m, indent=2) + "\n")
    with pytest.raises(BundleError, match="manifest.json does not match manifest.sha256"):
        loader.verify(bundle)


def test_a_missing_truncated_or_extra_file_is_named(stored, bundle, tmp_path):
    (bundle / "README.md").unlink()
    with pytest.raises(BundleError, match="README.md is missing"):
        loader.verify(bundle)
    other = export.write_bundle(stored.source(), tmp_path / "other")
    with open(other / "model/model.onnx", "ab") as f:
        f.write(b"\0")
    with pytest.raises(BundleError, match=r"model/model.onnx has \d+ bytes, the manifest says \d+"):
        loader.verify(other)
    third = export.write_bundle(stored.source(), tmp_path / "third")
    (third / "model" / "sneaky.so").write_bytes(b"x")
    with pytest.raises(BundleError, match="model/sneaky.so is not listed in the manifest"):
        loader.verify(third)


def test_cli_verify_info_run_on_a_real_bundle_and_a_damaged_one(stored, bundle, capsys, monkeypatch):
    from autodeploy.cli import _common

    monkeypatch.setattr(_common.out, "width", 200)
    code, out, err = run_cli(capsys, "bundle", "verify", str(bundle))
    assert code == 0 and "ok" in out and "10 files match the manifest" in out, err  # as `bundle info` counts them
    assert "signed:" not in out and "None" not in out, out  # an unsigned bundle claims no signature
    code, out, err = run_cli(capsys, "bundle", "info", str(bundle))
    assert (
        code == 0 and "onnxruntime" in out and "ORT_PARALLEL" in out and "autodeploy bench m.onnx" in out
    ), err
    assert re.search(r"p90 [\d.]+ (µs|ms) at x=2x8, one call at a time, (solo|under load)", out), out  # its shape
    code, out, err = run_cli(
        capsys, "bundle", "run", str(bundle), "--min-samples", "8", "--min-duration", "0.05"
    )
    assert code == 0 and "this machine" in out and "median" in out and "items/s" in out, err
    assert "b2  at x=2x8" in out and re.search(r"manifest: p90 .* at x=2x8, one call at a time", out), out
    # the units are in the values now, and the comparison says which way it goes
    assert re.search(r"\d+(\.\d+)? (µs|ms|s) ", out) and re.search(r"\d\.\d\dx (slower|faster)|same", out), out
    # the load beside the comparison: this machine's, and the manifest's (read when the trial was measured)
    assert re.search(r"other processes' CPU +│ +\d\.\d\d of \d+ cores.*│ +\d\.\d\d of \d+ cores", out), out
    flip_one_byte(bundle / "model" / "model.onnx")
    code, out, err = run_cli(capsys, "bundle", "verify", str(bundle))
    assert code == 1 and "model/model.onnx does not match its SHA-256" in err
    code, out, err = run_cli(capsys, "bundle", "run", str(bundle))
    assert code == 1 and "model/model.onnx does not match its SHA-256" in err


def test_cli_export_of_a_trial_as_tar_then_verify(stored, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("AUTODEPLOY_DB", stored.db)
    code, out, err = run_cli(
        capsys, "export", "--trial", str(stored.trial_id), "-o", str(tmp_path / "w"), "--tar"
    )
    assert code == 0 and "w.tar.gz" in out, err
    # each number with the shape, the calls and the machine it was measured at
    assert re.search(r"p90 \S+ (µs|ms) at x=2x8, one call at a time, (solo|under load).*: one run, trial \d+", out), out
    code, out, err = run_cli(capsys, "bundle", "verify", str(tmp_path / "w.tar.gz"))
    assert code == 0 and "match the manifest" in out, err
    code, _, err = run_cli(capsys, "export", "-o", str(tmp_path / "x"))
    assert code == 2 and "give a study name or --trial ID" in err


BLOCKER = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("autodeploy", "sqlalchemy", "optuna", "streamlit", "typer", "onnx", "psutil"):
            raise ImportError(f"{name} is not installed here")
sys.meta_path.insert(0, Block())
"""


def test_the_shipped_loader_needs_only_numpy_and_the_engine(stored, bundle, tmp_path):
    x = feeds(batch=3, seed=1)
    np.save(tmp_path / "x.npy", x["x"])
    script = BLOCKER + textwrap.dedent(f"""
        import runpy
        import numpy as np
        loader = runpy.run_path({str(bundle / "loader.py")!r})
        assert {str(bundle)!r} not in sys.path
        p = loader["load"]({str(bundle)!r})
        np.save({str(tmp_path / "y.npy")!r}, p.run({{"x": np.load({str(tmp_path / "x.npy")!r})}})["logits"])
        heavy = [m for m in ("autodeploy", "sqlalchemy", "optuna", "streamlit", "onnx") if m in sys.modules]
        assert not heavy, heavy
        assert issubclass(loader["BundleError"], Exception)
    """)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert np.array_equal(np.load(tmp_path / "y.npy"), stored.reference_outputs(x)["logits"])
    # Loading this way leaves no bytecode in the bundle: it still verifies as exported.
    assert not list(bundle.rglob("__pycache__"))
    loader.verify(bundle)


def test_autodeploy_bundle_imports_no_heavy_package():
    code = "import sys, autodeploy.bundle; print(sorted(m for m in ('sqlalchemy', 'optuna', 'streamlit', 'onnxruntime') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})  # fmt: skip
    assert out.stdout.strip() == "[]"


@pytest.mark.slow
def test_bundle_runs_in_a_fresh_virtualenv_with_only_numpy_and_the_engine(stored, bundle, tmp_path):
    """The issue's 'done when': a new venv, `pip install -r requirements.txt`, nothing else."""
    python, env = fresh_venv(bundle / "requirements.txt", tmp_path / "venv")
    listed = subprocess.run(
        [str(python), "-m", "pip", "list", "--format=freeze"], capture_output=True, text=True, env=env
    )
    installed = {line.split("==")[0].lower() for line in listed.stdout.split()}
    assert not installed & {"autodeploy", "optuna", "sqlalchemy", "streamlit", "onnx"}, installed
    copy = shutil.copytree(bundle, tmp_path / "shipped")  # a bundle copied elsewhere still verifies
    x = feeds(batch=5, seed=2)
    np.save(tmp_path / "x.npy", x["x"])
    script = textwrap.dedent(f"""
        import runpy, numpy as np
        loader = runpy.run_path({str(copy / "loader.py")!r})
        p = loader["load"]({str(copy)!r})
        np.save({str(tmp_path / "y.npy")!r}, p.run({{"x": np.load({str(tmp_path / "x.npy")!r})}})["logits"])
    """)
    proc = subprocess.run(
        [str(python), "-c", script], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert np.array_equal(np.load(tmp_path / "y.npy"), stored.reference_outputs(x)["logits"])
    check = subprocess.run(
        [str(python), "-I", str(copy / "loader.py")], capture_output=True, text=True, env=env, timeout=120
    )
    assert check.returncode == 0 and "every file verified; runs here" in check.stdout, check.stderr
    flip_one_byte(copy / "model" / "model.onnx")
    proc = subprocess.run(
        [str(python), "-c", script], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120
    )
    assert proc.returncode != 0 and "model/model.onnx does not match its SHA-256" in proc.stderr


def test_cli_verify_and_info_as_json(bundle, capsys):
    code, out, err = run_cli(capsys, "bundle", "verify", str(bundle), "--format", "json")
    assert code == 0, err
    verified = json.loads(out)
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert verified["ok"] is True and verified["files"] == len(manifest["files"]) and verified["runs_here"] is True
    assert verified["size_bytes"] == sum(f["size"] for f in manifest["files"].values())
    code, out, err = run_cli(capsys, "bundle", "info", str(bundle), "--format", "json")
    assert code == 0 and json.loads(out)["manifest"] == manifest, err
