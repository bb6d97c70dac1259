"""Tag and note edits from the dashboard: written to the SQLite file through engine.recorder,
and refused (with a 4xx, changing nothing) unless they come from the dashboard's own page."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from engine.recorder import NOTES_MAX_CHARS, Recorder
from tests.webui.hosts import TEST_HOSTS
from webui.app import create_app

RUN = "ab" * 16
OK = {"X-Psctl-Write": "1", "Origin": "http://testserver"}


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "experiments.db"
    recorder = Recorder(path, flush_interval_s=0.05, heartbeat_interval_s=0.05)
    try:
        recorder.start_run(RUN, "seed", {"lr": 0.1}, sync="async", workers=2, servers=1,
                           dataset="digits", started_at=1000.0)
    finally:
        recorder.close()
    return path


@pytest.fixture
def client(db: Path) -> TestClient:
    return TestClient(create_app(db, hosts=TEST_HOSTS))


def _rows(db: Path, sql: str) -> list[tuple[Any, ...]]:
    with sqlite3.connect(db) as raw:
        rows = raw.execute(sql).fetchall()
    raw.close()
    return rows


def test_tags_are_set_and_removed_in_the_file(client: TestClient, db: Path) -> None:
    got = client.put(f"/api/runs/{RUN}/tags", json={"set": {"a": "1", "b": "2"}}, headers=OK)
    assert got.status_code == 200, got.text
    assert got.json()["tags"] == {"a": "1", "b": "2"}
    got = client.put(f"/api/runs/{RUN[:8]}/tags", json={"remove": ["a"]}, headers=OK)
    assert got.json()["tags"] == {"b": "2"}
    assert _rows(db, "SELECT key, value FROM tags") == [("b", "2")]


def test_notes_are_written_to_the_file(client: TestClient, db: Path) -> None:
    got = client.put(f"/api/runs/{RUN}/notes", json={"notes": "diverged"}, headers=OK)
    assert got.status_code == 200, got.text
    assert got.json()["notes"] == "diverged"
    assert _rows(db, "SELECT notes FROM runs") == [("diverged",)]


@pytest.mark.parametrize(("headers", "status"), [
    ({}, 403),
    ({"X-Psctl-Write": "1", "Origin": "https://evil.example"}, 403),
    ({"X-Psctl-Write": "0"}, 403),
])
def test_cross_site_writes_are_refused(
    client: TestClient, db: Path, headers: dict[str, str], status: int
) -> None:
    assert client.put(f"/api/runs/{RUN}/notes", json={"notes": "x"},
                      headers=headers).status_code == status
    assert client.put(f"/api/runs/{RUN}/tags", json={"set": {"k": "v"}},
                      headers=headers).status_code == status
    assert _rows(db, "SELECT notes FROM runs") == [(None,)]
    assert _rows(db, "SELECT * FROM tags") == []


def test_a_form_post_body_is_refused(client: TestClient, db: Path) -> None:
    got = client.put(f"/api/runs/{RUN}/notes", content=b"notes=x", headers={
        **OK, "Content-Type": "application/x-www-form-urlencoded"})
    assert got.status_code == 415
    assert _rows(db, "SELECT notes FROM runs") == [(None,)]


@pytest.mark.parametrize(("path", "body", "status"), [
    ("notes", {"notes": "x" * (NOTES_MAX_CHARS + 1)}, 400),
    ("notes", {"notes": 3}, 400),
    ("notes", {"other": "x"}, 400),
    ("notes", [1], 400),
    ("tags", {"set": {"": "v"}}, 400),
    ("tags", {"set": {"k" * 65: "v"}}, 400),
    ("tags", {"set": {"k": 1}}, 400),
    ("tags", {"remove": "k"}, 400),
    ("tags", {"set": {f"k{i}": "v" for i in range(65)}}, 400),
])
def test_bad_bodies_are_4xx_and_change_nothing(
    client: TestClient, db: Path, path: str, body: Any, status: int
) -> None:
    got = client.put(f"/api/runs/{RUN}/{path}", json=body, headers=OK)
    assert got.status_code == status, got.text
    assert _rows(db, "SELECT notes FROM runs") == [(None,)]
    assert _rows(db, "SELECT * FROM tags") == []


def test_unknown_run_and_bad_json(client: TestClient) -> None:
    assert client.put("/api/runs/ffffffff/notes", json={"notes": "x"},
                      headers=OK).status_code == 404
    got = client.put(f"/api/runs/{RUN}/notes", content=b"{nope", headers={
        **OK, "Content-Type": "application/json"})
    assert got.status_code == 400
