"""The import graph of ``src/autodeploy`` has no cycles, few arrows back up, and no private imports.

Built with :mod:`ast`, not by importing: every ``import`` counts, at module level, inside a function (a
function-level import hides a cycle from Python's loader, not from the design) or under
``if TYPE_CHECKING:`` (an import only for type hints is still an import: if it runs upward, the record is in
the wrong room, docs/architecture.md). A package's ``__init__`` is not counted as imported by its
submodules' imports (Python runs it first, but that is the package, not a dependency).

Rooms are ``autodeploy.X``, a top-level module or a sub-package: stacked by what they import, no more than
:data:`MAX_BACK_ARROWS` room arrows (none) may run back up. Private names (``_x``) are not imported from another
module, and a private module (``pkg._mod``) only from inside ``pkg``.
"""

from __future__ import annotations

import ast
import itertools
from collections.abc import Iterator
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
#: The most room arrows that may run from a lower floor to a higher one: none since issue 38 moved the last
#: two (the in-house engine into adapters/, the accuracy records into verdict.py).
MAX_BACK_ARROWS = 0


def modules(root: Path = SRC) -> dict[str, Path]:
    """Every module of the package by its dotted name (a package by its own name)."""
    found = {}
    for path in sorted((root / "autodeploy").rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imported(name: str, known: dict[str, Path]) -> str | None:
    """The known module that importing ``name`` loads: itself, else its nearest known parent."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def imported_from(node: ast.ImportFrom, package: str) -> str:
    """The absolute module a ``from ... import`` in ``package`` reads (``from .kinds import x`` in
    ``autodeploy.accuracy`` is ``autodeploy.accuracy.kinds``)."""
    if not node.level:
        return node.module or ""
    parent = package.split(".")[: len(package.split(".")) - node.level + 1]
    return ".".join(parent + ([node.module] if node.module else []))


def _statements(module: str, path: Path) -> Iterator[tuple[int, str, str | None]]:
    """Every import of ``module`` as ``(line, dotted base, name)``: ``import a.b`` is ``("a.b", None)``,
    ``from a import b`` is ``("a", "b")``; relative imports are made absolute."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, None
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                yield node.lineno, imported_from(node, package), alias.name


def imports_of(module: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package's modules that ``module`` imports (``from autodeploy import x`` is module ``x``)."""
    found = set()
    for _, base, name in _statements(module, path):
        whole = f"{base}.{name}" if name is not None else base
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


def room(module: str) -> str:
    """The room a module is in: ``autodeploy.X`` (a top-level module or a sub-package), or ``autodeploy``."""
    return ".".join(module.split(".")[:2])


def room_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Rooms and the rooms they import (a room importing itself is no arrow)."""
    rooms: dict[str, set[str]] = {room(m): set() for m in graph}
    for module, deps in graph.items():
        rooms[room(module)] |= {room(d) for d in deps} - {room(module)}
    return rooms


def back_arrows(rooms: dict[str, set[str]], limit: int) -> list[tuple[str, str]] | None:
    """A smallest set of room arrows whose removal leaves ``rooms`` acyclic, or ``None`` when that takes
    more than ``limit`` arrows (brute force over the arrows inside each cycle: cheap for a few)."""
    chosen: list[tuple[str, str]] = []
    for component in cycles(rooms):
        inside = set(component)
        arrows = sorted((a, b) for a in component for b in rooms[a] if b in inside)
        for k in range(1, limit - len(chosen) + 1):
            cut = next((combo for combo in itertools.combinations(arrows, k)
                        if not cycles({a: {b for b in rooms[a] & inside if (a, b) not in combo} for a in inside})),
                       None)  # fmt: skip
            if cut is not None:
                chosen += cut
                break
        else:
            return None
    return chosen


def private_imports(root: Path = SRC) -> list[str]:
    """Every import of a private name (``_x``, not a dunder) from another module, and of a private
    module (``pkg._mod``) from outside ``pkg``, as ``file:line: what``."""
    known = modules(root)
    found: list[tuple[str, int, str]] = []
    for module, path in known.items():
        where = path.relative_to(root).as_posix()
        for line, base, name in _statements(module, path):
            if base.split(".")[0] != "autodeploy":
                continue  # another distribution's privates are its own business
            whole = f"{base}.{name}" if name is not None else base
            target = whole if whole in known else base
            parts = target.split(".")
            for i, part in enumerate(parts):
                package = ".".join(parts[:i])
                if part.startswith("_") and not part.startswith("__") and module != package and \
                        not module.startswith(f"{package}."):  # fmt: skip
                    found.append(
                        (where, line, f"private module {'.'.join(parts[: i + 1])} from outside {package}")
                    )
                    break
            if name is not None and whole not in known and name.startswith("_") and not name.startswith("__"):
                found.append((where, line, f"private name {name} from {base}"))
    return [f"{where}:{line}: {what}" for where, line, what in sorted(found)]


def test_the_package_imports_form_no_cycle():
    graph = import_graph()
    found = cycles(graph)
    assert not found, "import cycles (move the thing to its owner):\n" + "\n".join(
        describe(c, graph) for c in found
    )


def _arrow(graph: dict[str, set[str]], a: str, b: str) -> str:
    """Room arrow ``a -> b`` with the file imports behind it."""
    files = sorted(f"{m} -> {d}" for m in graph if room(m) == a for d in graph[m] if room(d) == b)
    return f"{a} -> {b} ({', '.join(files)})"


def _too_many(graph: dict[str, set[str]], rooms: dict[str, set[str]]) -> str:
    """Why the rooms fail: the fewest arrows back up (up to two more than allowed) and every room circle."""
    fewest = back_arrows(rooms, MAX_BACK_ARROWS + 2)
    cut = "more" if fewest is None else f"{len(fewest)}: " + "; ".join(_arrow(graph, a, b) for a, b in fewest)
    circles = "\n".join(f"{c}: " + "; ".join(_arrow(graph, a, b) for a in c for b in sorted(rooms[a] & set(c)))
                        for c in cycles(rooms))  # fmt: skip
    return (
        f"room arrows run back up, at most {MAX_BACK_ARROWS} may (move each record down to its owner); the fewest "
        f"that leave the rooms without a circle are {cut}\nthe room circles:\n{circles}"
    )


def test_no_room_arrow_runs_back_up():
    graph = import_graph()
    rooms = room_graph(graph)
    assert back_arrows(rooms, MAX_BACK_ARROWS) is not None, _too_many(graph, rooms)


def test_no_private_name_or_module_is_imported_across():
    found = private_imports()
    assert not found, "private imports (make the name public where it belongs, or move it):\n" + "\n".join(
        found
    )


def test_function_level_and_type_checking_imports_count(tmp_path):
    package = tmp_path / "autodeploy"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "a.py").write_text("def f():\n    from autodeploy.sub import b\n")
    (package / "sub" / "b.py").write_text("from .. import c\n")
    (package / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from autodeploy import a\n"
    )
    graph = import_graph(tmp_path)
    assert graph["autodeploy.a"] == {"autodeploy.sub.b"} and graph["autodeploy.sub.b"] == {"autodeploy.c"}
    assert graph["autodeploy.c"] == {"autodeploy.a"}
    assert cycles(graph) == [("autodeploy.a", "autodeploy.c", "autodeploy.sub.b")]
    (package / "c.py").write_text("from typing import TYPE_CHECKING\n")
    assert cycles(import_graph(tmp_path)) == []


def test_rooms_and_the_arrows_back_up(tmp_path):
    package = tmp_path / "autodeploy"
    (package / "low").mkdir(parents=True)
    for name in ("__init__.py", "low/__init__.py", "low/x.py", "low/y.py", "mid.py", "top.py"):
        (package / name).write_text("")
    (package / "top.py").write_text("from autodeploy import mid\n")
    (package / "mid.py").write_text("from autodeploy.low import x\n")
    (package / "low" / "y.py").write_text("from autodeploy.low import x\n")  # inside one room: no arrow
    rooms = room_graph(import_graph(tmp_path))
    assert rooms["autodeploy.top"] == {"autodeploy.mid"} and rooms["autodeploy.low"] == set()
    assert back_arrows(rooms, 2) == []
    (package / "low" / "y.py").write_text("from autodeploy import top\n")  # low -> top: one circle
    rooms = room_graph(import_graph(tmp_path))
    assert back_arrows(rooms, 2) == [("autodeploy.low", "autodeploy.top")]  # the one arrow back up
    assert back_arrows(rooms, MAX_BACK_ARROWS) is None  # the rule fails on it, naming the arrow and its file
    assert "autodeploy.low -> autodeploy.top (autodeploy.low.y -> autodeploy.top)" in _too_many(
        import_graph(tmp_path), rooms
    )
    (package / "low" / "x.py").write_text("from autodeploy import mid\n")  # low <-> mid: a second circle
    (package / "top.py").write_text("from autodeploy import mid\nfrom autodeploy.low import y\n")
    rooms = room_graph(import_graph(tmp_path))
    assert back_arrows(rooms, 1) is None
    assert back_arrows(rooms, 2) == [
        ("autodeploy.low", "autodeploy.mid"),
        ("autodeploy.low", "autodeploy.top"),
    ]


def test_private_imports_are_found(tmp_path):
    package = tmp_path / "autodeploy"
    (package / "pkg").mkdir(parents=True)
    for name in ("__init__.py", "pkg/__init__.py", "pkg/_inner.py"):
        (package / name).write_text("")
    (package / "pkg" / "user.py").write_text("from autodeploy.pkg import _inner\nfrom ._inner import thing\n")
    (package / "pkg" / "mod.py").write_text("def _hidden():\n    pass\n")
    (package / "fine.py").write_text("from autodeploy import __version__\nfrom os import _exit\n")
    (package / "bad.py").write_text(
        "from autodeploy.pkg._inner import thing\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
        "    from autodeploy.pkg.mod import _hidden\nimport autodeploy.pkg._inner\n"
    )
    found = private_imports(tmp_path)
    assert found == [
        "autodeploy/bad.py:1: private module autodeploy.pkg._inner from outside autodeploy.pkg",
        "autodeploy/bad.py:4: private name _hidden from autodeploy.pkg.mod",
        "autodeploy/bad.py:5: private module autodeploy.pkg._inner from outside autodeploy.pkg",
    ]
