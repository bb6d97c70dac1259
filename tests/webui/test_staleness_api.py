"""GET /api/runs/{run}/staleness: per worker, how many iterations saw each staleness, counted
from the rows the real recorder wrote (no training processes, so this stays in the fast tier)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from engine.config import RunConfig
from engine.recorder import Recorder
from engine.wire.records import IterationRecord, RunStatus
from tests.webui.hosts import TEST_HOSTS
from webui.app import create_app

RUN = "5e" * 16
# Per worker, the staleness of each iteration: uneven counts, so a count and a staleness
# swapped, or one worker's rows given to another, show.
STALENESS = {0: [0, 1, 0, 1, 0, 3, 0], 1: [2, 2, 0, 2, 5]}


def _iteration(worker: int, iteration: int, staleness: int, start: float) -> IterationRecord:
    return IterationRecord(worker=worker, iteration=iteration, epoch=0,
                           started_at=start + iteration, ended_at=start + iteration + 0.5,
                           compute_s=0.3, push_s=0.01, pull_s=0.01, wait_s=0.1,
                           staleness=staleness, loss=1.0, samples=8, bytes_sent=100,
                           bytes_received=100)


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    db = tmp_path_factory.mktemp("staleness-api") / "experiments.db"
    start = time.time() - 60
    recorder = Recorder(db)
    try:
        recorder.start_run(RUN, "stale", RunConfig().to_json_dict(), sync="asp",
                           workers=len(STALENESS), servers=1, dataset="digits", started_at=start)
        recorder.record_iterations([_iteration(w, i, s, start) for w, rows in STALENESS.items()
                                    for i, s in enumerate(rows)])
        recorder.finish(RunStatus.FINISHED)
    finally:
        recorder.close()
    with TestClient(create_app(db, hosts=TEST_HOSTS)) as test_client:
        yield test_client


def test_the_histogram_counts_each_worker_s_staleness(client: TestClient) -> None:
    expected = [{"worker": w, "staleness": s, "count": n}
                for w, rows in STALENESS.items() for s, n in sorted(Counter(rows).items())]
    body = client.get(f"/api/runs/{RUN}/staleness")
    assert body.status_code == 200
    assert body.json() == expected  # by worker, then by staleness


def test_an_unknown_run_has_no_histogram(client: TestClient) -> None:
    assert client.get(f"/api/runs/{'0' * 32}/staleness").status_code == 404
