"""The README's shell commands, for .ci/run to run as a user would (standard library only).

    python .ci/readme.py installs          every `pip install -e ...` line of the README's bash blocks
    python .ci/readme.py block "First run" the bash block under that heading, one command a line

Comments after `#` and a trailing `&& ...` are dropped, so `pip install -e '.[dev]' && python -m pytest`
counts as the install line `pip install -e '.[dev]'`.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def bash_blocks(text: str) -> list[tuple[str, list[str]]]:
    """(the heading above it, its command lines) for every ```bash block, in order."""
    blocks, heading, block = [], "", None
    for line in text.splitlines():
        if block is None and line.startswith("#"):
            heading = line.lstrip("#").strip()
        elif block is None and line.strip() == "```bash":
            block = []
        elif block is not None and line.strip() == "```":
            blocks.append((heading, block))
            block = None
        elif block is not None:
            command = re.sub(r"\s+#.*$", "", line).strip()
            if command and not command.startswith("#"):
                block.append(command)
    return blocks


def installs(text: str) -> list[str]:
    """The README's editable install lines, each once, in the order they first appear."""
    found = [c.split("&&")[0].strip() for _, block in bash_blocks(text) for c in block]
    return list(dict.fromkeys(c for c in found if c.startswith("pip install -e ")))


def main(argv: list[str]) -> int:
    text = README.read_text()
    if argv[:1] == ["installs"]:
        print("\n".join(installs(text)))
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
