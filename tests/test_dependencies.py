"""Every package the code imports is declared in pyproject.toml, in the install that needs it.

A package that arrives only as someone else's dependency can vanish with their next release: Typer
0.29 stopped requiring click, and ``autodeploy --help`` died on a fresh core install while CI (which
installs ``.[dev]``, where Streamlit still pulls click in) stayed green. So the rule is: a module that
the core CLI imports may import at module level only the core's *direct* dependencies, and every other
import (lazy, or in an extra's module) must be declared by the core or by some extra.
"""

from __future__ import annotations

import ast
import functools
import importlib.metadata as md
import json
import re
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "autodeploy"

#: Import names whose distribution is not installed here (TensorRT needs an NVIDIA GPU), so
#: ``packages_distributions`` cannot name it: import name -> the distribution pyproject declares.
NOT_INSTALLED_HERE = {"tensorrt": "tensorrt-cu12", "cuda": "cuda-python", "pynvml": "nvidia-ml-py"}

#: What the core CLI loads: the console script's module and the library entry points.
CORE_ENTRY_POINTS = ("autodeploy.cli.app", "autodeploy.api")


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _declared() -> tuple[set[str], dict[str, set[str]]]:
    """(core distributions, {extra: distributions}) from the installed metadata of autodeploy."""
    core: set[str] = set()
    extras: dict[str, set[str]] = {}
    for requirement in md.requires("autodeploy") or ():
        name = _normalise(re.match(r"[A-Za-z0-9_.-]+", requirement).group(0))
        extra = re.search(r"""extra\s*==\s*["']([^"']+)["']""", requirement)
        if extra is None:
            core.add(name)
        elif name != "autodeploy":  # autodeploy[images] inside [zoo]: the images extra declares those
            extras.setdefault(extra.group(1), set()).add(name)
    return core, extras


def _is_guarded(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    """Inside a function, a class body, ``if TYPE_CHECKING`` or ``try``: not run at module import."""
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Try):
            return True
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return True
    return False


def _imports(path: Path) -> list[tuple[str, bool, int]]:
    """(top-level package, imported at module level, line) for every absolute third-party import."""
    tree = ast.parse(path.read_text(), filename=str(path))
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        for name in names:
            top = name.split(".")[0]
            if top in sys.stdlib_module_names or top in ("autodeploy", "__future__"):
                continue
            found.append((top, not _is_guarded(node, parents), node.lineno))
    return found


@functools.cache
def _providers() -> Mapping[str, list[str]]:
    """Import name -> the distributions that provide it: read once (a scan of every installed distribution)."""
    return md.packages_distributions()


def _distribution(import_name: str) -> str:
    providers = _providers().get(import_name)
    if providers:
        return _normalise(providers[0])
    if import_name in NOT_INSTALLED_HERE:
        return NOT_INSTALLED_HERE[import_name]
    pytest.fail(f"import {import_name!r}: no installed distribution provides it and NOT_INSTALLED_HERE does not name one")


def _core_modules() -> set[Path]:
    """The source files of every autodeploy module the core entry points load (in a fresh interpreter)."""
    code = (
        "import importlib, json, sys\n"
        f"for name in {CORE_ENTRY_POINTS!r}: importlib.import_module(name)\n"
        "print(json.dumps(sorted(getattr(m, '__file__', None) or '' for n, m in sys.modules.items()"
        " if n == 'autodeploy' or n.startswith('autodeploy.'))))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    return {Path(f).resolve() for f in json.loads(done.stdout) if f}


def test_module_level_imports_of_the_core_cli_are_direct_core_dependencies():
    core, _ = _declared()
    modules = _core_modules()
    assert SRC / "cli" / "app.py" in modules  # the scan saw the console script's own module
    undeclared = [
        f"{path.relative_to(SRC.parent)}:{line} imports {name} ({_distribution(name)})"
        for path in sorted(modules)
        for name, module_level, line in _imports(path)
        if module_level and _distribution(name) not in core
    ]
    assert not undeclared, "declare these in pyproject's core dependencies:\n" + "\n".join(undeclared)


def test_every_import_is_declared_by_the_core_or_an_extra():
    core, extras = _declared()
    anywhere = core.union(*extras.values())
    assert "openvino" in extras and "openvino" in extras["openvino"]  # the metadata was read
    undeclared = [
        f"{path.relative_to(SRC.parent)}:{line} imports {name} ({_distribution(name)})"
        for path in sorted(SRC.rglob("*.py"))
        for name, _, line in _imports(path)
        if _distribution(name) not in anywhere
    ]
    assert not undeclared, "declare these in pyproject (core or the extra that uses them):\n" + "\n".join(undeclared)


def test_the_scan_sees_a_module_level_import_and_a_guarded_one(tmp_path):
    module = tmp_path / "m.py"
    module.write_text(
        "import click\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pandas\n"
        "def f():\n    import openvino\ntry:\n    import tensorrt\nexcept ImportError:\n    pass\n"
    )
    assert sorted(_imports(module), key=lambda found: found[2]) == [("click", True, 1), ("pandas", False, 4), ("openvino", False, 6), ("tensorrt", False, 8)]
