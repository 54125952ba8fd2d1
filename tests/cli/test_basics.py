"""What every command shares: --version, one exit-code table, install hints, quiet engines, readable help."""

import re
import sys
from pathlib import Path

import pytest
import tomllib

import autodeploy
from tests.cli.test_cli import FAST, env, run  # noqa: F401 - env is a fixture
from tests.models import mlp


def test_version(capsys):
    code, out, _ = run(capsys, "--version")
    assert code == 0 and out.strip() == f"autodeploy {autodeploy.__version__}"
    # the version is pyproject.toml's, not a second copy in the code that can drift from it
    project = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["project"]
    assert autodeploy.__version__ == project["version"]


def _cases(tmp):
    """(argv, exit code) per command: the README's table. 2: bad input, nothing ran; 1: it ran and failed."""
    m = str(tmp / "m.onnx")
    return {
        "bench: missing model file": (["bench", str(tmp / "nope.onnx")], 2),
        "bench: --precision int4": (["bench", m, "--precision", "int4"], 2),
        "bench: bad --format": (["bench", m, "--format", "xml"], 2),
        "bench: a failed trial": (["bench", m, "--timeout", "0.01", *FAST], 1),
        "tune: no model": (["tune"], 2),
        "tune: unknown objective": (["tune", m, "--objective", "fastest"], 2),
        "tune: missing config": (["tune", m, "--config", str(tmp / "nope.yaml")], 2),
        "results show: unknown trial": (["results", "show", "999"], 2),
        "results list: bad --format": (["results", "list", "--format", "xml"], 2),
        "engines: bad --format": (["engines", "--format", "xml"], 2),
        "bundle verify: no bundle": (["bundle", "verify", str(tmp / "nob")], 2),
        "bundle info: no bundle": (["bundle", "info", str(tmp / "nob")], 2),
        "bundle run: no bundle": (["bundle", "run", str(tmp / "nob")], 2),
        "export: nothing to export": (["export"], 2),
        "zoo build: unknown model": (["zoo", "build", "nope"], 2),
        "gate: missing model": (["gate", "--baseline", str(tmp / "nope.onnx"), "--candidate", m, "--no-store"], 64),
    }


CASES = list(_cases(Path("/")))  # the case names; each test builds its own paths


@pytest.mark.parametrize("case", CASES)
def test_exit_code_per_command(env, capsys, case):  # noqa: F811
    tmp_path, _ = env
    mlp(tmp_path / "m.onnx")
    argv, expected = _cases(tmp_path)[case]
    code, out, err = run(capsys, *argv)
    assert code == expected, out + err
    assert "Traceback" not in out + err


def test_a_missing_extra_is_one_line_with_the_install_command(env, capsys, monkeypatch):  # noqa: F811
    monkeypatch.setitem(sys.modules, "sklearn", None)  # import sklearn -> ModuleNotFoundError, as if not installed
    code, out, err = run(capsys, "bench", "zoo:digits")
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "Traceback" not in out + err, err
    assert "sklearn is not installed" in lines[0] and "pip install 'autodeploy[zoo]'" in lines[0]


def test_a_module_outside_every_extra_is_a_bug_and_keeps_its_traceback(monkeypatch):
    from autodeploy.adapters import registry
    from autodeploy.cli import app

    assert registry.missing_extra(ModuleNotFoundError("no", name="numpy")) is None

    def broken(*_a, **_k):
        raise ModuleNotFoundError("No module named 'not_ours'", name="not_ours")

    monkeypatch.setattr(app.engines, "probe_device", broken)
    with pytest.raises(ModuleNotFoundError):
        app.main(["engines"])


COMMANDS = [[], ["bench"], ["tune"], ["results", "list"], ["results", "show"], ["results", "studies"], ["engines"],
            ["bundle", "verify"], ["bundle", "info"], ["bundle", "run"], ["gate"], ["export"], ["zoo", "build"],
            ["inhouse", "optimize"], ["dashboard"]]  # fmt: skip


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_help_metavars_say_what_to_type(capsys, monkeypatch, command):
    monkeypatch.setenv("COLUMNS", "200")
    code, out, _ = run(capsys, *command, "--help")
    assert code == 0 and "Usage:" in out
    assert not re.search(r"<(bool|str|int|float|path|list\[\w+\])>", out), out


def test_tune_help_points_at_examples_that_exist(capsys, monkeypatch):
    from autodeploy.search.config import EXAMPLES

    monkeypatch.setenv("COLUMNS", "400")
    code, out, _ = run(capsys, "tune", "--help")
    assert code == 0 and str(EXAMPLES) in out and (EXAMPLES / "latency-mobilenetv2.yaml").is_file()


def test_engine_noise_is_hidden_unless_verbose(capfd):
    import os

    from autodeploy.cli import _common

    def noisy():
        with _common.engine_noise():
            os.write(2, b"INFO: Created TensorFlow Lite XNNPACK delegate for CPU.\n")

    _common.quiet_engines(True)
    noisy()
    assert "INFO:" not in capfd.readouterr().err
    _common.quiet_engines(False)
    try:
        noisy()
        assert "INFO: Created" in capfd.readouterr().err
    finally:
        _common.quiet_engines(True)


def test_bench_on_an_engine_that_cannot_run_here_is_a_setup_error_and_stores_nothing(env, capsys):  # noqa: F811
    """Issue 52 item 9: it stored a failed trial and exited 1; a setup problem is 2, in one line, as tune skips it."""
    from autodeploy.adapters import registry
    from autodeploy.device import probe_device

    device = probe_device()
    absent = [e for e in registry.all_engines() if not e.probe(device).available]
    if not absent:
        pytest.skip("every engine runs on this machine")
    tmp_path, _ = env
    mlp(tmp_path / "m.onnx")
    code, out, err = run(capsys, "bench", str(tmp_path / "m.onnx"), "--engine", absent[0].name, *FAST)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "Traceback" not in out + err, err
    assert f"{absent[0].name} cannot run on this machine: {absent[0].probe(device).reason}" in lines[0]
    assert "fix: " in lines[0]
    code, out, err = run(capsys, "results", "list", "--format", "json")
    assert code == 2 and "the file does not exist" in err, err  # nothing stored: not even the store was made
