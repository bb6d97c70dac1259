"""GET /api/runs/{run}/user-metrics: what the run's code logged (psctl.log), a series per
process, from rows the real recorder wrote (no training processes: the fast tier)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from engine.config import RunConfig
from engine.recorder import Recorder
from engine.wire.records import RunStatus, UserMetricRecord
from tests.webui.hosts import TEST_HOSTS
from webui.app import create_app

RUN, QUIET = "d1" * 16, "d2" * 16
ITERATIONS = 300


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    db = tmp_path_factory.mktemp("user-metrics-api") / "experiments.db"
    start = time.time() - 60
    recorder = Recorder(db)
    try:
        for run in (RUN, QUIET):
            recorder.start_run(run, "logged", RunConfig().to_json_dict(), sync="bsp", workers=2,
                               servers=1, dataset="digits", started_at=start)
            if run == RUN:
                recorder.record_user_metrics(
                    [UserMetricRecord(role="worker", rank=w, iteration=i, at=start + i / 10,
                                      name="grad_norm", value=w + i / ITERATIONS)
                     for w in (1, 0) for i in range(ITERATIONS)]
                    + [UserMetricRecord(role="evaluator", rank=0, iteration=step, at=start + 30,
                                        name="act/mean", value=0.5) for step in (10, 20)])
            recorder.finish(RunStatus.FINISHED)
    finally:
        recorder.close()
    with TestClient(create_app(db, hosts=TEST_HOSTS)) as test_client:
        test_client.started = start  # type: ignore[attr-defined]
        yield test_client


def test_each_metric_comes_with_a_series_per_process(client: TestClient) -> None:
    reply = client.get(f"/api/runs/{RUN}/user-metrics")
    assert reply.status_code == 200
    body = reply.json()
    assert (body["run_id"], body["status"]) == (RUN, "finished")
    assert body["started_at"] == pytest.approx(client.started)  # type: ignore[attr-defined]
    assert [m["name"] for m in body["metrics"]] == ["act/mean", "grad_norm"]
    [evaluator] = body["metrics"][0]["series"]
    assert (evaluator["role"], evaluator["iteration"], evaluator["value"]) == (
        "evaluator", [10.0, 20.0], [0.5, 0.5])
    workers = body["metrics"][1]["series"]
    assert [(s["role"], s["rank"], len(s["value"]), s["rows"]) for s in workers] == [
        ("worker", 0, ITERATIONS, ITERATIONS), ("worker", 1, ITERATIONS, ITERATIONS)]
    assert workers[1]["value"][:2] == [1.0, 1 + 1 / ITERATIONS]


def test_points_bound_each_series(client: TestClient) -> None:
    body = client.get(f"/api/runs/{RUN[:8]}/user-metrics", params={"points": 100}).json()
    for series in body["metrics"][1]["series"]:
        assert len(series["value"]) == 100 and series["rows"] == ITERATIONS
    for points in (9, 10**6, "x"):
        reply = client.get(f"/api/runs/{RUN}/user-metrics", params={"points": points})
        assert reply.status_code == 422, points


def test_a_run_that_logged_nothing_and_an_unknown_run(client: TestClient) -> None:
    assert client.get(f"/api/runs/{QUIET}/user-metrics").json()["metrics"] == []
    assert client.get(f"/api/runs/{'0' * 32}/user-metrics").status_code == 404
