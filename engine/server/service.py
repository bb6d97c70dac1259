"""The shard server's data plane: answers PUSH, PULL and INIT frames for one ``ShardState``.

Every frame is validated before it touches the state; a bad one is answered with an ERROR frame
naming the problem, and the connection (and every other) keeps being served. A peer that sends
nothing but garbage is disconnected after ``MAX_BAD_FRAMES`` with a close reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from engine.consistency.base import PushTiming
from engine.errors import ConnectionClosed, ProtocolError, PsctlError
from engine.server.shard import ShardState
from engine.transport.base import Connection, Listener, Transport
from engine.wire.protocol import (
    FLAG_COMMIT,
    FLAG_FINAL,
    Frame,
    MsgType,
    Role,
    decode,
    encode,
    error_frame,
    from_ns,
    peek_request_id,
)
from engine.wire.records import SyncRecord

log = logging.getLogger(__name__)
MAX_BAD_FRAMES = 32


@dataclass
class _PendingPull:
    connection: Connection
    frame: Frame
    since: float


@dataclass
class ServerStats:
    frames_in: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    bad_frames: int = 0
    errors_by_code: dict[str, int] = field(default_factory=dict)


class ShardServer:
    def __init__(self, state: ShardState, *, run: bytes, rank: int, max_frame_bytes: int,
                 on_syncs: Callable[[list[SyncRecord]], None] | None = None) -> None:
        self.state = state
        self._on_syncs = on_syncs
        self.run = run
        self.rank = rank
        self.max_frame_bytes = max_frame_bytes
        self.stats = ServerStats()
        self._pending: list[_PendingPull] = []
        self._draining = False
        self._sends: set[asyncio.Task[None]] = set()
        self._listener: Listener | None = None

    async def start(self, transport: Transport, host: str, port: int, *, token: str) -> str:
        self._listener = await transport.listen(host, port, self.serve, token=token)
        return self._listener.address

    async def close(self) -> None:
        self.drain("server shutting down")
        if self._listener is not None:
            await self._listener.close()
        if self._sends:
            await asyncio.wait(self._sends, timeout=5)

    def drain(self, reason: str) -> None:
        """Stop accepting pushes and waiting pulls; pulls that need no wait are still answered."""
        self._draining = True
        pending, self._pending = self._pending, []
        for pull in pending:
            self._reply_error(pull.connection, pull.frame.request_id, "shutting_down", reason)

    async def serve(self, connection: Connection) -> None:
        bad_frames = 0
        while True:
            try:
                message = await connection.recv()
            except ConnectionClosed:
                return
            if self._handle(connection, message):
                continue
            bad_frames += 1
            if bad_frames >= MAX_BAD_FRAMES:
                if self._sends:  # the peer should read why before the close
                    await asyncio.wait(self._sends, timeout=1.0)
                await connection.close(1008, f"{bad_frames} invalid frames; closing")
                return

    def _handle(self, connection: Connection, message: bytes | str) -> bool:
        """Process one message; False if it was invalid (an ERROR was sent back)."""
        self.stats.frames_in += 1
        self.stats.bytes_in += len(message)
        if isinstance(message, str):
            self._refuse(
                connection,
                0,
                ProtocolError("text message on a tensor connection: send binary psctl frames"),
            )
            return False
        try:
            frame = decode(message, max_bytes=self.max_frame_bytes)
            self._dispatch(connection, frame)
        except PsctlError as exc:
            self._refuse(connection, peek_request_id(message), exc)
            return False
        return True

    def _dispatch(self, connection: Connection, frame: Frame) -> None:
        if frame.run != self.run:
            raise ProtocolError("frame belongs to another run")
        if frame.type is MsgType.PULL:
            self._pull(connection, frame)
        elif frame.type is MsgType.PUSH:
            self._push(connection, frame)
        elif frame.type is MsgType.INIT:
            applied = self.state.init(frame.keys, frame.values)
            self._send(connection, self._ack(frame, self.state.version_of(frame.keys)))
            if applied:
                self._release_ready_pulls()
        else:
            raise ProtocolError(f"a server does not accept {frame.type.name} frames")

    def _pull(self, connection: Connection, frame: Frame) -> None:
        self.state.read(frame.keys, frame.index)  # validates the keys before the pull may wait
        if self.state.pull_ready(frame.rank, frame.clock, frame.keys):
            self._answer_pull(connection, frame, waited_s=0.0)
        elif self._draining:
            self._reply_error(connection, frame.request_id, "shutting_down", "run is stopping")
        else:
            self._pending.append(_PendingPull(connection, frame, time.perf_counter()))

    def _push(self, connection: Connection, frame: Frame) -> None:
        if self._draining:
            self._reply_error(connection, frame.request_id, "shutting_down", "run is stopping")
            return
        if frame.role is not Role.WORKER:
            raise ProtocolError(f"only workers push; this frame comes from a {frame.role.name}")
        timing = PushTiming(from_ns(frame.stamp_ns), from_ns(frame.wait_ns),
                            bool(frame.flags & FLAG_FINAL))
        accepted_at = self.state.push(frame.rank, frame.clock, frame.keys, frame.values, timing,
                                      index=frame.index, commit=bool(frame.flags & FLAG_COMMIT))
        self._send(connection, self._ack(frame, accepted_at))
        syncs = self.state.controller.take_syncs()
        if syncs and self._on_syncs is not None:
            self._on_syncs(syncs)
        self._release_ready_pulls()

    def _release_ready_pulls(self) -> None:
        now, still_waiting = time.perf_counter(), []
        for pull in self._pending:
            if self.state.pull_ready(pull.frame.rank, pull.frame.clock, pull.frame.keys):
                self._answer_pull(pull.connection, pull.frame, waited_s=now - pull.since)
            else:
                still_waiting.append(pull)
        self._pending = still_waiting

    def _answer_pull(self, connection: Connection, frame: Frame, *, waited_s: float) -> None:
        reply = Frame(
            MsgType.VALUES,
            frame.request_id,
            frame.keys,
            run=self.run,
            role=Role.SERVER,
            rank=self.rank,
            clock=frame.clock,
            version=self.state.version_of(frame.keys),
            wait_ns=int(waited_s * 1e9),
            payload=self.state.read(frame.keys, frame.index),
            index=frame.index,
        )
        self._send(connection, reply)

    def _ack(self, frame: Frame, version: int) -> Frame:
        return Frame(
            MsgType.ACK,
            frame.request_id,
            frame.keys,
            run=self.run,
            role=Role.SERVER,
            rank=self.rank,
            clock=frame.clock,
            version=version,
        )

    def _refuse(self, connection: Connection, request_id: int, exc: PsctlError) -> None:
        self.stats.bad_frames += 1
        code = type(exc).__name__
        self.stats.errors_by_code[code] = self.stats.errors_by_code.get(code, 0) + 1
        log.warning("refused a frame from %s: %s", connection.remote, exc)
        self._reply_error(connection, request_id, code, str(exc))

    def _reply_error(
        self, connection: Connection, request_id: int, code: str, message: str
    ) -> None:
        self._send(
            connection, error_frame(request_id, code, message, role=Role.SERVER, rank=self.rank)
        )

    def _send(self, connection: Connection, frame: Frame) -> None:
        # Encoding copies the payload now, so the reply is a snapshot of this version even if
        # the parameters change before the bytes leave; sending happens in its own task so
        # that one slow peer never delays the replies to the others.
        data = encode(frame)
        self.stats.bytes_out += len(data)
        task = asyncio.create_task(self._send_quietly(connection, data))
        self._sends.add(task)
        task.add_done_callback(self._sends.discard)

    @staticmethod
    async def _send_quietly(connection: Connection, data: bytearray) -> None:
        with contextlib.suppress(ConnectionClosed):  # the peer is gone; its handler says so
            await connection.send(data)
