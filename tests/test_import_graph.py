"""The import graph of ``src/autodeploy`` has no cycles (docs/architecture.md: data flows one way).

Built with :mod:`ast`, not by importing: every ``import`` counts, at module level or inside a function
(a function-level import hides a cycle from Python's loader, not from the design); only imports under
``if TYPE_CHECKING:`` do not, since they never run. A package's ``__init__`` is not counted as imported
by its submodules' imports (Python runs it first, but that is the package, not a dependency).
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


def modules(root: Path = SRC) -> dict[str, Path]:
    """Every module of the package by its dotted name (a package by its own name)."""
    found = {}
    for path in sorted((root / "autodeploy").rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _type_checking_only(tree: ast.AST) -> set[int]:
    """The ids of the nodes under ``if TYPE_CHECKING:`` (or ``typing.TYPE_CHECKING``)."""
    hidden = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            test = node.test
            name = (
                test.id
                if isinstance(test, ast.Name)
                else test.attr
                if isinstance(test, ast.Attribute)
                else ""
            )
            if name == "TYPE_CHECKING":
                hidden |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return hidden


def _imported(name: str, known: dict[str, Path]) -> str | None:
    """The known module that importing ``name`` loads: itself, else its nearest known parent."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(module: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package's modules that ``module`` imports (``from autodeploy import x`` is module ``x``)."""
    tree = ast.parse(path.read_text(), str(path))
    hidden = _type_checking_only(tree)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if id(node) in hidden:
            continue
        if isinstance(node, ast.Import):
            found |= {_imported(alias.name, known) for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([node.module] if node.module else []))
            for alias in node.names:
                whole = f"{base}.{alias.name}"
                found.add(whole if whole in known else _imported(base, known))
    return {m for m in found if m is not None and m != module}


def import_graph(root: Path = SRC) -> dict[str, set[str]]:
    known = modules(root)
    return {module: imports_of(module, path, known) for module, path in known.items()}


def cycles(graph: dict[str, set[str]]) -> list[tuple[str, ...]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(tuple(sorted(component)))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def describe(component: tuple[str, ...], graph: dict[str, set[str]]) -> str:
    return "; ".join(f"{m} -> {', '.join(sorted(graph[m] & set(component)))}" for m in component)


def test_the_package_imports_form_no_cycle():
    graph = import_graph()
    found = cycles(graph)
    assert not found, "import cycles (move the thing to its owner):\n" + "\n".join(
        describe(c, graph) for c in found
    )


def test_function_level_imports_count_and_type_checking_ones_do_not(tmp_path):
    package = tmp_path / "autodeploy"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "a.py").write_text("def f():\n    from autodeploy.sub import b\n")
    (package / "sub" / "b.py").write_text("from .. import c\n")
    (package / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from autodeploy import a\nimport autodeploy.a\n"
    )
    graph = import_graph(tmp_path)
    assert graph["autodeploy.a"] == {"autodeploy.sub.b"} and graph["autodeploy.sub.b"] == {"autodeploy.c"}
    assert cycles(graph) == [("autodeploy.a", "autodeploy.c", "autodeploy.sub.b")]
    (package / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from autodeploy import a\n"
    )
    assert cycles(import_graph(tmp_path)) == []
