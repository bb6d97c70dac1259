"""A real ElasticBSP run on the dashboard: its barriers, predicted against actual wait.

One small elastic run (3 workers, one of them 10x slow, so barriers really wait) is recorded
once for the module; the API, the websocket snapshot and the page in headless Chromium are
checked against its ``syncs`` rows.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tests.conftest import psctl
from tests.webui.hosts import TEST_HOSTS
from webui.app import create_app

CHROMIUM = shutil.which("chromium")


@pytest.fixture(scope="module")
def elastic_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("elastic") / "experiments.db"
    done = psctl("launch", "--dataset", "digits", "--workers", "3", "--servers", "2",
                 "--epochs", "2", "--sync", "elastic", "--lookahead", "6", "--straggler",
                 "2:10x", "--name", "elastic-run", "--no-live", db=db)
    assert done.returncode == 0, done.stderr
    return db


def test_barriers_reach_the_api_and_the_snapshot(elastic_db: Path) -> None:
    client = TestClient(create_app(elastic_db, hosts=TEST_HOSTS))
    syncs = client.get("/api/runs/@last/syncs").json()
    released = [s for s in syncs if s["released_at"] is not None]
    assert len(released) >= 2
    # Sync 0 only watches; later ones were predicted, and every released one has a real wait.
    assert syncs[0]["sync_index"] == 0 and all(len(s["chosen"]) == 3 for s in syncs)
    assert all(s["actual_wait"] >= 0 for s in released)
    assert any(s["predicted"] for s in released[1:])
    run_id = client.get("/api/runs").json()[0]["id"]
    with client.websocket_connect(f"/ws/runs/{run_id}") as ws:
        snap = ws.receive_json()
        ws.send_json({"type": "painted"})  # the staleness histogram, then the timeline follow
        assert ws.receive_json()["type"] == "staleness"
        timeline = ws.receive_json()
    assert [s["sync_index"] for s in snap["syncs"]] == [s["sync_index"] for s in syncs]
    assert timeline["type"] == "timeline"
    first = min(r["started_at"] for r in timeline["timeline"])
    assert all(s["released_at"] >= first for s in released)  # every barrier in the timeline


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed")
@pytest.mark.timeout(120)
def test_page_marks_barriers_and_plots_their_waits(elastic_db: Path) -> None:
    from playwright.sync_api import sync_playwright

    from webui.server import BackgroundServer

    client = TestClient(create_app(elastic_db, hosts=TEST_HOSTS))
    syncs = client.get("/api/runs/@last/syncs").json()
    released = sum(s["released_at"] is not None for s in syncs)
    predicted = sum(bool(s["predicted"]) and s["actual_wait"] is not None for s in syncs)
    server = BackgroundServer(elastic_db, port=0)
    base = server.start()
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(f"{base}/runs/@last")
            page.wait_for_selector("body[data-complete='1']", timeout=30_000)
            timeline = page.locator("#chart-timeline")
            assert int(timeline.get_attribute("data-barriers") or 0) == released
            assert page.locator("#chart-timeline .shapelayer path").count() >= released
            elastic = page.locator("#chart-elastic")
            assert int(elastic.get_attribute("data-points") or 0) == predicted
            assert "predicted wait" in elastic.inner_text()
            browser.close()
        assert errors == []
    finally:
        server.stop()
