"""``autodeploy inhouse ...`` end to end, in-process (lives here: tests/cli belongs to the CLI's owners)."""

import onnx
import pytest

from autodeploy.cli import _common
from tests.cli_runner import run_cli
from tests.models import mlp


@pytest.fixture(autouse=True)
def wide(monkeypatch, tmp_path):
    monkeypatch.setenv("AUTODEPLOY_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(_common.out, "width", 250)


def run(capsys, *argv):
    return run_cli(capsys, *argv)


def test_optimize_prints_passes_and_memory_plan(capsys, tmp_path):
    model = mlp(tmp_path / "m.onnx")
    out_path = tmp_path / "out.onnx"
    code, out, err = run(capsys, "inhouse", "optimize", str(model), "-o", str(out_path), "--dim", "N=4")
    assert code == 0, err
    assert "matmul-add-to-gemm" in out and "MatMulAddToGemm x1" in out
    assert "peak without reuse" in out and "peak with reuse (arena)" in out and "N=4" in out
    onnx.checker.check_model(onnx.load(str(out_path)))


def test_optimize_with_chosen_passes_and_a_bad_name(capsys, tmp_path):
    model = mlp(tmp_path / "m.onnx")
    code, out, _ = run(capsys, "inhouse", "optimize", str(model), "-o", str(tmp_path / "o.onnx"),
                       "--passes", "eliminate-dead", "--target", "onnxruntime")  # fmt: skip
    assert code == 0 and "matmul-add-to-gemm" not in out
    code, _, err = run(
        capsys, "inhouse", "optimize", str(model), "-o", str(tmp_path / "o.onnx"), "--passes", "nope"
    )
    assert code == 2 and "unknown pass" in err


def test_quantize_and_passes_commands(capsys, tmp_path):
    model = mlp(tmp_path / "m.onnx", in_features=16)
    code, out, err = run(
        capsys, "inhouse", "quantize", str(model), "-o", str(tmp_path / "q.onnx"), "--items", "32"
    )
    assert code == 0, err
    assert "int8 quantization (percentile, asymmetric)" in out and "budget met" in out
    assert any(n.op_type == "QuantizeLinear" for n in onnx.load(str(tmp_path / "q.onnx")).graph.node)
    code, out, _ = run(capsys, "inhouse", "passes")
    assert code == 0 and "fold-batchnorm" in out and "fuse-gelu" in out
