"""No accuracy measure's name is compared, or keys a table, outside ``accuracy/kinds.py`` (issue 48).

A measure (``exact``, ``top1``, ..., ``sqnr``, ``cosine``) carries its behaviour in its row
(:class:`autodeploy.accuracy.kinds.Measure`: its words, the record's field holding its value, whether its
threshold is a probability, an SQNR limit in dB or a cosine limit, what is reported beside it). A branch on a
name elsewhere (``if o.kind == "regression"``) or a second table keyed by the names (``{"sqnr": "SQNR", ...}``)
is a copy of a row that a new measure silently misses. Read with :mod:`ast`: the names are the ``Measure`` rows'
of ``kinds.py``; every ``==``, ``!=``, ``in``, ``not in`` and ``match``/``case`` whose constant side is one of
them is a finding (``tests/test_objective_names.py``'s check), and so is a dict literal whose keys are all
measure names. A name in prose or a message (``--accuracy NAME=top1``), a record's field that happens to share
a name (``"cosine"``, beside the other fields) and a lookup (``measure_of("sqnr")``) are no copy.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.test_objective_names import PACKAGE, compared, row_names

TABLE = PACKAGE / "accuracy" / "kinds.py"


def measure_names(table: Path = TABLE) -> set[str]:
    """The measures' names, as the ``Measure`` rows of ``table`` give them (first argument or ``name=``)."""
    return row_names(table, ("Measure",))


def tables(source: str, names: set[str]) -> list[tuple[int, str]]:
    """``(line, keys)`` for each dict literal of ``source`` keyed by ``names`` only (a second table of the rows)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Dict) and node.keys:
            keys = [k.value if isinstance(k, ast.Constant) and k.value in names else None for k in node.keys]
            if all(keys):
                found.append((node.lineno, ", ".join(map(repr, keys))))
    return sorted(found)


def _outside(check) -> list[str]:
    return [f"{path.relative_to(PACKAGE.parent)}:{line}: {what!r}"
            for path in sorted(PACKAGE.rglob("*.py")) if path != TABLE
            for line, what in check(path.read_text())]  # fmt: skip


def test_the_names_come_from_the_table():
    assert measure_names() == {"exact", "top1", "sequence", "cells", "decision", "logit", "embedding",
                               "regression", "sqnr", "cosine", "bins"}  # fmt: skip


def test_no_module_but_the_table_compares_a_measure_name():
    names = measure_names()
    found = _outside(lambda source: compared(source, names))
    assert not found, ("accuracy measure names compared outside accuracy/kinds.py (read the row instead: "
                       "OutputAccuracy.measure, rules.output_measure(o), measure_of(name), then its "
                       "attribute):\n" + "\n".join(found))  # fmt: skip


def test_no_module_but_the_table_keys_a_dict_by_measure_names():
    names = measure_names()
    found = _outside(lambda source: tables(source, names))
    assert not found, ("a dict keyed by accuracy measure names outside accuracy/kinds.py (make it a field of "
                       "kinds.Measure):\n" + "\n".join(found))  # fmt: skip


def test_each_copy_is_found_and_prose_records_and_lookups_are_not(tmp_path):
    """The checks can fail: a module with each kind of copy is flagged; messages, records and lookups are not."""
    table = tmp_path / "kinds.py"
    table.write_text(
        'ROWS = (Measure("sqnr", "SQNR", "sqnr_db"), Measure(name="top1", metric="top-1 agreement"))\n'
    )
    names = measure_names(table)
    assert names == {"sqnr", "top1"}
    module = (
        "def judged(o, kind):\n"
        '    if o.kind == "sqnr":\n'  # 2
        "        return 1\n"
        '    if kind in ("top1", "other"):\n'  # 4
        "        return 2\n"
        "    match kind:\n"
        '        case "top1":\n'  # 7
        "            return 3\n"
        '    return {"sqnr": "SQNR", "top1": "top-1 agreement"}[kind]\n'  # 9: a second table
        'WORDS = {"top1": "classes"}\n'  # 10
        'RECORD = {"name": "y", "sqnr": 1.0}\n'  # a record: not only names
        "def hint(name, table):\n"
        '    """Judge it with --accuracy NAME=sqnr."""\n'
        '    text = f"judge them with --accuracy {name}=top1"\n'  # a message
        '    return table.get("sqnr"), measure_of("top1"), text, o.kind is None\n'  # lookups
    )
    assert compared(module, names) == [(2, "sqnr"), (4, "top1"), (7, "top1")]
    assert tables(module, names) == [(9, "'sqnr', 'top1'"), (10, "'top1'")]
