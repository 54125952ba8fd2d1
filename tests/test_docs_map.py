"""docs/architecture.md is the map of the code (issue 38): every module is in its "Map", every room in its "Layers".

A room is a top-level module or a sub-package of ``autodeploy`` (``tests/test_import_graph.py`` stacks them by
their imports). A module added without a line in the map, or a room without a row, fails here, and so does a
line for a module that no longer exists.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "autodeploy"
DOC = ROOT / "docs" / "architecture.md"


def section(text: str, title: str) -> str:
    """The text under ``## title`` up to the next ``## `` heading."""
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def mapped(text: str) -> list[str]:
    """The module paths the map's table names, one per row, in order."""
    return re.findall(r"^\| `([\w/]+\.py)` \|", section(text, "Map: every module"), flags=re.MULTILINE)


def modules(package: Path = PACKAGE) -> set[str]:
    """Every module the map must name: all but package ``__init__``s, ``__main__`` and the migrations' versions."""
    found = set()
    for path in package.rglob("*.py"):
        rel = path.relative_to(package).as_posix()
        if path.name == "__init__.py" or rel == "__main__.py" or "/migrations/versions/" in rel:
            continue
        found.add(rel)
    return found


def rooms(package: Path = PACKAGE) -> set[str]:
    """Every room: ``name.py`` for a top-level module, ``name/`` for a sub-package."""
    found = {p.name for p in package.glob("*.py") if p.name not in ("__init__.py", "__main__.py")}
    return found | {f"{p.name}/" for p in package.iterdir() if (p / "__init__.py").exists()}


def layered(text: str) -> set[str]:
    """The rooms the "Layers" table names in its "where" column."""
    where = [row.split("|")[2] for row in section(text, "Layers").splitlines() if row.startswith("| ")]
    return {name for cell in where for name in re.findall(r"`([\w/]+(?:\.py|/))`", cell)}


def test_every_module_has_one_line_in_the_map_and_every_line_a_module():
    text = DOC.read_text()
    lines = mapped(text)
    missing = sorted(modules() - set(lines))
    assert not missing, f"modules without a line in docs/architecture.md's Map (add one): {missing}"
    gone = sorted(set(lines) - modules())
    assert not gone, f"the Map names modules that no longer exist (remove or rename them): {gone}"
    twice = sorted({m for m in lines if lines.count(m) > 1})
    assert not twice, f"the Map names these twice: {twice}"


def test_every_room_has_a_row_in_the_layers_table():
    missing = sorted(rooms() - layered(DOC.read_text()))
    assert not missing, f"rooms without a row in docs/architecture.md's Layers table: {missing}"


def test_the_checks_catch_a_new_module_and_a_stale_line(tmp_path):
    package = tmp_path / "autodeploy"
    (package / "sub").mkdir(parents=True)
    for name in ("__init__.py", "a.py", "sub/__init__.py", "sub/b.py"):
        (package / name).write_text("")
    text = (
        "# x\n\n## Layers\n\n| layer | where | owns |\n|---|---|---|\n| one | `a.py` | it |\n\n"
        "## Map: every module\n\n| module | what |\n|---|---|\n| `a.py` | it |\n| `gone.py` | was |\n\n## Next\n"
    )
    assert modules(package) - set(mapped(text)) == {"sub/b.py"}  # a new module without a line
    assert set(mapped(text)) - modules(package) == {"gone.py"}  # a line for a module that went
    assert rooms(package) - layered(text) == {"sub/"}  # a new room without a row
