"""Security round 4 (issue 37), part B: ``--data`` images open only as the format their suffix names, and
every ``--format json`` output is strict JSON (no ``Infinity`` or ``NaN``)."""

from __future__ import annotations

import json

import pytest

from tests.cli_runner import run_cli
from tests.models import detector

PIL = pytest.importorskip("PIL.Image")
FAST = ["--engine", "onnxruntime", "--precision", "fp32", "--threads", "1", "--min-samples", "16", "--min-duration", "0.1"]

EPS = b"""%!PS-Adobe-3.0 EPSF-3.0
%%BoundingBox: 0 0 8 8
%%EndComments
(%pipe%touch PWNED) (w) file
showpage
%%EOF
"""


def test_a_postscript_file_named_png_never_reaches_pillows_eps_plugin(here, capsys, monkeypatch):
    # Pillow sniffs the content: an EPS named .png went to EpsImagePlugin, which runs Ghostscript in this process.
    from PIL import EpsImagePlugin

    from tests.test_images import image_model, solid

    reached = []
    real_open = EpsImagePlugin.EpsImageFile._open

    def spy(self):  # type: ignore[no-untyped-def]
        reached.append(self.fp)
        return real_open(self)

    monkeypatch.setattr(EpsImagePlugin.EpsImageFile, "_open", spy)
    monkeypatch.setattr(EpsImagePlugin, "Ghostscript", lambda *a, **k: reached.append("gs"))
    image_model(here / "m.onnx", ["N", 3, 8, 8])
    solid(here / "imgs" / "a.png", (10, 20, 30))
    (here / "imgs" / "b.png").write_bytes(EPS)
    code, _, err = run_cli(capsys, "bench", "m.onnx", "--data", "imgs", *FAST)
    assert code == 2, err
    assert reached == [] and not (here / "PWNED").exists()
    assert "b.png is not a PNG file" in " ".join(err.split()) and len(err.strip().splitlines()) == 1
    # A JPEG named .png is refused too: the suffix names the one format read.
    solid(here / "jpeg" / "c.jpg", (10, 20, 30))
    (here / "jpeg" / "c.jpg").rename(here / "jpeg" / "c.png")
    code, _, err = run_cli(capsys, "bench", "m.onnx", "--data", "jpeg", *FAST)
    assert code == 2 and "not a PNG file" in err


def _strict(text: str):  # type: ignore[no-untyped-def]
    def refuse(constant: str) -> None:
        raise AssertionError(f"non-strict JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def test_json_output_is_strict(here, capsys):
    # An output bit-exact to its reference has SQNR infinity: `--format json` printed `Infinity`.
    detector(here / "d.onnx")
    code, out, err = run_cli(capsys, "bench", "d.onnx", *FAST, "--format", "json")
    assert code == 0, err
    record = _strict(out)
    outputs = record["measurement"]["accuracy"]["outputs"]
    assert outputs[0]["kind"] == "sqnr" and outputs[0]["sqnr_db"] is None
    code, out, err = run_cli(capsys, "results", "list", "--format", "json")
    assert code == 0, err
    (row,) = _strict(out)
    code, out, err = run_cli(capsys, "results", "show", str(row["id"]), "--format", "json")
    assert code == 0, err
    assert _strict(out)["measurement"]["accuracy"]["outputs"][0]["sqnr_db"] is None


def test_the_json_writer_refuses_what_it_cannot_make_strict():
    import numpy as np

    from autodeploy.report import strict, strict_json

    assert strict({"a": [float("inf"), np.float32("nan"), 1.5, 2], "b": (float("-inf"),)}) == {"a": [None, None, 1.5, 2], "b": [None]}
    with pytest.raises(ValueError):
        strict_json({"x": object()}, default=lambda o: float("nan"))  # a number only `default` makes: caught
    assert strict_json({"x": float("nan")}) == '{"x": null}'
