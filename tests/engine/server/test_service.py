"""A shard server driven by parameter clients, over the in-memory, websocket and TCP transports.

The server runs on its own event-loop thread, the clients on another (as in a worker process).
Raw peers then send what a broken or hostile peer might: each gets an ERROR frame naming the
problem (or a close for an oversize websocket message), and well-behaved clients keep working.
"""

from __future__ import annotations

import asyncio
import pickle
import re
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import websockets
from websockets.asyncio.client import connect as ws_connect

from engine.aio import LoopThread
from engine.config import LearningConfig
from engine.consistency.registry import make_controller
from engine.errors import (
    AuthenticationError,
    ConnectFailed,
    ConnectionClosed,
    ProtocolError,
    RemoteError,
    RequestTimeout,
    ShuttingDown,
)
from engine.keys import KeyLayout, KeyRange, RangePartitioner, Segment
from engine.server.learning import Learning, make_learning
from engine.server.optimizers import SGD
from engine.server.pull_filter import PullFilter, make_pull_filter
from engine.server.service import MAX_BAD_FRAMES, ShardServer
from engine.server.shard import ShardState, SparseKeys
from engine.transport import MemoryTransport, WebSocketTransport
from engine.transport.base import Transport
from engine.transport.tcp import TcpTransport
from engine.transport.websocket import TOKEN_HEADER
from engine.wire.protocol import (
    ANY_CLOCK,
    HEADER_BYTES,
    DType,
    Frame,
    MsgType,
    Role,
    decode,
    encode,
)
from engine.worker.client import (
    PLAIN_WIRE,
    ParameterClient,
    PullResult,
    PushResult,
    ShardAddress,
    WireFormat,
)

TOKEN = "join-token-for-tests"
RUN = bytes.fromhex("00112233445566778899aabbccddeeff")
MIB = 2**20
LR = 0.5
TRANSPORTS = ["memory", "websocket", "tcp"]

pytestmark = pytest.mark.timeout(60)


def stop_loop(thread: LoopThread) -> None:
    thread.stop()
    if not thread.loop.is_running():
        thread.loop.close()


@dataclass
class Rig:
    """Shard servers on one loop thread, clients on another, one transport between them."""

    kind: str
    transport: Transport
    server_loop: LoopThread
    io: LoopThread
    servers: list[ShardServer] = field(default_factory=list)
    addresses: list[str] = field(default_factory=list)
    clients: list[ParameterClient] = field(default_factory=list)

    def start(
        self,
        keys: list[KeyRange],
        *,
        model: str = "bsp",
        workers: int = 2,
        max_frame_bytes: int = MIB,
        layout: KeyLayout | None = None,
        momentum: float = 0.0,
        learning: Callable[[], Learning] | None = None,
        pull_filter: Callable[[int], PullFilter] | None = None,
        sparse: SparseKeys | None = None,
    ) -> None:
        for rank, owned in enumerate(keys):
            ranges = layout.clock_ranges(owned) if layout is not None else None
            size = len(owned) if sparse is None else sparse.capacity
            state = ShardState(
                owned,
                make_controller(model, workers=workers, ranges=len(ranges or [owned])),
                SGD(size, lr=LR, momentum=momentum),
                workers=workers,
                ranges=ranges,
                sparse=sparse,
                **({"learning": learning()} if learning is not None else {}),
            )
            server = ShardServer(state, run=RUN, rank=rank, max_frame_bytes=max_frame_bytes,
                                 pull_filter=pull_filter(size) if pull_filter else None)
            address = self.server_loop.call(
                server.start(self.transport, "127.0.0.1", 0, token=TOKEN), 10
            )
            self.servers.append(server)
            self.addresses.append(address)

    def shard_map(self) -> list[ShardAddress]:
        return [
            ShardAddress(i, address, server.state.keys)
            for i, (address, server) in enumerate(zip(self.addresses, self.servers, strict=True))
        ]

    def client(
        self,
        rank: int = 0,
        *,
        role: Role = Role.WORKER,
        token: str = TOKEN,
        run: bytes = RUN,
        shards: list[ShardAddress] | None = None,
        connect: bool = True,
        wire: WireFormat = PLAIN_WIRE,
    ) -> ParameterClient:
        client = ParameterClient(
            self.transport,
            self.shard_map() if shards is None else shards,
            token=token,
            run=run,
            role=role,
            rank=rank,
            connect_timeout_s=5.0,
            request_timeout_s=10.0,
            max_frame_bytes=4 * MIB,
            io=self.io,
            wire=wire,
        )
        self.clients.append(client)
        if connect:
            client.connect()
        return client

    def on_server(self, action: Callable[[], Any]) -> Any:
        """Run a synchronous server method on the server's loop (it may create tasks)."""

        async def call() -> Any:
            return action()

        return self.server_loop.call(call(), 10)

    def close(self) -> None:
        for client in self.clients:
            client.close()
        for server in self.servers:
            self.server_loop.call(server.close(), 10)


@pytest.fixture
def make_rig() -> Iterator[Callable[..., Rig]]:
    made: list[Rig] = []
    loops: list[LoopThread] = []

    def make(kind: str, *, transport_max: int = MIB) -> Rig:
        transport: Transport = {
            "memory": MemoryTransport,
            "websocket": lambda: WebSocketTransport(max_frame_bytes=transport_max),
            "tcp": lambda: TcpTransport(max_frame_bytes=transport_max),
        }[kind]()
        server_loop, io = LoopThread("test-server"), LoopThread("test-client")
        loops.extend([io, server_loop])
        rig = Rig(kind, transport, server_loop, io)
        made.append(rig)
        return rig

    yield make
    for rig in made:
        rig.close()
    for thread in loops:
        stop_loop(thread)


@pytest.fixture(params=TRANSPORTS)
def rig(request: pytest.FixtureRequest, make_rig: Callable[..., Rig]) -> Rig:
    return make_rig(request.param)


def f32(*values: float) -> np.ndarray:
    return np.array(values, dtype=np.float32)


START8 = np.arange(1, 9, dtype=np.float32)


def pull(client: ParameterClient, keys: KeyRange, clock: int) -> tuple[np.ndarray, PullResult]:
    out = np.full(len(keys), -999.0, dtype=np.float32)
    return out, client.wait(client.pull(keys, out, clock=clock))


def push(
    client: ParameterClient, keys: KeyRange, grad: np.ndarray, clock: int, base: dict[int, int]
) -> PushResult:
    return client.wait(client.push(keys, grad, clock=clock, base_versions=base))


# -- round trips --------------------------------------------------------------------------------


def test_init_then_pull_over_two_shards(rig: Rig) -> None:
    rig.start(RangePartitioner().ranges(8, 2))
    client = rig.client()
    acked = client.wait(client.init(START8))
    assert acked == PushResult(
        versions={0: 0, 1: 0}, staleness=0, bytes_sent=2 * (104 + 8 + 16), bytes_received=2 * 104
    )
    assert [s.state.params.tolist() for s in rig.servers] == [[1, 2, 3, 4], [5, 6, 7, 8]]

    values, result = pull(client, KeyRange(0, 8), ANY_CLOCK)
    assert values.tolist() == START8.tolist()
    assert result.versions == {0: 0, 1: 0}
    assert result.wait_s == 0.0

    values, result = pull(client, KeyRange(3, 6), 0)  # one key from shard 0, two from shard 1
    assert values.tolist() == [4.0, 5.0, 6.0]
    assert result.bytes_sent == 2 * 104
    assert result.bytes_received == (104 + 8 + 4) + (104 + 8 + 8)


def test_a_second_init_is_ignored(rig: Rig) -> None:
    rig.start([KeyRange(0, 8)])
    first, second = rig.client(0), rig.client(1)
    first.wait(first.init(START8))
    second.wait(second.init(np.zeros(8, dtype=np.float32)))
    values, _ = pull(second, KeyRange(0, 8), ANY_CLOCK)
    assert values.tolist() == START8.tolist()


def test_a_pull_before_init_waits_for_the_init(rig: Rig) -> None:
    rig.start([KeyRange(0, 8)])
    early, initializer = rig.client(1), rig.client(0)
    out = np.zeros(8, dtype=np.float32)
    request = early.pull(KeyRange(0, 8), out, clock=0)
    time.sleep(0.2)
    initializer.wait(initializer.init(START8))
    result = early.wait(request)
    assert isinstance(result, PullResult)
    assert out.tolist() == START8.tolist()
    assert result.wait_s > 0.1


# -- consistency over the wire ------------------------------------------------------------------


def test_bsp_pull_waits_for_every_worker(rig: Rig) -> None:
    keys = KeyRange(0, 8)
    rig.start([keys], model="bsp", workers=2)
    a, b = rig.client(0), rig.client(1)
    a.wait(a.init(START8))
    _, pulled_a = pull(a, keys, 0)
    _, pulled_b = pull(b, keys, 0)
    assert pulled_a.versions == pulled_b.versions == {0: 0}
    grad_a = np.linspace(-1, 1, 8, dtype=np.float32)
    grad_b = np.arange(8, dtype=np.float32) / 4

    pushed_a = push(a, keys, grad_a, 0, pulled_a.versions)
    out = np.zeros(8, dtype=np.float32)
    issued = time.perf_counter()
    held = a.pull(keys, out, clock=1)  # needs the update of clock 0: b has not pushed yet
    time.sleep(0.3)
    assert rig.servers[0].state.version == 0
    pushed_b = push(b, keys, grad_b, 0, pulled_b.versions)
    result = a.wait(held)
    elapsed = time.perf_counter() - issued

    assert isinstance(result, PullResult)
    assert result.wait_s > 0.2
    assert elapsed >= 0.3
    assert result.wait_s <= elapsed
    assert result.versions == {0: 1}
    assert (pushed_a.staleness, pushed_b.staleness) == (0, 0)
    assert pushed_a.versions == pushed_b.versions == {0: 0}
    mean = (np.zeros(8, dtype=np.float32) + grad_a + grad_b) / np.float32(2)
    np.testing.assert_allclose(out, START8 - np.float32(LR) * mean, rtol=1e-6)
    # b's pull for clock 1 is served at once now
    values_b, result_b = pull(b, keys, 1)
    assert result_b.wait_s == 0.0
    np.testing.assert_array_equal(values_b, out)


def test_asp_interleaved_clients_see_staleness(rig: Rig) -> None:
    keys = KeyRange(0, 8)
    rig.start([keys], model="asp", workers=2)
    a, b = rig.client(0), rig.client(1)
    a.wait(a.init(START8))
    _, pulled_a = pull(a, keys, 0)
    _, pulled_b = pull(b, keys, 0)
    grad_a, grad_b = np.ones(8, dtype=np.float32), np.full(8, 2.0, dtype=np.float32)
    pushed_a = push(a, keys, grad_a, 0, pulled_a.versions)
    pushed_b = push(b, keys, grad_b, 0, pulled_b.versions)
    assert (pushed_a.staleness, pushed_a.versions) == (0, {0: 0})
    assert (pushed_b.staleness, pushed_b.versions) == (1, {0: 1})  # a's update came between
    assert pushed_a.lr_scale == pushed_b.lr_scale == 0.5  # the mean's weight, no rule
    values, result = pull(a, keys, 1)
    assert result.versions == {0: 2}
    # each of the two workers' pushes applies half its gradient (push_scale "mean")
    np.testing.assert_allclose(values, START8 - LR * (grad_a + grad_b) / 2)


def test_acks_carry_the_applied_scale_key_weighted_over_shards(rig: Rig) -> None:
    config = LearningConfig(rule="dynsgd")
    rig.start([KeyRange(0, 4), KeyRange(4, 8)], model="asp", workers=2,
              learning=lambda: make_learning(config, 2, 2, 4))
    a, b = rig.client(0), rig.client(1)
    a.wait(a.init(START8))
    _, pulled_a = pull(a, KeyRange(0, 8), 0)
    _, pulled_b = pull(b, KeyRange(0, 8), 0)
    fresh = push(a, KeyRange(0, 8), np.ones(8, dtype=np.float32), 0, pulled_a.versions)
    assert (fresh.lr_scale, fresh.scaled_keys) == (0.5, 8)  # 1/2 (mean) x 1/(0+1)
    # b's push is one update stale on both shards: 1/2 x 1/(1+1).
    stale = push(b, KeyRange(0, 8), np.ones(8, dtype=np.float32), 0, pulled_b.versions)
    assert (stale.staleness, stale.lr_scale) == (1, 0.25)
    # A sparse push with keys on shard 0 only: shard 1 gets an empty commit and no scale.
    _, pulled = pull(a, KeyRange(0, 8), 1)
    sparse = a.wait(a.push(np.array([1, 2], dtype=np.uint32), np.ones(2, dtype=np.float32),
                           clock=1, base_versions=pulled.versions))
    assert (sparse.lr_scale, sparse.scaled_keys) == (0.5, 2)
    empty = a.wait(a.push(np.array([], dtype=np.uint32), np.ones(0, dtype=np.float32),
                          clock=2, base_versions=pulled.versions))
    assert (empty.lr_scale, empty.scaled_keys) == (None, 0)


def test_bsp_acks_carry_the_weight_of_the_round(rig: Rig) -> None:
    keys = KeyRange(0, 8)
    rig.start([keys], model="bsp", workers=2)
    a, b = rig.client(0), rig.client(1)
    a.wait(a.init(START8))
    for client in (a, b):
        _, pulled = pull(client, keys, 0)
        assert push(client, keys, np.ones(8, dtype=np.float32), 0, pulled.versions).lr_scale \
            == 0.5


@pytest.mark.parametrize(("dtype", "codec"), [("float16", "zstd"), ("bfloat16", "lz4"),
                                              ("float16", "none"), ("float32", "snappy")])
def test_narrow_and_packed_frames_carry_the_same_update(rig: Rig, dtype: str,
                                                        codec: str) -> None:
    keys = KeyRange(0, 4000)
    rig.start([KeyRange(0, 2000), KeyRange(2000, 4000)], model="asp", workers=1)
    plain, wire = rig.client(0), rig.client(0, wire=WireFormat.of(dtype, codec))
    start = np.linspace(-1, 1, len(keys), dtype=np.float32)
    plain.wait(plain.init(start))
    rng = np.random.default_rng(3)
    index = np.sort(rng.choice(len(keys), size=400, replace=False)).astype(np.uint32)
    grad = rng.standard_normal(400).astype(np.float32)
    sent = wire.wait(wire.push(index, grad, clock=0, base_versions={}))
    dense_pull = wire.wait(wire.pull(keys, out := np.empty(len(keys), np.float32), clock=1))
    expected = start.copy()
    expected[index] -= LR * grad
    tolerance = {"float32": 0.0, "float16": 2e-3, "bfloat16": 1.6e-2}[dtype]
    np.testing.assert_allclose(out, expected, rtol=tolerance, atol=tolerance)
    exact = np.empty(len(keys), np.float32)
    plain.wait(plain.pull(keys, exact, clock=ANY_CLOCK))
    np.testing.assert_allclose(exact, expected, rtol=tolerance, atol=tolerance)
    # A dense pull in a 2-byte type is half the bytes of float32 (less the headers).
    if dtype != "float32":
        assert dense_pull.bytes_received == 2 * (HEADER_BYTES + 8) + 2 * len(keys)
    # The sparse push: keys (4 bytes each) and values, packed where the codec shrinks them.
    width = 4 if dtype == "float32" else 2
    unpacked = 2 * (HEADER_BYTES + 8) + 400 * (4 + width)
    assert sent.bytes_sent <= unpacked and (codec != "zstd" or sent.bytes_sent < unpacked)
    sparse = np.empty(len(index), np.float32)
    wire.wait(wire.pull(index, sparse, clock=ANY_CLOCK))
    np.testing.assert_allclose(sparse, expected[index], rtol=tolerance, atol=tolerance)


def test_a_filtered_pull_sends_only_what_moved_and_the_client_fills_in_the_rest(
        rig: Rig) -> None:
    keys = KeyRange(0, 8)
    rig.start([KeyRange(0, 4), KeyRange(4, 8)], model="asp", workers=1,
              pull_filter=lambda size: make_pull_filter("significant:0.1", 3, 1, size))
    worker = rig.client(0, wire=WireFormat(keeps_copy=True))
    worker.wait(worker.init(START8))
    out = np.empty(8, np.float32)
    first = worker.wait(worker.pull(keys, out, clock=ANY_CLOCK))  # the first pull: whole
    np.testing.assert_array_equal(out, START8)
    grad = np.array([1.0, 0.01, 0.0, -1.0, 0.01, 0.01, 0.5, 0.0], dtype=np.float32)
    worker.wait(worker.push(keys, grad, clock=0, base_versions=first.versions))
    second = worker.wait(worker.pull(keys, out, clock=ANY_CLOCK))
    moved = START8 - LR * grad
    big = np.abs(LR * grad) > 0.1  # keys 0, 3 and 6 moved by 0.5, 0.5 and 0.25
    np.testing.assert_array_equal(out[big], moved[big])
    np.testing.assert_array_equal(out[~big], START8[~big])  # the worker's copy, unchanged
    assert second.bytes_received < first.bytes_received
    # Another 0.005 on keys 1, 4 and 5: 0.01 in all since they were sent, still below DELTA.
    worker.wait(worker.push(keys, grad * (np.abs(grad) < 0.1), clock=1,
                            base_versions=second.versions))
    worker.wait(worker.pull(keys, out, clock=ANY_CLOCK))
    np.testing.assert_array_equal(out[[1, 4, 5]], START8[[1, 4, 5]])
    worker.wait(worker.pull(keys, out, clock=ANY_CLOCK))  # the 4th pull: whole again
    exact = np.empty(8, np.float32)
    probe = rig.client(0, role=Role.CLIENT)  # not a worker: its pulls are never filtered
    probe.wait(probe.pull(keys, exact, clock=ANY_CLOCK))
    np.testing.assert_array_equal(out, exact)
    assert exact[1] == pytest.approx(START8[1] - 2 * LR * 0.01)


def test_filtered_pulls_of_sparse_shards_by_key_send_what_moved_or_was_never_sent(
        rig: Rig) -> None:
    # Two sparse shards of a 2^40-key space, pulled by key as a sparse worker pulls its working
    # set: the client holds what it was sent by key (no dense copy of 2^40 keys).
    def initial(keys: np.ndarray) -> np.ndarray:
        return (keys % 7).astype(np.float32)

    half = 2**39
    rig.start([KeyRange(0, half), KeyRange(half, 2 * half)], model="asp", workers=1,
              pull_filter=lambda size: make_pull_filter("significant:0.1", 4, 1, size),
              sparse=SparseKeys(capacity=64, initial=initial))
    worker = rig.client(0, wire=WireFormat(keeps_copy=True))
    probe = rig.client(0, role=Role.CLIENT)  # not a worker: never filtered

    def exact(keys: np.ndarray) -> np.ndarray:
        values = np.empty(len(keys), np.float32)
        probe.wait(probe.pull(keys, values, clock=ANY_CLOCK))
        return values

    def pulled(client: ParameterClient, keys: np.ndarray) -> tuple[np.ndarray, PullResult]:
        values = np.full(len(keys), -999.0, np.float32)
        return values, client.wait(client.pull(keys, values, clock=ANY_CLOCK))

    keys = np.array([3, 10, 2**38, half + 5, half + 2**30, 2 * half - 1], dtype=np.uint64)
    out, first = pulled(worker, keys)  # nothing stored yet: every key is sent
    np.testing.assert_array_equal(out, initial(keys))
    grad = np.array([1.0, 0.01, -1.0, 0.01, 0.5, 0.0], np.float32)
    worker.wait(worker.push(keys, grad, clock=0, base_versions=first.versions))
    held, second = pulled(worker, keys)  # stored rows never sent by row: due, so all sent
    np.testing.assert_array_equal(held, exact(keys))
    worker.wait(worker.push(keys, grad, clock=1, base_versions=second.versions))
    out, third = pulled(worker, keys)
    # Moved by 0.5, 0.5 and 0.25: sent; by 0.005, or not at: the values the worker holds.
    big = np.abs(LR * grad) > 0.1
    np.testing.assert_array_equal(out[big], exact(keys)[big])
    np.testing.assert_array_equal(out[~big], held[~big])
    assert third.bytes_received < second.bytes_received
    # A key the shard does not store is sent (its initial value) beside the filtered ones.
    more = np.sort(np.append(keys, np.uint64(12345)))
    out, _ = pulled(worker, more)
    assert out[np.searchsorted(more, 12345)] == initial(np.array([12345]))[0]
    # Every 4th answer of a row is whole (the 2nd pull, then the 6th): exact values again.
    out, _ = pulled(worker, keys)
    np.testing.assert_array_equal(out[~big], held[~big])
    out, _ = pulled(worker, keys)
    np.testing.assert_array_equal(out, exact(keys))
    # A new connection of worker 0 (a restarted worker, holding nothing) is sent every value.
    worker.wait(worker.push(keys, grad / 100, clock=2, base_versions={}))
    restarted = rig.client(0, wire=WireFormat(keeps_copy=True))
    out, _ = pulled(restarted, keys)
    np.testing.assert_array_equal(out, exact(keys))


def test_a_filtered_answer_without_a_copy_is_refused_clearly(rig: Rig) -> None:
    rig.start([KeyRange(0, 8)], model="asp", workers=1,
              pull_filter=lambda size: make_pull_filter("significant:0", 100, 1, size))
    worker = rig.client(0)  # keeps no copy
    worker.wait(worker.init(START8))
    out = np.empty(8, np.float32)
    worker.wait(worker.pull(KeyRange(0, 8), out, clock=ANY_CLOCK))
    worker.wait(worker.push(KeyRange(0, 8), np.eye(8, dtype=np.float32)[2], clock=0,
                            base_versions={}))
    with pytest.raises(ProtocolError, match="keeps no copy"):
        worker.wait(worker.pull(KeyRange(0, 8), out, clock=ANY_CLOCK))


@pytest.mark.parametrize("size", [1, 3, 5])
def test_a_range_size_splits_frames_and_changes_no_result(rig: Rig, size: int) -> None:
    keys = KeyRange(0, 8)
    rig.start([KeyRange(0, 5), KeyRange(5, 8)], model="bsp", workers=2)
    split = [rig.client(0, wire=WireFormat(range_size=size)), rig.client(1)]
    split[0].wait(split[0].init(START8))
    grads = [np.arange(8, dtype=np.float32), np.full(8, 2.0, dtype=np.float32)]
    for clock in range(2):
        pulls = [pull(client, keys, clock) for client in split]
        np.testing.assert_array_equal(pulls[0][0], pulls[1][0])
        pushed = [push(client, keys, grad, clock, pulled.versions)
                  for client, grad, (_, pulled) in zip(split, grads, pulls, strict=True)]
        assert [p.staleness for p in pushed] == [0, 0]
        assert pushed[0].lr_scale == 0.5
    values, _ = pull(split[1], keys, 2)
    np.testing.assert_allclose(values, START8 - 2 * LR * (grads[0] + grads[1]) / 2)
    sparse = np.array([1, 4, 6], dtype=np.uint32)
    got = np.empty(3, np.float32)
    split[0].wait(split[0].pull(sparse, got, clock=ANY_CLOCK))
    np.testing.assert_array_equal(got, values[sparse])
    # Every shard saw each clock committed once: its versions are the two rounds.
    assert [server.state.version for server in rig.servers] == [2, 2]
    frames = sum(server.stats.frames_in for server in rig.servers)
    # Worker 0: per clock a pull and a push in ceil(5/size) + ceil(3/size) pieces (plus one
    # commit per shard when split), then the sparse pull; worker 1 one frame per shard each.
    pieces = -(-5 // size) + -(-3 // size)
    commits = sum(1 for n in (5, 3) if n > size)
    expected = 2 + 2 * (pieces + pieces + commits) + 2 * 2 * 2 + 2 + -(-2 // size) + 1
    assert frames == expected


def test_a_pull_for_bytes_is_refused(rig: Rig) -> None:
    rig.start([KeyRange(0, 8)], model="asp", workers=1)
    client = rig.client(0, wire=WireFormat(DType.BYTES))
    client.wait(client.init(START8))
    with pytest.raises(RemoteError, match="asks for its values as BYTES"):
        client.wait(client.pull(KeyRange(0, 8), np.empty(8, np.float32), clock=ANY_CLOCK))


def test_push_of_a_repeated_clock_is_refused(rig: Rig) -> None:
    keys = KeyRange(0, 8)
    rig.start([keys], model="asp", workers=1)
    client = rig.client(0)
    client.wait(client.init(START8))
    push(client, keys, np.ones(8, dtype=np.float32), 0, {0: 0})
    with pytest.raises(RemoteError) as caught:
        push(client, keys, np.ones(8, dtype=np.float32), 0, {0: 1})
    assert re.fullmatch(
        r"shard server 0 refused request \d+: DuplicatePush: "
        r"worker 0 already committed clock 0 on clock range 0",
        str(caught.value),
    )
    assert rig.servers[0].state.version == 1
    assert rig.servers[0].state.duplicates == 1


# -- refusals through the client ----------------------------------------------------------------


def test_wrong_token_is_refused(rig: Rig) -> None:
    rig.start([KeyRange(0, 8)])
    with pytest.raises(AuthenticationError) as caught:
        rig.client(token="not-the-token")
    assert str(caught.value) == f"{rig.addresses[0]} refused our join token"


def test_connect_to_nothing_names_the_address(rig: Rig) -> None:
    if rig.kind != "memory":
        with socket.socket() as probe:  # a port that was free a moment ago and is closed now
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        address = f"{'ws' if rig.kind == 'websocket' else 'tcp'}://127.0.0.1:{port}"
    else:
        address = "mem://127.0.0.1:65000"
    shards = [ShardAddress(0, address, KeyRange(0, 8))]
    with pytest.raises(ConnectFailed) as caught:
        rig.client(shards=shards)
    assert str(caught.value).startswith(f"cannot connect to {address}: ")


def test_pull_of_keys_the_shard_does_not_hold(rig: Rig) -> None:
    rig.start([KeyRange(0, 8)])
    client = rig.client(0)
    client.wait(client.init(START8))
    liar = rig.client(1, shards=[ShardAddress(0, rig.addresses[0], KeyRange(0, 16))])
    with pytest.raises(RemoteError) as caught:
        pull(liar, KeyRange(4, 12), ANY_CLOCK)
    assert str(caught.value).endswith(
        "BadPayload: keys [4, 12) are not all on this shard, which holds [0, 8)"
    )


def test_only_workers_push(rig: Rig) -> None:
    rig.start([KeyRange(0, 8)], model="asp")
    worker = rig.client(0)
    worker.wait(worker.init(START8))
    evaluator = rig.client(0, role=Role.EVALUATOR)
    with pytest.raises(RemoteError, match="only workers push; this frame comes from a EVALUATOR"):
        push(evaluator, KeyRange(0, 8), np.ones(8, dtype=np.float32), 0, {})
    assert rig.servers[0].state.pushes == 0


def test_frames_of_another_run_are_refused(rig: Rig) -> None:
    rig.start([KeyRange(0, 8)])
    stranger = rig.client(0, run=bytes(16))
    with pytest.raises(RemoteError, match="ProtocolError: frame belongs to another run$"):
        stranger.wait(stranger.init(START8))
    assert not rig.servers[0].state.initialized


# -- shutdown and timeouts ----------------------------------------------------------------------


def test_drain_answers_waiting_pulls_with_shutting_down(rig: Rig) -> None:
    keys = KeyRange(0, 8)
    rig.start([keys], model="bsp", workers=2)
    a, b = rig.client(0), rig.client(1)
    a.wait(a.init(START8))
    held_a = a.pull(keys, np.zeros(8, dtype=np.float32), clock=3)
    held_b = b.pull(keys, np.zeros(8, dtype=np.float32), clock=1)
    time.sleep(0.1)
    rig.on_server(lambda: rig.servers[0].drain("the test is over"))
    for client, request in ((a, held_a), (b, held_b)):
        with pytest.raises(ShuttingDown, match="^the test is over$"):
            client.wait(request, timeout=5)
    with pytest.raises(ShuttingDown, match="^run is stopping$"):
        push(a, keys, np.ones(8, dtype=np.float32), 0, {0: 0})
    with pytest.raises(ShuttingDown, match="^run is stopping$"):
        pull(b, keys, 2)
    values, _ = pull(b, keys, ANY_CLOCK)  # a pull that needs no wait is still served
    assert values.tolist() == START8.tolist()
    values, _ = pull(b, keys, 0)
    assert values.tolist() == START8.tolist()
    assert rig.servers[0].state.pushes == 0


def test_wait_times_out_and_the_client_still_works(rig: Rig) -> None:
    keys = KeyRange(0, 8)
    rig.start([keys], model="bsp", workers=2)
    client = rig.client(0)
    client.wait(client.init(START8))
    request = client.pull(keys, np.zeros(8, dtype=np.float32), clock=7)
    started = time.perf_counter()
    with pytest.raises(RequestTimeout) as caught:
        client.wait(request, timeout=0.2)
    assert 0.2 <= time.perf_counter() - started < 2.0
    assert str(caught.value) == f"request {request.request_id} got no answer within 0.2 s"
    assert isinstance(caught.value, TimeoutError)
    unknown = f"^unknown or already awaited request id {request.request_id}$"
    with pytest.raises(ProtocolError, match=unknown):
        client.wait(request)
    values, _ = pull(client, keys, 0)
    assert values.tolist() == START8.tolist()


def test_pull_into_a_wrong_buffer_is_refused_locally(rig: Rig) -> None:
    rig.start([KeyRange(0, 8)])
    client = rig.client(0)
    for out in (np.zeros(7, dtype=np.float32), np.zeros(8, dtype=np.float64)):
        with pytest.raises(ProtocolError, match=r"^pull buffer must be float32 of shape \(8,\)$"):
            client.pull(KeyRange(0, 8), out, clock=0)


# -- raw peers ----------------------------------------------------------------------------------


class RawPeer:
    """A peer that sends whatever it is told: a raw websocket or a raw memory connection."""

    def __init__(self, rig: Rig) -> None:
        self.rig = rig
        self._socket: Any = None
        self._memory: Any = None

    async def open(self) -> None:
        if self.rig.kind == "websocket":
            self._socket = await ws_connect(
                self.rig.addresses[0],
                additional_headers={TOKEN_HEADER: TOKEN},
                compression=None,
                max_size=None,
            )
        else:
            self._memory = await self.rig.transport.connect(
                self.rig.addresses[0], token=TOKEN, timeout=5
            )

    async def send(self, message: bytes | bytearray | str) -> None:
        await (self._socket or self._memory).send(message)

    async def recv(self) -> tuple[str, Any, Any]:
        """("frame", data, None) or ("closed", code, reason)."""
        try:
            if self._socket is not None:
                data = await asyncio.wait_for(self._socket.recv(), 5)
            else:
                data = await asyncio.wait_for(self._memory.recv(), 5)
        except websockets.ConnectionClosed as exc:
            assert exc.rcvd is not None
            return "closed", exc.rcvd.code, exc.rcvd.reason
        except ConnectionClosed as exc:
            found = re.search(r"\(code (\d+): (.*)\)$", str(exc))
            assert found, str(exc)
            return "closed", int(found.group(1)), found.group(2)
        return "frame", data, None

    async def error(self) -> tuple[int, str, str]:
        kind, data, _ = await self.recv()
        assert kind == "frame", (kind, data)
        frame = decode(data, max_bytes=MIB)
        assert frame.type is MsgType.ERROR
        assert frame.role is Role.SERVER
        return (frame.request_id, *frame.error())

    async def close(self) -> None:
        if self._socket is not None:
            await self._socket.close()
        elif self._memory is not None:
            await self._memory.close()


def raw(rig: Rig, script: Callable[[RawPeer], Any]) -> Any:
    async def session() -> Any:
        peer = RawPeer(rig)
        await peer.open()
        try:
            return await script(peer)
        finally:
            await peer.close()

    return rig.io.call(session(), 20, "raw peer session")


def push_frame(request_id: int, payload: np.ndarray, **fields: Any) -> bytearray:
    return encode(
        Frame(
            MsgType.PUSH,
            request_id,
            KeyRange(0, 8),
            run=RUN,
            role=Role.WORKER,
            payload=payload,
            **fields,
        )
    )


def test_bad_frames_get_error_replies_and_others_keep_being_served(rig: Rig) -> None:
    keys = KeyRange(0, 8)
    rig.start([keys], model="asp", workers=1)
    client = rig.client(0)
    client.wait(client.init(START8))
    pickled = pickle.dumps({"weights": [0.5] * 40})  # built, sent, never unpickled
    nan_grad = np.ones(8, dtype=np.float32)
    nan_grad[3] = np.nan

    async def script(peer: RawPeer) -> list[tuple[int, str, str]]:
        replies = []
        for message in (
            b"\x00garbage",
            pickled,
            "a text message",
            push_frame(77, np.zeros(8, dtype=np.uint8), dtype=DType.BYTES),
            push_frame(78, np.zeros((2, 4), dtype=np.float32)),
            push_frame(79, nan_grad),
            push_frame(80, np.zeros(7, dtype=np.float32)),
        ):
            await peer.send(message)
            replies.append(await peer.error())
        return replies

    replies = raw(rig, script)
    assert replies == [
        (
            0,
            "ProtocolError",
            "frame of 8 bytes is shorter than the 104-byte header; not a psctl frame",
        ),
        (0, "ProtocolError", f"bad magic {pickled[:2]!r}: not a psctl frame"),
        (0, "ProtocolError", "text message on a tensor connection: send binary psctl frames"),
        (77, "BadPayload", "PUSH values must be floating point, got BYTES"),
        (78, "BadPayload", "PUSH shape (2, 4) does not match the 8 keys of [0, 8)"),
        (79, "NonFinitePush", "PUSH values contain NaN or infinity"),
        (80, "BadPayload", "PUSH shape (7,) does not match the 8 keys of [0, 8)"),
    ]
    stats = rig.servers[0].stats
    assert stats.bad_frames == 7
    assert stats.errors_by_code == {"ProtocolError": 3, "BadPayload": 3, "NonFinitePush": 1}
    assert rig.servers[0].state.pushes == 0
    values, _ = pull(client, keys, 0)
    assert values.tolist() == START8.tolist()
    pushed = push(client, keys, np.ones(8, dtype=np.float32), 0, {0: 0})
    assert pushed.versions == {0: 0}


def test_a_raw_peer_may_push_a_valid_frame(rig: Rig) -> None:
    keys = KeyRange(0, 8)
    rig.start([keys], model="asp", workers=1)
    client = rig.client(0)
    client.wait(client.init(START8))

    async def script(peer: RawPeer) -> Frame:
        await peer.send(push_frame(5, np.ones(8, dtype=np.float64), dtype=DType.FLOAT64))
        kind, data, _ = await peer.recv()
        assert kind == "frame"
        return decode(data, max_bytes=MIB)

    ack = raw(rig, script)
    assert (ack.type, ack.request_id, ack.version, ack.keys) == (MsgType.ACK, 5, 0, keys)
    values, _ = pull(client, keys, ANY_CLOCK)
    np.testing.assert_allclose(values, START8 - LR)


def test_oversize_frame(rig: Rig) -> None:
    keys = KeyRange(0, 8)
    rig.start([keys], max_frame_bytes=MIB)
    client = rig.client(0)
    client.wait(client.init(START8))
    oversize = b"PS" + bytes(MIB)

    async def script(peer: RawPeer) -> tuple[str, Any, Any]:
        await peer.send(oversize)
        return await peer.recv()

    kind, first, _ = raw(rig, script)
    if rig.kind != "memory":  # the transport refuses it before the server sees it
        assert (kind, first) == ("closed", 1009)
    else:
        frame = decode(first, max_bytes=MIB)
        assert frame.error() == (
            "FrameTooLarge",
            f"frame of {MIB + 2} bytes exceeds the limit of {MIB}",
        )
    values, _ = pull(client, keys, 0)
    assert values.tolist() == START8.tolist()


def test_a_frame_over_what_the_shard_allows_is_closed_before_it_is_read(
    make_rig: Callable[..., Rig],
) -> None:
    # The server listens with the limit its key count allows (frame_limit: 64 KiB for 8 keys),
    # under the transport's and its own: websockets refuses the frame from its header.
    rig = make_rig("websocket", transport_max=4 * MIB)
    rig.start([KeyRange(0, 8)], max_frame_bytes=MIB)

    async def script(peer: RawPeer) -> tuple[str, Any, Any]:
        await peer.send(bytes(2 * MIB))
        return await peer.recv()

    kind, code, reason = raw(rig, script)
    assert (kind, code) == ("closed", 1009)
    assert reason == "frame with 2097152 bytes exceeds limit of 65536 bytes"


def test_a_peer_sending_only_garbage_is_closed_with_1008(rig: Rig) -> None:
    keys = KeyRange(0, 8)
    rig.start([keys])
    client = rig.client(0)
    client.wait(client.init(START8))

    async def script(peer: RawPeer) -> tuple[int, tuple[str, Any, Any]]:
        for _ in range(MAX_BAD_FRAMES):
            await peer.send(b"not a frame")
        errors = 0
        while True:
            kind, data, reason = await peer.recv()
            if kind == "closed":
                return errors, (kind, data, reason)
            assert decode(data, max_bytes=MIB).error()[0] == "ProtocolError"
            errors += 1

    errors, closed = raw(rig, script)
    # Replies still queued in send tasks when the server closes are dropped (see the report:
    # engine/server/service.py serve() closes without awaiting them), so only an upper bound holds.
    assert errors <= MAX_BAD_FRAMES
    assert closed == ("closed", 1008, f"{MAX_BAD_FRAMES} invalid frames; closing")
    assert rig.servers[0].stats.bad_frames == MAX_BAD_FRAMES
    values, _ = pull(client, keys, 0)
    assert values.tolist() == START8.tolist()


def test_a_websocket_without_the_token_is_refused_with_401(make_rig: Callable[..., Rig]) -> None:
    rig = make_rig("websocket")
    rig.start([KeyRange(0, 8)])

    async def attempt() -> int:
        try:
            await ws_connect(rig.addresses[0], compression=None)
        except websockets.InvalidStatus as exc:
            return exc.response.status_code
        return 0

    assert rig.io.call(attempt(), 10) == 401


def test_the_bad_frame_limit_counts_every_bad_frame_of_a_connection(rig: Rig) -> None:
    keys = KeyRange(0, 8)
    rig.start([keys])
    client = rig.client(0)
    client.wait(client.init(START8))
    pull_frame = encode(Frame(MsgType.PULL, 9, keys, run=RUN, clock=ANY_CLOCK))

    async def script(peer: RawPeer) -> tuple[list[int], Frame, tuple[str, Any, Any]]:
        for _ in range(MAX_BAD_FRAMES - 1):
            await peer.send(b"not a frame")
        await peer.send(pull_frame)  # a good frame in between does not reset the count
        ids = [(await peer.error())[0] for _ in range(MAX_BAD_FRAMES - 1)]
        kind, data, _ = await peer.recv()
        assert kind == "frame"
        values = decode(data, max_bytes=MIB)
        await peer.send(b"not a frame")
        while True:
            received = await peer.recv()
            if received[0] == "closed":
                return ids, values, received
            assert decode(received[1], max_bytes=MIB).type is MsgType.ERROR

    ids, values, closed = raw(rig, script)
    assert ids == [0] * (MAX_BAD_FRAMES - 1)
    assert (values.type, values.request_id) == (MsgType.VALUES, 9)
    assert values.values.tolist() == START8.tolist()
    assert closed == ("closed", 1008, f"{MAX_BAD_FRAMES} invalid frames; closing")


# -- sparse and single-layer push and pull (protocol version 3) ----------------------------------

# Three "layers" of 700, 600 and 700 keys over two shards of 1000: the middle one spans both.
LAYOUT = KeyLayout((Segment("a", (700,), KeyRange(0, 700)),
                    Segment("b", (600,), KeyRange(700, 1300)),
                    Segment("c", (700,), KeyRange(1300, 2000))))
START = np.linspace(-1.0, 1.0, 2000, dtype=np.float32)


def test_sparse_and_layer_pushes_change_exactly_their_keys(rig: Rig) -> None:
    rig.start(RangePartitioner().ranges(2000, 2), model="asp", workers=1, layout=LAYOUT,
              momentum=0.9)
    client = rig.client()
    client.wait(client.init(START))
    rng = np.random.default_rng(7)
    keys = np.sort(rng.choice(2000, size=20, replace=False)).astype(np.uint32)  # 1 % of the keys
    assert keys[0] < 1000 <= keys[-1]  # spans both shards
    grad = rng.normal(size=20).astype(np.float32)
    pushed = client.wait(client.push(keys, grad, clock=0, base_versions={}))
    assert pushed.bytes_sent > 0 and pushed.staleness == 0
    expected = START.copy()
    expected[keys] -= LR * grad  # momentum's first step is the gradient itself
    values, _ = pull(client, KeyRange(0, 2000), ANY_CLOCK)
    np.testing.assert_array_equal(values, expected)

    layer = LAYOUT.segment("b").keys  # across the shard boundary, pushed as one layer
    layer_grad = rng.normal(size=len(layer)).astype(np.float32)
    client.wait(client.push(layer, layer_grad, clock=1, base_versions={}))
    # keys pushed twice carry momentum: buf = 0.9 * g0 + g1; the rest of the layer: buf = g1
    buf = layer_grad.copy()
    inside = (keys >= layer.start) & (keys < layer.end)
    buf[keys[inside] - layer.start] += np.float32(0.9) * grad[inside]
    expected[layer.start:layer.end] -= LR * buf
    values, _ = pull(client, KeyRange(0, 2000), ANY_CLOCK)
    np.testing.assert_array_equal(values, expected)

    # a layer pull and a sparse pull return exactly the stored values
    one_layer, _ = pull(client, layer, ANY_CLOCK)
    np.testing.assert_array_equal(one_layer, expected[layer.start:layer.end])
    wanted = np.array([0, 699, 700, 999, 1000, 1999], dtype=np.int64)
    out = np.zeros(len(wanted), dtype=np.float32)
    client.wait(client.pull(wanted, out, clock=ANY_CLOCK))
    np.testing.assert_array_equal(out, expected[wanted])
    # per-range clocks: layer b is at clock 2, layers a and c still at 1
    assert [int(c) for c in rig.servers[0].state.clocks.next[0]] == [1, 2]
    assert [int(c) for c in rig.servers[1].state.clocks.next[0]] == [2, 1]


def test_layers_pushed_in_reverse_keep_bsp_in_lockstep_per_layer(rig: Rig) -> None:
    rig.start(RangePartitioner().ranges(2000, 2), model="bsp", workers=2, layout=LAYOUT)
    a, b = rig.client(0), rig.client(1)
    a.wait(a.init(START))
    order = [LAYOUT.segment(n).keys for n in ("c", "b", "a")]
    for clock in range(3):
        for client in (a, b):
            _, pulled = pull(client, KeyRange(0, 2000), clock)
            for layer in order:
                result = client.wait(client.push(layer, np.ones(len(layer), np.float32),
                                                 clock=clock, base_versions=pulled.versions))
                assert result.staleness == 0
        # no second-clock pull is answered before every layer's round is complete
    for server in rig.servers:
        assert server.state.versions.tolist() == [3, 3]
    values, _ = pull(a, KeyRange(0, 2000), 3)
    np.testing.assert_allclose(values, START - 3 * LR, rtol=0, atol=1e-6)


def test_an_empty_commit_advances_the_clock_and_a_duplicate_is_refused(rig: Rig) -> None:
    rig.start(RangePartitioner().ranges(2000, 2), model="bsp", workers=1, layout=LAYOUT)
    client = rig.client()
    client.wait(client.init(START))
    empty = np.zeros(0, dtype=np.uint32)
    client.wait(client.push(empty, np.zeros(0, np.float32), clock=0, base_versions={}))
    values, pulled = pull(client, KeyRange(0, 2000), 1)  # clock 1 is served: clock 0 committed
    np.testing.assert_array_equal(values, START)
    with pytest.raises(RemoteError, match="DuplicatePush: worker 0 already committed clock 0"):
        client.wait(client.push(KeyRange(0, 2000), np.ones(2000, np.float32), clock=0,
                                base_versions=pulled.versions))
    assert sum(server.state.duplicates for server in rig.servers) >= 1
    values, _ = pull(client, KeyRange(0, 2000), ANY_CLOCK)
    np.testing.assert_array_equal(values, START)  # the refused push changed nothing
