"""One client's connection to one shard: requests matched to replies by request id, sent again
when the link loses them (injected drops), and moved to a backup when the primary dies.

Failover (``engine.replication``): when the connection to a primary breaks and the shard has
backups, the requests still waiting go to the first backup that accepts a connection, under
their own request ids. Until the coordinator has promoted it, a backup answers ``not_primary``;
the request is sent again every ``NOT_PRIMARY_RETRY_S``. A push the dead primary had forwarded
before it died comes back as a duplicate, which counts as acknowledged. When a server that died
comes back and takes copies again, the coordinator sends every client the chains' addresses
(``set_copies``), so a later loss moves to the copies that exist then.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, replace

import numpy as np

from engine.errors import (
    ConnectionClosed,
    Diverged,
    NonFinitePush,
    ProtocolError,
    PsctlError,
    RemoteError,
    ShuttingDown,
)
from engine.keys import KeyRange
from engine.transport.base import Connection, Transport
from engine.wire.protocol import CLOSE_MOVED, Frame, MsgType, decode

NOT_PRIMARY_RETRY_S = 0.02
FAILOVER_TIMEOUT_S = 10.0  # to reach some backup once the primary is gone


@dataclass(frozen=True, slots=True)
class ShardAddress:
    index: int
    address: str
    keys: KeyRange
    backups: tuple[str, ...] = ()  # with replicas: where its keys move, in chain order


@dataclass(frozen=True, slots=True)
class LinkFaults:
    """Injected data-plane faults (``engine.faults``): frames this client sends, and replies it
    receives, are lost with probability ``drop``; frames leave ``delay_s`` late. With drops, a
    request unanswered for ``resend_after_s`` is sent again under its request id."""

    drop: float = 0.0
    delay_s: float = 0.0
    resend_after_s: float = 0.1
    seed: int = 0


class Link:
    """One connection's faults, with its own random stream so runs repeat."""

    def __init__(self, faults: LinkFaults, salt: int) -> None:
        self.faults = faults
        self._rng = np.random.default_rng([faults.seed, salt])
        self.dropped = 0
        self.resent = 0

    def drops(self) -> bool:
        if self.faults.drop and self._rng.random() < self.faults.drop:
            self.dropped += 1
            return True
        return False


class ShardConnection:
    """One connection to one shard; replies are matched to requests by request id."""

    def __init__(self, transport: Transport, connection: Connection, shard: ShardAddress, *,
                 token: str, max_frame_bytes: int, link: Link | None = None,
                 duplicates_ok: bool = False) -> None:
        self._transport, self._token = transport, token
        self._connection, self._shard = connection, shard
        self._max_frame_bytes = max_frame_bytes
        # A push refused as a duplicate of a committed clock counts as acknowledged: a
        # restarted worker repeats the clock some shard already has.
        self.link, self._duplicates_ok = link, duplicates_ok
        self._waiting: dict[int, asyncio.Future[tuple[Frame, int]]] = {}
        self._sent: dict[int, bytearray] = {}  # requests not answered yet, to send again
        self._closed: PsctlError | None = None
        self._broken: PsctlError | None = None  # the primary is gone; backups are left
        self._backups = list(shard.backups)
        # A replicated shard: when its server is lost the coordinator says where the copies
        # are (``set_copies``), so a client that has tried every address waits for more.
        self._replicated = bool(shard.backups)
        self._switching: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.failovers = 0
        self._reader = asyncio.create_task(self._read(connection))

    @classmethod
    async def open(cls, transport: Transport, shard: ShardAddress, *, token: str,
                   timeout: float, max_frame_bytes: int, link: Link | None = None,
                   duplicates_ok: bool = False) -> ShardConnection:
        connection = await transport.connect(shard.address, token=token, timeout=timeout)
        return cls(transport, connection, shard, token=token, max_frame_bytes=max_frame_bytes,
                   link=link, duplicates_ok=duplicates_ok)

    async def request(self, request_id: int, data: bytearray) -> tuple[Frame, int]:
        if self._closed is not None:
            raise self._closed
        future: asyncio.Future[tuple[Frame, int]] = asyncio.get_running_loop().create_future()
        self._waiting[request_id] = future
        self._sent[request_id] = data
        if self._broken is not None:
            self._fail_over()  # it goes out with the others, to the backup
        else:
            await self._send(data)
        if self.link is None or not self.link.faults.drop:
            return await future
        # A lossy link: send it again under the same id until an answer arrives (the shard
        # answers a repeated push with its first ack, and a waiting pull once).
        while True:
            done, _ = await asyncio.wait({future}, timeout=self.link.faults.resend_after_s)
            if future in done:
                return future.result()
            if self._closed is not None:
                raise self._closed
            self.link.resent += 1
            self._waiting[request_id] = future
            await self._send(data)

    async def close(self) -> None:
        self._closed = self._closed or ConnectionClosed("closed by this client")
        for task in (self._reader, self._switching, *self._tasks):
            if task is not None:
                task.cancel()
        await self._connection.close()

    async def _send(self, data: bytearray) -> None:
        link = self.link
        if link is not None:
            if link.faults.delay_s:
                await asyncio.sleep(link.faults.delay_s)
            if link.drops():
                return
        with contextlib.suppress(ConnectionClosed):  # the reader sees it and fails over
            await self._connection.send(data)

    async def _read(self, connection: Connection) -> None:
        try:
            while True:
                message = await connection.recv()
                if isinstance(message, str):
                    raise ProtocolError(f"shard {self._shard.index} sent a text message")
                if self.link is not None and self.link.drops():
                    continue  # lost on the way back: the request is sent again
                frame = decode(message, max_bytes=self._max_frame_bytes)
                self._resolve(frame, len(message))
        except ConnectionClosed as exc:
            if connection is not self._connection or self._closed is not None:
                return
            error = ConnectionClosed(f"shard server {self._shard.index} at "
                                     f"{self._shard.address}: {exc}")
            # A copy that closes as moved handed its range to another server (its clients are
            # told where); without replicas any other loss is final.
            if not (self._replicated or exc.code == CLOSE_MOVED):
                self._fail_all(error)
                return
            self._broken = error
            if self._waiting:
                self._fail_over()
        except PsctlError as exc:
            self._fail_all(exc)

    def _fail_over(self) -> None:
        if self._switching is None or self._switching.done():
            self._switching = asyncio.create_task(self._switch())

    async def _switch(self) -> None:
        """Connect to the next backup that answers and send every waiting request to it."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + FAILOVER_TIMEOUT_S
        while loop.time() < deadline:
            if not self._backups:  # a server handed a copy back is announced any moment
                await asyncio.sleep(NOT_PRIMARY_RETRY_S)
                continue
            address = self._backups.pop(0)
            try:
                connection = await self._transport.connect(
                    address, token=self._token, timeout=max(deadline - loop.time(), 0.1))
            except PsctlError:
                continue
            self._connection, self._broken = connection, None
            self._shard = replace(self._shard, address=address)
            self.failovers += 1
            self._reader = asyncio.create_task(self._read(connection))
            for request_id in sorted(self._sent):
                await self._send(self._sent[request_id])
            return
        self._fail_all(self._broken or ConnectionClosed(
            f"shard server {self._shard.index}: no backup could be reached"))

    def set_copies(self, addresses: list[str]) -> None:
        """Where this shard's copies listen now, in chain order (the primary first); the
        addresses it goes to, in that order, should its server be lost."""
        self._backups = [a for a in addresses if a != self._shard.address]
        self._replicated = self._replicated or bool(self._backups)

    def _resolve(self, frame: Frame, nbytes: int) -> None:
        future = self._waiting.pop(frame.request_id, None)
        if future is None or future.done():
            return
        if frame.type is MsgType.ERROR:
            code, message = frame.error()
            if code == "not_primary" and frame.request_id in self._sent:
                self._waiting[frame.request_id] = future  # promoted any moment now
                asyncio.get_running_loop().call_later(NOT_PRIMARY_RETRY_S, self._retry,
                                                      frame.request_id)
                return
            self._sent.pop(frame.request_id, None)
            if code == "DuplicatePush" and self._duplicates_ok:
                future.set_result((replace(frame, type=MsgType.ACK, payload=None), nbytes))
                return
            future.set_exception(refusal(self._shard.index, frame.request_id, code, message))
            return
        self._sent.pop(frame.request_id, None)
        future.set_result((frame, nbytes))

    def _retry(self, request_id: int) -> None:
        data = self._sent.get(request_id)
        if data is None or self._broken is not None or self._closed is not None:
            return
        task = asyncio.create_task(self._send(data))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _fail_all(self, error: PsctlError) -> None:
        self._closed = error
        waiting, self._waiting = self._waiting, {}
        self._sent.clear()
        for future in waiting.values():
            if not future.done():
                future.set_exception(error)


def refusal(shard: int, request_id: int, code: str, message: str) -> PsctlError:
    if code == "shutting_down":
        return ShuttingDown(message)
    if code == NonFinitePush.__name__:
        return Diverged(f"shard server {shard} refused its gradient: {message}")
    return RemoteError(f"shard server {shard} refused request {request_id}: {code}: {message}")
