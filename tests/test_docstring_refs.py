"""Every cross-reference in the code's docstrings and comments names something that exists (issue 48).

``tests/test_docs_map.py`` keeps docs/architecture.md true to the modules; this keeps the code's own pointers
true to the code: a Sphinx role (``:mod:``, ``:func:``, ``:class:``, ``:meth:``, ``:attr:``, ``:data:``,
``:exc:``, ``:obj:``) and a dotted ``autodeploy.x.y`` name in double backticks must resolve, after a move as
before. Read from the source with ``ast`` (nothing is imported, no engine loads), as Sphinx resolves them:

- ``autodeploy.a.b.C.m``: a module of the package, then names defined in it (a function, a class, a constant,
  an import, a member of a class or of one of its bases; an annotated field, an enum member, ``self.x``);
- ``.b.C`` (leading dot): from the module holding the reference or one of its packages, else any name of the
  package that ends so;
- ``C.m`` or ``m`` (bare): in the class holding the reference, then its module;
- a name the module imports from outside the package, a built-in or another top-level package (``numpy.ndarray``):
  not checked (that is Sphinx's intersphinx, not ours).
"""

from __future__ import annotations

import ast
import builtins
import importlib.util
import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from tests.test_import_graph import imported_from

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "autodeploy"
#: ``:role:`target` `` or ``:role:`title <target>` ``.
ROLE = re.compile(r":(?:py:)?(mod|func|class|meth|attr|data|exc|obj):`([^`]+)`")
#: A dotted name of the package alone in double backticks: ``autodeploy.fleet.ledger.take``.
DOTTED = re.compile(r"``(autodeploy(?:\.\w+)+)``")


@dataclass
class Scope:
    """The names a module or class defines: each to the dotted name it stands for (itself, or where an import
    takes it from); for a class also its bases' dotted names."""

    names: dict[str, str] = field(default_factory=dict)
    bases: list[str] = field(default_factory=list)
    #: A base from outside the package (or unknown): any member may come from it.
    open: bool = False


class Index:
    """Every module, class and name of a source tree, read with ``ast``."""

    def __init__(self, root: Path = SRC) -> None:
        self.scopes: dict[str, Scope] = {}
        self.modules: dict[str, Path] = {}
        for path in sorted((root / PACKAGE).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            self.modules[".".join(parts)] = path
        for name in list(self.modules):  # a folder without __init__.py is a (namespace) package too
            parts = name.split(".")
            for cut in range(1, len(parts)):
                self.modules.setdefault(".".join(parts[:cut]), root.joinpath(*parts[:cut]))
        for name, path in self.modules.items():
            self._read(name, path)

    def _read(self, module: str, path: Path) -> None:
        scope = self.scopes.setdefault(module, Scope())
        for sub in self.modules:  # a package's submodules are its attributes
            if sub.rpartition(".")[0] == module:
                scope.names.setdefault(sub.rpartition(".")[2], sub)
        if path.is_dir():
            return
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        self._body(ast.parse(path.read_text(), str(path)).body, module, scope, package)

    def _body(self, body: list[ast.stmt], prefix: str, scope: Scope, package: str) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef):
                full = f"{prefix}.{node.name}"
                scope.names[node.name] = full
                inner = self.scopes.setdefault(full, Scope())
                inner.bases = [ast.unparse(b) for b in node.bases]
                self._body(node.body, full, inner, package)
                for sub in ast.walk(node):  # self.x = ... in its methods
                    if isinstance(sub, ast.Attribute) and isinstance(sub.ctx, ast.Store):
                        if isinstance(sub.value, ast.Name) and sub.value.id == "self":
                            inner.names.setdefault(sub.attr, f"{full}.{sub.attr}")
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                scope.names[node.name] = f"{prefix}.{node.name}"
            elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    for name in ast.walk(target):
                        if isinstance(name, ast.Name):
                            scope.names[name.id] = f"{prefix}.{name.id}"
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    scope.names[alias.asname or alias.name.partition(".")[0]] = alias.asname and alias.name or alias.name.partition(".")[0]  # fmt: skip
            elif isinstance(node, ast.ImportFrom):
                base = imported_from(node, package)
                for alias in node.names:
                    scope.names[alias.asname or alias.name] = f"{base}.{alias.name}"
            elif isinstance(node, ast.If | ast.Try | ast.With):  # TYPE_CHECKING imports, guarded imports
                for block in ("body", "orelse", "finalbody"):
                    self._body(getattr(node, block, []), prefix, scope, package)
                for handler in getattr(node, "handlers", []):
                    self._body(handler.body, prefix, scope, package)

    @cache  # noqa: B019 (one index per test run)
    def exists(self, dotted: str) -> bool:
        """Whether ``dotted`` (a full name) is a module, or a name reachable from one, of the package; a name
        taken from outside the package counts (it is not ours to check)."""
        parts = dotted.split(".")
        if parts[0] != PACKAGE:
            return _external(parts[0])
        for cut in range(len(parts), 0, -1):
            head = ".".join(parts[:cut])
            if head in self.modules:
                return self._member(head, parts[cut:], depth=0)
        return False

    def _member(self, owner: str, rest: list[str], depth: int) -> bool:
        if not rest:
            return True
        if depth > 20:
            return False
        scope = self.scopes.get(owner)
        if scope is None:  # a function or a constant: no members we can see
            return False
        target = scope.names.get(rest[0])
        if target is None:
            return any(self._member(base, rest, depth + 1) for base in self._bases(owner, scope))
        if target.split(".")[0] != PACKAGE:
            return _external(target.split(".")[0])
        if target in self.modules or target in self.scopes:
            return self._member(target, rest[1:], depth + 1)
        if target == f"{owner}.{rest[0]}":  # a function or constant defined here: nothing below it is checked
            return len(rest) == 1
        return self.exists(".".join([target, *rest[1:]]))  # an import: where it comes from

    def _bases(self, owner: str, scope: Scope) -> list[str]:
        """The bases of class ``owner`` as full names; a base from outside the package is ``"*"`` (anything)."""
        module = owner
        while module not in self.modules:
            module = module.rpartition(".")[0]
        found = []
        for base in scope.bases:
            head, _, tail = base.partition(".")
            full = self.scopes[module].names.get(head)
            if full is None or full.split(".")[0] != PACKAGE:
                found.append("*")
            else:
                found.append(".".join([full, *([tail] if tail else [])]))
        return found

    def names_ending(self, suffix: str) -> bool:
        """Whether any name of the package ends with ``.suffix`` (Sphinx's search for a dotted reference)."""
        return any(
            full.endswith(f".{suffix}") or f"{owner}.{name}".endswith(f".{suffix}")
            for owner, scope in self.scopes.items()
            for name, full in scope.names.items()
        ) or any(m.endswith(f".{suffix}") for m in self.modules)


def _external(top: str) -> bool:
    """Whether ``top`` is a built-in or a top-level module from outside the package (found, not imported)."""
    if hasattr(builtins, top) or top in ("typing", "collections"):
        return True
    try:
        return top != PACKAGE and importlib.util.find_spec(top) is not None
    except (ImportError, ValueError):
        return False


def resolves(index: Index, target: str, module: str, cls: str | None) -> bool:
    """Whether the reference ``target``, written in ``module`` (inside class ``cls``, a full name, or none),
    names something, as Sphinx would look it up."""
    target = target.strip().lstrip("~!")
    if "<" in target and target.endswith(">"):  # ``title <target>``
        target = target[target.rindex("<") + 1 : -1].lstrip("~")
    target = target.rstrip("()")
    if target.startswith("."):
        tail = target.lstrip(".")
        owners = [*([cls] if cls else []), *_packages(module)]
        return any(index.exists(f"{o}.{tail}") for o in owners) or index.names_ending(tail)
    if target.split(".")[0] == PACKAGE:
        return index.exists(target)
    parts = target.split(".")
    if any(index._member(owner, parts, depth=0) for owner in (*([cls] if cls else []), module, PACKAGE)):
        return True  # in its class, its module, or the package's top (``bench``: autodeploy.bench)
    # ``queries.judged`` beside it, ``ShapeCase.key`` elsewhere: dotted, so named whole enough to find
    beside = any(index.exists(f"{p}.{target}") for p in _packages(module))
    if len(parts) > 1 and (beside or index.names_ending(target)):
        return True
    return _external(parts[0])


def _packages(module: str) -> list[str]:
    """``module`` and every package above it, innermost first."""
    parts = module.split(".")
    return [".".join(parts[:n]) for n in range(len(parts), 0, -1)]


def _classes(tree: ast.Module, module: str) -> list[tuple[int, int, str]]:
    """``(first line, last line, full name)`` of every class, outermost first."""
    found = []

    def walk(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef):
                found.append((node.lineno, node.end_lineno or node.lineno, f"{prefix}.{node.name}"))
                walk(node.body, f"{prefix}.{node.name}")

    walk(tree.body, module)
    return found


def stale_references(index: Index, module: str, path: Path) -> list[str]:
    """``"line: target"`` of every reference in the file of ``module`` that names nothing."""
    source = path.read_text()
    classes = _classes(ast.parse(source), module)
    found = []
    for number, line in enumerate(source.splitlines(), start=1):
        cls = next((name for first, last, name in reversed(classes) if first <= number <= last), None)
        targets = [m.group(2) for m in ROLE.finditer(line)]
        # a dotted name in backticks is checked where it starts with a room (``autodeploy.trial`` is a record's name)
        dotted = [m.group(1) for m in DOTTED.finditer(line)]
        targets += [name for name in dotted if ".".join(name.split(".")[:2]) in index.modules]
        found += [f"{number}: {t}" for t in targets if not resolves(index, t, module, cls)]
    return found


def test_every_docstring_reference_names_something_that_exists():
    index = Index()
    stale = {}
    for module, path in sorted(index.modules.items()):
        if path.is_dir():
            continue
        hits = stale_references(index, module, path)
        if hits:
            stale[str(path.relative_to(SRC))] = hits
    assert not stale, f"references to names that do not exist (point them where each lives now): {stale}"


def test_a_stale_reference_is_found(tmp_path):
    """The check can fail: references to a module, a function, a class member and a relative name that are gone
    are found; ones that exist, in every form, are not."""
    package = tmp_path / PACKAGE
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "measure.py").write_text(
        "from numpy import ndarray\n"
        "class Meter:\n"
        "    LIMIT = 3\n"
        "    def __init__(self):\n"
        "        self.count = 0\n"
        "    def read(self):\n"
        "        '''See :attr:`count`, :attr:`LIMIT` and :meth:`Meter.read`; not :meth:`write`.'''\n"
        "def compare(a: ndarray) -> None:\n"
        "    '''Like :func:`.measure.compare` and :class:`~autodeploy.sub.measure.Meter`, not :func:`.measure.old`.'''\n"
    )
    (package / "top.py").write_text(
        "'''Uses :mod:`autodeploy.sub.measure`, :func:`autodeploy.sub.measure.compare`, ``autodeploy.sub.measure.Meter``,\n"
        ":class:`numpy.ndarray` and :exc:`ValueError`; but :mod:`autodeploy.sub.gone`, :func:`autodeploy.sub.measure.moved`,\n"
        ":meth:`autodeploy.sub.measure.Meter.gone` and ``autodeploy.sub.verdict_old.X`` are stale.'''\n"
        "from autodeploy.sub.measure import Meter\n"
        "# :meth:`Meter.read` is imported here; :meth:`Meter.missing` is not a member\n"
    )
    index = Index(tmp_path)
    found = {m: stale_references(index, m, p) for m, p in index.modules.items() if p.is_file()}
    assert found["autodeploy.sub.measure"] == ["7: write", "9: .measure.old"], found
    assert found["autodeploy.top"] == ["2: autodeploy.sub.gone", "2: autodeploy.sub.measure.moved",
                                       "3: autodeploy.sub.measure.Meter.gone", "3: autodeploy.sub.verdict_old.X",
                                       "5: Meter.missing"], found  # fmt: skip
