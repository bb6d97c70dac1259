"""Chain replication, one hop: a shard copy forwards every update it applied to its successor
in the chain, in the order it applied them, and learns when the successor (and so, by
induction, the tail) has applied each one.

The successor answers each forwarded frame as it would a worker's: an ACK, or an ERROR. A
``DuplicatePush`` means it already holds that update (a frame sent again after the chain was
re-linked) and counts as applied. Frames travel under the link's own request ids, since two
workers' request ids may coincide.

When the successor dies, the unacknowledged frames wait; ``relink`` (the coordinator names the
dead one's successor, or None when this copy became the tail) sends them again, in order.

A server joining the chain is appended after the tail: the tail snapshots its copy and ``hold``s
from that very update on (no await between the two), so each update it applies later waits in
order for the newcomer; ``relink`` to the newcomer, once it restored the snapshot, sends them.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections import OrderedDict

from engine.errors import ConnectionClosed, ProtocolError, PsctlError
from engine.transport.base import Connection, Transport
from engine.wire.protocol import MsgType, decode, with_request_id

log = logging.getLogger(__name__)
LINK_CONNECT_TIMEOUT_S = 5.0


class ChainLink:
    def __init__(self, transport: Transport, *, token: str, max_frame_bytes: int,
                 label: str) -> None:
        self._transport, self._token = transport, token
        self._max_frame_bytes, self.label = max_frame_bytes, label
        self._ids = itertools.count(1)
        self._unacked: OrderedDict[int, tuple[bytearray, asyncio.Future[None]]] = OrderedDict()
        self._connection: Connection | None = None
        self._reader: asyncio.Task[None] | None = None
        self._pump: asyncio.Task[None] | None = None
        # In apply order; one task sends them, so the successor applies them in that order.
        self._outbox: asyncio.Queue[bytearray] = asyncio.Queue()
        self._tail = False
        self.successor: str | None = None
        self.held_since: float | None = None  # monotonic: when a hold began, until relinked
        self.forwarded = 0
        self.refused = 0  # frames the successor refused for another reason than a duplicate

    @property
    def pending(self) -> int:
        return len(self._unacked)

    def forward(self, message: bytes | bytearray) -> asyncio.Future[None]:
        """Send an applied update down the chain; the future completes once it is applied
        there. In the order of the calls, whatever happens to the successor."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self._tail:
            future.set_result(None)
            return future
        link_id = next(self._ids)
        data = with_request_id(message, link_id)
        self._unacked[link_id] = (data, future)
        self.forwarded += 1
        if self._connection is not None:
            self._outbox.put_nowait(data)
        return future

    def hold(self) -> None:
        """This tail gets a successor soon: keep every update from now on until ``relink``
        names it (its acknowledgement waits until the successor applied it)."""
        if not self._tail and self.successor is not None:
            raise ProtocolError(f"{self.label} forwards to {self.successor}; only a chain's "
                                "tail hands its copy to a joining server")
        self._tail = False
        self.held_since = time.monotonic()

    @property
    def tail(self) -> bool:
        return self._tail

    async def relink(self, successor: str | None) -> None:
        """Forward to ``successor`` from now on (None: this copy is the tail), sending again
        every update it may not have."""
        await self._disconnect()
        self.successor, self._tail = successor, successor is None
        self.held_since = None
        if successor is None:
            self._settle_all()
            return
        connection = await self._transport.connect(successor, token=self._token,
                                                   timeout=LINK_CONNECT_TIMEOUT_S)
        self._connection = connection
        self._outbox = asyncio.Queue()
        for data, _ in self._unacked.values():
            self._outbox.put_nowait(data)
        self._reader = asyncio.create_task(self._read(connection))
        self._pump = asyncio.create_task(self._send_all(connection, self._outbox))

    async def close(self) -> None:
        await self._disconnect()

    async def _disconnect(self) -> None:
        connection, self._connection = self._connection, None
        for task in (self._reader, self._pump):
            if task is not None:
                task.cancel()
        self._reader = self._pump = None
        if connection is not None:
            with contextlib.suppress(PsctlError):
                await connection.close()

    async def _send_all(self, connection: Connection, outbox: asyncio.Queue[bytearray]) -> None:
        with contextlib.suppress(ConnectionClosed):  # the frames wait in _unacked for a relink
            while True:
                await connection.send(await outbox.get())

    async def _read(self, connection: Connection) -> None:
        try:
            while True:
                message = await connection.recv()
                if isinstance(message, str):
                    continue
                frame = decode(message, max_bytes=self._max_frame_bytes)
                if frame.type is MsgType.ERROR:
                    code, text = frame.error()
                    if code != "DuplicatePush":
                        self.refused += 1
                        log.error("%s: the successor refused a forwarded update: %s: %s",
                                  self.label, code, text)
                self._settle(frame.request_id)
        except PsctlError:
            return  # the successor is gone: the coordinator relinks

    def _settle(self, link_id: int) -> None:
        entry = self._unacked.pop(link_id, None)
        if entry is not None and not entry[1].done():
            entry[1].set_result(None)

    def _settle_all(self) -> None:
        for link_id in list(self._unacked):
            self._settle(link_id)
