"""No child autodeploy starts imports code from the folder the user runs it in (issue 28, case 1)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

import autodeploy
from autodeploy.child import code_argv, module_argv
from autodeploy.cli.dashboard import server_argv
from autodeploy.harness.timing import TimingPolicy

FAST = TimingPolicy(warmup_min_calls=2, warmup_max_s=0.2, min_samples=10, min_duration_s=0.05, max_duration_s=2)
SRC = Path(autodeploy.__file__).parent


def _hostile(folder: Path) -> Path:
    """A working folder whose ``platform.py`` and ``autodeploy/`` leave a marker when imported."""
    marker = folder / "MARKER"
    plant = f"open({str(marker)!r}, 'a').write(__name__ + '\\n')\n"
    (folder / "platform.py").write_text(plant)
    (folder / "autodeploy").mkdir()
    (folder / "autodeploy" / "__init__.py").write_text(plant)
    return marker


@pytest.mark.parametrize("safe_path_flag", [True, False], ids=["-P", "3.10-bootstrap"])
@pytest.mark.parametrize(
    "module", ["autodeploy.harness.worker", "autodeploy.dashboard.serve", "autodeploy.adapters.tflite_convert",
               "autodeploy.formats"]
)
def test_every_kind_of_child_ignores_the_working_folder(tmp_path, module, safe_path_flag):
    marker = _hostile(tmp_path)
    # The real module, found through PYTHONPATH, runs (and fails on its missing arguments or prints a version).
    args = ("version",) if module.endswith("serve") else ()
    probe = "import platform, autodeploy, sys; print(autodeploy.__file__, platform.__file__, sys.argv[0])"
    for argv in (module_argv(module, *args, safe_path_flag=safe_path_flag),
                 code_argv(probe, safe_path_flag=safe_path_flag)):  # fmt: skip
        done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False)
        assert not marker.exists(), f"{argv[1:3]} imported from the working folder: {marker.read_text()}"
    assert str(tmp_path) not in done.stdout and done.stdout.startswith(str(SRC)), done.stdout + done.stderr


def test_the_310_bootstrap_runs_the_module_as_main_with_its_arguments(tmp_path):
    argv = module_argv("json.tool", "--compact", safe_path_flag=False)
    done = subprocess.run(argv, cwd=tmp_path, input='{"a": [1, 2]}', capture_output=True, text=True, check=True)
    assert done.stdout.strip() == '{"a":[1,2]}'


def test_the_dashboard_server_is_started_through_the_shared_helper():
    assert server_argv(8501)[:5] == module_argv("autodeploy.dashboard.serve", "run")


def test_no_child_is_started_with_the_interpreter_outside_the_helper():
    """``sys.executable`` appears only in child.py (and in the dashboard's exec of the argv it builds)."""
    found = {
        str(path.relative_to(SRC)): line.strip()
        for path in SRC.rglob("*.py")
        for line in path.read_text().splitlines()
        if re.search(r"sys\.executable|\"-m\"|'-m'", line) and not line.lstrip().startswith("#")
    }
    found.pop("child.py", None)
    assert found == {"cli/dashboard.py": "os.execve(sys.executable, argv, env)"}


def test_a_platform_module_in_the_working_folder_never_runs_in_a_worker(tmp_path, monkeypatch):
    from tests.models import mlp

    model = mlp(tmp_path / "m.onnx")
    work = tmp_path / "work"
    work.mkdir()
    marker = _hostile(work)
    monkeypatch.chdir(work)
    stored = autodeploy.bench(str(model), timing=FAST, timeout_s=120, db=f"sqlite:///{tmp_path / 'r.db'}",
                              cache=tmp_path / "cache")  # fmt: skip
    assert not marker.exists(), marker.read_text()
    assert stored.result.ok, stored.result.failure_message
    assert sys.modules["platform"].__file__ != str(work / "platform.py")
