"""A static check: no code path in ``src/`` or ``tests/`` can deserialize code from data.

Found with the ``ast`` module, through import aliases: pickle and its relatives (imported
or called), ``yaml.load`` without a safe loader, ``yaml.unsafe_load``/``full_load``,
``torch.load`` without ``weights_only=True``, ``np.load(allow_pickle=True)``,
``pandas.read_pickle``, ``marshal.loads``, ``torch.export.load`` and the builtins ``eval``/``exec``. The
failure lists every offending ``file:line``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("src", "tests")
UNSAFE_MODULES = {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "jsonpickle", "shelve", "marshal"}
SAFE_YAML_LOADERS = {"SafeLoader", "CSafeLoader", "BaseLoader", "CBaseLoader"}
ALWAYS_UNSAFE_CALLS = {
    "yaml.unsafe_load": "yaml.unsafe_load",
    "yaml.unsafe_load_all": "yaml.unsafe_load_all",
    "yaml.full_load": "yaml.full_load (FullLoader can build Python objects)",
    "yaml.full_load_all": "yaml.full_load_all",
    "pandas.read_pickle": "pandas.read_pickle",
    "joblib.load": "joblib.load (pickle)",
    "numpy.lib.format.read_array": "numpy read_array (may unpickle)",
    # Unpickles with weights_only=False after a failed try, dlopens AOTInductor libraries, evals the
    # graph's sizes: autodeploy.pt2 reads a .pt2 by allowlist instead.
    "torch.export.load": "torch.export.load (pickles, native libraries, eval of the graph)",
}


class _Finder(ast.NodeVisitor):
    def __init__(self) -> None:
        self.aliases: dict[str, str] = {}  # local name -> dotted origin
        self.problems: list[tuple[int, str]] = []

    def visit_Import(self, node: ast.Import) -> None:
        for a in node.names:
            self.aliases[(a.asname or a.name).split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
            if a.name.split(".")[0] in UNSAFE_MODULES:
                self.problems.append((node.lineno, f"import {a.name}"))

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        for a in node.names:
            self.aliases[a.asname or a.name] = f"{module}.{a.name}"
        if module.split(".")[0] in UNSAFE_MODULES:
            self.problems.append((node.lineno, f"from {module} import ..."))

    def _name(self, func: ast.expr) -> str:
        parts = []
        while isinstance(func, ast.Attribute):
            parts.append(func.attr)
            func = func.value
        if not isinstance(func, ast.Name):
            return ""
        base = self.aliases.get(func.id, func.id)
        base = {"np": "numpy", "pd": "pandas"}.get(base, base)
        return ".".join([base, *reversed(parts)])

    def visit_Call(self, node: ast.Call) -> None:
        name = self._name(node.func)
        keywords = {k.arg: k.value for k in node.keywords if k.arg}
        if name in ("eval", "exec") and isinstance(node.func, ast.Name):
            self.problems.append((node.lineno, f"{name}()"))
        elif name.split(".")[0] in UNSAFE_MODULES:
            self.problems.append((node.lineno, f"{name}()"))
        elif name in ALWAYS_UNSAFE_CALLS:
            self.problems.append((node.lineno, ALWAYS_UNSAFE_CALLS[name]))
        elif name in ("yaml.load", "yaml.load_all"):
            loader = keywords.get("Loader", node.args[1] if len(node.args) > 1 else None)
            loader_name = self._name(loader).rsplit(".", 1)[-1] if loader is not None else ""
            if loader_name not in SAFE_YAML_LOADERS:
                self.problems.append((node.lineno, f"{name} without a safe Loader"))
        elif name == "torch.load":
            weights_only = keywords.get("weights_only")
            if not (isinstance(weights_only, ast.Constant) and weights_only.value is True):
                self.problems.append((node.lineno, "torch.load without weights_only=True"))
        elif name == "numpy.load":
            allow = keywords.get("allow_pickle")
            if allow is not None and not (isinstance(allow, ast.Constant) and allow.value is False):
                self.problems.append((node.lineno, "numpy.load with allow_pickle"))
        self.generic_visit(node)


def unsafe_calls(source: str) -> list[tuple[int, str]]:
    finder = _Finder()
    finder.visit(ast.parse(source))
    return sorted(finder.problems)


def test_no_unsafe_deserialization_in_the_code():
    files = [p for folder in SCANNED for p in sorted((ROOT / folder).rglob("*.py"))]
    assert len(files) > 20
    found = [
        f"{path.relative_to(ROOT)}:{line}: {what}"
        for path in files
        for line, what in unsafe_calls(path.read_text(encoding="utf-8"))
    ]
    assert found == [], "unsafe deserialization:\n" + "\n".join(found)


@pytest.mark.parametrize(
    "source",
    [
        "import pickle",
        "import cPickle as p",
        "from pickle import loads",
        "import dill",
        "import shelve",
        "import yaml\nyaml.load(text)",
        "import yaml\nyaml.load(text, Loader=yaml.Loader)",
        "import yaml\nyaml.load(text, yaml.UnsafeLoader)",
        "from yaml import load\nload(text)",
        "import yaml as y\ny.unsafe_load(text)",
        "import yaml\nyaml.full_load(text)",
        "import torch\ntorch.load(path)",
        "import torch\ntorch.load(path, weights_only=False)",
        "from torch import load\nload(path, map_location='cpu')",
        "import numpy as np\nnp.load(path, allow_pickle=True)",
        "import numpy\nnumpy.load(path, allow_pickle=flag)",
        "import pandas as pd\npd.read_pickle(path)",
        "eval(text)",
        "exec(code)",
    ],
)
def test_the_check_finds_each_unsafe_pattern(source):
    assert unsafe_calls(source), source


@pytest.mark.parametrize(
    "source",
    [
        "import yaml\nyaml.safe_load(text)",
        "import yaml\nyaml.load(text, Loader=yaml.SafeLoader)",
        "import yaml\nyaml.load(text, yaml.CSafeLoader)",
        "import torch\ntorch.load(path, weights_only=True)",
        "import numpy as np\nnp.load(path)\nnp.load(path, allow_pickle=False)",
        "import json\njson.loads(text)",
        "model.eval()",
        "import numpy as np\nnp.save(path, a, allow_pickle=True)",
    ],
)
def test_the_check_allows_safe_code(source):
    assert unsafe_calls(source) == []
