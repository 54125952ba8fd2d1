"""The README's shell commands, for .ci/run to run as a user would (standard library only).

    python .ci/readme.py installs          every `pip install -e ...` line of the README's bash blocks
    python .ci/readme.py block "First run" the bash block under that heading, one command a line

The README is read as a Markdown renderer shows it: a ```bash block inside an HTML comment (`<!--`
starting a line, to the line holding `-->`) is not shown and not run; a line inside any fenced block
(```python, ~~~ or a longer fence) is code, never a heading; a heading is `#` to `######` then a space.
Comments after `#` and a trailing `&& ...` are dropped, so `pip install -e '.[dev]' && python -m pytest`
counts as the install line `pip install -e '.[dev]'`. The smoke evals an install line, so one must be
exactly `pip install -e .` or `pip install -e '.[extra,...]'`: anything else (`;`, `$(...)`, a URL) is
an error, never run.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})\s*([^`\s]*)")  # an opening fence and the first word of its info
HEADING = re.compile(r"^ {0,3}(#{1,6})(?:\s+(.*?))?(?:\s+#+)?\s*$")  # ATX: `## Name`, never `#!` or `#x`
COMMENT = re.compile(r"^ {0,3}<!--")  # an HTML block (CommonMark type 2): hidden until the line with -->
INSTALL = re.compile(r"pip install -e (\.|'\.\[[A-Za-z0-9_,-]+\]')")


def bash_blocks(text: str) -> list[tuple[str, list[str]]]:
    """(the heading above it, its command lines) for every ```bash block a reader sees, in order."""
    blocks: list[tuple[str, list[str]]] = []
    # fence: the open fence's marker; block: its command lines if it is a bash block
    heading, fence, block, comment = "", "", None, False
    for line in text.splitlines():
        if comment:
            comment = "-->" not in line
        elif fence:
            if re.fullmatch(rf" {{0,3}}{fence[0]}{{{len(fence)},}}\s*", line):  # closed by a fence as long
                if block is not None:
                    blocks.append((heading, block))
                fence, block = "", None
            elif block is not None:
                command = re.sub(r"\s+#.*$", "", line).strip()
                if command and not command.startswith("#"):
                    block.append(command)
        elif opened := FENCE.match(line):
            fence, block = opened[1], [] if opened[2] == "bash" else None
        elif COMMENT.match(line):
            comment = "-->" not in line[line.index("<!--") + 4 :]
        elif titled := HEADING.match(line):
            heading = (titled[2] or "").strip()
    return blocks


def installs(text: str) -> list[str]:
    """The README's editable install lines, each once, in the order they first appear.

    Raises:
        ValueError: an install line is more than ``pip install -e .`` or ``pip install -e '.[extras]'``.
    """
    found = [c.split("&&")[0].strip() for _, block in bash_blocks(text) for c in block]
    lines = list(dict.fromkeys(c for c in found if c.startswith("pip install -e ")))
    for line in lines:
        if not INSTALL.fullmatch(line):
            raise ValueError(f"README.md install line {line!r} is not plain; fix: write it as "
                             "pip install -e . or pip install -e '.[extra,...]' (CI evals it)")  # fmt: skip
    return lines


def main(argv: list[str]) -> int:
    text = README.read_text()
    if argv[:1] == ["installs"]:
        try:
            print("\n".join(installs(text)))
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        return 0
    if len(argv) == 2 and argv[0] == "block":
        block = next((b for h, b in bash_blocks(text) if h == argv[1]), None)
        if block is None:
            print(f"error: README.md has no bash block under a heading '{argv[1]}'", file=sys.stderr)
            return 2
        print("\n".join(block))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
