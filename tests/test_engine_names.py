"""No engine name is compared outside ``adapters/``, ``runtime/`` and ``inhouse/`` (issue 38).

An engine's quirks are its own declarations (``Engine.triton``, ``Engine.gpu``, ``Engine.peak_kernels``,
``Format.module``, ...), read through the registry: code elsewhere that asks ``engine == "openvino"`` is a
quirk living in the wrong room, and a new engine would silently take the other branch. Read from the source
with ``ast`` (nothing is imported): a comparison (``==``, ``!=``, ``in``, ``not in``, ``is``, ``is not``)
one of whose sides is an engine name, a collection holding one, or a module-level name bound to such a
collection; a ``match`` case on one; and a dict literal keyed by engine names indexed on the spot (a branch
written as a table). A default value, a record's field or a help text may still hold an engine name.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "autodeploy"
#: The rooms where engines live and may name each other.
ENGINE_ROOMS = ("adapters", "runtime", "inhouse")
COMPARISONS = (ast.Eq, ast.NotEq, ast.In, ast.NotIn, ast.Is, ast.IsNot)
COLLECTIONS = (ast.Tuple, ast.List, ast.Set)


def engine_names(registry: Path = SRC / "adapters" / "registry.py") -> frozenset[str]:
    """The keys of the registry's ``ENGINES`` table, read from its source."""
    for node in ast.walk(ast.parse(registry.read_text())):
        if not isinstance(node, ast.Assign | ast.AnnAssign) or not isinstance(node.value, ast.Dict):
            continue
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        if any(isinstance(t, ast.Name) and t.id == "ENGINES" for t in targets):
            return frozenset(k.value for k in node.value.keys if isinstance(k, ast.Constant))
    raise AssertionError(f"no ENGINES table in {registry}")


def holds(node: ast.AST | None, names: frozenset[str], bound: frozenset[str] = frozenset()) -> bool:
    """Whether ``node`` is one of ``names`` (engines here; ``tests/test_state_names.py``'s state words), a literal
    collection (or ``frozenset(...)``/``set(...)``/``tuple(...)`` of one) holding one, or a name in ``bound`` (a
    module-level collection of them)."""
    if isinstance(node, ast.Constant):
        return node.value in names
    if isinstance(node, COLLECTIONS):
        return any(holds(e, names) for e in node.elts)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("frozenset", "set", "tuple"):
        return any(holds(a, names) for a in node.args)
    if isinstance(node, ast.Name | ast.Attribute):
        return (node.id if isinstance(node, ast.Name) else node.attr) in bound
    return False


def engine_comparisons(source: str, names: frozenset[str]) -> list[str]:
    """``"line: code"`` of each place ``source`` compares or matches on an engine name."""
    tree = ast.parse(source)
    bound = frozenset(
        t.id
        for node in tree.body
        if isinstance(node, ast.Assign | ast.AnnAssign) and holds(node.value, names)
        for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(t, ast.Name)
    )
    found = []
    for node in ast.walk(tree):
        hit = False
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            hit = any(isinstance(op, COMPARISONS) and (holds(sides[i], names, bound) or
                                                       holds(sides[i + 1], names, bound))
                      for i, op in enumerate(node.ops))  # fmt: skip
        elif isinstance(node, ast.match_case):
            hit = any(isinstance(p, ast.MatchValue) and holds(p.value, names) for p in ast.walk(node.pattern))
        elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Dict):
            hit = any(holds(k, names) for k in node.value.keys)
        if hit:
            where = node.pattern if isinstance(node, ast.match_case) else node
            found.append((where.lineno, f"{where.lineno}: {ast.unparse(where)[:120]}"))
    return [text for _, text in sorted(found)]


def test_the_engine_names_come_from_the_registry_table():
    names = engine_names()
    assert {"onnxruntime", "openvino", "tflite", "tensorrt", "inhouse"} <= names, names


def test_no_engine_name_is_compared_outside_the_engine_rooms():
    names = engine_names()
    found = {}
    for path in sorted(SRC.rglob("*.py")):
        if path.relative_to(SRC).parts[0] in ENGINE_ROOMS:
            continue
        hits = engine_comparisons(path.read_text(), names)
        if hits:
            found[str(path.relative_to(SRC))] = hits
    assert not found, (
        "engine names compared outside adapters/, runtime/ and inhouse/ (make it an engine's declaration, "
        f"read through the registry): {found}"
    )


def test_a_comparison_on_an_engine_name_is_found(tmp_path):
    """The check can fail: each form it looks for, in a module of its own, is found; literals that decide
    nothing are not."""
    names = engine_names()
    module = tmp_path / "branches.py"
    module.write_text(
        'GPU = frozenset({"tensorrt"})\n'
        "def f(engine, kind):\n"
        '    if engine == "openvino":\n'
        "        return 1\n"
        '    if kind in ("tflite", "onnx"):\n'
        "        return 2\n"
        "    if engine in GPU:\n"
        "        return 3\n"
        "    match engine:\n"
        '        case "inhouse":\n'
        "            return 4\n"
        '    return {"onnxruntime": 5, "other": 6}[engine]\n'
    )
    found = engine_comparisons(module.read_text(), names)
    assert [hit.split(":")[0] for hit in found] == ["3", "5", "7", "10", "12"], found
    assert "engine == 'openvino'" in found[0]
    quiet = tmp_path / "quiet.py"
    quiet.write_text(
        '"""Run it with engine="openvino"."""\n'
        'def bench(model, engine="openvino"):\n'
        '    record = {"framework": "tflite"}\n'
        '    return FORMATS["tflite"], record, engine == BASELINE_ENGINE\n'
    )
    assert engine_comparisons(quiet.read_text(), names) == []
