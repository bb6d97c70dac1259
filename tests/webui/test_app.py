from __future__ import annotations

import json
import re
import shutil
import sqlite3
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tests.webui.hosts import TEST_HOSTS
from webui.app import create_app


@pytest.fixture(scope="module")
def client(seeded_db: Path) -> TestClient:
    return TestClient(create_app(seeded_db, hosts=TEST_HOSTS))


def test_api_lists_and_shows_runs(client: TestClient) -> None:
    runs = client.get("/api/runs").json()
    assert [run["name"] for run in runs] == ["seed-run"]
    detail = client.get("/api/runs/@last").json()
    assert detail["summary"]["id"] == runs[0]["id"]
    assert client.get("/api/runs/unknown").status_code == 404
    assert client.get("/api/runs?status=bogus").status_code == 400


def test_missing_database_is_503(tmp_path: Path) -> None:
    client = TestClient(create_app(tmp_path / "none.db", hosts=TEST_HOSTS))
    assert client.get("/api/runs").status_code == 503


def test_metric_series_counts_every_row(client: TestClient) -> None:
    total = client.get("/api/runs/@last").json()["totals"]["iterations"]
    body = client.get("/api/runs/@last/series/throughput").json()
    assert body["unit"] == "samples/s" and body["points_total"] == total
    assert set(body["series"]) == {"all", "worker 0", "worker 1"}
    assert 0 < body["points_shown"] <= total
    # The buckets partition the rows: nothing summarised twice, nothing left out.
    loss = client.get("/api/runs/@last/series/loss?max_points=10").json()
    assert len(loss["series"]["worker 0"]["t"]) <= 11
    acc = client.get("/api/runs/@last/series/accuracy").json()
    assert acc["points_shown"] >= 1 and all(0 <= a <= 1 for a in acc["series"]["all"]["accuracy"])
    assert client.get("/api/runs/@last/series/nope").status_code == 404


def test_since_returns_only_the_tail(client: TestClient) -> None:
    # The narrowest buckets: the seed run may last well under a second.
    full = client.get("/api/runs/@last/series/throughput?width=0.25").json()
    times = full["series"]["all"]["t"]
    tail = client.get(f"/api/runs/@last/series/throughput?since={times[-1]}"
                      f"&width={full['width']}").json()
    assert 1 <= len(tail["series"]["all"]["t"]) < len(times)


def test_downloads_are_full_fidelity(client: TestClient) -> None:
    total = client.get("/api/runs/@last").json()["totals"]["iterations"]
    csv_text = client.get("/api/runs/@last/iterations.csv").text
    assert len(csv_text.strip().splitlines()) == total + 1
    rows = client.get("/api/runs/@last/series/staleness/full.json").json()
    assert len(rows) == total and {"worker", "iteration", "staleness"} <= set(rows[0])
    assert client.get("/api/runs/@last/iterations.xml").status_code == 404


def test_events_syncs_and_staleness(client: TestClient) -> None:
    kinds = {e["kind"] for e in client.get("/api/runs/@last/events").json()}
    assert "worker_done" in kinds
    assert client.get("/api/runs/@last/syncs").json() == []  # BSP: no ElasticBSP barriers
    hist = client.get("/api/runs/@last/staleness").json()
    assert sum(h["count"] for h in hist) == client.get("/api/runs").json()[0]["iterations"]


def test_pages_and_plotly_are_served_locally(client: TestClient) -> None:
    page = client.get("/runs/@last")
    assert page.status_code == 200 and "/vendor/plotly.min.js" in page.text
    assert not re.search(r"https?://", page.text.split("<body>")[0])  # nothing from elsewhere
    assert client.get("/vendor/plotly.min.js").status_code == 200
    assert client.get("/").status_code == 200
    assert client.get("/compare?runs=@last").status_code == 200
    assert "/api/runs/{selector}/series/{metric}" in client.get("/openapi.json").json()["paths"]


def test_websocket_sends_snapshot_then_staleness(client: TestClient) -> None:
    run_id = client.get("/api/runs").json()[0]["id"]
    with client.websocket_connect(f"/ws/runs/{run_id}") as ws:
        snap = ws.receive_json()
        assert snap["type"] == "snapshot" and snap["summary"]["id"] == run_id
        assert sum(r[2] for r in snap["records"] if r[0] >= 0) == snap["total_rows"]
        ws.send_json({"type": "painted"})  # the histogram waits for the first charts
        assert ws.receive_json()["type"] == "staleness"


def test_pages_render_from_the_top_level_templates_folder(client: TestClient) -> None:
    from tests.conftest import REPO
    from webui.app import templates_dir

    assert templates_dir() == REPO / "templates"
    assert not (REPO / "webui" / "templates").exists()
    page = client.get("/runs/@last").text
    assert "window.__psctlEarly" in page and "/static/run.js" in page  # run.html over base.html


def test_syncs_are_decoded(seeded_db: Path, tmp_path: Path) -> None:
    db = tmp_path / "copy.db"
    shutil.copy(seeded_db, db)
    with sqlite3.connect(db) as conn:
        run_id = conn.execute("SELECT id FROM runs").fetchone()[0]
        conn.execute("INSERT INTO syncs VALUES (?, 0, 1.0, 'mean', 4, ?, ?, ?, ?, 0.02, ?, 0.03, "
                     "2.0)", (run_id, "[3, 4]", "[[1.1], [1.2]]", "[1, 0]", "[4, 4]",
                              json.dumps([1.9, 1.93])))
    syncs = TestClient(create_app(db, hosts=TEST_HOSTS)).get(f"/api/runs/{run_id}/syncs").json()
    assert syncs[0]["predicted"] == [[1.1], [1.2]] and syncs[0]["actual_wait"] == 0.03


def test_runs_are_pushed_over_a_websocket(client: TestClient) -> None:
    listed = client.get("/api/runs").json()
    with client.websocket_connect("/ws/runs") as ws:
        message = ws.receive_json()
    assert message["type"] == "runs" and [r["id"] for r in message["runs"]] == [
        r["id"] for r in listed]
