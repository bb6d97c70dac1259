"""Chain replication, one hop (engine.replication.link.ChainLink), between real shard servers
(engine.server.service.ShardServer) on the in-memory and the websocket transport.

A primary forwards every update it applied to its successor and acknowledges a worker's push only
once the successor (and so the tail) applied it; a backup serves only its chain predecessor until
it is promoted; a relinked copy sends its unacknowledged frames again, in order, and a successor
that already had some answers DuplicatePush, which counts as applied. The servers run on their
own event-loop thread, workers (a parameter client, raw peers) on another, as in real processes.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import pytest

from engine.aio import LoopThread
from engine.consistency.registry import make_controller
from engine.errors import ConnectionClosed, ProtocolError, PsctlError
from engine.keys import KeyRange
from engine.replication.link import ChainLink
from engine.server.optimizers import SGD
from engine.server.service import ShardServer
from engine.server.shard import ShardState
from engine.transport import MemoryTransport, WebSocketTransport
from engine.transport.admission import credential
from engine.transport.base import Connection, Listener, Transport
from engine.wire.protocol import (
    CLOSE_MOVED,
    FLAG_COMMIT,
    Frame,
    MsgType,
    Role,
    decode,
    encode,
)
from engine.worker.client import PLAIN_WIRE, ParameterClient, ShardAddress

TOKEN = "join-token-for-chain-link-tests"
RUN = bytes.fromhex("a0b1c2d3e4f5061728394a5b6c7d8e9f")
MIB = 2**20
LR = 0.5
KEYS = KeyRange(0, 6)
START = np.arange(1, 7, dtype=np.float32)
QUIET_S = 0.1  # how long a reply that must not come is waited for

pytestmark = pytest.mark.timeout(30)
T = TypeVar("T")


def grad(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=len(KEYS)).astype(np.float32)


def push_frame(request_id: int, clock: int, values: np.ndarray, *, rank: int = 0) -> bytearray:
    return encode(Frame(MsgType.PUSH, request_id, KEYS, run=RUN, role=Role.WORKER, rank=rank,
                        clock=clock, flags=FLAG_COMMIT, payload=values))


def pull_frame(request_id: int, clock: int, *, rank: int = 0) -> bytearray:
    return encode(Frame(MsgType.PULL, request_id, KEYS, run=RUN, role=Role.WORKER, rank=rank,
                        clock=clock))


def init_frame(request_id: int, values: np.ndarray = START, *, rank: int = 0) -> bytearray:
    return encode(Frame(MsgType.INIT, request_id, KEYS, run=RUN, role=Role.WORKER, rank=rank,
                        payload=values))


Snapshot = tuple[list[float], list[int], int, list[list[int]], bool]


def snapshot(server: ShardServer) -> Snapshot:
    """What a copy holds: parameters, versions, pushes applied, clocks, initialised."""
    state = server.state
    return (state.params.tolist(), state.versions.tolist(), state.pushes,
            state.clocks.next.tolist(), state.initialized)


@dataclass
class Recorder:
    """A successor that records what it is sent and never answers (a hung or dying copy)."""

    listener: Listener | None = None
    connections: list[Connection] = field(default_factory=list)
    frames: list[bytes] = field(default_factory=list)

    async def serve(self, connection: Connection) -> None:
        self.connections.append(connection)
        with contextlib.suppress(ConnectionClosed):
            while True:
                message = await connection.recv()
                assert isinstance(message, bytes | bytearray)
                self.frames.append(bytes(message))

    @property
    def address(self) -> str:
        assert self.listener is not None
        return self.listener.address

    async def close(self) -> None:
        for connection in self.connections:
            with contextlib.suppress(PsctlError):
                await connection.close()
        if self.listener is not None:
            await self.listener.close()


@dataclass
class Peer:
    """A raw connection driven from the test's thread: it sends exactly the bytes it is given."""

    rig: Rig
    connection: Connection

    def send(self, data: bytes | bytearray) -> None:
        self.rig.io.call(self.connection.send(data), 5)

    def reply(self, timeout: float = 5.0) -> Frame:
        message = self.rig.io.call(asyncio.wait_for(self.connection.recv(), timeout),
                                   timeout + 5)
        assert isinstance(message, bytes | bytearray), message
        return decode(message, max_bytes=MIB)

    def silent(self, seconds: float = QUIET_S) -> bool:
        """True if nothing arrives within ``seconds``."""
        try:
            self.rig.io.call(asyncio.wait_for(self.connection.recv(), seconds), seconds + 5)
        except TimeoutError:
            return True
        return False

    def close(self) -> None:
        with contextlib.suppress(PsctlError):
            self.rig.io.call(self.connection.close(), 5)


@dataclass
class Rig:
    kind: str
    transport: Transport
    server_loop: LoopThread
    io: LoopThread
    servers: list[ShardServer] = field(default_factory=list)
    recorders: list[Recorder] = field(default_factory=list)
    peers: list[Peer] = field(default_factory=list)
    clients: list[ParameterClient] = field(default_factory=list)

    def on_server(self, action: Callable[[], T]) -> T:
        """``action`` on the servers' loop (their state is only touched there)."""

        async def call() -> T:
            return action()

        return self.server_loop.call(call(), 10)

    def server(self, rank: int, *, primary: bool = True, linked: bool = False,
               model: str = "asp", workers: int = 2) -> ShardServer:
        """A copy of KEYS as engine.roles.server builds one: a backup serves its chain
        predecessor only; ``linked`` gives it a chain link (connecting as server ``rank``)."""
        state = ShardState(KEYS, make_controller(model, workers=workers), SGD(len(KEYS), lr=LR),
                           workers=workers)
        server = ShardServer(state, run=RUN, rank=rank, max_frame_bytes=MIB)
        server.primary = primary
        if linked:
            server.link = ChainLink(self.transport, token=credential(TOKEN, "server", rank),
                                    max_frame_bytes=MIB, label=f"server {rank}")
        self.server_loop.call(server.start(self.transport, "127.0.0.1", 0, token=TOKEN), 10)
        self.servers.append(server)
        return server

    def relink(self, server: ShardServer, successor: str | None) -> None:
        link = server.link
        assert link is not None
        self.server_loop.call(link.relink(successor), 10)

    def recorder(self) -> Recorder:
        recorder = Recorder()

        async def listen() -> None:
            recorder.listener = await self.transport.listen("127.0.0.1", 0, recorder.serve,
                                                            token=TOKEN)

        self.server_loop.call(listen(), 10)
        self.recorders.append(recorder)
        return recorder

    def close_recorder(self, recorder: Recorder) -> None:
        self.server_loop.call(recorder.close(), 10)

    def peer(self, address: str, token: str) -> Peer:
        peer = Peer(self, self.io.call(self.transport.connect(address, token=token, timeout=5),
                                       10))
        self.peers.append(peer)
        return peer

    def worker(self, address: str, rank: int = 0) -> Peer:
        return self.peer(address, credential(TOKEN, "worker", rank))

    def client(self, address: str, rank: int = 0) -> ParameterClient:
        client = ParameterClient(
            self.transport, [ShardAddress(0, address, KEYS)], token=TOKEN, run=RUN,
            role=Role.WORKER, rank=rank, connect_timeout_s=5.0, request_timeout_s=10.0,
            max_frame_bytes=MIB, io=self.io, wire=PLAIN_WIRE)
        self.clients.append(client)
        client.connect()
        return client

    def snapshots(self, *servers: ShardServer) -> list[Snapshot]:
        return self.on_server(lambda: [snapshot(s) for s in servers])

    def until(self, condition: Callable[[], bool], timeout: float = 5.0) -> None:
        """Poll ``condition`` on the servers' loop until it holds."""
        deadline = self.server_loop.loop.time() + timeout

        async def wait() -> None:
            while not condition():
                assert self.server_loop.loop.time() < deadline, "condition not met in time"
                await asyncio.sleep(0.005)

        self.server_loop.call(wait(), timeout + 5)

    def close(self) -> None:
        for peer in self.peers:
            peer.close()
        for client in self.clients:
            client.close()
        for server in self.servers:
            with contextlib.suppress(PsctlError):
                self.server_loop.call(server.close(), 10)
        for recorder in self.recorders:
            with contextlib.suppress(PsctlError):
                self.server_loop.call(recorder.close(), 10)


def stop_loop(thread: LoopThread) -> None:
    thread.stop()
    if not thread.loop.is_running():
        thread.loop.close()


@pytest.fixture(params=["memory", "websocket"])
def rig(request: pytest.FixtureRequest) -> Iterator[Rig]:
    transport: Transport = (MemoryTransport() if request.param == "memory"
                            else WebSocketTransport(max_frame_bytes=MIB))
    server_loop, io = LoopThread("link-servers"), LoopThread("link-workers")
    made = Rig(request.param, transport, server_loop, io)
    try:
        yield made
    finally:
        made.close()
        stop_loop(io)
        stop_loop(server_loop)


def chain_of_two(rig: Rig, **kwargs: Any) -> tuple[ShardServer, ShardServer]:
    """A primary (rank 0) forwarding to a backup (rank 1), the tail."""
    backup = rig.server(1, primary=False, **kwargs)
    primary = rig.server(0, linked=True, **kwargs)
    rig.relink(primary, backup.address)
    return primary, backup


def link_of(server: ShardServer) -> ChainLink:
    assert server.link is not None
    return server.link


# -- acknowledged once the chain has it ---------------------------------------------------------


def test_a_push_is_acknowledged_after_the_backup_applied_it(rig: Rig) -> None:
    primary, backup = chain_of_two(rig)
    client = rig.client(primary.address)
    client.wait(client.init(START), timeout=5)
    assert rig.snapshots(primary) == rig.snapshots(backup)
    for clock in range(4):
        result = client.wait(client.push(KEYS, grad(clock), clock=clock, base_versions={}),
                             timeout=5)
        assert result.versions == {0: clock}
        # The ack is out only once the backup applied the push: it holds the same state now.
        mine, theirs = rig.snapshots(primary, backup)
        assert theirs == mine
        assert theirs[2] == clock + 1
    link = link_of(primary)
    assert rig.on_server(lambda: (link.forwarded, link.pending, link.refused)) == (5, 0, 0)
    expected = START - LR * sum(grad(c) / 2 for c in range(4))  # the mean over 2 workers
    np.testing.assert_allclose(rig.snapshots(backup)[0][0], expected, rtol=1e-6)


def test_a_chain_of_three_acknowledges_after_the_tail_applied_it(rig: Rig) -> None:
    tail = rig.server(2, primary=False)
    middle = rig.server(1, primary=False, linked=True)
    head = rig.server(0, linked=True)
    rig.relink(middle, tail.address)
    rig.relink(head, middle.address)
    client = rig.client(head.address)
    client.wait(client.init(START), timeout=5)
    for clock in range(3):
        client.wait(client.push(KEYS, grad(clock), clock=clock, base_versions={}), timeout=5)
        first, second, third = rig.snapshots(head, middle, tail)
        assert first == second == third
        assert third[2] == clock + 1


def test_no_ack_while_the_successor_has_not_answered(rig: Rig) -> None:
    """A successor that never answers holds the worker's INIT and PUSH acks back; what the
    primary forwarded travels under the link's own request ids."""
    hung = rig.recorder()
    primary = rig.server(0, linked=True)
    rig.relink(primary, hung.address)
    worker = rig.worker(primary.address)
    worker.send(init_frame(901))
    assert worker.silent()
    link = link_of(primary)
    assert rig.on_server(lambda: link.pending) == 1
    rig.until(lambda: len(hung.frames) == 1)
    forwarded = decode(hung.frames[0], max_bytes=MIB)
    assert (forwarded.type, forwarded.request_id) == (MsgType.INIT, 1)
    worker.send(push_frame(902, 0, grad(0)))
    assert worker.silent()
    assert rig.on_server(lambda: (link.pending, primary.state.pushes)) == (2, 1)


# -- relink(None): the tail ---------------------------------------------------------------------


def test_relink_none_makes_the_copy_the_tail_and_settles_pending_forwards(rig: Rig) -> None:
    hung = rig.recorder()
    primary = rig.server(0, linked=True)
    rig.relink(primary, hung.address)
    worker = rig.worker(primary.address)
    worker.send(init_frame(1))
    worker.send(push_frame(2, 0, grad(0)))
    assert worker.silent()
    link = link_of(primary)
    rig.relink(primary, None)
    acks = [worker.reply(), worker.reply()]
    assert [(a.type, a.request_id) for a in acks] == [(MsgType.ACK, 1), (MsgType.ACK, 2)]
    assert rig.on_server(lambda: (link.pending, link.successor)) == (0, None)
    worker.send(push_frame(3, 1, grad(1)))  # a tail acknowledges at once
    ack = worker.reply()
    assert (ack.type, ack.request_id, ack.clock) == (MsgType.ACK, 3, 1)
    assert rig.on_server(lambda: (link.pending, link.forwarded)) == (0, 2)
    assert len(hung.frames) == 2  # nothing more went to the old successor


def test_a_link_never_relinked_forwards_nothing_and_holds_the_ack(rig: Rig) -> None:
    primary = rig.server(0, linked=True)
    worker = rig.worker(primary.address)
    worker.send(init_frame(5))
    assert worker.silent()
    rig.relink(primary, None)
    assert worker.reply().request_id == 5


# -- a backup serves its predecessor only until it is promoted ----------------------------------


def test_a_backup_refuses_workers_until_it_is_promoted(rig: Rig) -> None:
    primary, backup = chain_of_two(rig)
    client = rig.client(primary.address)
    client.wait(client.init(START), timeout=5)
    client.wait(client.push(KEYS, grad(0), clock=0, base_versions={}), timeout=5)
    before = rig.snapshots(backup)
    worker = rig.worker(backup.address, rank=1)
    for request_id, frame in ((11, pull_frame(11, 0, rank=1)),
                              (12, push_frame(12, 0, grad(1), rank=1)),
                              (13, init_frame(13, rank=1))):
        worker.send(frame)
        reply = worker.reply()
        assert (reply.type, reply.request_id) == (MsgType.ERROR, request_id)
        code, message = reply.error()
        assert code == "not_primary"
        assert "server 1 holds a backup of these keys" in message
    assert rig.snapshots(backup) == before
    assert rig.on_server(lambda: backup.promoted_at) is None

    rig.on_server(backup.promote)
    assert rig.on_server(lambda: (backup.primary, backup.promoted_at is not None)) == (True, True)
    worker.send(pull_frame(21, 0, rank=1))
    values = worker.reply()
    assert (values.type, values.request_id) == (MsgType.VALUES, 21)
    assert values.values.tolist() == rig.snapshots(primary)[0][0]
    assert rig.on_server(lambda: backup.first_pull_at) is not None
    worker.send(push_frame(22, 0, grad(1), rank=1))
    ack = worker.reply()
    assert (ack.type, ack.request_id, ack.version) == (MsgType.ACK, 22, 1)
    assert rig.on_server(lambda: backup.state.pushes) == 2


def test_a_backup_serves_its_chain_predecessor(rig: Rig) -> None:
    """Frames from a connection admitted as a server (the predecessor) are applied by a backup,
    whatever worker they came from."""
    backup = rig.server(1, primary=False)
    predecessor = rig.peer(backup.address, credential(TOKEN, "server", 0))
    predecessor.send(init_frame(1))
    assert predecessor.reply().type is MsgType.ACK
    predecessor.send(push_frame(2, 0, grad(0), rank=1))
    assert predecessor.reply().type is MsgType.ACK
    predecessor.send(pull_frame(3, 0))
    refused = predecessor.reply()
    assert refused.type is MsgType.ERROR
    assert refused.error()[0] == "ProtocolError"
    assert rig.on_server(lambda: backup.state.pushes) == 1


# -- relinking after a successor died -----------------------------------------------------------


def test_relink_resends_unacknowledged_frames_in_order_and_duplicates_count_as_applied(
        rig: Rig) -> None:
    """The primary forwards clocks 1-3 to a successor that dies without answering (it had
    passed clocks 1 and 2 on to the backup), and clock 4 while it is dead. Relinked to another
    copy, the primary sends the four again, in order and byte for byte; relinked to the backup,
    the backup refuses clocks 1 and 2 as DuplicatePush, which settles them, and applies 3 and
    4: every worker push is acknowledged once, and the backup applied each exactly once."""
    backup = rig.server(1, primary=False)
    primary = rig.server(0, linked=True)
    link = link_of(primary)
    rig.relink(primary, backup.address)
    worker = rig.worker(primary.address)
    worker.send(init_frame(100))
    assert worker.reply().request_id == 100
    worker.send(push_frame(110, 0, grad(0)))
    assert worker.reply().request_id == 110  # clock 0: on the backup

    dying = rig.recorder()
    rig.relink(primary, dying.address)
    for clock in (1, 2, 3):
        worker.send(push_frame(110 + clock, clock, grad(clock)))
    assert worker.silent()
    rig.until(lambda: len(dying.frames) == 3)
    rig.close_recorder(dying)  # the old successor is gone
    worker.send(push_frame(114, 4, grad(4)))
    assert worker.silent()
    assert rig.on_server(lambda: (link.pending, primary.state.pushes)) == (4, 5)
    sent = [decode(f, max_bytes=MIB) for f in dying.frames]
    assert [(f.request_id, f.clock) for f in sent] == [(3, 1), (4, 2), (5, 3)]

    # Another copy gets all four again, in the order they were applied.
    again = rig.recorder()
    rig.relink(primary, again.address)
    rig.until(lambda: len(again.frames) == 4)
    assert again.frames[:3] == dying.frames
    assert [(f.request_id, f.clock) for f in (decode(m, max_bytes=MIB) for m in again.frames)] \
        == [(3, 1), (4, 2), (5, 3), (6, 4)]

    # The dying copy had passed clocks 1 and 2 on to the backup before it went.
    passed = rig.peer(backup.address, credential(TOKEN, "server", 2))
    for data in dying.frames[:2]:
        passed.send(data)
        assert passed.reply().type is MsgType.ACK
    assert rig.on_server(lambda: backup.state.pushes) == 3
    rig.close_recorder(again)

    rig.relink(primary, backup.address)
    acks = [worker.reply() for _ in range(4)]
    assert [(a.type, a.request_id, a.clock) for a in acks] == [
        (MsgType.ACK, 110 + clock, clock) for clock in (1, 2, 3, 4)]
    assert worker.silent()
    assert rig.on_server(lambda: (link.pending, link.refused)) == (0, 0)
    mine, theirs = rig.snapshots(primary, backup)
    assert theirs == mine
    assert theirs[2] == 5  # clocks 0-4, each applied once
    assert rig.on_server(lambda: (backup.state.duplicates, backup.stats.resent_pushes)) == (2, 0)
    assert rig.on_server(lambda: backup.stats.errors_by_code) == {"DuplicatePush": 2}


def test_a_successor_refusing_a_frame_for_another_reason_settles_it_and_counts(
        rig: Rig) -> None:
    """A frame the successor refuses for another reason than a duplicate (here: it was linked
    after the INIT, so it was never initialised) is counted as refused and settled, so the
    worker is not held forever."""
    backup = rig.server(1, primary=False)
    primary = rig.server(0, linked=True)
    link = link_of(primary)
    rig.relink(primary, None)
    worker = rig.worker(primary.address)
    worker.send(init_frame(1))
    assert worker.reply().request_id == 1
    rig.relink(primary, backup.address)
    worker.send(push_frame(2, 0, grad(0)))
    ack = worker.reply()
    assert (ack.type, ack.request_id) == (MsgType.ACK, 2)
    assert rig.on_server(lambda: (link.refused, link.pending, backup.state.pushes,
                                  backup.stats.errors_by_code)) == (1, 0, 0, {"ProtocolError": 1})


# -- link ids -----------------------------------------------------------------------------------


def test_two_workers_pushes_with_the_same_request_id_are_both_forwarded(rig: Rig) -> None:
    primary, backup = chain_of_two(rig)
    first, second = rig.worker(primary.address, 0), rig.worker(primary.address, 1)
    first.send(init_frame(7, rank=0))
    assert first.reply().request_id == 7
    first.send(push_frame(7, 0, grad(10), rank=0))
    second.send(push_frame(7, 0, grad(11), rank=1))
    for peer in (first, second):
        ack = peer.reply()
        assert (ack.type, ack.request_id) == (MsgType.ACK, 7)
    mine, theirs = rig.snapshots(primary, backup)
    assert theirs == mine
    assert theirs[2] == 2  # both applied on the backup, neither taken for a resend
    assert theirs[3] == [[1], [1]]
    link = link_of(primary)
    assert rig.on_server(lambda: (link.forwarded, backup.stats.resent_pushes,
                                  backup.state.duplicates)) == (3, 0, 0)
    expected = START - LR * (grad(10) + grad(11)) / 2
    np.testing.assert_allclose(theirs[0], expected, rtol=1e-6)


def test_a_worker_resending_a_push_gets_one_ack_and_one_forward(rig: Rig) -> None:
    """The primary recognises a push sent again by its request id while the chain still has it:
    it is neither applied nor forwarded twice, and answered once the chain has it."""
    hung = rig.recorder()
    primary = rig.server(0, linked=True)
    link = link_of(primary)
    rig.relink(primary, None)
    worker = rig.worker(primary.address)
    worker.send(init_frame(1))
    assert worker.reply().request_id == 1
    rig.relink(primary, hung.address)
    frame = push_frame(2, 0, grad(0))
    worker.send(frame)
    worker.send(frame)  # its ack is on the way: nothing goes out for this one
    assert worker.silent()
    # The INIT went nowhere (the copy was the tail then): the push is the one forward.
    assert rig.on_server(lambda: (link.forwarded, primary.stats.resent_pushes)) == (1, 1)
    rig.close_recorder(hung)
    rig.relink(primary, None)
    ack = worker.reply()
    assert (ack.type, ack.request_id) == (MsgType.ACK, 2)
    assert worker.silent()
    worker.send(frame)  # once acknowledged, a resend gets the same ack again
    assert worker.reply() == ack
    assert rig.on_server(lambda: (primary.state.pushes, link.forwarded)) == (1, 1)


# -- a tail handing its copy to a joining server ------------------------------------------------


def test_a_holding_tail_keeps_acks_until_it_links_to_the_newcomer(rig: Rig) -> None:
    """After ``hold`` the tail applies pushes but acknowledges none; once relinked to the
    newcomer (which restored the tail's snapshot), it sends what it kept, in order, and the
    acks go out as the newcomer applies them."""
    tail = rig.server(0, linked=True)
    rig.relink(tail, None)
    worker = rig.worker(tail.address)
    worker.send(init_frame(1))
    assert worker.reply().request_id == 1
    worker.send(push_frame(2, 0, grad(0)))
    assert worker.reply().request_id == 2
    snapshot_of = rig.on_server(lambda: snapshot(tail))
    link = link_of(tail)
    rig.on_server(link.hold)
    worker.send(push_frame(3, 1, grad(1)))
    worker.send(push_frame(4, 2, grad(2)))
    assert worker.silent()
    assert rig.on_server(lambda: (link.pending, tail.state.pushes)) == (2, 3)
    newcomer = rig.server(1, primary=False, linked=True)
    rig.relink(newcomer, None)

    def restore() -> None:  # what a Restore order does: the tail's copy as it was snapshotted
        state = newcomer.state
        state.params[:] = snapshot_of[0]
        state.versions[:] = snapshot_of[1]
        state.pushes = snapshot_of[2]
        state.clocks.next[:] = snapshot_of[3]
        state.initialized = True

    rig.on_server(restore)
    rig.relink(tail, newcomer.address)
    assert [worker.reply().request_id for _ in range(2)] == [3, 4]
    assert rig.snapshots(tail) == rig.snapshots(newcomer)
    assert rig.on_server(lambda: link.held_since) is None


def test_only_a_tail_may_hold(rig: Rig) -> None:
    primary, _ = chain_of_two(rig)
    with pytest.raises(ProtocolError, match="only a chain's tail"):
        rig.on_server(link_of(primary).hold)


def test_a_demoted_copy_refuses_workers_and_release_moves_them_but_not_its_chain(
        rig: Rig) -> None:
    primary, backup = chain_of_two(rig)
    worker = rig.worker(primary.address)
    worker.send(init_frame(1))
    assert worker.reply().request_id == 1
    rig.on_server(primary.demote)
    worker.send(push_frame(2, 0, grad(0)))
    refused = worker.reply()
    assert refused.type is MsgType.ERROR and refused.error()[0] == "not_primary"
    closed = rig.server_loop.call(primary.release_clients("moved"), 10)
    assert closed == 1
    with pytest.raises(ConnectionClosed) as error:
        worker.reply()
    assert error.value.code == CLOSE_MOVED  # the client looks for the range elsewhere
    # The chain link to the backup is untouched: the demoted copy still forwards.
    assert rig.on_server(lambda: link_of(primary).successor) == backup.address


def test_a_client_told_where_the_copies_are_follows_a_moved_range(rig: Rig) -> None:
    """No replicas at the start (no backups known): the client learns the new copy from the
    coordinator (``set_copies``), and the old copy's close as moved sends it there."""
    old = rig.server(0)
    client = rig.client(old.address)
    client.wait(client.init(START), timeout=5)
    client.wait(client.push(KEYS, grad(0), clock=0, base_versions={}), timeout=5)
    new = rig.server(1)
    rig.on_server(lambda: setattr(new, "state", old.state))  # the handoff, in short

    async def tell() -> None:
        client.set_copies({0: [new.address, old.address]})

    rig.io.call(tell(), 5)
    rig.on_server(old.demote)
    rig.server_loop.call(old.release_clients("moved"), 10)
    result = client.wait(client.push(KEYS, grad(1), clock=1, base_versions={}), timeout=5)
    assert result.versions == {0: 1}
    assert rig.on_server(lambda: new.state.pushes) == 2


def test_without_word_of_other_copies_a_plain_close_fails_the_client(rig: Rig) -> None:
    old = rig.server(0)
    client = rig.client(old.address)
    client.wait(client.init(START), timeout=5)
    rig.server_loop.call(old.close(), 10)
    with pytest.raises(PsctlError):
        client.wait(client.push(KEYS, grad(0), clock=0, base_versions={}), timeout=15)
