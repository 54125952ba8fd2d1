"""Red-team cases against bundles: no bundle code runs before the bundle is verified, and the
manifest cannot point outside the bundle. Each case is one an attacker tried (issue: ship exactly
what was measured)."""

import json
import subprocess
import sys
import tarfile

import pytest

import autodeploy.bundle
from autodeploy.bundle import BundleError, loader
from autodeploy.bundle.archive import UnsafeArchiveError, safe_extract
from autodeploy.device import probe_device


def _rewrite_manifest(root, change):
    """Change the manifest and its digest consistently, as an attacker with write access can."""
    manifest = json.loads((root / "manifest.json").read_text())
    change(manifest)
    data = (json.dumps(manifest, indent=2) + "\n").encode()
    (root / "manifest.json").write_bytes(data)
    (root / "manifest.sha256").write_text(loader.digest_line(data))


def test_planted_bytecode_for_the_loader_is_refused(bundle):
    cache = bundle / "__pycache__"
    cache.mkdir()
    (cache / f"loader.cpython-{sys.version_info.major}{sys.version_info.minor}.pyc").write_bytes(b"\x00" * 64)
    with pytest.raises(BundleError, match="__pycache__/loader.cpython-.*is not listed in the manifest"):
        loader.verify(bundle)


def test_planted_module_next_to_the_loader_never_runs(bundle, tmp_path):
    marker = tmp_path / "pwned"
    (bundle / "platform.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\nfrom os import *\n")
    proc = subprocess.run([sys.executable, "-I", str(bundle / "loader.py")], capture_output=True, text=True,
                          cwd=tmp_path, timeout=120)  # fmt: skip
    assert proc.returncode != 0 and "platform.py is not listed in the manifest" in proc.stderr
    assert not marker.exists(), "a file planted in the bundle ran"


@pytest.mark.parametrize("value", ["/etc/passwd", "../../etc/passwd", "../model/model.onnx", "unlisted.onnx"])
def test_runtime_model_file_outside_the_listed_artifact_is_refused(bundle, value):
    _rewrite_manifest(bundle, lambda m: m["runtime"].update(model_file=value))
    with pytest.raises(BundleError, match="runtime.model_file .* is not a file of model/ listed in the manifest"):
        autodeploy.bundle.load(bundle)


def test_shipped_runtime_changed_after_verification_is_not_run(bundle, tmp_path):
    """The shipped loader executes runtime files from bytes it checks against the manifest."""
    manifest = loader.verify(bundle)
    (bundle / "runtime" / "onnxruntime.py").write_text("raise SystemExit('substituted runtime ran')\n")
    script = (
        "import runpy, json, sys\n"
        f"ns = runpy.run_path({str(bundle / 'loader.py')!r})\n"
        f"manifest = json.loads({json.dumps(json.dumps(manifest))})\n"
        "try:\n"
        "    ns['_runtime']('onnxruntime', manifest)\n"
        "except ns['BundleError'] as exc:\n"
        "    print('refused:', exc)\n"
    )
    proc = subprocess.run([sys.executable, "-I", "-c", script], capture_output=True, text=True, timeout=120)
    assert "refused:" in proc.stdout and "runtime/onnxruntime.py does not match its SHA-256" in proc.stdout, proc.stderr


def test_archive_member_with_a_negative_size_is_refused(tmp_path):
    info = tarfile.TarInfo("bundle/manifest.json")
    info.size = -(1 << 40)
    with tarfile.open(tmp_path / "b.tar.gz", "w:gz", format=tarfile.GNU_FORMAT) as tar:
        tar.addfile(info)
    with pytest.raises(UnsafeArchiveError, match="declares a negative size"):
        safe_extract(tmp_path / "b.tar.gz", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def _external_data_model(folder):
    """A MatMul whose weights live in ``w.bin`` next to the model; loaded (taken in) here."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from autodeploy.model import load_model

    weights = numpy_helper.from_array(np.ones((4, 4), np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])], [weights])  # fmt: skip
    folder.mkdir()
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(proto, str(folder / "m.onnx"), save_as_external_data=True, location="w.bin", size_threshold=0)
    model = load_model(folder / "m.onnx")
    assert model.external_files == ("w.bin",)
    return model


def test_external_data_swapped_for_a_link_after_intake_never_reaches_the_artifact(tmp_path):
    from autodeploy.adapters import registry
    from autodeploy.adapters.base import TrialConfig
    from autodeploy.errors import ModelError

    model = _external_data_model(tmp_path / "model")
    secret = tmp_path / "secret.bin"
    secret.write_bytes((tmp_path / "model" / "w.bin").read_bytes())  # same bytes: only the link gives it away
    (tmp_path / "model" / "w.bin").unlink()
    (tmp_path / "model" / "w.bin").symlink_to(secret)
    with pytest.raises(ModelError, match="w.bin: .*not links|cannot read"):
        registry.get("onnxruntime").build(
            model, TrialConfig("onnxruntime"), None, tmp_path / "artifacts", target=probe_device()
        )
    assert not list((tmp_path / "artifacts").glob("*/w.bin"))


def test_every_engine_builds_from_the_bytes_taken_in_at_intake(tmp_path):
    """Weights changed between intake and build: the worker refuses to build from them, for any engine."""
    from autodeploy.adapters.base import TrialConfig
    from autodeploy.harness.run import HarnessSettings, prepare_data, reference, run_trial

    model = _external_data_model(tmp_path / "model")
    settings = HarnessSettings(workdir=tmp_path / "work", timeout_s=60)
    data = prepare_data(model, settings)
    reference(model, data, settings)  # judged on the original weights
    weights = tmp_path / "model" / "w.bin"
    weights.write_bytes(bytes(len(weights.read_bytes())))  # same size, other values
    result = run_trial(model, TrialConfig("openvino" if _has("openvino") else "onnxruntime"), data, settings)
    assert not result.ok and result.failure_kind == "build_failed"
    assert "changed since it was taken in" in result.failure_message


def _has(module):
    import importlib.util

    return importlib.util.find_spec(module) is not None


@pytest.mark.parametrize("name", ["../../outside.txt", "/etc/passwd", ""])
def test_artifact_json_cannot_list_files_outside_its_folder(stored, tmp_path, name):
    import shutil

    from autodeploy.adapters.base import ARTIFACT_FILE, Artifact
    from autodeploy.errors import BuildError

    copy = shutil.copytree(stored.artifact.path, tmp_path / "artifact")
    data = json.loads((copy / ARTIFACT_FILE).read_text())
    data["files"].append(name)
    (copy / ARTIFACT_FILE).write_text(json.dumps(data))
    with pytest.raises(BuildError, match="outside the artifact folder"):
        Artifact.read(copy)


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    """Two elliptic-curve key pairs (PEM): the publisher's and someone else's."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    folder = tmp_path_factory.mktemp("keys")
    paths = {}
    for who in ("publisher", "other"):
        key = ec.generate_private_key(ec.SECP256R1())
        (folder / f"{who}.pem").write_bytes(key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
        (folder / f"{who}.pub").write_bytes(key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))  # fmt: skip
        paths[who] = (folder / f"{who}.pem", folder / f"{who}.pub")
    return paths


@pytest.fixture
def signed(stored, keys, tmp_path):
    from autodeploy.bundle import export

    return export.write_bundle(stored.source(), tmp_path / "signed", sign_key=keys["publisher"][0])


def test_a_signed_bundle_loads_with_its_publishers_key(signed, keys, stored):
    from tests.bundle.conftest import feeds

    assert (signed / loader.SIGNATURE).is_file()
    loader.verify(signed)  # the signature file is the one file the manifest cannot list
    with autodeploy.bundle.load(signed, trust=keys["publisher"][1]) as predictor:
        got = predictor.run(feeds())
    assert (got["logits"] == stored.reference_outputs(feeds())["logits"]).all()


def test_a_substituted_model_with_a_consistent_manifest_passes_integrity_but_not_trust(signed, keys):
    """The red-team case: swap model.onnx, rewrite manifest.json and manifest.sha256 to match."""
    import hashlib

    model = signed / "model" / "model.onnx"
    model.write_bytes(model.read_bytes() + b"\x00")  # any other model; trailing bytes keep it loadable

    def relist(m):
        m["files"]["model/model.onnx"] = {"sha256": hashlib.sha256(model.read_bytes()).hexdigest(),
                                          "size": model.stat().st_size}  # fmt: skip

    _rewrite_manifest(signed, relist)
    loader.verify(signed)  # integrity only: consistent, so it passes; this is why --trust exists
    with pytest.raises(BundleError, match="signature does not verify .*model/model.onnx"):
        loader.verify(signed, trust=keys["publisher"][1])
    with pytest.raises(BundleError, match="signature does not verify"):
        autodeploy.bundle.load(signed, trust=keys["publisher"][1])


def test_another_key_or_no_signature_is_refused(signed, bundle, keys):
    with pytest.raises(BundleError, match="signature does not verify"):
        loader.verify(signed, trust=keys["other"][1])
    with pytest.raises(BundleError, match="is not signed"):
        loader.verify(bundle, trust=keys["publisher"][1])


def test_a_file_added_to_a_signed_bundle_is_refused(signed, keys):
    (signed / "model" / "extra.bin").write_bytes(b"payload")
    with pytest.raises(BundleError, match="signature does not verify|not listed"):
        loader.verify(signed, trust=keys["publisher"][1])


def test_cli_verify_says_integrity_only_without_a_key_and_checks_the_signature_with_one(signed, keys, capsys):
    from tests.cli.test_cli import run as run_cli

    code, out, err = run_cli(capsys, "bundle", "verify", str(signed))
    assert code == 0 and "integrity only" in out, err
    code, out, err = run_cli(capsys, "bundle", "verify", str(signed), "--trust", str(keys["publisher"][1]))
    assert code == 0 and "signature over every file verifies" in out, err
    code, out, err = run_cli(capsys, "bundle", "verify", str(signed), "--trust", str(keys["other"][1]))
    assert code != 0 and "signature does not verify" in err and len(err.strip().splitlines()) == 1


def _bench(tmp_path, db):
    import autodeploy
    from autodeploy.harness.timing import TimingPolicy
    from tests.models import mlp

    policy = TimingPolicy(warmup_min_calls=2, warmup_max_s=0.2, min_samples=10, min_duration_s=0.05, max_duration_s=2)
    benched = autodeploy.bench(str(mlp(tmp_path / "m.onnx")), timing=policy, db=db, cache=tmp_path / "cache")
    assert benched.ok, benched.result.failure_message
    return benched


def test_an_artifact_replaced_after_its_measurement_is_not_exported(tmp_path):
    from pathlib import Path

    import autodeploy

    db = f"sqlite:///{tmp_path / 'r.db'}"
    benched = _bench(tmp_path, db)
    assert set(benched.result.artifact_files) == {"artifact.json", "model.onnx"}
    model = Path(benched.result.artifact_path) / "model.onnx"
    model.write_bytes(model.read_bytes() + b"\x00")  # the substitute: still a loadable model
    with pytest.raises(BundleError, match="model.onnx of trial .* is not the one that was measured"):
        autodeploy.export(trial=benched.id, output=tmp_path / "ship", db=db)
    assert not (tmp_path / "ship").exists()


def test_a_damaged_cached_artifact_is_rebuilt_not_reused(stored, tmp_path):
    from autodeploy.adapters import registry

    work = tmp_path / "artifacts"
    engine = registry.get("onnxruntime")
    first = engine.build(stored.model, stored.config, None, work, target=probe_device())
    (first.path / "model.onnx").write_bytes(b"not the built model")
    again = engine.build(stored.model, stored.config, None, work, target=probe_device())
    assert again.path == first.path and not again.changed()
    assert (again.path / "model.onnx").read_bytes() == stored.model.path.read_bytes()
    assert not [p for p in work.iterdir() if p.name.startswith(".")], "no stale folder is left behind"


def test_bundle_verify_with_the_store_names_the_trial_it_came_from(tmp_path, capsys):
    import autodeploy
    from tests.cli.test_cli import run as run_cli

    db = f"sqlite:///{tmp_path / 'r.db'}"
    benched = _bench(tmp_path, db)
    path = autodeploy.export(trial=benched.id, output=tmp_path / "ship", db=db)
    code, out, err = run_cli(capsys, "bundle", "verify", str(path), "--db", db)
    assert code == 0 and f"exported from trial {benched.id} " in out, err
    _rewrite_manifest(path, lambda m: m["settings"].update(threads=7))  # consistent, but not what was exported
    code, out, err = run_cli(capsys, "bundle", "verify", str(path), "--db", db)
    assert code == 2 and "no export with this manifest" in err and len(err.strip().splitlines()) == 1, out
