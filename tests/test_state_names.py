"""No fleet run or job state is spelled outside its home, ``results_db/states.py`` (issue 48).

A state is a row of ``RunState`` or ``JobState`` that carries what it means (``final``) and how it shows (colour,
mark, words): code elsewhere that asks ``run.state == "running"``, or keeps a table keyed by the words (a colour
per state), is a copy that a new state would silently miss. Read from the source with ``ast`` (nothing is
imported), outside the home and the migrations (which hold the stored strings, never changed): a comparison or
``match`` case between a state word and something that names a state (``run.state``, ``d["state"]``, ``state``),
a state word written to one (``state="queued"``, ``run.state = "done"``), and a dict literal keyed by two or more
state words. The words are read from the home's members. A reason's text, a help text or an unrelated dict key
(``"skipped": [...]``, a trial's ``status == "failed"``) may still hold the same words.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.test_engine_names import COMPARISONS, holds

SRC = Path(__file__).resolve().parents[1] / "src" / "autodeploy"
HOME = SRC / "results_db" / "states.py"
#: Besides the home: the migrations hold the stored strings as they were when written.
EXEMPT = (HOME, SRC / "results_db" / "migrations")


def state_words(home: Path = HOME) -> frozenset[str]:
    """The values of every member of the home's enums (``QUEUED = "queued", ...``), read from its source."""
    words = set()
    for cls in ast.parse(home.read_text()).body:
        if not isinstance(cls, ast.ClassDef):
            continue
        for node in cls.body:
            value = node.value if isinstance(node, ast.Assign) and node.targets[0].id.isupper() else None  # type: ignore[attr-defined]
            first = value.elts[0] if isinstance(value, ast.Tuple) else value
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                words.add(first.value)
    assert words, f"no state member in {home}"
    return frozenset(words)


def _names_a_state(node: ast.AST | None) -> bool:
    """Whether ``node`` is something that holds a state: a name or attribute ``state`` (``run.state``,
    ``job_state``), or a subscript by ``"state"`` (``d["state"]``)."""
    if isinstance(node, ast.Name):
        return "state" in node.id.lower()
    if isinstance(node, ast.Attribute):
        return "state" in node.attr.lower()
    if isinstance(node, ast.Subscript):
        key = node.slice
        return isinstance(key, ast.Constant) and isinstance(key.value, str) and "state" in key.value.lower()
    if isinstance(node, ast.Call):  # RunState(d["state"]) is parsed: a word beside it is compared with a row
        return any(_names_a_state(a) for a in node.args)
    return False


def _targets(node: ast.Assign) -> list[tuple[ast.AST, ast.AST]]:
    """``(target, value)`` pairs of an assignment, tuples unpacked (``run.state, run.reason = "done", None``)."""
    pairs = []
    for target in node.targets:
        if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple) and len(target.elts) == len(node.value.elts):
            pairs += list(zip(target.elts, node.value.elts, strict=True))
        else:
            pairs.append((target, node.value))
    return pairs


def _hit(node: ast.AST, words: frozenset[str]) -> bool:
    if isinstance(node, ast.Compare):
        sides = [node.left, *node.comparators]
        return any(isinstance(op, COMPARISONS) and ((holds(a, words) and _names_a_state(b)) or
                                                    (holds(b, words) and _names_a_state(a)))
                   for op, a, b in zip(node.ops, sides, sides[1:], strict=False))  # fmt: skip
    if isinstance(node, ast.Match):
        return _names_a_state(node.subject) and any(
            isinstance(p, ast.MatchValue) and holds(p.value, words) for case in node.cases for p in ast.walk(case.pattern)
        )
    if isinstance(node, ast.keyword):
        return node.arg is not None and "state" in node.arg.lower() and holds(node.value, words)
    if isinstance(node, ast.Assign):
        return any(_names_a_state(t) and holds(v, words) for t, v in _targets(node))
    if isinstance(node, ast.Dict):
        return sum(holds(k, words) for k in node.keys) >= 2
    return False


def state_spellings(source: str, words: frozenset[str]) -> list[str]:
    """``"line: code"`` of each place ``source`` compares, writes or keys a table by a state word."""
    found = sorted({(n.lineno, ast.unparse(n)[:120]) for n in ast.walk(ast.parse(source)) if _hit(n, words)})
    return [f"{line}: {code}" for line, code in found]


def test_the_state_words_come_from_the_home():
    assert {"queued", "running", "done", "failed", "cancelled", "skipped", "unreadable", "open"} <= state_words()


def test_no_state_word_is_spelled_outside_its_home():
    words = state_words()
    found = {}
    for path in sorted(SRC.rglob("*.py")):
        if any(path == e or e in path.parents for e in EXEMPT):
            continue
        hits = state_spellings(path.read_text(), words)
        if hits:
            found[str(path.relative_to(SRC))] = hits
    assert not found, f"fleet states spelled outside results_db/states.py (read RunState/JobState's members): {found}"


def test_a_spelled_state_is_found(tmp_path):
    """The check can fail: each form it looks for is found; the same words that decide no state are not."""
    words = state_words()
    module = tmp_path / "states.py"
    module.write_text(
        "def f(run, d, s, job_id):\n"
        '    if run.state == "running":\n'
        "        return 1\n"
        '    if d["state"] in ("done", "failed"):\n'
        "        return 2\n"
        '    COLOURS = {"queued": "dim", "done": "green"}\n'
        '    s.execute(update(FleetJob).values(state="cancelled"))\n'
        '    run.state, run.reason = "skipped", "none of its engines"\n'
        "    match run.state:\n"
        '        case "unreadable":\n'
        "            return 3\n"
        '    return RunState(d["state"]) != "open"\n'
    )
    found = state_spellings(module.read_text(), words)
    assert [hit.split(":")[0] for hit in found] == ["2", "4", "6", "7", "8", "9", "12"], found
    quiet = tmp_path / "quiet.py"
    quiet.write_text(
        '"""A run reads ``failed`` once its agent is lost."""\n'
        "def g(trial, run, fields):\n"
        '    record = {"skipped": [], "reason": "the job was cancelled"}\n'
        '    if trial.status == "failed" or run.state == RunState.DONE:\n'
        '        return {"failed": 1, "ok": 2}[trial.status], record, fields.get("skipped")\n'
    )
    assert state_spellings(quiet.read_text(), words) == []
