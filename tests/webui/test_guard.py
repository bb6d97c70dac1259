"""The dashboard answers only requests that name it by a host it is served as, and only
same-origin writes and websockets: a DNS-rebinding page (forged Host and Origin) and a page of
another site (forged Origin) are refused, and nothing is written."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from engine.recorder import Recorder
from webui.app import create_app
from webui.guard import HostOriginGuard, served_names

RUN = "cd" * 16
WRITE = {"X-Psctl-Write": "1"}
EVIL = "http://evil.example:8765"


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "experiments.db"
    recorder = Recorder(path, flush_interval_s=0.05, heartbeat_interval_s=0.05)
    try:
        recorder.start_run(RUN, "seed", {"lr": 0.1}, sync="async", workers=1, servers=1,
                           dataset="digits", started_at=1000.0)
    finally:
        recorder.close()
    return path


@pytest.fixture
def client(db: Path) -> TestClient:
    # As `psctl ui` serves it by default: bound to 127.0.0.1, port 8765.
    app = create_app(db, served_names("127.0.0.1"))
    return TestClient(app, base_url="http://127.0.0.1:8765")


def _notes(db: Path) -> list[tuple[str | None]]:
    with sqlite3.connect(db) as raw:
        rows = raw.execute("SELECT notes FROM runs").fetchall()
    raw.close()
    return rows


def test_same_origin_reads_writes_and_websockets_are_served(client: TestClient, db: Path) -> None:
    assert client.get("/api/runs").status_code == 200
    got = client.put(f"/api/runs/{RUN}/notes", json={"notes": "ok"},
                     headers={**WRITE, "Origin": "http://127.0.0.1:8765"})
    assert got.status_code == 200, got.text
    assert _notes(db) == [("ok",)]
    for path in ("/ws/runs", f"/ws/runs/{RUN}"):
        with client.websocket_connect(f"ws://127.0.0.1:8765{path}",
                                      headers={"Origin": "http://127.0.0.1:8765"}) as socket:
            assert socket.receive_json()["type"] in {"runs", "snapshot"}


@pytest.mark.parametrize("host", ["localhost:8765", "[::1]:8765", "LOCALHOST"])
def test_every_loopback_name_is_served(client: TestClient, host: str) -> None:
    assert client.get("/api/runs", headers={"Host": host}).status_code == 200


def test_a_proxy_ending_tls_keeps_the_page_same_origin(db: Path) -> None:
    # https://dash.example -> proxy (Host passed through) -> http://127.0.0.1:8765
    client = TestClient(create_app(db, served_names("127.0.0.1", ["dash.example"])),
                        base_url="http://dash.example")
    got = client.put(f"/api/runs/{RUN}/notes", json={"notes": "via proxy"},
                     headers={**WRITE, "Origin": "https://dash.example"})
    assert got.status_code == 200, got.text
    with client.websocket_connect("ws://dash.example/ws/runs",
                                  headers={"Origin": "https://dash.example"}) as socket:
        assert socket.receive_json()["type"] == "runs"


def test_a_write_without_origin_is_a_cli_client_and_served(client: TestClient, db: Path) -> None:
    got = client.put(f"/api/runs/{RUN}/notes", json={"notes": "curl"}, headers=WRITE)
    assert got.status_code == 200, got.text
    assert _notes(db) == [("curl",)]


def test_a_foreign_host_is_refused_on_a_read(client: TestClient) -> None:
    got = client.get("/", headers={"Host": "evil.example:8765"})
    assert got.status_code == 403
    detail = got.json()["detail"]
    assert "'evil.example:8765'" in detail and "DNS rebinding" in detail
    assert "--allow-host" in detail and "\n" not in detail


def test_a_rebinding_page_cannot_write_notes(client: TestClient, db: Path) -> None:
    # Same-origin to the browser: the page's own name resolves to 127.0.0.1.
    got = client.put(f"/api/runs/{RUN}/notes", json={"notes": "pwned"},
                     headers={**WRITE, "Host": "evil.example:8765", "Origin": EVIL})
    assert got.status_code == 403
    assert _notes(db) == [(None,)]


@pytest.mark.parametrize("headers", [{"Origin": EVIL}, {"Origin": "null"},
                                     {"Origin": "http://127.0.0.1:9999"},
                                     {"Origin": "http://127.0.0.1"},
                                     {"Origin": "http://localhost:8765"},
                                     {"Origin": "file://127.0.0.1:8765"},
                                     {"Referer": f"{EVIL}/page.html"}])
def test_a_write_from_another_origin_is_refused(client: TestClient, db: Path,
                                               headers: dict[str, str]) -> None:
    got = client.put(f"/api/runs/{RUN}/notes", json={"notes": "pwned"},
                     headers={**WRITE, **headers})
    assert got.status_code == 403
    assert "another site" in got.json()["detail"]
    assert _notes(db) == [(None,)]


@pytest.mark.parametrize("path", ["/ws/runs", f"/ws/runs/{RUN}"])
def test_websockets_from_another_origin_are_refused(client: TestClient, path: str) -> None:
    with pytest.raises(WebSocketDisconnect) as denied, \
            client.websocket_connect(f"ws://127.0.0.1:8765{path}", headers={"Origin": EVIL}):
        pass
    assert denied.value.code == 1008
    assert "another site" in denied.value.reason


@pytest.mark.parametrize("path", ["/ws/runs", f"/ws/runs/{RUN}"])
def test_websockets_for_a_foreign_host_are_refused(client: TestClient, path: str) -> None:
    with pytest.raises(WebSocketDisconnect) as denied, \
            client.websocket_connect(f"ws://evil.example:8765{path}", headers={"Origin": EVIL}):
        pass
    assert denied.value.code == 1008
    assert "evil.example" in denied.value.reason


def test_a_websocket_without_origin_is_served(client: TestClient) -> None:
    with client.websocket_connect("ws://127.0.0.1:8765/ws/runs") as socket:
        assert socket.receive_json()["type"] == "runs"


def test_allowed_names_are_served_and_a_wildcard_bind_accepts_addresses(db: Path) -> None:
    names = served_names("0.0.0.0", ["dash.example"])
    client = TestClient(create_app(db, names), base_url="http://dash.example")
    assert client.get("/api/runs").status_code == 200
    assert client.get("/api/runs", headers={"Host": "192.0.2.7:8765"}).status_code == 200
    assert client.get("/api/runs", headers={"Host": "evil.example"}).status_code == 403
    # Bound to loopback only, an address that is not its own is refused too.
    guard = HostOriginGuard(create_app(db), served_names("127.0.0.1"))
    scope = {"type": "http", "method": "GET", "headers": [(b"host", b"192.0.2.7")]}
    assert guard.refusal(scope) is not None


def test_allow_host_star_answers_any_name(db: Path) -> None:
    client = TestClient(create_app(db, served_names("127.0.0.1", ["*"])),
                        base_url="http://anything.example")
    assert client.get("/api/runs").status_code == 200


def test_psctl_ui_serves_the_bound_host_and_the_allowed_names(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    from typer.testing import CliRunner

    import webui.server
    from psctl.cli import app

    served: list[tuple[str, ...]] = []

    def serve(db: Path, sock: socket.socket, allow: list[str]) -> None:
        sock.close()
        served.append(tuple(allow))

    monkeypatch.setattr(webui.server, "serve", serve)
    done = CliRunner().invoke(app, ["ui", "--port", "0", "--db", str(tmp_path / "x.db"),
                                    "--allow-host", "dash.example", "--allow-host", "[fd00::1]"])
    assert done.exit_code == 0, done.output
    (allow,) = served
    assert allow == ("127.0.0.1", "dash.example", "[fd00::1]")  # the --host given, then these
    names = served_names("127.0.0.1", allow)
    assert {"127.0.0.1", "localhost", "::1", "dash.example", "fd00::1"} <= set(names)
    assert "evil.example" not in names
