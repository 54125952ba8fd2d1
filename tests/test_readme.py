"""The README's commands that .ci/run runs on a fresh machine (.ci/readme.py finds them)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _readme_tool():
    spec = importlib.util.spec_from_file_location("ci_readme", ROOT / ".ci" / "readme.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_parser_finds_install_lines_and_a_block_by_heading():
    tool = _readme_tool()
    text = (
        "# x\n## Install\n```bash\npip install -e .   # core\npip install -e '.[dev]' && python -m pytest\n```\n"
        "## First run\nprose `pip install -e '.[nope]'`\n```bash\npip install -e '.[zoo]'\n# a comment\n"
        "autodeploy tune zoo:mlp\n```\n```python\npip install -e '.[python-block]'\n```\n"
    )
    assert tool.installs(text) == ["pip install -e .", "pip install -e '.[dev]'", "pip install -e '.[zoo]'"]
    blocks = dict(tool.bash_blocks(text))
    assert blocks["First run"] == ["pip install -e '.[zoo]'", "autodeploy tune zoo:mlp"]


def test_the_readme_gives_the_core_install_and_a_first_run_that_tunes_then_ships():
    tool = _readme_tool()
    text = (ROOT / "README.md").read_text()
    assert "pip install -e ." in tool.installs(text)  # the core install, which CI starts the CLI from
    first_run = dict(tool.bash_blocks(text))["First run"]
    assert first_run[0].startswith("pip install -e ")
    assert first_run[1].startswith("autodeploy tune ")
    assert any(line.startswith("autodeploy export ") for line in first_run)
    assert first_run[-1].startswith("autodeploy bundle run ")
