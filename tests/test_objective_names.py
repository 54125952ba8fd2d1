"""No objective or scenario name is compared outside ``objectives.py`` (issue 38).

An objective carries its behaviour in its row (:mod:`autodeploy.objectives`: how its values reduce, compare,
mix and form a ratio; which scenario it runs in and what that scenario searches). A branch on a name elsewhere
(``if objective == "latency"``) is a second copy of a row that a new objective silently misses. Built with
:mod:`ast`: the names are read from the rows of ``objectives.py`` (each ``Objective``'s and ``Scenario``'s
``name`` and each objective's ``scenario``), and every ``==``, ``!=``, ``in``, ``not in`` and ``match``/``case``
whose constant side is one of them is a finding. A lookup in a table keyed by name (``SCENARIOS[name]``,
``OBJECTIVES.get(name)``) is no comparison.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "autodeploy"
TABLE = PACKAGE / "objectives.py"
_COMPARING = (ast.Eq, ast.NotEq, ast.In, ast.NotIn)


def row_names(table: Path, rows: tuple[str, ...], fields: tuple[str, ...] = ("name",)) -> set[str]:
    """The names the ``rows`` constructor calls of ``table`` give (``Objective("latency", ...)``): each call's first
    argument and its ``fields`` keywords that are strings. The vocabulary guards read their words with it."""
    names = set()
    for node in ast.walk(ast.parse(table.read_text())):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in rows):
            continue
        given = [*node.args[:1], *(k.value for k in node.keywords if k.arg in fields)]
        names |= {v.value for v in given if isinstance(v, ast.Constant) and isinstance(v.value, str)}
    return names


def table_names(table: Path = TABLE) -> set[str]:
    """The objectives' and the scenarios' names, as the rows of ``table`` give them."""
    return row_names(table, ("Objective", "Scenario"), ("name", "scenario"))


def _constants(node: ast.AST) -> list[str]:
    """The strings a comparison's operand holds: a constant, or the constants of a tuple, list or set."""
    items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return [n.value for n in items if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def _patterns(pattern: ast.pattern) -> list[str]:
    """The strings a ``case`` pattern matches (``case "latency" | "pareto":``, also inside sequences, mappings
    and class patterns)."""
    return [p.value.value for p in ast.walk(pattern)
            if isinstance(p, ast.MatchValue) and isinstance(p.value, ast.Constant) and isinstance(p.value.value, str)]  # fmt: skip


def compared(source: str, names: set[str]) -> list[tuple[int, str]]:
    """``(line, name)`` for every comparison in ``source`` whose constant side is one of ``names``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare) and any(isinstance(op, _COMPARING) for op in node.ops):
            operands = [node.left, *node.comparators]
            found += [(node.lineno, s) for operand in operands for s in _constants(operand) if s in names]
        elif isinstance(node, ast.match_case):
            found += [(node.pattern.lineno, s) for s in _patterns(node.pattern) if s in names]
    return sorted(found)


def test_the_names_come_from_the_table():
    names = table_names()
    assert {"latency", "throughput", "server", "pareto"} <= names  # the objectives
    assert {"single-stream", "offline", "multi-stream", "server"} <= names  # the scenarios


def test_no_module_but_the_table_compares_an_objective_or_a_scenario_name():
    names = table_names()
    found = [f"{path.relative_to(PACKAGE.parent)}:{line}: {name!r}"
             for path in sorted(PACKAGE.rglob("*.py")) if path != TABLE
             for line, name in compared(path.read_text(), names)]  # fmt: skip
    assert not found, ("objective or scenario names compared outside objectives.py (read the row instead: "
                       "OBJECTIVES[name].<attribute>, SCENARIOS[name].<attribute>):\n" + "\n".join(found))  # fmt: skip


def test_the_check_finds_every_kind_of_comparison_and_no_lookup(tmp_path):
    """A module with each kind of comparison fails the check; lookups, defaults and words in text do not."""
    table = tmp_path / "objectives.py"
    table.write_text('ROWS = (Objective(name="latency", scenario="single-stream"), Scenario("offline"))\n')
    names = table_names(table)
    assert names == {"latency", "single-stream", "offline"}
    module = tmp_path / "branches.py"
    module.write_text(
        "def f(objective, scenario, table):\n"
        '    if objective == "latency":\n'  # 2
        "        return 1\n"
        '    if "offline" != scenario:\n'  # 4
        "        return 2\n"
        '    if scenario in ("single-stream", "server"):\n'  # 6
        "        return 3\n"
        '    if objective not in {"latency"}:\n'  # 8
        "        return 4\n"
        "    match scenario:\n"
        '        case "offline" | "other":\n'  # 11
        "            return 5\n"
        '        case ["single-stream", _]:\n'  # 13
        "            return 6\n"
        '    kind = "throughput" if objective == "server" else "latency"\n'  # not in this table's names
        '    default = table.get("latency", "offline")\n'  # a lookup
        '    text = f"{objective} latency"\n'
        '    return table["single-stream"] if objective is not None and text != "other" else default\n'
    )
    assert compared(module.read_text(), names) == [(2, "latency"), (4, "offline"), (6, "single-stream"),
                                                   (8, "latency"), (11, "offline"), (13, "single-stream")]  # fmt: skip
