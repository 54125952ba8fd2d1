"""End to end: ``autodeploy dashboard`` on a free localhost port, the compare page in headless Chromium.

Chromium is Debian's ``chromium`` package (``apt-get install chromium``; ``.ci/run`` installs
it), driven by Playwright's Python package through ``executable_path``: Playwright's own
browser downloads are never used. Without either, the test skips and says which is missing.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.dashboard.conftest import artifacts_dir

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]  # fmt: skip
START_TIMEOUT_S = 90


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_healthy(proc: subprocess.Popen, port: int, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"the dashboard exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    pytest.fail(f"the dashboard did not answer within {START_TIMEOUT_S} s:\n{log.read_text()[-3000:]}")


@pytest.mark.slow
def test_compare_page_in_headless_chromium(study_db, tmp_path):
    if not CHROMIUM.is_file():
        pytest.skip(f"no Chromium at {CHROMIUM}: install Debian's package (apt-get install chromium)")
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="pip install playwright (the Python package only)"
    )
    pytest.importorskip("streamlit", reason="pip install 'autodeploy[dashboard]'")
    port, log = _free_port(), tmp_path / "dashboard.log"
    cmd = [sys.executable, "-m", "autodeploy", "dashboard", "--db", study_db.url, "--port", str(port)]
    with open(log, "w") as out:
        # `autodeploy dashboard` replaces itself with the Streamlit server: this pid is the server.
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_healthy(proc, port, log)
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 2200})
                page.goto(f"http://127.0.0.1:{port}/compare", timeout=60_000)
                page.get_by_role("heading", name="Compare").wait_for(timeout=60_000)
                heatmap = page.locator(".js-plotly-plot").first
                heatmap.locator("g.ytick text").first.wait_for(timeout=60_000)
                engines = {t.strip() for t in heatmap.locator("g.ytick text").all_text_contents()}
                precisions = {t.strip() for t in heatmap.locator("g.xtick text").all_text_contents()}
                assert engines == set(study_db.engines)
                assert precisions == set(study_db.precisions)
                assert page.get_by_text(f"engines: {', '.join(study_db.engines)}").is_visible()
                page.wait_for_timeout(1000)  # let the remaining charts finish drawing for the screenshot
                shot = artifacts_dir() / "compare.png"
                page.screenshot(
                    path=str(shot)
                )  # Streamlit scrolls inside the page: a tall viewport holds it all
                assert shot.stat().st_size > 10_000
            finally:
                browser.close()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # the session this test started (server and any children)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
