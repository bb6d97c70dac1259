"""Every page of the dashboard at 1400 x 1000 in real headless Chromium, saved as a screenshot
into test-artifacts/ (for a person to look at), each checked for what a screenshot cannot
prove by itself: no script error, no request off this machine, nothing wider than the window.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engine.config import RunConfig
from engine.recorder import Recorder
from engine.wire.records import EvaluationRecord, IterationRecord, ProcessSample, RunStatus
from tests.webui.chromium import chromium, is_local, needs_chromium, screenshot
from tests.webui.test_compare_api import SOLO, seed_compare_db

SAMPLED = "f" * 32
pytestmark = [
    pytest.mark.integration,  # a server and a browser: not the fast tier
    needs_chromium,
    pytest.mark.timeout(240),
]
# page name -> (path, the selector that says the page has drawn everything)
PAGES = {
    "runs": ("/", "#runs-table tbody[data-rows='5']"),
    "run": (f"/runs/{SAMPLED}", "body[data-complete='1']"),
    "compare-runs": (f"/compare?runs={SOLO},{SAMPLED}", "body[data-painted='1']"),
    "compare-group": ("/compare?group=g1", "body[data-painted='1']"),
    "api-docs": ("/docs", ".swagger-ui .info"),
}


def _record_sampled(db: Path) -> None:
    """A finished run with CPU and memory samples of its four processes, so that the run
    page's system charts have something to draw."""
    start = time.time() - 120
    recorder = Recorder(db)
    try:
        recorder.start_run(SAMPLED, "sampled-ssp", RunConfig().to_json_dict(), sync="ssp",
                           workers=2, servers=1, dataset="digits", started_at=start)
        recorder.record_iterations([
            IterationRecord(worker=w, iteration=i, epoch=i // 50, started_at=start + i,
                            ended_at=start + i + 0.9, compute_s=0.6, push_s=0.05, pull_s=0.05,
                            wait_s=0.2 * w, staleness=i % 3, loss=2.0 / (1 + i), samples=32,
                            bytes_sent=8000, bytes_received=8000)
            for w in range(2) for i in range(100)])
        recorder.record_process_samples([
            ProcessSample(at=start + s, role=role, rank=rank, pid=100 + k,
                          cpu_percent=(40 + 25 * k + 10 * (s % 7)) % 100,
                          rss_bytes=(80 + 10 * k) * 2**20 + s * 2**16)
            for s in range(100)
            for k, (role, rank) in enumerate([("server", 0), ("worker", 0), ("worker", 1),
                                              ("evaluator", 0)])])
        for k in range(1, 11):
            recorder.record_evaluation(EvaluationRecord(
                at=start + 10 * k, elapsed_s=10.0 * k, step=20 * k, accuracy=0.5 + 0.045 * k,
                loss=1.0 / k, epoch=k // 5))
        recorder.finish(RunStatus.FINISHED)
    finally:
        recorder.close()


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from webui.server import BackgroundServer

    db = seed_compare_db(tmp_path_factory.mktemp("screenshots") / "experiments.db")
    _record_sampled(db)
    server = BackgroundServer(db, port=0)
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as launched:
        yield launched


@pytest.mark.parametrize("name", list(PAGES))
def test_every_page_renders_whole_at_1400_by_1000(browser: Any, base: str, name: str) -> None:
    path, drawn = PAGES[name]
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors: list[str] = []
    foreign: list[str] = []

    def local_only(route: Any) -> None:
        url = route.request.url
        if is_local(url):
            route.continue_()
        else:
            foreign.append(url)
            route.abort()

    page.route("**/*", local_only)
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    try:
        page.goto(base + path)
        page.wait_for_selector(drawn, timeout=60_000)
        page.wait_for_timeout(300)  # plotly's last relayout after the flag is set
        widths = page.evaluate(
            "() => [document.documentElement.scrollWidth, window.innerWidth]")
        screenshot(page, f"page-{name}.png")
    finally:
        page.close()
    assert errors == [] and foreign == []
    assert widths[0] <= widths[1], f"{name} is {widths[0]} px wide in a {widths[1]} px window"
