"""Red-team cases: ``--data`` that declares more than it holds is refused before anything is allocated.

A 30000x30000 PNG gave Pillow's ``DecompressionBombError`` traceback; an ``.npy`` whose header
declares 64 TiB gave ``MemoryError``; 100,000 tiny images took 4 GB in the parent. Each hostile
file here is a few hundred bytes: the headers lie, and nothing behind them is ever read.
"""

from __future__ import annotations

import io
import struct
import zipfile
import zlib

import numpy as np
import pytest

from autodeploy import images
from autodeploy.errors import DataError
from tests.cli_runner import run_cli
from tests.models import mlp
from tests.test_images import image_model, solid

PIL = pytest.importorskip("PIL.Image")
#: 2**20 x 2**23 float64: 64 TiB.
HUGE = {"descr": "<f8", "fortran_order": False, "shape": (2**20, 2**23)}


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png_declaring(path, width: int, height: int):
    """A valid PNG header for a ``width`` x ``height`` 1-bit image, with one row of data behind it."""
    ihdr = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)  # 1-bit gray
    idat = zlib.compress(b"\x00" * (1 + (width + 7) // 8))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", idat) + _chunk(b"IEND", b""))
    return path


def npy_declaring(path, header=HUGE):
    with path.open("wb") as fp:
        np.lib.format.write_array_header_1_0(fp, header)  # the header alone: no data behind it
    return path


@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTODEPLOY_DB", f"sqlite:///{tmp_path / 'r.db'}")
    monkeypatch.setenv("AUTODEPLOY_CACHE", str(tmp_path / "cache"))
    return tmp_path


def _refused(capsys, *argv: str) -> str:
    code, out, err = run_cli(capsys, *argv)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, (code, out, err)
    return lines[0]


@pytest.mark.parametrize("size", [(30000, 30000), (9000, 9000)])  # over Pillow's own bomb limit, and under it
def test_an_image_declaring_too_many_pixels_is_refused_by_its_header(env, capsys, size):
    model = image_model(str(env / "m.onnx"), ["N", 3, 8, 8])
    folder = env / "images"
    solid(folder / "a.png", (10, 20, 30))
    bomb = png_declaring(folder / "b.png", *size)
    assert bomb.stat().st_size < 1000
    line = _refused(capsys, "bench", str(model.path), "--data", str(folder))
    assert "b.png has more than 67 million pixels" in line and "fix:" in line


def test_an_npy_declaring_64_tib_is_refused_before_allocation(env, capsys):
    model = mlp(env / "m.onnx")
    bomb = npy_declaring(env / "x.npy")
    assert bomb.stat().st_size < 200
    line = _refused(capsys, "bench", str(model), "--data", str(bomb))
    assert "would take 64 TiB in memory" in line and "fix:" in line
    folder = env / "arrays"
    folder.mkdir()
    npy_declaring(folder / "x.npy")
    assert "would take 64 TiB" in _refused(capsys, "bench", str(model), "--data", str(folder))


@pytest.mark.parametrize("compression", [zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED])
def test_an_npz_member_declaring_64_tib_is_refused_before_allocation(env, capsys, compression):
    model = mlp(env / "m.onnx")
    header = npy_declaring(env / "member.npy").read_bytes()
    with zipfile.ZipFile(env / "bomb.npz", "w", compression) as z:
        z.writestr("x.npy", header)
    assert "would take 64 TiB" in _refused(capsys, "bench", str(model), "--data", str(env / "bomb.npz"))


def test_an_npz_member_that_is_not_an_array_is_not_read(env, capsys):
    model = mlp(env / "m.onnx")
    array = io.BytesIO()
    np.save(array, np.zeros((2, 8), np.float32))
    with zipfile.ZipFile(env / "odd.npz", "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("x.npy", array.getvalue())
        z.writestr("payload.bin", b"\x00" * 1_000_000)  # numpy would read it whole, as bytes
    assert "cannot read input data" in _refused(capsys, "bench", str(model), "--data", str(env / "odd.npz"))


def test_a_folder_with_more_images_than_the_cap_is_refused_before_reading_one(env, monkeypatch, capsys):
    model = image_model(str(env / "m.onnx"), ["N", 3, 8, 8])
    monkeypatch.setattr(images, "MAX_IMAGES", 5)  # the rule, not 10,001 files
    folder = env / "images"
    for i in range(6):
        solid(folder / f"{i}.png", (i, i, i))
    opened = []
    monkeypatch.setattr(images, "_open", lambda pil, file: opened.append(file))
    line = _refused(capsys, "bench", str(model.path), "--data", str(folder))
    assert "holds 6 images; at most 5 are read" in line and "fix:" in line
    assert opened == []


def test_images_that_would_not_fit_in_memory_as_fed_are_refused(env, monkeypatch):
    from autodeploy import data
    from autodeploy.intake import load_data

    model = image_model(str(env / "m.onnx"), ["N", 3, 8, 8])
    for i in range(3):
        solid(env / "images" / f"{i}.png", (i, i, i))
    monkeypatch.setattr(data, "memory_limit", lambda: 3 * 3 * 8 * 8 * 4 - 1)  # one byte short of 3 items
    with pytest.raises(DataError, match="3 images at 8x8 would take"):
        load_data(env / "images", model)
    monkeypatch.setattr(data, "memory_limit", lambda: 3 * 3 * 8 * 8 * 4)
    assert len(load_data(env / "images", model)) == 3


def test_an_honest_npy_still_loads(env):
    from autodeploy.intake import load_data
    from autodeploy.model import load_model

    model = load_model(mlp(env / "m.onnx"))
    np.save(env / "x.npy", np.ones((5, 8), np.float32))
    assert len(load_data(env / "x.npy", model)) == 5
