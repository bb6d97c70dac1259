"""Data-plane resends and duplicates between a shard server (engine.server.service) and the
parameter client (engine.worker.client): a push sent again under its request id is applied once
and acknowledged alike, a waiting pull sent again is answered once, a lossy or slow link changes
no result (the run configuration refuses a lossy link with a pull filter), CLOCKS tells a
(restarted) worker where to pick up, and ``duplicates_ok`` turns the refusal of an already
committed clock into an acknowledgement."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import pytest
from pydantic import ValidationError

from engine.aio import LoopThread
from engine.config import RunConfig
from engine.consistency.registry import make_controller
from engine.errors import RemoteError
from engine.keys import KeyLayout, KeyRange, Segment
from engine.roles.worker import link_faults
from engine.server.optimizers import SGD
from engine.server.pull_filter import make_pull_filter
from engine.server.service import REMEMBERED_ACKS, ShardServer
from engine.server.shard import ShardState
from engine.transport import MemoryTransport, WebSocketTransport
from engine.transport.base import Connection, Transport
from engine.wire.protocol import (
    ANY_CLOCK,
    FLAG_COMMIT,
    Frame,
    MsgType,
    Role,
    decode,
    encode,
)
from engine.worker.client import (
    PLAIN_WIRE,
    LinkFaults,
    ParameterClient,
    PullResult,
    ShardAddress,
    WireFormat,
)

TOKEN = "join-token-for-resend-tests"
RUN = bytes.fromhex("0f1e2d3c4b5a69788796a5b4c3d2e1f0")
MIB = 2**20
LR = 0.5
KEYS = KeyRange(0, 8)
START8 = np.arange(1, 9, dtype=np.float32)
TWO_SHARDS = [KeyRange(0, 4), KeyRange(4, 8)]

pytestmark = pytest.mark.timeout(30)
T = TypeVar("T")


@dataclass
class Rig:
    """Shard servers on one loop thread, clients (and raw peers) on another."""

    kind: str
    transport: Transport
    server_loop: LoopThread
    io: LoopThread
    servers: list[ShardServer] = field(default_factory=list)
    addresses: list[str] = field(default_factory=list)
    clients: list[ParameterClient] = field(default_factory=list)
    peers: list[RawPeer] = field(default_factory=list)

    def start(self, keys: list[KeyRange], *, model: str = "asp", workers: int = 1,
              layout: KeyLayout | None = None, pull_filter: str = "none") -> None:
        for rank, owned in enumerate(keys):
            ranges = layout.clock_ranges(owned) if layout is not None else None
            state = ShardState(
                owned, make_controller(model, workers=workers, ranges=len(ranges or [owned])),
                SGD(len(owned), lr=LR), workers=workers, ranges=ranges)
            server = ShardServer(state, run=RUN, rank=rank, max_frame_bytes=MIB,
                                 pull_filter=make_pull_filter(pull_filter, 1000, workers,
                                                              len(owned)))
            self.addresses.append(self.server_loop.call(
                server.start(self.transport, "127.0.0.1", 0, token=TOKEN), 10))
            self.servers.append(server)

    def client(self, rank: int = 0, *, role: Role = Role.WORKER,
               faults: LinkFaults | None = None, duplicates_ok: bool = False,
               wire: WireFormat = PLAIN_WIRE) -> ParameterClient:
        shards = [ShardAddress(i, address, server.state.keys) for i, (address, server)
                  in enumerate(zip(self.addresses, self.servers, strict=True))]
        client = ParameterClient(
            self.transport, shards, token=TOKEN, run=RUN, role=role, rank=rank,
            connect_timeout_s=5.0, request_timeout_s=10.0, max_frame_bytes=4 * MIB, io=self.io,
            faults=faults, duplicates_ok=duplicates_ok, wire=wire)
        self.clients.append(client)
        client.connect()
        return client

    def on_server(self, action: Callable[[], Any]) -> Any:
        """Run ``action`` on the servers' loop (their state is only touched there)."""

        async def call() -> Any:
            return action()

        return self.server_loop.call(call(), 10)

    def each(self, read: Callable[[ShardServer], T]) -> list[T]:
        """``read`` of every server, on the servers' loop."""

        async def call() -> list[T]:
            return [read(server) for server in self.servers]

        result: list[T] = self.server_loop.call(call(), 10)
        return result

    def raw(self, shard: int = 0) -> RawPeer:
        peer = RawPeer(self, self.io.call(
            self.transport.connect(self.addresses[shard], token=TOKEN, timeout=5), 10))
        self.peers.append(peer)
        return peer

    def close(self) -> None:
        for peer in self.peers:
            peer.close()
        for client in self.clients:
            client.close()
        for server in self.servers:
            self.server_loop.call(server.close(), 10)


@dataclass
class RawPeer:
    """A connection that sends exactly the bytes it is given, driven from the test's thread."""

    rig: Rig
    connection: Connection

    def send(self, data: bytes | bytearray) -> None:
        self.rig.io.call(self.connection.send(data), 5)

    def recv(self) -> bytes:
        message = self.rig.io.call(asyncio.wait_for(self.connection.recv(), 5), 10)
        assert isinstance(message, bytes | bytearray), message
        return bytes(message)

    def reply(self) -> Frame:
        return decode(self.recv(), max_bytes=MIB)

    def close(self) -> None:
        self.rig.io.call(self.connection.close(), 5)


def stop_loop(thread: LoopThread) -> None:
    thread.stop()
    if not thread.loop.is_running():
        thread.loop.close()


@pytest.fixture
def make_rig() -> Iterator[Callable[[str], Rig]]:
    made: list[Rig] = []
    loops: list[LoopThread] = []

    def make(kind: str) -> Rig:
        transport: Transport = (MemoryTransport() if kind == "memory"
                                else WebSocketTransport(max_frame_bytes=MIB))
        server_loop, io = LoopThread("resend-server"), LoopThread("resend-client")
        loops.extend([io, server_loop])
        rig = Rig(kind, transport, server_loop, io)
        made.append(rig)
        return rig

    yield make
    for rig in made:
        rig.close()
    for thread in loops:
        stop_loop(thread)


@pytest.fixture(params=["websocket", "memory"])
def rig(request: pytest.FixtureRequest, make_rig: Callable[[str], Rig]) -> Rig:
    return make_rig(request.param)


def grad(clock: int, size: int = 8) -> np.ndarray:
    return np.random.default_rng(clock).normal(size=size).astype(np.float32)


def push_frame(request_id: int, clock: int, values: np.ndarray, *, rank: int = 0,
               keys: KeyRange = KEYS) -> bytearray:
    return encode(Frame(MsgType.PUSH, request_id, keys, run=RUN, role=Role.WORKER, rank=rank,
                        clock=clock, flags=FLAG_COMMIT, payload=values))


def pull_frame(request_id: int, clock: int, *, rank: int = 0,
               role: Role = Role.WORKER) -> bytearray:
    return encode(Frame(MsgType.PULL, request_id, KEYS, run=RUN, role=role, rank=rank,
                        clock=clock))


def until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.005)


def initialised(rig: Rig, *clients: ParameterClient) -> ParameterClient:
    client = clients[0] if clients else rig.client(0)
    client.wait(client.init(START8), timeout=5)
    return client


# -- pushes sent again ------------------------------------------------------------------------


def test_a_push_sent_twice_is_applied_once_and_acked_alike(rig: Rig) -> None:
    rig.start([KEYS])
    initialised(rig)
    peer = rig.raw()
    frame = push_frame(41, 0, np.ones(8, dtype=np.float32))
    peer.send(frame)
    peer.send(frame)
    first, second = peer.recv(), peer.recv()
    assert first == second
    ack = decode(first, max_bytes=MIB)
    assert (ack.type, ack.request_id, ack.clock, ack.version) == (MsgType.ACK, 41, 0, 0)
    assert ack.payload is not None and ack.payload.tolist() == [1.0]  # the applied scale
    server = rig.servers[0]
    state = rig.on_server(lambda: (server.stats.resent_pushes, server.state.pushes,
                                   server.state.version, server.state.duplicates,
                                   server.state.params.tolist()))
    assert state == (1, 1, 1, 0, (START8 - LR).tolist())


def test_a_resent_push_gets_its_own_ack_after_later_pushes(rig: Rig) -> None:
    rig.start([KEYS])
    initialised(rig)
    peer = rig.raw()
    frames = [push_frame(10 + clock, clock, grad(clock)) for clock in range(3)]
    for frame in frames:
        peer.send(frame)
    acks = [peer.recv() for _ in frames]
    peer.send(frames[0])
    peer.send(frames[2])
    assert [peer.recv(), peer.recv()] == [acks[0], acks[2]]
    assert [decode(a, max_bytes=MIB).version for a in acks] == [0, 1, 2]
    stats = rig.on_server(lambda: (rig.servers[0].stats.resent_pushes,
                                   rig.servers[0].state.pushes))
    assert stats == (2, 3)


def test_a_new_request_id_for_a_committed_clock_is_a_duplicate(rig: Rig) -> None:
    rig.start([KEYS])
    initialised(rig)
    peer = rig.raw()
    peer.send(push_frame(1, 0, np.ones(8, dtype=np.float32)))
    assert peer.reply().type is MsgType.ACK
    peer.send(push_frame(2, 0, np.ones(8, dtype=np.float32)))  # same clock, a new request
    refusal = peer.reply()
    assert refusal.type is MsgType.ERROR and refusal.request_id == 2
    assert refusal.error() == ("DuplicatePush", "worker 0 already committed clock 0 on clock "
                                                "range 0")
    # request ids are remembered per connection: the same id from another one is new
    other = rig.raw()
    other.send(push_frame(1, 0, np.ones(8, dtype=np.float32)))
    assert other.reply().error()[0] == "DuplicatePush"
    counts = rig.on_server(lambda: (rig.servers[0].stats.resent_pushes,
                                    rig.servers[0].state.duplicates,
                                    rig.servers[0].state.pushes))
    assert counts == (0, 2, 1)


def test_only_the_latest_acks_are_remembered(rig: Rig) -> None:
    rig.start([KEYS])
    initialised(rig)
    peer = rig.raw()
    zeros = np.zeros(8, dtype=np.float32)
    frames = [push_frame(1000 + clock, clock, zeros) for clock in range(REMEMBERED_ACKS + 1)]
    for frame in frames:
        peer.send(frame)
    acks = [peer.reply() for _ in frames]
    assert all(a.type is MsgType.ACK for a in acks)
    peer.send(frames[1])  # still remembered
    assert peer.reply().request_id == 1001
    peer.send(frames[0])  # the oldest was forgotten: now it is a duplicate push
    assert peer.reply().error()[0] == "DuplicatePush"
    assert rig.on_server(lambda: rig.servers[0].state.pushes) == REMEMBERED_ACKS + 1


# -- pulls sent again -------------------------------------------------------------------------


def test_a_waiting_pull_sent_again_is_answered_once(rig: Rig) -> None:
    rig.start([KEYS], model="bsp", workers=2)
    a, b = rig.client(0), rig.client(1)
    initialised(rig, a)
    server = rig.servers[0]
    peer = rig.raw()
    frame = pull_frame(7, 1)  # clock 1 under BSP: waits for round 0
    peer.send(frame)
    peer.send(frame)
    until(lambda: rig.on_server(lambda: server.stats.resent_pulls) == 1)
    assert rig.on_server(lambda: len(server._waiting)) == 1
    for rank, client in enumerate((a, b)):
        client.wait(client.push(KEYS, np.full(8, 2.0 * (rank + 1), np.float32), clock=0,
                                base_versions={0: 0}), timeout=5)
    values = peer.reply()
    assert (values.type, values.request_id, values.version) == (MsgType.VALUES, 7, 1)
    assert values.values.tolist() == (START8 - LR * 3.0).tolist()  # the mean of 2 and 4
    # had the repeat been queued, its answer would come before the next request's
    peer.send(pull_frame(8, ANY_CLOCK))
    assert peer.reply().request_id == 8
    assert rig.on_server(lambda: (server.stats.resent_pulls, len(server._waiting))) == (1, 0)


def test_a_pull_sent_again_after_its_answer_is_answered_again(rig: Rig) -> None:
    rig.start([KEYS])
    initialised(rig)
    peer = rig.raw()
    frame = pull_frame(3, 0)  # ready at once: each copy is answered (the answer was lost)
    peer.send(frame)
    peer.send(frame)
    first, second = peer.reply(), peer.reply()
    assert (first.request_id, second.request_id) == (3, 3)
    assert first.values.tolist() == second.values.tolist() == START8.tolist()
    assert rig.on_server(lambda: rig.servers[0].stats.resent_pulls) == 0


# -- a lossy or slow link ---------------------------------------------------------------------


def training(client: ParameterClient, clocks: int) -> list[list[float]]:
    """Init, then pull and push for ``clocks`` clocks, one request at a time; the values of
    every pull."""
    client.wait(client.init(START8), timeout=10)
    pulled = []
    for clock in range(clocks):
        out = np.zeros(8, dtype=np.float32)
        result = client.wait(client.pull(KEYS, out, clock=clock), timeout=10)
        pulled.append(out.tolist())
        client.wait(client.push(KEYS, grad(clock), clock=clock,
                                base_versions=result.versions), timeout=10)
    out = np.zeros(8, dtype=np.float32)
    client.wait(client.pull(KEYS, out, clock=ANY_CLOCK), timeout=10)
    return [*pulled, out.tolist()]


def test_a_lossy_link_changes_no_value(make_rig: Callable[[str], Rig]) -> None:
    plain_rig, lossy_rig = make_rig("websocket"), make_rig("websocket")
    for each in (plain_rig, lossy_rig):
        each.start(TWO_SHARDS, model="asp", workers=1)
    plain = plain_rig.client(0)
    lossy = lossy_rig.client(0, faults=LinkFaults(drop=0.3, resend_after_s=0.05, seed=1))
    started = time.perf_counter()
    assert training(lossy, 5) == training(plain, 5)
    assert time.perf_counter() - started < 10
    assert lossy_rig.each(lambda s: s.state.params.tobytes()) == \
        plain_rig.each(lambda s: s.state.params.tobytes())
    assert lossy_rig.each(lambda s: (s.state.pushes, s.state.version, s.state.duplicates)) == \
        [(5, 5, 0), (5, 5, 0)]
    stats = lossy.link_stats
    assert stats["dropped"] > 0 and stats["resent"] > 0, stats
    assert plain.link_stats == {"dropped": 0, "resent": 0}
    assert lossy.clock() == plain.clock() == 5


def test_a_lossy_link_is_refused_with_a_pull_filter() -> None:
    # A filtered answer is recorded as sent (SignificantlyModified.select); were it lost, the
    # pull sent again would get only what changed since, and the worker's copy would keep
    # stale values. So the run configuration refuses injected drops with a pull filter, and a
    # worker's link (link_faults, the only place a lossy link is made) drops nothing then.
    def run(inject: list[str], pull_filter: str) -> dict[str, Any]:
        return {"cluster": {"workers": 1, "servers": 2}, "comm": {"pull_filter": pull_filter},
                "fault": {"inject": inject}}

    for inject in (["drop:30%"], ["delay:5ms", "drop:0.1%"]):
        with pytest.raises(ValidationError) as caught:
            RunConfig.model_validate(run(inject, "significant:0"))
        assert [e["msg"] for e in caught.value.errors()] == [
            "Value error, fault.inject drop and comm.pull_filter do not mix: a filtered answer "
            "that is lost cannot be sent again as it was"]
    delayed = link_faults(RunConfig.model_validate(run(["delay:5ms"], "significant:0")))
    assert delayed is not None and (delayed.drop, delayed.delay_s) == (0.0, 0.005)
    lossy = link_faults(RunConfig.model_validate(run(["drop:30%"], "none")))
    assert lossy is not None and lossy.drop == 0.3


def test_a_lossy_link_resends_a_waiting_pull_that_is_answered_once(
        make_rig: Callable[[str], Rig]) -> None:
    rig = make_rig("websocket")
    rig.start([KEYS], model="bsp", workers=2)
    lossy = rig.client(0, faults=LinkFaults(drop=0.2, resend_after_s=0.02, seed=3))
    other = rig.client(1)
    lossy.wait(lossy.init(START8), timeout=10)
    out = np.zeros(8, dtype=np.float32)
    held = lossy.pull(KEYS, out, clock=1)
    until(lambda: rig.on_server(lambda: rig.servers[0].stats.resent_pulls) >= 2)
    for client in (lossy, other):
        client.wait(client.push(KEYS, np.ones(8, np.float32), clock=0, base_versions={0: 0}),
                    timeout=10)
    result: PullResult = lossy.wait(held, timeout=10)
    assert result.versions == {0: 1}
    assert out.tolist() == (START8 - LR).tolist()
    assert rig.on_server(lambda: len(rig.servers[0]._waiting)) == 0


def test_a_delayed_link_is_slower_and_loses_nothing(rig: Rig) -> None:
    rig.start(TWO_SHARDS)
    slow = rig.client(0, faults=LinkFaults(delay_s=0.02))
    slow.wait(slow.init(START8), timeout=5)
    out = np.zeros(8, dtype=np.float32)
    started = time.perf_counter()
    slow.wait(slow.pull(KEYS, out, clock=0), timeout=5)
    assert time.perf_counter() - started >= 0.02
    assert out.tolist() == START8.tolist()
    started = time.perf_counter()
    slow.wait(slow.push(KEYS, np.ones(8, np.float32), clock=0, base_versions={0: 0, 1: 0}),
              timeout=5)
    assert time.perf_counter() - started >= 0.02
    assert slow.link_stats == {"dropped": 0, "resent": 0}
    assert rig.each(lambda s: s.state.pushes) == [1, 1]


# -- CLOCKS: where a worker picks up ----------------------------------------------------------

LAYER_A, LAYER_B = KeyRange(0, 3), KeyRange(3, 8)
LAYERS = KeyLayout((Segment("a", (3,), LAYER_A), Segment("b", (5,), LAYER_B)))
SHARDS_5_3 = [KeyRange(0, 5), KeyRange(5, 8)]  # shard 0 holds a and part of b


def clocks_frame(request_id: int, keys: KeyRange, rank: int = 0) -> bytearray:
    return encode(Frame(MsgType.CLOCKS, request_id, keys, run=RUN, role=Role.WORKER, rank=rank))


def test_clock_is_the_slowest_clock_range_over_every_shard(rig: Rig) -> None:
    rig.start(SHARDS_5_3, model="asp", workers=2, layout=LAYERS)
    worker, other = rig.client(0), rig.client(1)
    initialised(rig, worker)
    assert worker.clock() == 0
    worker.wait(worker.push(LAYER_A, np.ones(3, np.float32), clock=0, base_versions={}), 5)
    assert worker.clock() == 0  # layer b is still at clock 0
    worker.wait(worker.push(LAYER_B, np.ones(5, np.float32), clock=0, base_versions={}), 5)
    assert worker.clock() == 1
    worker.wait(worker.push(LAYER_A, np.ones(3, np.float32), clock=1, base_versions={}), 5)
    worker.wait(worker.push(LAYER_A, np.ones(3, np.float32), clock=2, base_versions={}), 5)
    assert worker.clock() == 1
    assert other.clock() == 0
    # per span, a shard answers the clock of the slowest clock range it touches
    peer = rig.raw(0)
    answers = []
    for request_id, keys in ((1, LAYER_A), (2, KeyRange(3, 5)), (3, KeyRange(0, 5))):
        peer.send(clocks_frame(request_id, keys))
        ack = peer.reply()
        assert (ack.type, ack.request_id, ack.keys) == (MsgType.ACK, request_id, keys)
        answers.append(ack.clock)
    assert answers == [3, 1, 1]
    peer.send(clocks_frame(4, LAYER_A, rank=1))
    assert peer.reply().clock == 0


def test_clock_of_a_fresh_shard_is_zero_under_bsp(rig: Rig) -> None:
    rig.start(TWO_SHARDS, model="bsp", workers=3)
    assert [rig.client(rank).clock() for rank in range(3)] == [0, 0, 0]


@pytest.mark.parametrize("role", [Role.EVALUATOR, Role.CLIENT])
def test_only_workers_ask_for_their_clock(rig: Rig, role: Role) -> None:
    rig.start(TWO_SHARDS)
    stranger = rig.client(0, role=role)
    with pytest.raises(RemoteError) as caught:
        stranger.clock()
    assert re.fullmatch(r"shard server \d refused request \d+: ProtocolError: only workers ask "
                        r"for their clocks", str(caught.value))


def test_a_worker_rank_the_shard_lacks_is_refused(rig: Rig) -> None:
    rig.start([KEYS], workers=2)
    with pytest.raises(RemoteError, match="worker rank 2 is outside 0..1$"):
        rig.client(2).clock()


def test_clocks_of_keys_the_shard_does_not_hold_are_refused(rig: Rig) -> None:
    rig.start([KeyRange(0, 4)])
    peer = rig.raw()
    peer.send(clocks_frame(9, KeyRange(2, 6)))
    refusal = peer.reply()
    assert refusal.request_id == 9
    assert refusal.error() == ("BadPayload", "keys [2, 6) are not all on this shard, which "
                                             "holds [0, 4)")


# -- duplicates_ok: a restarted worker repeats a clock ----------------------------------------


def test_a_duplicate_raises_by_default(rig: Rig) -> None:
    rig.start(TWO_SHARDS)
    client = initialised(rig)
    client.wait(client.push(KEYS, np.ones(8, np.float32), clock=0, base_versions={}), 5)
    with pytest.raises(RemoteError, match="DuplicatePush: worker 0 already committed clock 0 "
                                          "on clock range 0$"):
        client.wait(client.push(KEYS, np.ones(8, np.float32), clock=0, base_versions={}), 5)


def test_with_duplicates_ok_a_committed_clock_counts_as_acknowledged(rig: Rig) -> None:
    rig.start(TWO_SHARDS)
    client = rig.client(0, duplicates_ok=True)
    initialised(rig, client)
    client.wait(client.push(KEYS, np.ones(8, np.float32), clock=0, base_versions={}), 5)
    again = client.wait(client.push(KEYS, np.full(8, 100.0, np.float32), clock=0,
                                    base_versions={}), 5)
    assert sorted(again.versions) == [0, 1]
    assert again.lr_scale is None  # nothing was applied
    counts = rig.each(lambda s: (s.state.pushes, s.state.version, s.state.duplicates,
                                 s.state.params.tolist()))
    assert counts == [(1, 1, 1, (START8[:4] - LR).tolist()),
                      (1, 1, 1, (START8[4:] - LR).tolist())]
    # a clock the shard is not at yet is still an error
    with pytest.raises(RemoteError, match="ProtocolError: worker 0 pushed clock 5 but its next "
                                          "clock is 1 on clock range 0$"):
        client.wait(client.push(KEYS, np.ones(8, np.float32), clock=5, base_versions={}), 5)


def test_a_restarted_worker_repeats_the_clock_one_shard_already_has(rig: Rig) -> None:
    rig.start(TWO_SHARDS)
    before = initialised(rig)
    before.wait(before.push(KEYS, np.ones(8, np.float32), clock=0, base_versions={}), 5)
    # clock 1 reached shard 0 only, then the worker died
    before.wait(before.push(KeyRange(0, 4), np.ones(4, np.float32), clock=1, base_versions={}),
                5)
    restarted = rig.client(0, duplicates_ok=True)
    assert restarted.clock() == 1
    restarted.wait(restarted.push(KEYS, np.full(8, 3.0, np.float32), clock=1, base_versions={}),
                   5)
    assert restarted.clock() == 2
    params = rig.each(lambda s: s.state.params.tolist())
    assert params == [(START8[:4] - 2 * LR).tolist(), (START8[4:] - LR - 3 * LR).tolist()]
    assert rig.each(lambda s: s.state.duplicates) == [1, 0]
