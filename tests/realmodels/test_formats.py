"""Real models in the formats users have besides ONNX, run as given (``autodeploy.formats``).

basic-pitch's wheel ships ``nmp.tflite`` beside ``nmp.onnx``: the ``.tflite`` is benched on LiteRT
against its own fp32 reference, on basic-pitch's audio windows given as ``--data`` by input name, and
shipped as a bundle holding the file unchanged. OpenVINO reads the same ``.tflite`` with its own
frontend (issue 39): fp32 and bf16 are judged against LiteRT fp32, the file as given, and a study over
both engines names LiteRT as its baseline. ONNX Runtime runs the ONNX tf2onnx makes of it, judged against
LiteRT too, so a conversion that changes the outputs fails as one. An OpenVINO IR is written in the test
from the wheel's ``nmp.onnx`` (``openvino.save_model(openvino.convert_model(...))``) and benched on
OpenVINO. Every engine that cannot read a format is left out with its one-line reason.
"""

from __future__ import annotations

import zipfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import autodeploy
from autodeploy import sealed
from autodeploy.adapters import registry
from autodeploy.bundle import load as load_bundle
from autodeploy.cli import tune as tune_cli
from autodeploy.device import probe_device
from autodeploy.errors import UnsupportedConfigError
from autodeploy.harness.timing import TimingPolicy
from autodeploy.model import load_model
from autodeploy.report import study_record
from autodeploy.results_db.records import StoredTrial
from autodeploy.search.config import validate
from autodeploy.search.space import build_space
from tests.cli.test_cli import run
from tests.realmodels.corpus import WHEELS, pitch_windows

pytestmark = pytest.mark.slow

QUICK = TimingPolicy(
    warmup_min_calls=2, warmup_max_s=1.0, min_samples=10, min_duration_s=0.3, max_duration_s=2.0
)
MEMBER = "basic_pitch/saved_models/icassp_2022/nmp"
INPUT = "serving_default_input_2:0"  # the same tensor name in nmp.onnx, nmp.tflite and its IR
OUTPUTS = ("StatefulPartitionedCall:2", "StatefulPartitionedCall:1", "StatefulPartitionedCall:0")
LITERT = "LiteRT fp32, the file as given"
#: Two finalists and the baseline, one short round each (a call takes 30-90 ms here).
QUICK_FINALISTS = {"finalists": {"count": 2, "rounds": 1, "min_samples": 8, "min_duration_s": 0.2}}


@pytest.fixture(scope="module")
def pitch(tmp_path_factory) -> dict[str, Path]:
    """nmp.tflite and nmp.onnx from the basic-pitch wheel, an IR of nmp.onnx, and 8 audio windows (.npz)."""
    found = sorted(WHEELS.glob("basic_pitch-0.4.0-*.whl"))
    if not found:
        pytest.skip(f"wheel basic_pitch-0.4.0-*.whl not in {WHEELS} (.ci/run fetches it with pip download)")
    folder = tmp_path_factory.mktemp("formats")
    with zipfile.ZipFile(found[-1]) as wheel:
        for suffix in (".tflite", ".onnx"):
            (folder / f"nmp{suffix}").write_bytes(wheel.read(MEMBER + suffix))
    ov = pytest.importorskip("openvino")
    (folder / "ir").mkdir()
    ov.save_model(ov.convert_model(str(folder / "nmp.onnx")), str(folder / "ir" / "nmp.xml"))
    np.savez(folder / "windows.npz", **pitch_windows(8))
    return {"tflite": folder / "nmp.tflite", "xml": folder / "ir" / "nmp.xml", "data": folder / "windows.npz",
            "onnx": folder / "nmp.onnx"}  # fmt: skip


def _bench(model: Path, tmp_path: Path, **kwargs) -> StoredTrial:
    return autodeploy.bench(model, data=kwargs.pop("data", None), timing=QUICK, timeout_s=300.0,
                            db=f"sqlite:///{tmp_path / 'results.db'}", cache=tmp_path / "cache", **kwargs)  # fmt: skip


@pytest.mark.parametrize("kind, engine", [("tflite", "tflite"), ("xml", "openvino")])
def test_interface_is_read_by_the_engine_that_runs_the_file(pitch, kind, engine):
    model = load_model(pitch[kind])
    assert model.format == registry.baseline_config(model.format).engine == engine
    assert [(s.name, s.dtype, s.shape) for s in model.inputs] == [(INPUT, "float32", (None, 43844, 1))]
    assert model.output_names == OUTPUTS  # in the order the ONNX model lists them
    assert model.external_files == (("nmp.bin",) if kind == "xml" else ())
    assert model.sha256 != load_model(pitch["onnx"]).sha256


def test_tflite_is_benched_on_litert_with_its_own_reference_and_real_audio(pitch, tmp_path):
    stored = _bench(pitch["tflite"], tmp_path, data=pitch["data"])
    result = stored.result
    assert result.ok, result.failure_message
    assert result.config.engine == "tflite" and result.config.precision == "fp32"
    assert result.latency is not None and result.latency.n > 0  # how many: max_duration_s decides
    assert (
        result.accuracy is not None and result.accuracy.n_samples == 8
    )  # the 8 windows given, not synthetic
    assert "inputs" not in result.extra
    # Its reference is the same file on LiteRT: the measured outputs are the reference's, to rounding.
    assert all(o.cosine > 0.9999 for o in result.accuracy.outputs)
    # The engines that read ONNX take it through tf2onnx (the [tflite] extra, installed with LiteRT here).
    assert not {"onnxruntime", "inhouse", "tensorrt"} & set(registry.unreadable(stored.model))
    with pytest.raises(
        UnsupportedConfigError, match="tflite cannot run precision 'int8'.*needs a conversion from ONNX"
    ):
        _bench(pitch["tflite"], tmp_path, engine="tflite", precision="int8")

    # Shipped as measured: the bundle holds the user's file byte for byte, and its loader runs it.
    bundle = autodeploy.export(
        trial=stored.id, output=tmp_path / "ship", db=f"sqlite:///{tmp_path / 'results.db'}"
    )
    assert (bundle / "model" / "model.tflite").read_bytes() == pitch["tflite"].read_bytes()
    outputs = load_bundle(bundle).run({INPUT: np.load(pitch["data"])[INPUT][:1]})
    assert tuple(outputs) == OUTPUTS and outputs[OUTPUTS[2]].shape == (1, 172, 264)
    # The gate takes the shipped file as its own source: its reference is LiteRT fp32, not ONNX Runtime.
    from autodeploy.gate.measure import bundle_arm

    arm = bundle_arm("candidate", str(bundle), bundle, reference_model=None)
    assert arm.reference_model is not None and arm.reference_model.sha256 == stored.model.sha256
    assert arm.reference_model.format == arm.model.format == "tflite" and arm.model.path.name == "model.tflite"
    assert registry.baseline_config(arm.reference_model.format).engine == "tflite"


def test_tflite_is_benched_on_onnx_runtime_through_tf2onnx_against_litert(pitch, tmp_path):
    """tf2onnx's ONNX on ONNX Runtime, judged against LiteRT fp32 on the file as given, the conversion recorded
    with its version and shipped; an ONNX that computes something else fails its fp32 as a broken conversion."""
    import json

    from autodeploy import tflite_onnx

    stored = _bench(pitch["tflite"], tmp_path, data=pitch["data"], engine="onnxruntime")
    result = stored.result
    assert result.ok, result.failure_message
    assert result.accuracy is not None and result.accuracy.n_samples == 8  # the audio windows given
    assert all(o.cosine > 0.9999 for o in result.accuracy.outputs)  # tf2onnx's ONNX computes what LiteRT does
    source = result.extra["source"]
    assert (source["converter"], source["tf2onnx"]) == ("tf2onnx.convert.from_tflite", tflite_onnx.version())
    assert source["sha256"] == stored.model.sha256 and stored.model.format == "tflite"  # the model is the file
    bundle = autodeploy.export(trial=stored.id, output=tmp_path / "ship", db=f"sqlite:///{tmp_path / 'results.db'}")
    meta = json.loads((bundle / "model" / "artifact.json").read_text())["meta"]
    assert meta["source"]["tf2onnx"] == tflite_onnx.version() and (bundle / "model" / "model.onnx").is_file()
    outputs = load_bundle(bundle).run({INPUT: np.load(pitch["data"])[INPUT][:1]})
    assert tuple(sorted(outputs)) == tuple(sorted(OUTPUTS)) and outputs[OUTPUTS[2]].shape == (1, 172, 264)

    # A conversion that changes an output (the cached ONNX doubled at one output): LiteRT's reference catches it.
    import hashlib

    import onnx
    from onnx import helper

    (cached,) = (tmp_path / "cache").glob("**/tf2onnx/*/model.onnx")
    proto = onnx.load(str(cached))
    out = proto.graph.output[0].name
    for node in proto.graph.node:
        node.output[:] = [f"{o}_raw" if o == out else o for o in node.output]
    proto.graph.initializer.append(helper.make_tensor("two", onnx.TensorProto.FLOAT, [], [2.0]))
    proto.graph.node.append(helper.make_node("Mul", [f"{out}_raw", "two"], [out]))
    onnx.save(proto, str(cached))
    # Its record resealed, as anyone who writes the cache can (else it is discarded and converted again).
    record = {**tflite_onnx._bound(source["sha256"]), "model_sha256": hashlib.sha256(cached.read_bytes()).hexdigest()}  # fmt: skip
    sealed.seal(cached.parent / "convert.json", record)
    broken = _bench(pitch["tflite"], tmp_path, data=pitch["data"], engine="onnxruntime").result
    assert broken.failure_kind == "conversion", broken.failure_message
    assert out in broken.failure_message


def test_openvino_ir_is_benched_on_openvino_and_shipped_unchanged(pitch, tmp_path):
    stored = _bench(pitch["xml"], tmp_path, data=pitch["data"])
    assert stored.result.ok, stored.result.failure_message
    assert stored.config.engine == "openvino"
    assert stored.result.latency is not None and stored.result.accuracy is not None
    assert set(registry.unreadable(stored.model)) == set(registry.targets()) - {"openvino"}
    with pytest.raises(
        UnsupportedConfigError, match="openvino cannot run precision 'int8'.*OpenVINO IR, run as given"
    ):
        _bench(pitch["xml"], tmp_path, precision="int8")
    bundle = autodeploy.export(
        trial=stored.id, output=tmp_path / "ship", db=f"sqlite:///{tmp_path / 'results.db'}"
    )
    for name in ("nmp.xml", "nmp.bin"):
        assert (bundle / "model" / name).read_bytes() == (pitch["xml"].parent / name).read_bytes()
    outputs = load_bundle(bundle).run({INPUT: np.load(pitch["data"])[INPUT][:1]})
    assert tuple(outputs) == OUTPUTS


def test_tune_searches_the_engines_that_read_the_file(pitch):
    model = load_model(pitch["tflite"])
    space = build_space(validate({"model": str(pitch["tflite"])}, {}), probe_device(), model)
    assert {"tflite", "openvino", "onnxruntime", "inhouse"} <= set(space.engines)  # the last two through tf2onnx
    assert space.engines["tflite"].precisions == ("fp32",)
    assert {"fp32", "int8"} <= set(space.engines["openvino"].precisions)  # NNCF quantizes the ov.Model read
    assert {"fp32", "int8"} <= set(space.engines["onnxruntime"].precisions)  # ORT quantizes tf2onnx's ONNX
    assert registry.baseline_config(model.format) == replace(registry.BASELINE_CONFIG, engine="tflite")
    assert registry.baseline_name(model.format) == LITERT


def _openvino_bf16(pitch) -> str | None:
    """Why OpenVINO bf16 cannot run here (the engine's own reason), or None."""
    model = load_model(pitch["tflite"])
    return registry.get("openvino").space(probe_device(), model).unsupported.get("bf16")


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_tflite_is_benched_on_openvino_against_litert(pitch, tmp_path, precision):
    """OpenVINO reads the .tflite itself (no ONNX); LiteRT fp32 on the same file is the reference. fp32 matches
    it to rounding; bf16 runs and is judged (on this model its note onsets move: it may be inaccurate)."""
    if precision == "bf16" and (why := _openvino_bf16(pitch)):
        pytest.skip(f"OpenVINO bf16 cannot run on this CPU: {why}")
    stored = _bench(pitch["tflite"], tmp_path, data=pitch["data"], engine="openvino", precision=precision)
    result = stored.result
    assert result.config.engine == "openvino" and result.config.precision == precision
    assert result.failure_kind in (None, "inaccurate"), result.failure_message
    assert result.latency is not None and result.latency.n > 0
    assert result.accuracy is not None and result.accuracy.n_samples == 8  # the audio windows given
    assert [o.name for o in result.accuracy.outputs] == list(OUTPUTS)
    assert result.extra["compiled"]["INFERENCE_PRECISION_HINT"] == precision.replace("fp", "f")  # what ran
    if precision == "fp32":
        assert result.ok and all(o.cosine > 0.9999 for o in result.accuracy.outputs)
    else:
        assert all(o.cosine > 0.95 for o in result.accuracy.outputs)  # bf16 rounding, not a broken conversion
    assert LITERT in stored.model.notes[0]


def test_tune_on_the_tflite_names_litert_as_its_baseline(pitch, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("AUTODEPLOY_CACHE", str(tmp_path / "cache"))
    db = f"sqlite:///{tmp_path / 'r.db'}"
    summary = autodeploy.tune(
        str(pitch["tflite"]), name="pitch", engines=["tflite", "openvino"], precisions=["fp32"], threads=[1],
        knobs={"openvino": {}}, trials=2, min_samples=8, min_duration_s=0.1, config=QUICK_FINALISTS,
        data=pitch["data"], db=db, cache=tmp_path / "cache",
    )  # fmt: skip
    assert summary.winner is not None, summary.note
    assert {f.config.engine for f in summary.finalists if not f.baseline} == {"tflite", "openvino"}
    base = [f for f in summary.finalists if f.baseline]
    assert [f.config for f in base] == [registry.baseline_config("tflite")], [f.label for f in summary.finalists]
    assert summary.baseline_name == LITERT == study_record(summary)["baseline"]
    line = summary.headline()
    assert f"for {LITERT}: " in line or f"the baseline itself ({LITERT})" in line, line
    assert "ORT" not in line and "ONNX Runtime" not in line

    tune_cli._print_summary(summary, "pitch")
    shown = capsys.readouterr().out
    assert f"baseline ({LITERT})" in shown and "ORT" not in shown, shown
    code, out, err = run(capsys, "results", "studies", "--db", db)
    assert code == 0, err
    assert "speedup vs baseline" in out and "ORT" not in out
