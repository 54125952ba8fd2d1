"""Red-team cases: text from a model's file name never drives the terminal or a spreadsheet.

A file named with ``ESC[2J`` cleared the screen, ``[link=...]`` became an OSC-8 hyperlink (Rich
markup) and U+202E (right-to-left override) reversed what followed, all through the title of
``bench``'s table; ``--format csv`` wrote the ESC raw. The consoles are forced to act as a
colour terminal here, since Rich renders neither styles nor links into a pipe.
"""

from __future__ import annotations

import csv
import io

import pytest
from rich.color import ColorSystem

from autodeploy.cli import _common
from tests.cli_runner import run_cli
from tests.models import mlp

#: Clears the screen, opens a hyperlink, reverses the rest; a path cannot hold "/", so no "[/link]".
HOSTILE = "\x1b[2J[link=https:x]evil\u202ecod.exe"
FAST = ["--threads", "1", "--min-samples", "64", "--min-duration", "0.1"]
RAW = ("\x1b[2J", "\x1b]8;", "\u202e")  # the screen clear, an OSC-8 hyperlink, the override


@pytest.fixture
def terminal(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTODEPLOY_DB", f"sqlite:///{tmp_path / 'r.db'}")
    monkeypatch.setenv("AUTODEPLOY_CACHE", str(tmp_path / "cache"))
    for console in (_common.out, _common.err):
        monkeypatch.setattr(console, "_force_terminal", True)
        monkeypatch.setattr(console, "_color_system", ColorSystem.TRUECOLOR)
        monkeypatch.setattr(console, "width", 400)
    return mlp(tmp_path / f"{HOSTILE}.onnx")


def test_a_hostile_model_file_name_is_shown_not_obeyed_in_the_table(terminal, capsys):
    code, out, err = run_cli(capsys, "bench", str(terminal), *FAST)
    assert code == 0, err
    for raw in RAW:
        assert raw not in out + err, f"{raw!r} reached the terminal"
    assert "\\x1b[2J[link=https:x]evil\\u202ecod.exe" in out  # made visible, markup shown as typed


def test_a_hostile_model_file_name_is_plain_text_in_csv(terminal, capsys):
    code, out, err = run_cli(capsys, "bench", str(terminal), *FAST, "--format", "csv")
    assert code == 0, err
    assert "\x1b" not in out and "\u202e" not in out
    (row,) = csv.DictReader(io.StringIO(out))
    assert row["model.name"] == "\\x1b[2J[link=https:x]evil\\u202ecod.exe"


@pytest.mark.parametrize(("cell", "written"), [
    ("=HYPERLINK(\"http://x\")", "'=HYPERLINK(\"http://x\")"), ("+1+cmd|' /C calc'!A0", "'+1+cmd|' /C calc'!A0"),
    ("@SUM(A1)", "'@SUM(A1)"), ("-2+3", "'-2+3"), ("-1.5", "-1.5"), ("-", "-"), ("a\tb\r", "a\\tb\\r"), (3, 3),
])  # fmt: skip
def test_csv_cells_cannot_be_formulas_or_control_characters(cell, written):
    assert _common.csv_cell(cell) == written


def test_every_control_and_bidi_character_is_made_visible():
    bad = [chr(c) for c in (*range(0x20), *range(0x7F, 0xA0), 0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F),
                            *range(0x2066, 0x206A))]  # fmt: skip
    text = _common.shown("".join(bad))
    assert not any(c in text for c in bad)
    assert "\\x1b" in text and "\\u202e" in text and "\\u2069" in text
    assert _common.shown("[bold]é ü 中[/bold]") == "\\[bold]é ü 中\\[/bold]"  # markup escaped, other text kept
