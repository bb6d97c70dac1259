"""A shard server against careless and hostile peers, over real websockets on loopback.

Each test runs a server and raw websocket peers on one event loop: a peer admitted as one worker
speaking for another, a peer that never reads its replies, a peer that parks pulls and leaves, a
flood of refused frames, and a bug inside the server's handler.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import tracemalloc
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import pytest
from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect

from engine.consistency.registry import make_controller
from engine.keys import KeyRange
from engine.server.optimizers import SGD
from engine.server.service import LogBudget, ServerLimits, ShardServer
from engine.server.shard import ShardState
from engine.transport import WebSocketTransport
from engine.transport import tcp as tcp_module
from engine.transport.admission import credential
from engine.transport.base import Transport
from engine.transport.tcp import TcpTransport
from engine.transport.websocket import TOKEN_HEADER
from engine.wire.protocol import (
    ANY_CLOCK,
    FLAG_COMMIT,
    MAX_LIST_KEYS,
    Frame,
    MsgType,
    Role,
    decode,
    encode,
)

SECRET = "hardening-secret"
RUN = bytes(range(16))
MIB = 2**20

pytestmark = pytest.mark.timeout(60)


def serve_and(script: Callable[[ShardServer], Awaitable[Any]], *, keys: int = 8,
              model: str = "asp", workers: int = 2, transport: Transport | None = None,
              **limits: int) -> Any:
    """Start a server for ``keys`` keys (initialised to 1.0), run ``script`` against it."""

    async def main() -> Any:
        state = ShardState(KeyRange(0, keys), make_controller(model, workers=workers, ranges=1),
                           SGD(keys, lr=0.5), workers=workers)
        state.init(KeyRange(0, keys), np.ones(keys, dtype=np.float32))
        server = ShardServer(state, run=RUN, rank=0, max_frame_bytes=64 * MIB,
                             limits=ServerLimits(**limits))
        await server.start(transport or WebSocketTransport(), "127.0.0.1", 0, token=SECRET)
        try:
            return await asyncio.wait_for(script(server), 45)
        finally:
            await server.close()

    return asyncio.run(main())


async def peer(server: ShardServer, token: str, **options: Any) -> ClientConnection:
    return await ws_connect(server.address, additional_headers={TOKEN_HEADER: token},
                            compression=None, max_size=None, **options)


def frame(kind: MsgType, request_id: int, keys: KeyRange, *, rank: int = 0, clock: int = 0,
          values: np.ndarray | None = None, role: Role = Role.WORKER) -> bytearray:
    return encode(Frame(kind, request_id, keys, run=RUN, role=role, rank=rank, clock=clock,
                        flags=FLAG_COMMIT if kind is MsgType.PUSH else 0, payload=values))


async def reply(socket: ClientConnection) -> Frame:
    data = await asyncio.wait_for(socket.recv(), 10)
    assert isinstance(data, bytes)
    return decode(data, max_bytes=64 * MIB)


def test_a_connection_admitted_as_worker_1_cannot_push_as_worker_0() -> None:
    keys = KeyRange(0, 8)
    grad = np.full(8, 4.0, dtype=np.float32)

    async def script(server: ShardServer) -> None:
        before = server.state.params.tobytes()
        one = await peer(server, credential(SECRET, "worker", 1))
        await one.send(frame(MsgType.PUSH, 1, keys, rank=0, values=grad))
        code, message = (await reply(one)).error()
        assert code == "ProtocolError"
        assert message == ("this connection was admitted as worker 1; it may not send frames "
                           "as worker 0")
        await one.send(frame(MsgType.PULL, 2, keys, rank=0, clock=ANY_CLOCK))
        assert (await reply(one)).error()[0] == "ProtocolError"
        assert server.state.params.tobytes() == before
        # Worker 0's clock 0 was not consumed by the forgery: its own push is accepted.
        zero = await peer(server, credential(SECRET, "worker", 0))
        await zero.send(frame(MsgType.PUSH, 3, keys, rank=0, values=grad))
        assert (await reply(zero)).type is MsgType.ACK
        await one.send(frame(MsgType.PUSH, 4, keys, rank=1, values=grad))
        assert (await reply(one)).type is MsgType.ACK
        await one.close()
        await zero.close()

    serve_and(script)


def test_a_wrong_credential_is_refused_at_the_handshake() -> None:
    async def script(server: ShardServer) -> str:
        forged = credential("not-the-secret", "worker", 0)
        with pytest.raises(Exception) as caught:
            await peer(server, forged)
        return str(caught.value)

    assert "401" in serve_and(script)


def test_pending_pulls_are_bounded_per_sender_and_freed_when_it_leaves() -> None:
    keys = KeyRange(0, 8)

    async def script(server: ShardServer) -> None:
        socket = await peer(server, SECRET)
        for request in range(1, 6):  # clock 5 under BSP: unanswerable for now
            await socket.send(frame(MsgType.PULL, request, keys, clock=5))
        refused = await reply(socket)
        assert refused.request_id == 5
        assert refused.error() == ("ProtocolError", "4 pulls of this sender already wait at "
                                   "this server; the limit is 4 (cluster.max_pending_pulls)")
        assert len(server._waiting) == 4
        await socket.close()
        for _ in range(100):
            if not len(server._waiting):
                break
            await asyncio.sleep(0.02)
        assert len(server._waiting) == 0
        assert server.budget.waiting == 0

    serve_and(script, model="bsp", max_pending_pulls=4)


def test_a_peer_that_never_reads_is_disconnected_and_the_others_are_served() -> None:
    size = 64 * 1024  # 256 KiB per reply
    keys = KeyRange(0, size)

    async def script(server: ShardServer) -> None:
        # max_queue=1: the client library itself stops reading after one message.
        slow = await peer(server, SECRET, max_queue=1)
        for request in range(1, 401):  # 100 MiB of replies, never read
            await slow.send(frame(MsgType.PULL, request, keys, clock=ANY_CLOCK))
        other = await peer(server, credential(SECRET, "worker", 1))
        for request in range(1, 21):
            await other.send(frame(MsgType.PULL, request, keys, rank=1, clock=ANY_CLOCK))
            assert (await reply(other)).request_id == request
        for _ in range(400):
            if server.stats.slow_readers_closed and len(server._peers) == 1:
                break
            await asyncio.sleep(0.025)
        assert server.stats.slow_readers_closed == 1
        assert len(server._peers) == 1  # the slow peer is gone, its queue with it
        queued = sum(p.queued_bytes for p in server._peers)
        assert queued < 2 * MIB
        await other.close()

    serve_and(script, keys=size, max_queued_bytes=4 * MIB)


def test_a_peer_that_never_reads_over_tcp_is_disconnected_and_the_others_are_served() -> None:
    # The TCP transport stops reading a connection once 16 messages wait unread, so the
    # server's replies back up in its queue, as they do behind a websocket that is not read.
    size = 64 * 1024  # 256 KiB per reply
    keys = KeyRange(0, size)
    tcp = TcpTransport(64 * MIB)

    async def script(server: ShardServer) -> None:
        slow = await tcp.connect(server.address, token=SECRET, timeout=5)
        for request in range(1, 401):  # 100 MiB of replies, never read
            await slow.send(frame(MsgType.PULL, request, keys, clock=ANY_CLOCK))
        other = await tcp.connect(server.address, token=credential(SECRET, "worker", 1),
                                  timeout=5)
        for request in range(1, 21):
            await other.send(frame(MsgType.PULL, request, keys, rank=1, clock=ANY_CLOCK))
            data = await asyncio.wait_for(other.recv(), 10)
            assert not isinstance(data, str)
            assert decode(data, max_bytes=64 * MIB).request_id == request
        for _ in range(400):
            if server.stats.slow_readers_closed and len(server._peers) == 1:
                break
            await asyncio.sleep(0.025)
        assert server.stats.slow_readers_closed == 1
        assert len(server._peers) == 1
        assert sum(p.queued_bytes for p in server._peers) < 2 * MIB
        await other.close()
        await slow.close()

    serve_and(script, keys=size, max_queued_bytes=4 * MIB, transport=tcp)


def test_refused_frames_are_logged_at_a_bounded_rate_and_counted(
        caplog: pytest.LogCaptureFixture) -> None:
    async def script(server: ShardServer) -> int:
        socket = await peer(server, SECRET)
        for _ in range(25):
            await socket.send(b"garbage")
        for _ in range(25):
            assert (await reply(socket)).error()[0] == "ProtocolError"
        await socket.close()
        return server.stats.warnings_held_back

    with caplog.at_level(logging.WARNING, logger="engine.server.service"):
        held_back = serve_and(script, warnings_per_minute=10)
    refusals = [r for r in caplog.records if "refused a frame" in r.getMessage()]
    assert len(refusals) == 10
    assert held_back == 15
    assert any("15 more refused frames were not logged" in r.getMessage()
               for r in caplog.records)


def test_log_budget_refills_over_time(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]
    monkeypatch.setattr("engine.server.service.time.monotonic", lambda: now[0])
    budget = LogBudget(per_minute=2)
    assert [budget.take(), budget.take(), budget.take(), budget.take()] == [0, 0, None, None]
    now[0] += 30.0  # one line's worth
    assert budget.take() == 2
    assert budget.take() is None


def test_a_bug_in_the_handler_is_an_error_reply_not_a_dropped_connection() -> None:
    keys = KeyRange(0, 8)

    async def script(server: ShardServer) -> None:
        def broken(*_: object) -> np.ndarray:
            raise RuntimeError("a bug")

        socket = await peer(server, SECRET)
        original = server.state.read
        server.state.read = broken  # type: ignore[method-assign,assignment]
        await socket.send(frame(MsgType.PULL, 7, keys, clock=ANY_CLOCK))
        answer = await reply(socket)
        assert answer.request_id == 7
        assert answer.error() == ("InternalError",
                                  "the server failed on this frame; its log has the details")
        server.state.read = original  # type: ignore[method-assign]
        await socket.send(frame(MsgType.PULL, 8, keys, clock=ANY_CLOCK))
        assert (await reply(socket)).type is MsgType.VALUES
        assert server.stats.internal_errors == 1
        await socket.close()

    serve_and(script)


def test_a_flood_of_waiting_pulls_costs_a_push_nothing_and_is_bounded_per_sender() -> None:
    keys = KeyRange(0, 8)
    grad = np.zeros(8, dtype=np.float32)
    far = 10**6  # a BSP clock this test never reaches

    async def script(server: ShardServer) -> None:
        worker0 = credential(SECRET, "worker", 0)
        floods = [await peer(server, worker0) for _ in range(2)]
        for n, flood in enumerate(floods):  # 2 x 12 pulls; the sender's bound is 8
            for request in range(12):
                await flood.send(frame(MsgType.PULL, 100 * n + request, keys, clock=far + request))
        # The second connection's first 2 (a quarter of the bound) wait all the same.
        refusals = [await reply(floods[0]) for _ in range(4)]
        refusals += [await reply(floods[1]) for _ in range(10)]
        assert {r.error()[0] for r in refusals} == {"ProtocolError"}
        assert {r.error()[1] for r in refusals} == {
            "8 pulls of this sender already wait at this server; the limit is 8 "
            "(cluster.max_pending_pulls)",
            "10 pulls of this sender already wait at this server; the limit is 8 "
            "(cluster.max_pending_pulls)"}
        assert len(server._waiting) == server.budget.waiting == 10
        # Worker 0 itself, on its own connection: its pulls still wait and are answered.
        honest, other = await peer(server, worker0), await peer(server, credential(
            SECRET, "worker", 1))
        await honest.send(frame(MsgType.PULL, 1, keys, clock=1))
        for rank, socket in ((0, honest), (1, other)):
            await socket.send(frame(MsgType.PUSH, 2, keys, rank=rank, values=grad))
            assert (await reply(socket)).type is MsgType.ACK
        answered = await reply(honest)
        assert (answered.type, answered.request_id) == (MsgType.VALUES, 1)
        # Pushes asked about the earliest waiting pull only, never the flood behind it.
        assert server._waiting.readiness_checks <= 4
        # The server's own bound: worker 1 may park 2 more, then the server is full.
        for request in range(3):
            await other.send(frame(MsgType.PULL, 10 + request, keys, rank=1, clock=far))
        assert (await reply(other)).error() == (
            "ProtocolError", "12 pulls already wait at this server; the limit is 12 "
                             "(cluster.max_server_pending_pulls)")
        assert server.stats.refused_pulls == 15
        for socket in (*floods, honest, other):
            await socket.close()
        for _ in range(100):
            if server.budget.waiting == 0:
                break
            await asyncio.sleep(0.02)
        assert len(server._waiting) == server.budget.waiting == 0

    serve_and(script, model="bsp", max_pending_pulls=8, max_server_pending_pulls=12)


def test_the_slowest_readers_go_first_when_the_servers_reply_budget_is_full() -> None:
    size = 64 * 1024  # 256 KiB per reply
    keys = KeyRange(0, size)

    async def script(server: ShardServer) -> None:
        slow = [await peer(server, SECRET, max_queue=1) for _ in range(3)]
        for socket in slow:  # 3 x 10 MiB of replies, never read; each alone is within 32 MiB
            for request in range(40):
                await socket.send(frame(MsgType.PULL, request, keys, clock=ANY_CLOCK))
        other = await peer(server, credential(SECRET, "worker", 1))
        for request in range(1, 21):
            await other.send(frame(MsgType.PULL, request, keys, rank=1, clock=ANY_CLOCK))
            assert (await reply(other)).request_id == request
        for _ in range(400):
            if server.stats.slow_readers_closed >= 2:
                break
            await asyncio.sleep(0.025)
        assert server.stats.slow_readers_closed >= 2
        assert server.budget.queued_bytes <= 8 * MIB + 2 * size * 4
        assert server.budget.queued_bytes == sum(p.queued_bytes for p in server._peers)
        await other.close()
        for socket in slow:  # a polite close would wait for replies nobody reads
            socket.transport.abort()

    serve_and(script, keys=size, max_server_queued_bytes=8 * MIB)


def test_a_tcp_message_declaring_more_than_the_shard_allows_is_refused_unallocated() -> None:
    head = struct.Struct("<B3xQ")

    async def script(server: ShardServer) -> tuple[int, bytes]:
        host, port = tcp_module.parse_address(server.address)
        reader, writer = await asyncio.open_connection(host, port)
        hello = tcp_module.PREFACE + credential(SECRET, "worker", 0).encode()
        writer.write(head.pack(tcp_module.HELLO, len(hello)) + hello)
        kind, _ = head.unpack(await reader.readexactly(head.size))
        assert kind == tcp_module.WELCOME
        tracemalloc.start()
        try:
            writer.write(head.pack(tcp_module.BINARY, 64 * MIB))  # and nothing after it
            kind, length = head.unpack(await asyncio.wait_for(reader.readexactly(head.size), 10))
            body = await reader.readexactly(length)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        writer.close()
        assert kind == tcp_module.CLOSE
        assert peak < MIB
        return struct.unpack_from("<H", body)[0], body[2:]

    code, reason = serve_and(script, transport=TcpTransport(64 * MIB))
    assert code == 1009
    assert reason == b"a message of 67108864 bytes is over the limit of 65536"


def test_a_key_list_of_more_keys_than_a_frame_may_name_is_refused_and_changes_nothing() -> None:
    """Issue 57: one push of 2 million keys held the server's event loop 2-7 s, and every
    other connection with it. A frame names at most MAX_LIST_KEYS keys (a client splits longer
    lists); one over is refused before anything is read or changed."""
    size = 2 * MAX_LIST_KEYS + 8
    keys = KeyRange(0, size)
    over = np.arange(MAX_LIST_KEYS + 1, dtype=np.int64)

    async def script(server: ShardServer) -> None:
        before = server.state.params.tobytes()
        one = await peer(server, credential(SECRET, "worker", 0))
        for kind, values in ((MsgType.PUSH, np.ones(len(over), dtype=np.float32)),
                             (MsgType.PULL, None)):
            await one.send(encode(Frame(kind, 1, keys, run=RUN, role=Role.WORKER, rank=0,
                                        clock=ANY_CLOCK if values is None else 0, index=over,
                                        flags=FLAG_COMMIT if values is not None else 0,
                                        payload=values)))
            code, message = (await reply(one)).error()
            assert code == "FrameTooLarge"
            assert message == (f"a {kind.name} of {MAX_LIST_KEYS + 1:,} keys; a frame names at "
                               f"most {MAX_LIST_KEYS:,} (a client sends a longer list in several)")
        assert server.state.params.tobytes() == before
        assert server.state.clocks.next[0].tolist() == [0]  # its clock was not consumed
        at_most = over[:-1]
        await one.send(encode(Frame(MsgType.PUSH, 2, keys, run=RUN, role=Role.WORKER, rank=0,
                                    clock=0, index=at_most, flags=FLAG_COMMIT,
                                    payload=np.ones(len(at_most), dtype=np.float32))))
        assert (await reply(one)).type is MsgType.ACK
        await one.close()

    serve_and(script, keys=size)
