"""Issue 52 item 6: a PyTorch file that is not a ``.pt2`` is refused in one line naming what it is and the routes
that work (a ``.pt2``, the ``nn.Module`` in Python, ONNX from TorchScript), never "re-export with onnx.save".
Real files: silero-vad's TorchScript archive as its wheel ships it, and MTCNN O-Net's trained weights saved by
``torch.save`` as a checkpoint is (nothing in them is ever unpickled: the zip's directory is all that is read)."""

from __future__ import annotations

import zipfile

import pytest

from tests.cli_runner import run_cli
from tests.realmodels.corpus import MODELS, WHEELS

pytestmark = pytest.mark.slow


def _one_line(capsys, path) -> str:
    code, out, err = run_cli(capsys, "bench", str(path))
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "Traceback" not in out + err, err
    assert "onnx.save" not in lines[0]  # the old fix, which pointed nowhere for a PyTorch user
    return lines[0]


def test_a_torchscript_archive_is_named_and_told_the_onnx_route(capsys, tmp_path):
    found = sorted(WHEELS.glob("silero_vad-*.whl"))
    if not found:
        pytest.skip(f"wheel silero_vad-*.whl not in {WHEELS} (.ci/run fetches it with pip download)")
    path = tmp_path / "silero_vad.jit"
    with zipfile.ZipFile(found[-1]) as wheel:
        path.write_bytes(wheel.read("silero_vad/data/silero_vad.jit"))
    line = _one_line(capsys, path)
    assert "is a TorchScript archive (torch.jit.save)" in line and "never loads" in line
    assert "torch.onnx.export(torch.jit.load(PATH)" in line


@pytest.mark.parametrize("suffix", [".pt", ".pth", ".bin"])
def test_a_torch_save_checkpoint_is_named_and_told_the_pt2_and_module_routes(capsys, tmp_path, corpus_dir, suffix):
    torch = pytest.importorskip("torch")
    onnx = pytest.importorskip("onnx")
    real = next(m for m in MODELS if m.name == "mtcnn-onet")
    model = real.extract(corpus_dir)
    if isinstance(model, str):
        pytest.skip(model)
    weights = {t.name: torch.from_numpy(onnx.numpy_helper.to_array(t).copy())
               for t in onnx.load(str(model)).graph.initializer}  # fmt: skip
    path = tmp_path / f"onet{suffix}"
    torch.save(weights, path)  # a state dict, as a training script saves one
    line = _one_line(capsys, path)
    assert "is a PyTorch checkpoint (torch.save)" in line
    assert "autodeploy.tune(module, example_inputs=(x,))" in line and "'model.pt2'" in line
