"""The run page in real headless Chromium, while a real run is being recorded.

Debian's ``chromium`` is driven by PyPI's ``playwright`` (``.ci/run`` installs both; no browser
is downloaded). Every request that does not go to this machine is aborted.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine.db import open_engine
from engine.db.queries import list_runs
from engine.errors import StoreError
from tests.webui.chromium import ARTIFACTS, CHROMIUM, block_foreign

pytestmark = [
    pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed "
                       "(.ci/run installs it: apt-get install chromium)"),
    pytest.mark.timeout(180),
]


def _start_run(db: Path) -> subprocess.Popen[str]:
    # Long enough to watch (stopped by --max-seconds or by the test), small enough for 2 cores.
    args = ["launch", "--dataset", "digits", "--workers", "2", "--servers", "1", "--epochs",
            "400", "--batch-size", "16", "--max-seconds", "40", "--name", "browser-run",
            "--no-live"]
    env = dict(os.environ, PSCTL_DB=str(db), NO_COLOR="1")
    return subprocess.Popen([sys.executable, "-m", "psctl", *args], env=env, text=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _wait_for_iterations(db: Path, proc: subprocess.Popen[str], timeout_s: float = 60) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else "launch exited"
        if db.exists():
            try:
                engine = open_engine(db, readonly=True)
                runs = list_runs(engine)
                engine.dispose()
            except StoreError:
                runs = []
            if runs and runs[0].iterations > 0:
                return runs[0].id
        time.sleep(0.2)
    raise AssertionError("the run recorded no iteration in time")


def _assert_charts_labelled(page: object) -> None:
    """Every chart shown has a title and both axis titles (plotly draws them as SVG text); a
    card that does not apply to the run (ElasticBSP for an asp run) is hidden, not empty."""
    labels = page.evaluate(  # type: ignore[attr-defined]
        """() => [...document.querySelectorAll('.chart')].filter((c) => !c.closest('[hidden]'))
          .map((c) => ({
            id: c.id,
            title: c.querySelector('.gtitle')?.textContent || '',
            x: c.querySelector('.xtitle')?.textContent || '',
            y: c.querySelector('.ytitle')?.textContent || ''}))""")
    assert len(labels) >= 5, labels
    for chart in labels:
        assert chart["title"] and chart["x"] and chart["y"], chart


def _assert_fits_narrow_window(page: object) -> None:
    """At phone width nothing scrolls sideways and every chart shrinks to the window."""
    width = 400
    page.set_viewport_size({"width": width, "height": 800})  # type: ignore[attr-defined]
    page.wait_for_function(  # type: ignore[attr-defined]
        f"[...document.querySelectorAll('.chart .main-svg')]"
        f".every((svg) => svg.getBoundingClientRect().width <= {width})", timeout=10_000)
    overflow = page.evaluate(  # type: ignore[attr-defined]
        "document.documentElement.scrollWidth - window.innerWidth")
    assert overflow <= 0, f"the page scrolls sideways by {overflow} px at {width} px wide"


def test_run_page_receives_points_live(tmp_path: Path) -> None:
    from playwright.sync_api import sync_playwright

    from webui.server import BackgroundServer

    db = tmp_path / "experiments.db"
    proc = _start_run(db)
    server = BackgroundServer(db, port=0)
    try:
        base = server.start()
        run_id = _wait_for_iterations(db, proc)
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            page.route("**/*", block_foreign)
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(f"{base}/runs/{run_id}")
            page.wait_for_selector("body[data-complete='1']", timeout=30_000)
            page.evaluate("window.__sameDocument = true")
            first = page.evaluate("window.__psctl.latestT")
            points = int(page.get_attribute("#chart-thr", "data-points") or 0)
            page.wait_for_function(f"window.__psctl.latestT > {first}", timeout=15_000)
            page.wait_for_function(
                f"Number(document.querySelector('#chart-thr').dataset.points) > {points}",
                timeout=15_000)
            assert page.evaluate("window.__sameDocument") is True  # no reload happened
            assert page.inner_text("#live-badge") == "live"
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "dashboard-live.png"), full_page=True)
            _assert_charts_labelled(page)
            _assert_fits_narrow_window(page)
            page.screenshot(path=str(ARTIFACTS / "dashboard-narrow.png"), full_page=True)
            # The runs page is pushed the list over its websocket (no polling).
            page.goto(base)
            page.wait_for_selector("body[data-live='1'] #runs-table a", timeout=15_000)
            assert "browser-run" in page.inner_text("#runs-table")
            browser.close()
        assert errors == []
    finally:
        server.stop()
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=30)
