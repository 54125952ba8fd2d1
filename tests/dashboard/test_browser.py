"""End to end: ``autodeploy dashboard`` on a free localhost port, every page in headless Chromium.

Chromium is Debian's ``chromium`` package (``apt-get install chromium``; ``.ci/run`` installs
it), driven by Playwright's Python package through ``executable_path``: Playwright's own
browser downloads are never used. Without either, the tests skip and say which is missing.

One server serves every page; each test opens one page, checks something only that page
draws (read from the browser's DOM: Plotly's SVG text, Streamlit's alerts and captions), and
saves a screenshot to ``$AUTODEPLOY_SCREENSHOTS`` (default: ``tests/dashboard/artifacts/``,
git-ignored).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.dashboard.conftest import STUDY, artifacts_dir

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]  # fmt: skip
START_TIMEOUT_S = 90
WAIT_MS = 60_000
SCREENSHOTS_ENV = "AUTODEPLOY_SCREENSHOTS"


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


@pytest.fixture(scope="module")
def browser(study_db, tmp_path_factory) -> Iterator[tuple[object, int]]:
    """The dashboard on the study store, and a headless Chromium: (browser, port)."""
    if not CHROMIUM.is_file():
        pytest.skip(f"no Chromium at {CHROMIUM}: install Debian's package (apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright (the Python package only)")
    pytest.importorskip("streamlit", reason="pip install 'autodeploy[dashboard]'")
    port, log = _free_port(), tmp_path_factory.mktemp("browser") / "dashboard.log"
    cmd = [sys.executable, "-m", "autodeploy", "dashboard", "--db", study_db.url, "--port", str(port)]
    with open(log, "w") as out:
        # `autodeploy dashboard` replaces itself with the Streamlit server: this pid is the server.
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_healthy(proc, port, log)
        with sync_api.sync_playwright() as p:
            chromium = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
            try:
                yield chromium, port
            finally:
                chromium.close()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # the session this fixture started (server and any children)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def _screenshot_dir() -> Path:
    folder = os.environ.get(SCREENSHOTS_ENV)
    if not folder:
        return artifacts_dir()
    path = Path(folder)
    path.mkdir(parents=True, exist_ok=True)
    return path


def _shown(locator) -> bool:
    """Wait until the first match is visible (Streamlit draws elements as the script reaches them)."""
    locator.first.wait_for(state="visible", timeout=WAIT_MS)
    return True


def _svg_texts(page, selector: str) -> list[str]:
    return [t.strip() for t in page.locator(selector).all_text_contents()]


def _top_tick(plot) -> str:
    """The topmost y tick label of a Plotly chart, by where the browser drew it (the DOM order is not the axis order)."""
    ticks = plot.locator("g.ytick text")
    ticks.first.wait_for(timeout=WAIT_MS)
    drawn = [(ticks.nth(i).bounding_box()["y"], ticks.nth(i).text_content().strip()) for i in range(ticks.count())]
    return min(drawn)[1]


def _overview(page, db) -> None:
    assert _shown(page.get_by_text(db.summary.winner.label, exact=True))  # the winner, in the success box
    assert _shown(page.get_by_role("button", name="Download the study's trials (CSV)"))


def _winners(page, db) -> None:
    top = _top_tick(page.locator(".js-plotly-plot").first)
    assert top.startswith(db.summary.winner.label) and "★ winner" in top  # winner on top, marked
    assert any("ORT fp32 default" in t for t in _svg_texts(page, ".js-plotly-plot g.ytick text"))  # baseline named
    assert _shown(page.get_by_text("Per model × device and objective"))


def _compare(page, db) -> None:
    heatmap = page.locator(".js-plotly-plot").first
    heatmap.locator("g.ytick text").first.wait_for(timeout=WAIT_MS)
    assert set(_svg_texts(heatmap, "g.ytick text")) == set(db.engines)
    assert set(_svg_texts(heatmap, "g.xtick text")) == set(db.precisions)
    assert "★ winner" in _svg_texts(heatmap, "g.annotation text")
    top = _top_tick(page.locator(".js-plotly-plot").nth(1))
    assert top.startswith(db.summary.winner.label) and "★ winner" in top
    assert _shown(page.get_by_text(f"ranked as study {STUDY} ranked them"))
    assert "✗ rejected" in _svg_texts(heatmap, "text")  # the int8 cell, greyed: no int8 config met the budget


def _pareto(page, db) -> None:
    page.locator(".js-plotly-plot g.annotation text").first.wait_for(timeout=WAIT_MS)
    notes = _svg_texts(page, ".js-plotly-plot g.annotation text")
    assert "accuracy budget 1.00%" in notes
    assert any(t.endswith("%") for t in _svg_texts(page, ".js-plotly-plot g.ytick text"))  # accuracy axis in %
    assert _shown(page.get_by_text("Rejected configs"))


def _trials(page, db) -> None:
    page.locator(".js-plotly-plot").first.wait_for(timeout=WAIT_MS)
    assert _shown(page.get_by_text("Computed from only"))  # the caveat of a short study
    assert _shown(page.get_by_text("Parameter importance (fANOVA, from"))


def _devices(page, db) -> None:
    assert _shown(page.get_by_text("measured on 2 device fingerprints"))
    page.locator(".js-plotly-plot text.legendtext").first.wait_for(timeout=WAIT_MS)
    assert any("Second Test CPU" in t for t in _svg_texts(page, ".js-plotly-plot text.legendtext"))
    assert "★ winner" in _svg_texts(page, ".js-plotly-plot text.bartext")  # the study's winner, on its bar


def _regressions(page, db) -> None:
    assert _shown(page.get_by_text("The regression gate has not run on this store"))


#: Each page: its URL path, its heading, and what only it draws.
PAGES: dict[str, tuple[str, Callable]] = {
    "overview": ("", _overview),
    "winners": ("winners", _winners),
    "compare": ("compare", _compare),
    "pareto": ("pareto", _pareto),
    "trials": ("trials", _trials),
    "devices": ("devices", _devices),
    "regressions": ("regressions", _regressions),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(PAGES))
def test_every_page_in_headless_chromium(browser, study_db, name):
    chromium, port = browser
    path, check = PAGES[name]
    page = chromium.new_page(viewport={"width": 1600, "height": 2400})  # Streamlit scrolls inside: a tall view
    try:
        page.goto(f"http://127.0.0.1:{port}/{path}", timeout=WAIT_MS)
        page.get_by_role("heading", name=name.capitalize()).wait_for(timeout=WAIT_MS)
        check(page, study_db)
        page.locator("[data-testid='stStatusWidget']").wait_for(state="hidden", timeout=WAIT_MS)  # script done
        assert not page.locator("[data-testid='stException']").count(), "the page raised"
        page.wait_for_timeout(1000)  # let the charts finish drawing for the screenshot
        shot = _screenshot_dir() / f"{name}.png"
        page.screenshot(path=str(shot))
        assert shot.stat().st_size > 10_000
    finally:
        page.close()
