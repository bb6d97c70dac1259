"""A shard server's heartbeat: a thread that sends the coordinator a signed datagram every
interval, whatever its event loop is doing (``engine.wire.beats``).

The loop is watched too: a callback on it notes the time every interval, and each beat says how
long ago it last did beyond that (``loop_lag_s``). A server whose process lives but whose loop
is stuck is then still told apart from one that is merely busy.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from urllib.parse import urlsplit

from engine.errors import ProtocolError
from engine.wire import beats


def beat_target(coordinator: str, port: int) -> tuple[str, int]:
    """Where the beats go: the coordinator's host (from the address the server reached it
    at) and the port its welcome named."""
    host = urlsplit(coordinator).hostname
    if not host:
        raise ProtocolError(f"no host in the coordinator's address {coordinator!r}")
    return host, port


class BeatSender:
    def __init__(self, target: tuple[str, int], rank: int, token: str, interval_s: float,
                 loop: asyncio.AbstractEventLoop, *, incarnation: int = 0) -> None:
        self.target, self.rank, self.token, self.interval_s = target, rank, token, interval_s
        self.incarnation = incarnation
        self._loop = loop
        self._turned = time.monotonic()
        self._stop = threading.Event()
        self._timer: asyncio.TimerHandle | None = None
        family = socket.AF_INET6 if ":" in target[0] else socket.AF_INET
        self._socket = socket.socket(family, socket.SOCK_DGRAM)
        self._thread = threading.Thread(target=self._beat, name="psctl-heartbeat", daemon=True)

    def start(self) -> None:
        self._turn()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._timer is not None:
            self._timer.cancel()
        self._thread.join(timeout=2 * self.interval_s + 1.0)
        self._socket.close()

    def _turn(self) -> None:
        self._turned = time.monotonic()
        self._timer = self._loop.call_later(self.interval_s, self._turn)

    def _beat(self) -> None:
        seq = 0
        while not self._stop.is_set():
            lag = max(0.0, time.monotonic() - self._turned - self.interval_s)
            seq += 1
            # A refused or full send is like a lost datagram: the next one tries again.
            with contextlib.suppress(OSError):
                beat = beats.Beat(self.rank, self.incarnation, seq, lag)
                self._socket.sendto(beats.encode(beat, self.token), self.target)
            self._stop.wait(self.interval_s)
