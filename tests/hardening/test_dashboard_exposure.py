"""The served dashboard (issue 28, case 5): names from the store are shown as text, never as Markdown."""

import pytest

pytest.importorskip("streamlit", reason="pip install 'autodeploy[dashboard]'")
pytest.importorskip("plotly", reason="pip install 'autodeploy[dashboard]'")

import autodeploy  # noqa: E402
from autodeploy.dashboard import cache  # noqa: E402
from autodeploy.harness.timing import TimingPolicy  # noqa: E402
from tests.dashboard.test_pages import open_page  # noqa: E402
from tests.models import mlp  # noqa: E402

FAST = TimingPolicy(warmup_min_calls=2, warmup_max_s=0.2, min_samples=10, min_duration_s=0.05, max_duration_s=2)
HOSTILE = "**bold** [click](javascript:alert(1)) :red[red] $x^2$ <b>"


def test_md_escapes_every_markdown_construct():
    assert cache.md("[a](javascript:x)") == r"\[a\]\(javascript\:x\)"
    assert cache.md("**b** :red[r] $x$ `c` # h") == r"\*\*b\*\* \:red\[r\] \$x\$ \`c\` \# h"
    assert cache.md("plain name 1") == "plain name 1"


@pytest.mark.parametrize("page", ["compare", "devices"])
def test_a_model_named_like_markdown_is_captioned_as_text(tmp_path, monkeypatch, page):
    url = f"sqlite:///{tmp_path / 'r.db'}"
    stored = autodeploy.bench(str(mlp(tmp_path / f"{HOSTILE}.onnx")), timing=FAST, timeout_s=120, db=url,
                              cache=tmp_path / "cache")  # fmt: skip
    assert stored.result.ok, stored.result.failure_message
    at = open_page(monkeypatch, url, page)
    shown = [c.value for c in at.caption] + [i.value for i in at.info]
    with_name = [text for text in shown if cache.md(HOSTILE) in text]
    assert with_name, shown
    assert not [text for text in shown if HOSTILE in text or "](" in text or "**" in text], shown
