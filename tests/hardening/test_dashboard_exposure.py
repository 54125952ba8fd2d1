"""The served dashboard (issue 28, case 5): a foreign Host is refused; names from the store are text, never Markdown."""

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


def _get(port, path, host, headers=()):
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.putrequest("GET", path, skip_host=True)
        for name, value in (("Host", host), *headers):
            conn.putheader(name, value)
        conn.endheaders()
        return conn.getresponse().status
    finally:
        conn.close()


@pytest.mark.slow
def test_the_served_dashboard_refuses_a_foreign_host(tmp_path):
    """DNS rebinding: a page on evil.example resolving to 127.0.0.1 must not reach the dashboard."""
    import os
    import signal
    import socket
    import subprocess
    import time

    from autodeploy.cli.dashboard import server_argv
    from autodeploy.dashboard import DB_ENV
    from autodeploy.results_db import Store

    url = f"sqlite:///{tmp_path / 'r.db'}"
    Store.open(url).close()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = subprocess.Popen(server_argv(port), env={**os.environ, DB_ENV: url}, cwd=tmp_path, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while True:  # bounded wait for the server to listen
            assert proc.poll() is None and time.monotonic() < deadline, "the dashboard did not start"
            try:
                if _get(port, "/_stcore/health", f"127.0.0.1:{port}") == 200:
                    break
            except OSError:
                time.sleep(0.5)
        assert _get(port, "/_stcore/health", f"localhost:{port}") == 200
        assert _get(port, "/", "evil.example") == 400
        upgrade = (("Upgrade", "websocket"), ("Connection", "Upgrade"),
                   ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="), ("Sec-WebSocket-Version", "13"))  # fmt: skip
        ours = f"127.0.0.1:{port}"
        assert _get(port, "/_stcore/stream", ours, (("Origin", f"http://{ours}"), *upgrade)) == 101
        # The rebinding page's request: its own name as Host, and the matching Origin.
        assert _get(port, "/_stcore/stream", "evil.example", (("Origin", "http://evil.example"), *upgrade)) != 101
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
