"""The worker-side parameter client: non-blocking range push and pull over all shards.

``push``, ``pull`` and ``init`` return a request id at once; ``wait(request_id, timeout)`` blocks
until every shard involved has answered. Network I/O runs on an event loop in a background
thread (a ``LoopThread`` shared with the control channel), so a worker's computation overlaps
its communication. Values passed to ``push`` are copied before the call returns: the caller may
reuse its buffer at once.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engine.aio import LoopThread
from engine.errors import (
    ConnectionClosed,
    ProtocolError,
    PsctlError,
    RemoteError,
    RequestTimeout,
    ShuttingDown,
)
from engine.keys import KeyRange, split_by_shard
from engine.transport.base import Connection, Transport
from engine.wire.protocol import FLAG_FINAL, Frame, MsgType, Role, decode, encode, to_ns


@dataclass(frozen=True, slots=True)
class ShardAddress:
    index: int
    address: str
    keys: KeyRange


@dataclass(frozen=True, slots=True)
class PullResult:
    versions: dict[int, int]  # shard index -> version the values were read at
    wait_s: float  # longest time a shard held the pull back for consistency
    bytes_sent: int
    bytes_received: int
    answered_at: float = field(default=0.0, compare=False)  # when the last reply arrived (unix s)


@dataclass(frozen=True, slots=True)
class PushResult:
    versions: dict[int, int]  # shard index -> version the push was accepted at
    staleness: int  # updates applied between the pull and this push, worst shard
    bytes_sent: int
    bytes_received: int
    answered_at: float = field(default=0.0, compare=False)  # when the last ack arrived (unix s)


Result = PullResult | PushResult


class ParameterClient:
    def __init__(
        self,
        transport: Transport,
        shards: list[ShardAddress],
        *,
        token: str,
        run: bytes,
        role: Role,
        rank: int,
        connect_timeout_s: float,
        request_timeout_s: float,
        max_frame_bytes: int,
        io: LoopThread,
    ) -> None:
        self._transport, self._shards, self._token = transport, shards, token
        self._run, self._role, self._rank = run, role, rank
        self._connect_timeout_s, self.request_timeout_s = connect_timeout_s, request_timeout_s
        self._max_frame_bytes = max_frame_bytes
        self._ids = itertools.count(1)
        self._requests: dict[int, concurrent.futures.Future[Result]] = {}
        self._io = io
        self._connections: list[_ShardConnection] = []

    @property
    def shard_keys(self) -> list[KeyRange]:
        return [shard.keys for shard in self._shards]

    def connect(self) -> None:
        self._io.call(self._connect_all(), self._connect_timeout_s + 5, "connecting to shards")

    def close(self) -> None:
        with contextlib.suppress(PsctlError):
            self._io.call(self._close_all(), 5, "closing shard connections")

    def init(self, values: np.ndarray) -> int:
        return self._submit(MsgType.INIT, KeyRange(0, values.size), values, clock=0, base={})

    def push(
        self, keys: KeyRange, values: np.ndarray, *, clock: int, base_versions: dict[int, int],
        pushed_at: float = 0.0, waited_s: float = 0.0, final: bool = False,
    ) -> int:
        """Send a gradient. ``pushed_at`` (unix s) and ``waited_s`` (how long this iteration's
        pull was held back) travel with it for the timing-driven consistency models."""
        timing = (to_ns(pushed_at), to_ns(waited_s))
        return self._submit(MsgType.PUSH, keys, values, clock=clock, base=base_versions,
                            timing=timing, flags=FLAG_FINAL if final else 0)

    def pull(self, keys: KeyRange, out: np.ndarray, *, clock: int) -> int:
        """Fill ``out`` (len(keys) float32) with the servers' values; see ``wait``."""
        if out.shape != (len(keys),) or out.dtype != np.float32:
            raise ProtocolError(f"pull buffer must be float32 of shape ({len(keys)},)")
        return self._submit(MsgType.PULL, keys, out, clock=clock, base={})

    def done(self, request_id: int) -> bool:
        """Has the request been answered (so that ``wait`` returns at once)?"""
        future = self._requests.get(request_id)
        if future is None:
            raise ProtocolError(f"unknown or already awaited request id {request_id}")
        return future.done()

    def wait(self, request_id: int, timeout: float | None = None) -> Result:
        future = self._requests.pop(request_id, None)
        if future is None:
            raise ProtocolError(f"unknown or already awaited request id {request_id}")
        limit = self.request_timeout_s if timeout is None else timeout
        try:
            return future.result(limit)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise RequestTimeout(
                f"request {request_id} got no answer within {limit:.1f} s"
            ) from None

    def _submit(
        self, kind: MsgType, keys: KeyRange, values: np.ndarray, *, clock: int,
        base: dict[int, int], timing: tuple[int, int] = (0, 0), flags: int = 0,
    ) -> int:
        request_id = next(self._ids)
        parts = []
        for index, piece in split_by_shard(keys, self.shard_keys):
            local = keys.local(piece)
            payload = None if kind is MsgType.PULL else values[local]
            frame = Frame(
                kind,
                request_id,
                piece,
                run=self._run,
                role=self._role,
                rank=self._rank,
                clock=clock,
                version=base.get(index, 0),
                stamp_ns=timing[0],
                wait_ns=timing[1],
                flags=flags,
                payload=payload,
            )
            parts.append((index, encode(frame), values[local] if kind is MsgType.PULL else None))
        coro = self._request(kind, request_id, parts, base)
        self._requests[request_id] = self._io.submit(coro)
        return request_id

    async def _request(
        self,
        kind: MsgType,
        request_id: int,
        parts: list[tuple[int, bytearray, Any]],
        base: dict[int, int],
    ) -> Result:
        sent = sum(len(data) for _, data, _ in parts)
        replies = await asyncio.gather(
            *(self._connections[index].request(request_id, data) for index, data, _ in parts)
        )
        answered_at = time.time()
        received = sum(nbytes for _, nbytes in replies)
        versions = {
            index: reply.version for (index, _, _), (reply, _) in zip(parts, replies, strict=True)
        }
        if kind is MsgType.PULL:
            for (_, _, out), (reply, _) in zip(parts, replies, strict=True):
                np.copyto(out, reply.values)
            wait_s = max((reply.wait_ns for reply, _ in replies), default=0) / 1e9
            return PullResult(versions, wait_s, sent, received, answered_at)
        staleness = max((versions[i] - base.get(i, versions[i]) for i in versions), default=0)
        return PushResult(versions, max(staleness, 0), sent, received, answered_at)

    async def _connect_all(self) -> None:
        self._connections = list(
            await asyncio.gather(
                *(
                    _ShardConnection.open(
                        self._transport,
                        shard,
                        token=self._token,
                        timeout=self._connect_timeout_s,
                        max_frame_bytes=self._max_frame_bytes,
                    )
                    for shard in self._shards
                )
            )
        )

    async def _close_all(self) -> None:
        await asyncio.gather(*(connection.close() for connection in self._connections))


class _ShardConnection:
    """One connection to one shard; replies are matched to requests by request id."""

    def __init__(self, connection: Connection, shard: ShardAddress, max_frame_bytes: int) -> None:
        self._connection, self._shard = connection, shard
        self._max_frame_bytes = max_frame_bytes
        self._waiting: dict[int, asyncio.Future[tuple[Frame, int]]] = {}
        self._reader = asyncio.create_task(self._read())
        self._closed: PsctlError | None = None

    @classmethod
    async def open(
        cls,
        transport: Transport,
        shard: ShardAddress,
        *,
        token: str,
        timeout: float,
        max_frame_bytes: int,
    ) -> _ShardConnection:
        connection = await transport.connect(shard.address, token=token, timeout=timeout)
        return cls(connection, shard, max_frame_bytes)

    async def request(self, request_id: int, data: bytearray) -> tuple[Frame, int]:
        if self._closed is not None:
            raise self._closed
        future = asyncio.get_running_loop().create_future()
        self._waiting[request_id] = future
        await self._connection.send(data)
        return await future

    async def close(self) -> None:
        await self._connection.close()
        self._reader.cancel()

    async def _read(self) -> None:
        try:
            while True:
                message = await self._connection.recv()
                if isinstance(message, str):
                    raise ProtocolError(f"shard {self._shard.index} sent a text message")
                frame = decode(message, max_bytes=self._max_frame_bytes)
                self._resolve(frame, len(message))
        except ConnectionClosed as exc:
            self._fail_all(
                ConnectionClosed(
                    f"shard server {self._shard.index} at {self._shard.address}: {exc}"
                )
            )
        except PsctlError as exc:
            self._fail_all(exc)

    def _resolve(self, frame: Frame, nbytes: int) -> None:
        future = self._waiting.pop(frame.request_id, None)
        if future is None or future.done():
            return
        if frame.type is MsgType.ERROR:
            code, message = frame.error()
            error = (
                ShuttingDown(message)
                if code == "shutting_down"
                else RemoteError(
                    f"shard server {self._shard.index} refused request {frame.request_id}: "
                    f"{code}: {message}"
                )
            )
            future.set_exception(error)
        else:
            future.set_result((frame, nbytes))

    def _fail_all(self, error: PsctlError) -> None:
        self._closed = error
        waiting, self._waiting = self._waiting, {}
        for future in waiting.values():
            if not future.done():
                future.set_exception(error)
