"""The dashboard's process lifecycle with a browser attached: ``psctl ui`` stops at once on
SIGINT or SIGTERM despite open live websockets, and ``launch --ui`` keeps serving the finished
run until told to stop. Also: /docs loads nothing from the network, and a taken port is said
plainly."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest

from tests.webui.chromium import LOCAL_HOSTS, block_foreign, chromium, needs_chromium

pytestmark = pytest.mark.timeout(180)
STOP_WITHIN_S = 2.0


def _psctl(args: list[str], db: Path) -> subprocess.Popen[str]:
    env = dict(os.environ, PSCTL_DB=str(db), NO_COLOR="1", COLUMNS="160")
    return subprocess.Popen([sys.executable, "-m", "psctl", *args], env=env, text=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


class _Lines:
    """stderr of a process, read in a thread, so a test can wait for a line with a timeout."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        self._proc = proc
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self._proc.stderr is not None
        for line in self._proc.stderr:
            self.lines.append(line)

    def wait_for(self, pattern: str, timeout_s: float) -> re.Match[str]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for line in list(self.lines):
                if found := re.search(pattern, line):
                    return found
            if self._proc.poll() is not None and not self._thread.is_alive():
                break
            time.sleep(0.05)
        raise AssertionError(f"no line matching {pattern!r} in:\n{''.join(self.lines)}")

    def text_so_far(self) -> str:
        return "".join(self.lines)

    def text(self) -> str:
        self._thread.join(timeout=5)
        return "".join(self.lines)


def _stop_time(proc: subprocess.Popen[str], sig: signal.Signals) -> float:
    """Seconds from ``sig`` to the process's exit (fails past STOP_WITHIN_S + margin)."""
    sent = time.monotonic()
    proc.send_signal(sig)
    try:
        proc.wait(timeout=STOP_WITHIN_S + 8)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)
        raise AssertionError(f"still running {STOP_WITHIN_S + 8} s after {sig.name}") from None
    return time.monotonic() - sent


def _end(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=10)


@pytest.fixture()
def browser() -> Iterator[Any]:
    with chromium() as launched:
        yield launched


def _open_live(browser: Any, url: str) -> Any:
    """The run page at ``url``, once its charts are drawn (its websocket is then open)."""
    page = browser.new_page()
    page.route("**/*", block_foreign)
    page.goto(url, timeout=30_000)
    page.wait_for_selector("body[data-complete='1']", timeout=30_000)
    return page


@needs_chromium
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_ui_stops_at_once_with_a_live_page_open(seeded_db: Path, browser: Any,
                                                sig: signal.Signals) -> None:
    proc = _psctl(["ui", "--port", "0"], seeded_db)
    try:
        lines = _Lines(proc)
        base = lines.wait_for(r"on (http://127\.0\.0\.1:\d+)", 30)[1]
        page = _open_live(browser, f"{base}/runs/@last")
        page.goto(base)  # the runs page: a second live socket, one that seldom sends
        page.wait_for_selector("body[data-live='1']", timeout=15_000)
        second = browser.new_page()
        second.goto(f"{base}/runs/@last", timeout=30_000)
        second.wait_for_selector("body[data-complete='1']", timeout=30_000)
        took = _stop_time(proc, sig)
        print(f"psctl ui stopped {took:.2f} s after {sig.name}")
        assert took < STOP_WITHIN_S, f"{took:.2f} s"
        text = lines.text()
        # The live loops end by themselves when the server closes their sockets, rather than
        # being cancelled by uvicorn's backstop timeout (which says so on stderr).
        assert "Traceback" not in text and "graceful shutdown exceeded" not in text, text
    finally:
        _end(proc)


@needs_chromium
def test_launch_ui_keeps_serving_the_finished_run(tmp_path: Path, browser: Any) -> None:
    db = tmp_path / "experiments.db"
    proc = _psctl(["launch", "--dataset", "digits", "--workers", "2", "--servers", "1",
                   "--epochs", "2", "--no-live", "--ui"], db)
    try:
        lines = _Lines(proc)
        found = lines.wait_for(r"the dashboard stays at (http://127\.0\.0\.1:\d+)/runs/(\w+)",
                               120)
        base, run_id = found[1], found[2]
        assert proc.poll() is None, "the launcher exited instead of serving the dashboard"
        assert re.search(r"dashboard: http://127\.0\.0\.1:\d+/runs/@last", lines.text_so_far())
        page = _open_live(browser, f"{base}/runs/{run_id}")
        assert page.inner_text("#live-badge") == "finished"
        took = _stop_time(proc, signal.SIGINT)
        print(f"launch --ui stopped {took:.2f} s after SIGINT")
        assert took < STOP_WITHIN_S, f"{took:.2f} s"
        assert proc.returncode == 0, lines.text()  # the run's code, not the interruption's
        # The server is gone; the page keeps the run's final status, not "reconnecting".
        page.wait_for_timeout(1500)
        assert page.inner_text("#live-badge") == "finished"
    finally:
        _end(proc)


def test_docs_load_nothing_from_the_network(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from tests.webui.hosts import TEST_HOSTS
    from webui.app import create_app

    client = TestClient(create_app(tmp_path / "experiments.db", hosts=TEST_HOSTS))
    html = client.get("/docs")
    assert html.status_code == 200
    urls = re.findall(r"""(?:src|href|url)\s*[=:]\s*["']([^"']+)["']""", html.text)
    assert len(urls) >= 3, urls  # the script, the stylesheet, the schema
    for url in urls:
        assert not re.match(r"(?i)(https?:)?//", url) or urlparse(url).hostname in LOCAL_HOSTS, url
        assert client.get(url).status_code == 200, url
    assert not re.search(r"https?://(?!127\.0\.0\.1)", html.text)


def test_taken_port_is_said_plainly(tmp_path: Path) -> None:
    from webui.server import DEFAULT_HOST, DEFAULT_PORT

    probe = socket.socket()
    holder: socket.socket | None = probe
    # as the dashboard does: a port left in TIME_WAIT by an earlier test is free to take
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        probe.bind((DEFAULT_HOST, DEFAULT_PORT))
    except OSError:  # taken already: just as good for this test
        probe.close()
        holder = None
    try:
        if holder is not None:
            holder.listen()
        proc = _psctl(["launch", "--dataset", "digits", "--workers", "1", "--servers", "1",
                       "--epochs", "1", "--no-live", "--ui"], tmp_path / "experiments.db")
        try:
            lines = _Lines(proc)
            found = lines.wait_for(r"port (\d+) is taken; the dashboard is at "
                                   r"http://127\.0\.0\.1:(\d+)/$", 60)
            assert int(found[1]) == DEFAULT_PORT and int(found[2]) != DEFAULT_PORT
            lines.wait_for(r"the dashboard stays at", 120)
            _stop_time(proc, signal.SIGTERM)
            text = lines.text()
            assert "rror" not in text and "Errno" not in text, text  # no uvicorn bind error
            assert proc.returncode == 0, text
        finally:
            _end(proc)
    finally:
        if holder is not None:
            holder.close()
