"""Helpers for tests that start real runs: launch, read the database, find leaked processes."""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from engine.config import RunConfig
from engine.plan import build_config
from engine.transport.websocket import TOKEN_HEADER

if TYPE_CHECKING:
    from engine.launcher import Launcher


def config(**overrides: Any) -> RunConfig:
    values = {"cluster.connect_timeout_s": 60.0, "cluster.request_timeout_s": 60.0}
    values.update({key.replace("__", "."): value for key, value in overrides.items()})
    return build_config({}, values)


def launch_in_background(db: Path, *extra: str) -> subprocess.Popen[str]:
    """``psctl launch`` of a digits run long enough to interrupt or kill (2 workers, 1 server),
    recording into ``db``; its output is captured in pipes."""
    env = dict(os.environ, PSCTL_DB=str(db), NO_COLOR="1")
    command = [sys.executable, "-m", "psctl", "launch", "--dataset", "digits", "--workers", "2",
               "--servers", "1", "--epochs", "500", "--no-live", *extra]
    # SIGHUP at its default, as a terminal's command has it, even where the tests run under
    # nohup (ignored, psctl rightly keeps it ignored).
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=default_hangup)


def default_hangup() -> None:
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def query(db: Path, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as connection:
        return connection.execute(sql, args).fetchall()


def wait_for(predicate: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except sqlite3.OperationalError:  # the recorder has not created the tables yet
            value = None
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def wait_until_training(db: Path, timeout: float = 90) -> None:
    """Until the one run in ``db`` has recorded more than five iterations."""
    wait_for(lambda: db.exists() and query(db, "SELECT count(*) FROM runs WHERE "
                                               "iteration_count > 5")[0][0] == 1,
             timeout, "the run to be training")


def processes_with(marker: str) -> list[int]:
    """PIDs whose command line or environment mentions ``marker`` (a run id or token)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            blob = (entry / "cmdline").read_bytes() + (entry / "environ").read_bytes()
        except OSError:
            continue
        if marker.encode() in blob:
            found.append(int(entry.name))
    return found


# -- helpers for attacks on a live run (tests/integration/test_slow_reader.py) -------------------


def child_pid(launcher: Launcher, role: str, rank: int = 0) -> int:
    """The PID of one process the launcher started."""
    return next(c.process.pid for c in launcher.children if c.role == role and c.rank == rank)


def rss_bytes(pid: int, field: str = "VmRSS") -> int:
    """A process's resident memory (or another ``/proc/PID/status`` size field) in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"/proc/{pid}/status has no {field}")


def iteration_rate(db: Path, run_id: str, start: float, end: float) -> float:
    """Iterations (all workers) per second that ended in the wall-clock window [start, end)."""
    count = query(db, "SELECT count(*) FROM iterations WHERE run_id = ? AND ended_at >= ? "
                      "AND ended_at < ?", run_id, start, end)[0][0]
    return float(count) / (end - start)


def server_address(db: Path, rank: int = 0) -> str:
    """The websocket address shard server ``rank`` announced (its ``server_listening`` event)."""
    for (detail,) in query(db, "SELECT detail FROM events WHERE kind = 'server_listening'"):
        found = json.loads(detail)
        if found["rank"] == rank:
            return str(found["address"])
    raise AssertionError(f"server {rank} has not announced its address")


def raw_websocket(address: str, token: str, *, receive_buffer: int = 4096,
                  timeout: float = 10.0) -> socket.socket:
    """A websocket opened by hand on a plain TCP socket with a tiny receive buffer, so that a
    test can send frames and never read a byte of what comes back."""
    host, port = address.removeprefix("ws://").rsplit(":", 1)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)  # before connect
    sock.settimeout(timeout)
    sock.connect((host, int(port)))
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall((f"GET / HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
                  f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                  f"Sec-WebSocket-Version: 13\r\n{TOKEN_HEADER}: {token}\r\n\r\n").encode())
    response = b""
    deadline = time.monotonic() + timeout
    while b"\r\n\r\n" not in response and time.monotonic() < deadline and len(response) < 8192:
        chunk = sock.recv(1)  # byte by byte: nothing after the handshake is consumed
        if not chunk:
            break
        response += chunk
    if not response.startswith(b"HTTP/1.1 101"):
        sock.close()
        raise AssertionError(f"websocket handshake refused: {response[:200]!r}")
    return sock


def ws_binary(payload: bytes | bytearray, opcode: int = 0x2) -> bytes:
    """One masked client-to-server websocket frame (FIN set) carrying ``payload``."""
    size = len(payload)
    if size < 126:
        header = bytes([0x80 | opcode, 0x80 | size])
    elif size < 2**16:
        header = bytes([0x80 | opcode, 0x80 | 126]) + size.to_bytes(2, "big")
    else:
        header = bytes([0x80 | opcode, 0x80 | 127]) + size.to_bytes(8, "big")
    mask = os.urandom(4)
    data = np.frombuffer(bytes(payload), dtype=np.uint8)
    pad = np.frombuffer(mask * (size // 4 + 1), dtype=np.uint8)[:size]
    return header + mask + (data ^ pad).tobytes()


def drain_until_close(sock: socket.socket, *, timeout: float,
                      max_bytes: int = 4 * 2**30) -> dict[str, Any]:
    """Read what a raw websocket holds, frame by frame, until the server's close frame, the
    end of the connection, ``timeout`` seconds or ``max_bytes``; what was seen, as a dict:
    ``frames`` (data frames), ``bytes``, ``close_code`` and ``close_reason`` (None without a
    close frame) and ``end`` (close, eof, reset, timeout or limit)."""
    seen: dict[str, Any] = {"frames": 0, "bytes": 0, "close_code": None, "close_reason": None}
    buffer = bytearray()
    skip, in_frame = 0, False  # payload bytes of the current data frame still to discard
    deadline = time.monotonic() + timeout
    while True:
        while True:  # consume every whole frame (or frame part) in the buffer
            if in_frame:
                taken = min(skip, len(buffer))
                del buffer[:taken]
                skip -= taken
                if skip:
                    break
                in_frame = False
                seen["frames"] += 1
            if len(buffer) < 2:
                break
            opcode, size, at = buffer[0] & 0x0F, buffer[1] & 0x7F, 2
            if size >= 126:
                at = 4 if size == 126 else 10
                if len(buffer) < at:
                    break
                size = int.from_bytes(buffer[2:at], "big")
            if opcode == 0x8:
                if len(buffer) < at + size:
                    break
                body = bytes(buffer[at:at + size])
                seen["close_code"] = int.from_bytes(body[:2], "big") if len(body) >= 2 else None
                seen["close_reason"] = body[2:].decode("utf-8", "replace")
                seen["end"] = "close"
                return seen
            del buffer[:at]
            skip, in_frame = size, True
        remaining = deadline - time.monotonic()
        if remaining <= 0 or seen["bytes"] >= max_bytes:
            seen["end"] = "timeout" if remaining <= 0 else "limit"
            return seen
        sock.settimeout(min(remaining, 1.0))
        try:
            chunk = sock.recv(2**20)
        except TimeoutError:
            continue
        except ConnectionResetError:
            seen["end"] = "reset"
            return seen
        if not chunk:
            seen["end"] = "eof"
            return seen
        seen["bytes"] += len(chunk)
        buffer += chunk


def descendants(ancestor: int) -> list[int]:
    """Every process started by ``ancestor``, by its children, and so on."""
    parents = {int(entry.name): _parent(int(entry.name)) for entry in Path("/proc").iterdir()
               if entry.name.isdigit()}
    found, frontier = [], [ancestor]
    while frontier:
        children = [pid for pid, parent in parents.items() if parent in frontier]
        found += children
        frontier = children
    return found


def _parent(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


def running(pid: int) -> bool:
    """Whether the pid is a process that has not ended (a zombie has; its parent reaps it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@contextmanager
def cpu_hogs(count: int = 2) -> Iterator[None]:
    """``count`` processes spinning on the CPU beside what the block runs (the machine twice
    oversubscribed, as psctl's own runs leave it); ended by their PIDs."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait(timeout=10)


class Sniffer:
    """Copies of the IPv4 UDP datagrams on the loopback interface whose payload starts with
    ``prefix``, as an attacker on the machine would capture them: the newest one per
    ``key(payload)``, with the port it was sent to. Needs CAP_NET_RAW (``PermissionError``)."""

    def __init__(self, prefix: bytes, key: Any = lambda payload: 0) -> None:
        self.prefix, self.key = prefix, key
        self.latest: dict[Any, tuple[bytes, int]] = {}
        self._socket = socket.socket(socket.AF_PACKET, socket.SOCK_DGRAM,  # type: ignore[attr-defined]
                                     socket.ntohs(0x0800))
        self._socket.bind(("lo", 0))
        self._socket.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._capture, daemon=True)
        self._thread.start()

    def _capture(self) -> None:
        while not self._stop.is_set():
            try:
                packet = self._socket.recv(65535)
            except TimeoutError:
                continue
            header = (packet[0] & 0x0F) * 4
            if packet[9] != socket.IPPROTO_UDP:
                continue
            payload = packet[header + 8:]
            if payload.startswith(self.prefix):
                port = int.from_bytes(packet[header + 2:header + 4], "big")
                self.latest[self.key(payload)] = (payload, port)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._socket.close()
