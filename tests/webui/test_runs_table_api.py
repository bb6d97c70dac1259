"""GET /api/table: every run with the metrics ``psctl compare --per-run --json`` prints, its
backend, tags and notes, filtered by any config key and grouped by any config key, run column or
tag; ended runs are measured once.

The database is written by the real recorder (no training processes), so this stays fast.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from engine.recorder import Recorder, set_notes
from tests.conftest import psctl
from tests.webui.hosts import TEST_HOSTS
from tests.webui.test_compare_api import GROUP, SOLO, seed_compare_db
from webui import runs_api
from webui.app import create_app
from webui.runs_api import TABLE_COLUMNS

LIVE = "c" * 32


@pytest.fixture(scope="module")
def recorded_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = seed_compare_db(tmp_path_factory.mktemp("runs-table") / "experiments.db")
    set_notes(db, SOLO, "lr too high?")
    return db


@pytest.fixture
def client(recorded_db: Path) -> Iterator[TestClient]:
    with TestClient(create_app(recorded_db, hosts=TEST_HOSTS),
                    raise_server_exceptions=False) as test_client:
        yield test_client


def _cli_rows(db: Path, *args: str) -> dict[str, dict[str, Any]]:
    done = psctl("compare", "--json", "--per-run", "--target", "0.97", *args, db=db, timeout=60)
    assert done.returncode == 0, done.stderr
    return {row["id"]: row for row in json.loads(done.stdout)}


def test_every_run_has_the_metrics_psctl_compare_prints(
    client: TestClient, recorded_db: Path
) -> None:
    body = client.get("/api/table").json()
    assert body["target"] == 0.97
    assert [r["id"] for r in body["rows"]] == [SOLO, *GROUP]  # oldest first, as compare
    expected = _cli_rows(recorded_db)
    for row in body["rows"]:
        assert row["values"] == {k: expected[row["id"]][k] for k in TABLE_COLUMNS}
        assert row["cells"]["best_accuracy"].endswith("%")
    solo = body["rows"][0]
    assert solo["notes"] == "lr too high?"
    assert solo["group"] is None and solo["tags"] == {}
    assert body["rows"][1]["group"] == "g1" and body["rows"][1]["tags"] == {"group": "g1"}
    # The solo run never reached 97 %; every run of the group did.
    assert solo["values"]["time_to_target_s"] is None
    assert all(r["values"]["time_to_target_s"] is not None for r in body["rows"][1:])
    assert "optimizer.lr" in body["config_keys"]


def test_a_config_key_filters_the_table(client: TestClient, recorded_db: Path) -> None:
    body = client.get("/api/table", params={"where": ["sync.model=asp"]}).json()
    assert [r["id"] for r in body["rows"]] == GROUP
    body = client.get("/api/table", params={"where": ["optimizer.lr=0.1", "tag.group=g1"]}).json()
    assert body["rows"] == [] and "matches" in body["message"]
    lower = client.get("/api/table", params={"target": 0.5}).json()
    assert lower["rows"][0]["values"]["time_to_target_s"] is not None
    assert lower["rows"][0]["values"] == {
        k: v for k, v in _cli_rows(recorded_db, "--target", "0.5")[SOLO].items()
        if k in TABLE_COLUMNS}


@pytest.mark.parametrize(("params", "status", "says"), [
    ({"where": "lr"}, 400, "KEY=VALUE"),
    ({"where": "no.such.key=1"}, 400, "no.such.key"),
    ({"where": "x=" + "y" * 300}, 422, "at most"),
    ({"where": [f"k{i}=1" for i in range(21)]}, 422, "where"),
    ({"target": "1.5"}, 422, "target"),
    ({"target": "nan"}, 422, "target"),
    ({"group_by": ""}, 422, "group_by"),
    ({"group_by": "k" * 201}, 422, "group_by"),
    ({"group_by": "no.such.key"}, 400, "no.such.key"),
    ({"group_by": "lr"}, 400, "group_by"),  # a leaf name is not enough: say optimizer.lr
    ({"group_by": "tag.nosuch"}, 400, "nosuch"),
])
def test_bad_parameters_get_a_short_4xx(
    client: TestClient, params: dict[str, Any], status: int, says: str
) -> None:
    got = client.get("/api/table", params=params)
    assert got.status_code == status, got.text
    assert says in got.json()["detail"]
    assert len(got.text) < 600


def test_rows_group_by_a_tag_with_the_settings_that_vary(client: TestClient) -> None:
    body = client.get("/api/table", params={"group_by": "tag.group"}).json()
    assert body["group_by"] == "tag.group" and "tag.group" in body["tag_keys"]
    by_id = {r["id"]: r for r in body["rows"]}
    assert [r["group_value"] for r in body["rows"]] == [None, "g1", "g1", "g1"]
    g1, rest = body["groups"]  # the largest group first
    assert (g1["value"], g1["label"], g1["runs"]) == ("g1", "g1", GROUP)
    # launch --repeat's runs differ in their seed only (their names are no setting).
    assert g1["varying"] == ["train.seed"] and g1["more_varying"] == 0
    assert [by_id[r]["config"] for r in GROUP] == [{"train.seed": n} for n in range(3)]
    assert (rest["value"], rest["runs"], rest["varying"]) == (None, [SOLO], [])
    assert all(r["backend"] == "local" for r in body["rows"])


@pytest.mark.parametrize(("key", "values"), [
    ("sync", {"bsp": [SOLO], "asp": GROUP}),  # a run column
    ("optimizer.lr", {0.1: [SOLO], 0.05: GROUP}),  # a config key: the raw number
    ("train.seed", {0: [SOLO, GROUP[0]], 1: [GROUP[1]], 2: [GROUP[2]]}),
])
def test_rows_group_by_a_run_column_or_config_key(
    client: TestClient, key: str, values: dict[Any, list[str]]
) -> None:
    body = client.get("/api/table", params={"group_by": key}).json()
    assert {g["value"]: g["runs"] for g in body["groups"]} == values
    assert sum(len(g["runs"]) for g in body["groups"]) == len(body["rows"])


def test_without_group_by_rows_have_no_group_fields(client: TestClient) -> None:
    body = client.get("/api/table").json()
    assert body["groups"] == [] and body["group_by"] is None
    assert all("group_value" not in r and "config" not in r for r in body["rows"])


def test_ended_runs_are_measured_once_and_live_runs_every_time(
    tmp_path: Path, recorded_db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "experiments.db"
    db.write_bytes(recorded_db.read_bytes())
    recorder = Recorder(db)  # a run still going: its metrics change between requests
    recorder.start_run(LIVE, "live", {"lr": 0.1}, sync="asp", workers=1, servers=1,
                       dataset="digits", started_at=2e9)
    measured: list[str] = []
    real = runs_api.run_metrics

    def counting(engine: Any, run_id: str, *, target: float | None = None) -> Any:
        measured.append(run_id)
        return real(engine, run_id, target=target)

    monkeypatch.setattr(runs_api, "run_metrics", counting)
    try:
        with TestClient(create_app(db, hosts=TEST_HOSTS)) as test_client:
            for _ in range(3):
                assert test_client.get("/api/table").status_code == 200
            test_client.get("/api/table", params={"target": 0.5})
    finally:
        recorder.close()
    ended = [SOLO, *GROUP]
    assert sorted(measured) == sorted(ended * 2 + [LIVE] * 4)


def test_an_empty_database_is_an_empty_table(tmp_path: Path) -> None:
    db = tmp_path / "experiments.db"
    Recorder(db).close()
    with TestClient(create_app(db, hosts=TEST_HOSTS)) as test_client:
        body = test_client.get("/api/table").json()
    assert body["rows"] == [] and "no runs" in body["message"]
