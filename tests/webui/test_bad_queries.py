"""Malformed, huge and non-finite query parameters and selectors get a short 4xx from the
dashboard's HTTP API, never a 500 and never the input echoed back whole."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from engine.config import RunConfig
from engine.recorder import Recorder
from engine.wire.records import EvaluationRecord, IterationRecord, RunStatus
from tests.webui.hosts import TEST_HOSTS
from webui.app import create_app

RUN = "ab" * 16
T0 = 1_000_000.0
HUGE = "9" * 20  # past 2**63: what SQLite's driver cannot bind
# Under httpx's URL limit (64 KiB); uvicorn refuses longer request lines before the app sees them.
LONG = "a" * 60_000
# A body that echoed one of the inputs above would be far longer than this.
SHORT_BODY = 400


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    """One small finished run, written by the recorder (no processes launched)."""
    db = tmp_path_factory.mktemp("bad-queries") / "experiments.db"
    recorder = Recorder(db)
    try:
        recorder.start_run(RUN, "small", RunConfig().to_json_dict(), sync="bsp", workers=1,
                           servers=1, dataset="digits", started_at=T0)
        recorder.record_iterations([
            IterationRecord(worker=0, iteration=i, epoch=0, started_at=T0 + i, ended_at=T0 + i + 1,
                            compute_s=0.5, push_s=0.1, pull_s=0.1, wait_s=0.3, staleness=0,
                            loss=1.0, samples=8, bytes_sent=10, bytes_received=10)
            for i in range(20)])
        recorder.record_evaluation(EvaluationRecord(at=T0 + 10, elapsed_s=10, step=10,
                                                    accuracy=0.5, loss=1.0, epoch=0.5))
        recorder.finish(RunStatus.FINISHED)
    finally:
        recorder.close()
    # raise_server_exceptions=False: a bug must show up as the 500 a browser would get.
    with TestClient(create_app(db, hosts=TEST_HOSTS), raise_server_exceptions=False) as test_client:
        yield test_client


def _refused(client: TestClient, url: str, statuses: tuple[int, ...]) -> str:
    """The JSON ``detail`` of a refusal with one of ``statuses``."""
    response = client.get(url)
    assert response.status_code in statuses, (url[:120], response.status_code, response.text[:300])
    assert response.headers["content-type"] == "application/json"
    assert len(response.content) < SHORT_BODY, response.text[:300]
    detail = response.json()["detail"]
    assert isinstance(detail, str) and "\n" not in detail
    return detail


SERIES = f"/api/runs/{RUN}/series/throughput"


@pytest.mark.parametrize(("url", "parameter"), [
    *((f"/api/runs?limit={v}", "limit") for v in (HUGE, f"-{HUGE}", "-1", "abc", "1.5", "nan")),
    *((f"{SERIES}?since={v}", "since")
      for v in ("nan", "inf", "-inf", "1e400", "-1", "1e300", "abc", HUGE + "e300")),
    (f"/api/runs/{RUN}/series/accuracy?since=nan", "since"),
    *((f"{SERIES}?width={v}", "width") for v in ("nan", "inf", "0", "-1", "1e-300", "1e300")),
    *((f"{SERIES}?max_points={v}", "max_points") for v in (HUGE, "-1", "nan")),
    *((f"/api/runs/{RUN}/syncs?from_index={v}", "from_index")
      for v in (f"-{HUGE}000", HUGE, "-1", "nan", "1e3")),
    *((f"/api/runs/{RUN}/events?after_id={v}", "after_id") for v in (HUGE, f"-{HUGE}", "x")),
    (f"/api/runs?limit={LONG}", "limit"),
])
def test_bad_query_parameters_are_a_short_422_naming_the_parameter(
        client: TestClient, url: str, parameter: str) -> None:
    detail = _refused(client, url, (422,))
    assert detail.startswith(f"{parameter}: ")


def test_a_long_unknown_status_is_a_400_that_quotes_only_its_start(client: TestClient) -> None:
    detail = _refused(client, f"/api/runs?status={LONG}", (400,))
    assert "unknown run status 'aaaa" in detail and "…" in detail


@pytest.mark.parametrize("url", [
    f"/api/runs/{LONG}", f"/api/runs/{LONG}/series/throughput", f"/api/runs/{LONG}/syncs",
    f"/runs/{LONG}", f"/compare?runs=@last,{LONG}", f"/api/runs/@last~{HUGE}",
    f"/runs/@last~{'9' * 5000}", f"/api/runs/{RUN}/series/{LONG}",
    f"/api/runs/{RUN}/series/{LONG}/full.csv",
])
def test_unknown_runs_and_metrics_are_a_short_404(client: TestClient, url: str) -> None:
    detail = _refused(client, url, (404,))
    assert "no run matches" in detail or "unknown metric" in detail


def test_the_websocket_names_an_unknown_run_briefly(client: TestClient) -> None:
    with client.websocket_connect(f"/ws/runs/{LONG}") as socket:
        message = socket.receive_json()
    assert message["type"] == "error" and "no run with id" in message["message"]
    assert len(message["message"]) < 200


@pytest.mark.parametrize("url", [
    "/api/runs?limit=0", f"/api/runs?limit={2**63 - 1}", f"{SERIES}?since=0&width=0.25",
    f"{SERIES}?since={T0 + 10}&width=1e9", f"/api/runs/{RUN}/series/accuracy?since={T0}",
    f"/api/runs/{RUN}/syncs?from_index={2**63 - 1}", f"/api/runs/{RUN}/events?after_id=0",
    f"/api/runs/@last~{'0' * 30}",
])
def test_values_at_the_bounds_are_still_served(client: TestClient, url: str) -> None:
    assert client.get(url).status_code == 200


def test_since_still_selects_the_tail(client: TestClient) -> None:
    whole = client.get(f"{SERIES}?width=1").json()["series"]["all"]["t"]
    tail = client.get(f"{SERIES}?width=1&since={T0 + 15}").json()["series"]["all"]["t"]
    assert 0 < len(tail) < len(whole)
