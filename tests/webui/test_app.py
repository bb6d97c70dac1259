from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient

from webui.app import create_app


def test_api_lists_and_shows_runs(seeded_db: Path) -> None:
    client = TestClient(create_app(seeded_db))
    runs = client.get("/api/runs").json()
    assert [run["name"] for run in runs] == ["seed-run"]
    detail = client.get("/api/runs/@last").json()
    assert detail["summary"]["id"] == runs[0]["id"]
    assert client.get("/api/runs/unknown").status_code == 404


def test_missing_database_is_503(tmp_path: Path) -> None:
    client = TestClient(create_app(tmp_path / "none.db"))
    assert client.get("/api/runs").status_code == 503
