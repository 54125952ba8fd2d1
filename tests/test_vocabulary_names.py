"""Each small vocabulary is one table: no second table, default or comparison spells its words elsewhere (issue 48).

``tests/test_objective_names.py`` keeps objective and scenario names from being compared outside
``objectives.py``; this file adds the other ways a vocabulary gets copied (STYLE.md, rule 15), read with
:mod:`ast` as ``tests/test_engine_names.py`` reads engines:

- **objective, scenario and round-statistic names** (the rows of ``objectives.py``): a dict literal keyed by
  them only (a second table of the rows: ``{"single-stream": "one call at a time", ...}``), a function's
  parameter default or a class field's default spelled as one (``scenario: str = "single-stream"``: the
  table's default row is ``DEFAULT_SCENARIO``), and, for statistics, a comparison (``statistic == "items/s"``);
- **the baseline's names** (``adapters/registry.py``'s ``BASELINE_NAME`` and ``REFERENCE_NAME``, each format's
  ``baseline`` in ``formats.py``): any string outside those two files that holds one, docstrings aside.

A dict that mixes a name with other keys is a record, not a table (``LATENCY_KEYS``: a ``LatencyStats``'s fields),
and a name in text or passed to a lookup (``objectives.of("throughput")``) is no copy.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.test_objective_names import PACKAGE, TABLE, compared, row_names, table_names

REGISTRY = PACKAGE / "adapters" / "registry.py"
FORMATS = PACKAGE / "formats.py"


def statistic_names(table: Path = TABLE) -> set[str]:
    """The round statistics' names, as the ``Statistic`` rows of ``table`` give them."""
    return row_names(table, ("Statistic",))


def baseline_names(registry: Path = REGISTRY, formats: Path = FORMATS) -> set[str]:
    """What the baselines are called: the registry's ``BASELINE_NAME`` and ``REFERENCE_NAME`` and each format's
    ``baseline`` (its fifth field), each also without a leading ``the `` (a label: ``ORT fp32 default``)."""
    names = set()
    for node in ast.walk(ast.parse(registry.read_text())):
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
                and any(isinstance(t, ast.Name) and t.id in ("BASELINE_NAME", "REFERENCE_NAME") for t in node.targets)):  # fmt: skip
            names.add(node.value.value)
    for node in ast.walk(ast.parse(formats.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Format":
            given = [*node.args[4:5], *(k.value for k in node.keywords if k.arg == "baseline")]
            names |= {v.value for v in given if isinstance(v, ast.Constant)}
    return names | {n.removeprefix("the ") for n in names}


def _name(node: ast.AST | None, names: set[str]) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names else None


def copies(source: str, names: set[str]) -> list[tuple[int, str]]:
    """``(line, what)`` for each dict literal keyed by ``names`` only, and each default spelled as one."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Dict):
            keys = [_name(k, names) for k in node.keys]
            if keys and all(keys):
                found.append((node.lineno, f"a table keyed by {', '.join(map(repr, keys))}"))
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            defaults = [*node.args.defaults, *node.args.kw_defaults]
            found += [(d.lineno, f"default {word!r}") for d in defaults if (word := _name(d, names))]
        elif isinstance(node, ast.ClassDef):
            found += [(s.lineno, f"field default {word!r}") for s in node.body
                      if isinstance(s, ast.AnnAssign) and (word := _name(s.value, names))]  # fmt: skip
    return sorted(found)


def spelled(source: str, names: set[str]) -> list[tuple[int, str]]:
    """``(line, name)`` for each string of ``source`` that holds one of ``names``, docstrings aside."""
    tree = ast.parse(source)
    docs = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
    return sorted((n.lineno, name) for n in ast.walk(tree)
                  if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs
                  for name in names if name in n.value)  # fmt: skip


def _outside(home: set[Path], check) -> list[str]:
    return [f"{path.relative_to(PACKAGE.parent)}:{line}: {what}"
            for path in sorted(PACKAGE.rglob("*.py")) if path not in home
            for line, what in check(path.read_text())]  # fmt: skip


def test_the_names_come_from_the_tables():
    assert {"p90", "median", "items/s"} <= statistic_names()
    assert {"the ORT fp32 default", "ORT fp32 default", "ONNX Runtime FP32",
            "LiteRT fp32, the file as given"} <= baseline_names()  # fmt: skip


def test_no_second_table_or_default_spells_an_objective_scenario_or_statistic_name():
    names = table_names() | statistic_names()
    found = _outside({TABLE}, lambda source: copies(source, names))
    assert not found, ("a dict keyed by objective, scenario or statistic names, or a default spelled as one, "
                       "outside objectives.py (make it a field of the row; read DEFAULT_OBJECTIVE, DEFAULT_SCENARIO "
                       "or the statistic's row):\n" + "\n".join(found))  # fmt: skip


def test_no_module_but_the_table_compares_a_statistic_name():
    names = statistic_names()
    found = _outside({TABLE}, lambda source: compared(source, names))
    assert not found, ("statistic names compared outside objectives.py (read its row: statistic_of(name)):\n"
                       + "\n".join(found))  # fmt: skip


def test_no_module_but_the_registry_and_the_formats_spells_a_baseline_name():
    names = baseline_names()
    found = _outside({REGISTRY, FORMATS}, lambda source: spelled(source, names))
    assert not found, ("a baseline's name spelled outside adapters/registry.py and formats.py (read "
                       "registry.BASELINE_NAME, baseline_name(), reference_name()):\n" + "\n".join(found))  # fmt: skip


def test_each_copy_is_found_and_a_record_lookup_or_text_is_not(tmp_path):
    """The checks can fail: a module with each kind of copy is flagged; records, lookups and prose are not."""
    table = tmp_path / "objectives.py"
    table.write_text('ROWS = (Objective(name="latency", scenario="single-stream"), Scenario("offline"),\n'
                     '        Statistic("p90", field="p90_ms"), Statistic("items/s", field="throughput"))\n')  # fmt: skip
    names = table_names(table) | statistic_names(table)
    assert names == {"latency", "single-stream", "offline", "p90", "items/s"}
    module = (
        'WORDS = {"single-stream": "one call at a time", "offline": "requests in flight"}\n'  # 1
        'FIELDS = {"p90": "p90_ms", "items/s": "throughput"}\n'  # 2
        'def bench(model, scenario="single-stream", *, objective="latency"):\n'  # 3: two defaults
        '    return {"latency": 1}[objective]\n'  # 4
        "class Request:\n"
        '    scenario: str = "offline"\n'  # 6
        'pick = lambda statistic="p90": statistic\n'  # 7
        'RECORD = {"p90": "p90_ms", "n": "n_samples"}\n'  # a record: not only names
        'COLORS = {"winner": "green", "pareto": "blue"}\n'  # no name of this table
        'def f(table, scenario=DEFAULT_SCENARIO.name, kind="other"):\n'
        '    return table["latency"], of("offline"), f"{scenario} p90"\n'  # lookups and text
    )
    assert [line for line, _ in copies(module, names)] == [1, 2, 3, 3, 4, 6, 7]
    assert "'single-stream', 'offline'" in copies(module, names)[0][1]
    statistics = 'def f(s):\n    if s == "items/s":\n        return 1\n    return s in ("p90", "median")\n'
    assert compared(statistics, statistic_names(table)) == [(2, "items/s"), (4, "p90")]


def test_a_spelled_baseline_name_is_found(tmp_path):
    registry, formats = tmp_path / "registry.py", tmp_path / "formats.py"
    registry.write_text('BASELINE_NAME = "the ORT fp32 default"\nREFERENCE_NAME = "ONNX Runtime FP32"\nOTHER = "x"\n')
    formats.write_text('F = {"tflite": Format("a flatbuffer", "tflite", "reader", "export", "LiteRT fp32, as given")}\n')
    names = baseline_names(registry, formats)
    assert names == {"the ORT fp32 default", "ORT fp32 default", "ONNX Runtime FP32", "LiteRT fp32, as given"}
    module = (
        '"""Speed-ups are over the ORT fp32 default."""\n'  # a docstring: prose
        'NAME = "ORT fp32 default"\n'  # 2: a second constant
        'def f(name):\n'
        '    """Against ONNX Runtime FP32."""\n'
        '    failed = "the ONNX Runtime FP32 reference could not run"\n'  # 5: inside a message
        '    return name != "LiteRT fp32, as given" and f"vs {name}"\n'  # 6: a comparison of text
    )
    assert [line for line, _ in spelled(module, names)] == [2, 5, 6]
