"""The role-log API: a run's logs listed and tailed from its own folder, the role in the URL
checked against the run's roles (never joined to a path as sent), bounded tails, and a 404 that
says why when the run, the role, its log or the run's folder is missing.

Runs are written with the recorder into a real SQLite file; their log folders are real folders
with the file names psctl launch gives them (engine/launcher.py).
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from engine.config import RunConfig
from engine.recorder import Recorder
from engine.wire.records import RunStatus
from tests.webui.hosts import TEST_HOSTS
from webui.app import create_app
from webui.logs_api import DEFAULT_TAIL_BYTES, MAX_TAIL_BYTES

LOCAL, MOVED, SIM, NOFOLDER, SCALED = "a1" * 16, "b2" * 16, "c3" * 16, "d4" * 16, "e5" * 16
WORKER_LOG = "".join(f"line {i}\n" for i in range(20_000)) + "RuntimeError: boom\n"


def _config(workers: int, servers: int, backend: str = "local") -> dict[str, object]:
    config = RunConfig().to_json_dict()
    config["cluster"].update(workers=workers, servers=servers, backend=backend)
    return config


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("logs-api")
    path = root / "experiments.db"
    elsewhere = root / "other-place" / MOVED  # a run whose folder is not beside the database
    for run_id, workers, servers, backend in ((LOCAL, 2, 1, "local"), (MOVED, 1, 1, "local"),
                                              (SIM, 4, 2, "sim"), (NOFOLDER, 1, 1, "local"),
                                              (SCALED, 2, 1, "local")):
        recorder = Recorder(path)
        try:
            recorder.start_run(run_id, f"run-{run_id[:2]}", _config(workers, servers, backend),
                               sync="asp", workers=workers, servers=servers, dataset="digits")
            recorder.finish(RunStatus.FAILED, "worker 0 failed: RuntimeError: boom")
        finally:
            recorder.close()
    _listening(path, MOVED, elsewhere)
    # A damaged event naming another run's folder is never read: LOCAL's stays the default.
    _listening(path, LOCAL, root / "psctl-logs" / ("f" * 32))
    _scaled(path, SCALED)
    local = root / "psctl-logs" / LOCAL
    local.mkdir(parents=True)
    (local / "coordinator.log").write_text("coordinator listening\n")
    (local / "server-0.log").write_text("server 0 serving\n")
    (local / "evaluator.log").write_text("")
    (local / "worker-0.log").write_text(WORKER_LOG)
    (local / "worker-1.log").write_bytes(b"caf\xc3\xa9 \xff broken utf-8\n")
    (local / "config.json").write_text("{}")
    (local / "worker-7.log").write_text("not a role of this run\n")
    elsewhere.mkdir(parents=True)
    (elsewhere / "worker-0.log").write_text("moved worker\n")
    (root / "psctl-logs" / SIM).mkdir()
    (root / "psctl-logs" / SIM / "sim.log").write_text("Traceback: simulation failed\n")
    (root / "psctl-logs" / SCALED).mkdir()
    (root / "psctl-logs" / SCALED / "worker-3.log").write_text("joined by psctl scale\n")
    (root / "secret.txt").write_text("never served\n")
    return path


def _listening(db: Path, run_id: str, folder: Path) -> None:
    """The event the coordinator records once it listens, naming the run's folder."""
    with sqlite3.connect(db) as conn:
        conn.execute("INSERT INTO events (run_id, at, kind, detail) VALUES (?, 2.0, "
                     "'coordinator_listening', ?)", (run_id, json.dumps({"folder": str(folder)})))
    conn.close()


def _scaled(db: Path, run_id: str) -> None:
    """psctl scale added worker 3 (and worker 1 left)."""
    with sqlite3.connect(db) as conn:
        conn.execute("INSERT INTO events (run_id, at, kind, detail) VALUES (?, 3.0, 'membership', "
                     "?)", (run_id, json.dumps({"workers": 3, "joining": [3], "leaving": [1]})))
    conn.close()


@pytest.fixture(scope="module")
def client(db: Path) -> TestClient:
    return TestClient(create_app(db, hosts=TEST_HOSTS))


def test_the_list_names_each_role_with_a_log_in_launch_order(client: TestClient) -> None:
    got = client.get(f"/api/runs/{LOCAL}/logs")
    assert got.status_code == 200, got.text
    body = got.json()
    assert body["run_id"] == LOCAL and body["note"] is None
    assert body["folder"].endswith(f"psctl-logs/{LOCAL}")
    assert body["roles"] == ["coordinator", "server-0", "evaluator", "worker-0", "worker-1"]
    # worker-7.log lies in the folder, but the run had 2 workers: it is not listed.
    assert [e["role"] for e in body["logs"]] == body["roles"]
    sizes = {e["role"]: e["size"] for e in body["logs"]}
    assert sizes["worker-0"] == len(WORKER_LOG) and sizes["evaluator"] == 0
    assert all(e["mtime"] > 1e9 for e in body["logs"])
    # A run selector works as everywhere else: an id prefix.
    assert client.get(f"/api/runs/{LOCAL[:8]}/logs").json()["roles"] == body["roles"]


def test_a_tail_is_the_end_of_the_log_from_a_whole_line(client: TestClient) -> None:
    got = client.get(f"/api/runs/{LOCAL}/logs/worker-0")
    assert got.status_code == 200, got.text
    assert got.headers["content-type"].startswith("text/plain")
    assert got.text.endswith("RuntimeError: boom\n")
    assert len(got.content) <= DEFAULT_TAIL_BYTES and got.text.startswith("line ")
    assert int(got.headers["x-log-size"]) == len(WORKER_LOG)
    offset = int(got.headers["x-log-offset"])
    assert WORKER_LOG[offset:] == got.text and WORKER_LOG[offset - 1] == "\n"
    # 30 bytes start a line; 31 and 35 start in the line before, which is left out; 12 cut
    # the last line, which is kept as cut rather than leaving nothing.
    last_two = "line 19999\nRuntimeError: boom\n"
    for n, text in ((30, last_two), (31, last_two), (35, last_two), (12, "Error: boom\n")):
        small = client.get(f"/api/runs/{LOCAL}/logs/worker-0", params={"bytes": n})
        assert small.text == text, n
    whole = client.get(f"/api/runs/{LOCAL}/logs/coordinator", params={"bytes": MAX_TAIL_BYTES})
    assert whole.text == "coordinator listening\n" and whole.headers["x-log-offset"] == "0"
    assert client.get(f"/api/runs/{LOCAL}/logs/evaluator").text == ""
    # Bytes that are not UTF-8 are shown replaced, not refused.
    assert "café \ufffd broken" in client.get(f"/api/runs/{LOCAL}/logs/worker-1").text


@pytest.mark.parametrize("value", ["0", "-5", str(MAX_TAIL_BYTES + 1), "lots", "1e3"])
def test_the_tail_size_is_bounded(client: TestClient, value: str) -> None:
    got = client.get(f"/api/runs/{LOCAL}/logs/worker-0", params={"bytes": value})
    assert got.status_code == 422, got.text
    assert "bytes" in got.json()["detail"]


@pytest.mark.parametrize("role", ["worker-2", "worker-7", "worker-99", "server-1"])
def test_a_role_the_run_does_not_have_is_not_found(client: TestClient, role: str) -> None:
    got = client.get(f"/api/runs/{LOCAL}/logs/{role}")
    assert got.status_code == 404, got.text
    detail = got.json()["detail"]
    assert f"has no role {role}" in detail
    assert "coordinator, server-0, evaluator, worker-0, worker-1" in detail


@pytest.mark.parametrize("role", ["foo", "worker", "worker-01", "worker-0.log", "worker-1x",
                                  "Worker-0", "...x", "worker-0 ", "worker-1234567",
                                  "config.json", "sim.log", "%2e%2e"])
def test_a_malformed_role_is_refused_before_any_lookup(client: TestClient, role: str) -> None:
    got = client.get(f"/api/runs/{LOCAL}/logs/{role}")
    assert got.status_code == 422, got.text
    assert "is not a role such as worker-0" in got.json()["detail"]


@pytest.mark.parametrize("path", ["logs/../../secret.txt", "logs/..%2F..%2Fsecret.txt",
                                  "logs/%2e%2e%2f%2e%2e%2fsecret.txt",
                                  "logs/worker-0/../config.json", "logs/..%5C..%5Csecret.txt",
                                  "logs/%2Fetc%2Fpasswd"])
def test_no_path_in_the_request_reaches_the_file_system(client: TestClient, path: str) -> None:
    got = client.get(f"/api/runs/{LOCAL}/{path}")
    assert got.status_code in (404, 422), got.text
    assert "never served" not in got.text and "root:" not in got.text
    assert got.text != "{}"  # not config.json either


def test_an_unknown_run_is_not_found(client: TestClient) -> None:
    for url in (f"/api/runs/{'0' * 32}/logs", f"/api/runs/{'0' * 32}/logs/worker-0"):
        got = client.get(url)
        assert got.status_code == 404, got.text
        assert "no run" in got.json()["detail"].lower()


def test_the_folder_the_run_recorded_is_where_its_logs_are(client: TestClient) -> None:
    got = client.get(f"/api/runs/{MOVED}/logs/worker-0")
    assert got.status_code == 200, got.text
    assert got.text == "moved worker\n"
    listed = client.get(f"/api/runs/{MOVED}/logs").json()["logs"]
    assert [e["role"] for e in listed] == ["worker-0"]


def test_a_run_without_a_folder_says_so(client: TestClient) -> None:
    got = client.get(f"/api/runs/{NOFOLDER}/logs/worker-0")
    assert got.status_code == 404, got.text
    said = got.json()["detail"]
    assert "log folder of run" in said and f"psctl-logs/{NOFOLDER}" in said
    # The list is empty, with the same words.
    listed = client.get(f"/api/runs/{NOFOLDER}/logs")
    assert listed.status_code == 200, listed.text
    body = listed.json()
    assert body["logs"] == [] and body["folder"] is None and body["note"] == said
    assert body["roles"] == ["coordinator", "server-0", "evaluator", "worker-0"]


def test_a_role_that_wrote_no_log_is_not_found(client: TestClient) -> None:
    got = client.get(f"/api/runs/{MOVED}/logs/coordinator")
    assert got.status_code == 404, got.text
    assert "coordinator of run" in got.json()["detail"] and "wrote no log" in got.json()["detail"]


def test_a_simulated_run_has_only_its_sim_log(client: TestClient) -> None:
    body = client.get(f"/api/runs/{SIM}/logs").json()
    assert body["roles"] == ["sim"] and [e["role"] for e in body["logs"]] == ["sim"]
    assert client.get(f"/api/runs/{SIM}/logs/sim").text == "Traceback: simulation failed\n"
    assert client.get(f"/api/runs/{SIM}/logs/worker-0").status_code == 404
    # ...and a real run has no sim log.
    assert client.get(f"/api/runs/{LOCAL}/logs/sim").status_code == 404


def test_workers_added_by_psctl_scale_are_roles_of_the_run(client: TestClient) -> None:
    body = client.get(f"/api/runs/{SCALED}/logs").json()
    assert body["roles"][-4:] == ["worker-0", "worker-1", "worker-2", "worker-3"]
    assert client.get(f"/api/runs/{SCALED}/logs/worker-3").text == "joined by psctl scale\n"
    assert client.get(f"/api/runs/{SCALED}/logs/worker-4").status_code == 404
