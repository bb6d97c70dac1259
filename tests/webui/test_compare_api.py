"""GET /api/compare: the rows are what ``psctl compare --json`` prints for the same arguments
(groups of repeated runs included), each run comes with its backend and clock (first iteration,
start-up, a resumed run's downtime), and malformed parameters get a short 4xx, never a 500.

The database is written by the real recorder (no training processes), so this stays fast.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from engine.config import RunConfig
from engine.recorder import Recorder, set_tags
from engine.wire.records import (
    EvaluationRecord,
    EventRecord,
    IterationRecord,
    RunStatus,
    UserMetricRecord,
)
from tests.conftest import psctl
from tests.webui.hosts import TEST_HOSTS
from webui.app import create_app

# A lone bsp run, then three asp runs of group g1 (launch --repeat 3 tags them so).
SOLO = "5" * 32
GROUP = ["a1" * 16, "a2" * 16, "a3" * 16]
RESUMED = "7e" * 16  # a simulated run killed and resumed (record_resumed)
# Sparse evaluations: the last of the solo run is the 88.1 % a smoothed line once drew as 63 %.
SOLO_ACCURACY = [0.31, 0.62, 0.881]
GROUP_ACCURACY = [[0.5, 0.9, 0.975, 0.98], [0.45, 0.85, 0.96, 0.972], [0.55, 0.92, 0.978, 0.985]]


def record_run(db: Path, run_id: str, name: str, *, sync: str, lr: float,
               accuracy: list[float], step_s: float, start: float, seed: int = 0,
               backend: str = "local") -> None:
    """One finished run of 60 iterations on each of 2 workers, evaluated ``len(accuracy)``
    times, spread evenly over its training."""
    config = RunConfig().to_json_dict()
    config["cluster"]["backend"] = backend
    config["optimizer"]["lr"] = lr
    config["sync"]["model"] = sync
    config["train"]["seed"] = seed
    recorder = Recorder(db)
    try:
        recorder.start_run(run_id, name, config, sync=sync, workers=2, servers=1,
                           dataset="digits", started_at=start)
        recorder.record_iterations([
            IterationRecord(worker=w, iteration=i, epoch=i // 20, started_at=start + i * step_s,
                            ended_at=start + (i + 1) * step_s, compute_s=step_s * 0.6,
                            push_s=0.01, pull_s=0.01, wait_s=step_s * 0.3, staleness=(i + w) % 3,
                            loss=2.0 / (1 + i), samples=16, bytes_sent=4000, bytes_received=4000)
            for w in range(2) for i in range(60)])
        span = 60 * step_s
        for k, acc in enumerate(accuracy, start=1):
            at = span * k / len(accuracy)
            recorder.record_evaluation(EvaluationRecord(at=start + at, elapsed_s=at, step=k * 15,
                                                        accuracy=acc, loss=1.0 - acc, epoch=k))
        recorder.finish(RunStatus.FINISHED)
    finally:
        recorder.close()


def seed_compare_db(db: Path) -> Path:
    """The solo run and the three runs of group g1 (seeds 0, 1, 2, as ``launch --repeat 3``
    makes them), finished, with sparse evaluations."""
    start = time.time() - 600
    record_run(db, SOLO, "solo-bsp", sync="bsp", lr=0.1, accuracy=SOLO_ACCURACY, step_s=0.5,
               start=start)
    for n, (run_id, accuracy) in enumerate(zip(GROUP, GROUP_ACCURACY, strict=True)):
        record_run(db, run_id, f"g1-{n}", sync="asp", lr=0.05, accuracy=accuracy,
                   step_s=0.3 + 0.05 * n, start=start + 60 * (n + 1), seed=n)
        set_tags(db, run_id, {"group": "g1"}, [])
    return db


@pytest.fixture(scope="module")
def recorded_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return seed_compare_db(tmp_path_factory.mktemp("compare-api") / "experiments.db")


@pytest.fixture(scope="module")
def client(recorded_db: Path) -> Iterator[TestClient]:
    # raise_server_exceptions=False: a bug must show up as the 500 a browser would get.
    with TestClient(create_app(recorded_db, hosts=TEST_HOSTS),
                    raise_server_exceptions=False) as test_client:
        yield test_client


def _cli_json(db: Path, *args: str) -> list[dict[str, object]]:
    done = psctl("compare", "--json", *args, db=db, timeout=60)
    assert done.returncode == 0, done.stderr
    rows: list[dict[str, object]] = json.loads(done.stdout)
    return rows


def test_rows_are_what_psctl_compare_json_prints(client: TestClient, recorded_db: Path) -> None:
    ids = [SOLO, *GROUP]
    body = client.get(f"/api/compare?runs={','.join(ids)}&target=0.97").json()
    assert body["rows"] == _cli_json(recorded_db, *ids, "--target", "0.97")
    # Three runs of one group: one row of means, with the run count and standard deviations.
    assert [r["id"] for r in body["rows"]] == [SOLO, "g1"]
    assert body["rows"][1]["runs"] == 3 and body["rows"][1]["best_accuracy_std"] is not None
    assert body["target"] == 0.97
    assert [c["key"] for c in body["columns"]] == list(body["rows"][0])
    assert {c["key"] for c in body["columns"]} >= {
        "time_to_target_s", "samples_per_s", "idle_fraction", "staleness_mean",
        "bytes_per_sample"}
    assert [(r["id"], r["group"]) for r in body["runs"]] == [
        (SOLO, None), *((g, "g1") for g in GROUP)]
    assert body["runs"][0]["name"] == "solo-bsp" and body["runs"][0]["sync"] == "bsp"


def test_cells_are_formatted_like_the_terminal_table(client: TestClient) -> None:
    body = client.get(f"/api/compare?runs={SOLO},{GROUP[0]}&target=0.9").json()
    solo = body["cells"][0]
    assert solo["id"] == SOLO[:8]
    assert solo["best_accuracy"] == "88.10%"
    assert solo["time_to_target_s"] == ""  # never reached: blank, never zero
    assert "best_accuracy_std" not in solo  # a deviation is written beside its mean
    grouped = client.get(f"/api/compare?runs={','.join(GROUP)}").json()
    assert " ± " in grouped["cells"][0]["best_accuracy"]


def test_where_baseline_and_per_run_match_the_cli(client: TestClient, recorded_db: Path) -> None:
    url = f"/api/compare?where=sync=asp&target=0.95&baseline={GROUP[0]}&per_run=true"
    rows = client.get(url).json()["rows"]
    assert rows == _cli_json(recorded_db, "--where", "sync=asp", "--target", "0.95",
                             "--baseline", GROUP[0], "--per-run")
    assert [r["id"] for r in rows] == GROUP and rows[0]["speedup"] == pytest.approx(1.0)


@pytest.mark.parametrize(("query", "status"), [
    ("runs=nosuchrun", 404),
    ("runs=" + ",".join(["x"] * 101), 422),
    ("runs=" + "a" * 300, 422),
    ("target=0", 422), ("target=1.5", 422), ("target=-0.1", 422), ("target=nan", 422),
    ("target=abc", 422),
    ("where=novalue", 400), ("where=bogus.key=1", 400), ("where=sync=none", 404),
    ("where=" + "k=" + "v" * 300, 422),
    ("&".join(["where=sync=asp"] * 21), 422),
    ("baseline=nosuchrun&target=0.9", 404), ("baseline=" + "b" * 300, 422),
    ("sort_by=nope", 400), ("top=-1", 422), ("top=" + "9" * 20, 422),
    ("metric=", 422), ("metric=" + "m" * 65, 422), ("metric=grad_norm", 400),
])
def test_bad_parameters_are_refused_briefly(client: TestClient, query: str, status: int) -> None:
    response = client.get(f"/api/compare?{query}")
    assert response.status_code == status, (query[:80], response.text[:300])
    detail = response.json()["detail"]
    assert isinstance(detail, str) and "\n" not in detail and len(detail) < 1000, detail


def test_an_ambiguous_selector_is_the_callers_to_fix(client: TestClient) -> None:
    response = client.get("/api/compare?runs=a")  # a prefix of all three group runs
    assert response.status_code == 400 and "a1" in response.json()["detail"]


def test_group_page_lists_the_runs_tagged_with_the_group(client: TestClient) -> None:
    page = client.get("/compare?group=g1")
    assert page.status_code == 200
    assert all(run_id in page.text for run_id in GROUP) and SOLO not in page.text
    assert client.get("/compare?group=nosuch").status_code == 404
    assert client.get("/compare?group=" + "g" * 300).status_code == 422


def test_each_run_has_its_backend_and_clock(client: TestClient, recorded_db: Path) -> None:
    # Per run and folded into a group's row alike: the group's runs are measured apart.
    for per_run in ("true", "false"):
        body = client.get(f"/api/compare?runs={SOLO},{GROUP[0]},{GROUP[1]}"
                          f"&per_run={per_run}").json()
        for run in body["runs"]:
            assert run["backend"] == "local" and run["downtime"] == []
            # The fixture's runs start their first iteration when they start.
            assert run["first_iteration_at"] == pytest.approx(run["started_at"])
            assert run["startup_s"] == pytest.approx(0.0)


def test_a_resumed_run_has_its_start_up_and_downtime(tmp_path: Path) -> None:
    db = tmp_path / "experiments.db"
    record_resumed(db, RESUMED, start=1_700_000_000.0)
    with TestClient(create_app(db, hosts=TEST_HOSTS)) as test_client:
        body = test_client.get(f"/api/compare?runs={RESUMED}").json()
        logged = test_client.get(f"/api/compare?runs={RESUMED}&metric=grad_norm").json()
    run = body["runs"][0]
    assert run["backend"] == "sim"
    assert run["startup_s"] == pytest.approx(5.0)
    assert run["first_iteration_at"] == pytest.approx(1_700_000_005.0)
    # Down from the last iteration before the kill to the first after the resume.
    [span] = run["downtime"]
    assert (span["start"], span["end"]) == (pytest.approx(1_700_000_035.0),
                                            pytest.approx(1_700_000_103.0))
    # A metric its model logged: its final and mean value, as `psctl compare --metric`.
    assert logged["rows"][0]["user.grad_norm.final"] == pytest.approx(1 / 60)
    assert logged["cells"][0]["user.grad_norm.mean"] != ""


def record_resumed(db: Path, run_id: str, *, start: float) -> None:
    """A simulated run with 5 s of start-up, 30 one-second iterations, killed, resumed at
    start + 100 and trained 30 s more (first new iteration at start + 103): evaluated at 50 %
    before the kill and 90 % after; its model logged ``grad_norm`` (psctl.log) every iteration,
    1 / (1 + iteration)."""
    config = RunConfig().to_json_dict()
    config["cluster"]["backend"] = "sim"
    config["sync"]["model"] = "asp"

    def rows(first: int, at: float) -> list[IterationRecord]:
        return [IterationRecord(worker=0, iteration=first + i, epoch=0, started_at=at + i,
                                ended_at=at + i + 1, compute_s=0.6, push_s=0.1, pull_s=0.1,
                                wait_s=0.2, staleness=1, loss=1.0 / (1 + first + i), samples=16,
                                bytes_sent=4000, bytes_received=4000) for i in range(30)]

    def logged(first: int, at: float) -> list[UserMetricRecord]:
        return [UserMetricRecord(role="worker", rank=0, iteration=first + i, at=at + i + 1,
                                 name="grad_norm", value=1.0 / (1 + first + i))
                for i in range(30)]

    with Recorder(db) as recorder:
        recorder.start_run(run_id, "resumed-sim", config, sync="asp", workers=1, servers=1,
                           dataset="digits", started_at=start)
        recorder.record_iterations(rows(0, start + 5))
        recorder.record_user_metrics(logged(0, start + 5))
        recorder.record_evaluation(EvaluationRecord(at=start + 30, elapsed_s=30.0, step=25,
                                                    accuracy=0.5, loss=0.5, epoch=1))
        recorder.finish(RunStatus.FAILED, "killed", ended_at=start + 36)
    with Recorder(db) as recorder:
        recorder.resume_run(run_id)
        recorder.record_event(EventRecord(at=start + 100, kind="resumed", detail={
            "checkpoint": 1, "folder": "f", "downtime_s": 64.0, "active_s": 36.0}))
        recorder.record_iterations(rows(30, start + 103))
        recorder.record_user_metrics(logged(30, start + 103))
        recorder.record_evaluation(EvaluationRecord(at=start + 120, elapsed_s=20.0, step=50,
                                                    accuracy=0.9, loss=0.1, epoch=2))
        recorder.finish(RunStatus.FINISHED, ended_at=start + 134)
