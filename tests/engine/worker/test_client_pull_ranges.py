"""A worker's pull over several shards puts each shard's answer in that shard's own keys: a whole
range, a range that straddles shards, and a key list, in process over the memory transport."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from engine.aio import LoopThread
from engine.consistency.registry import make_controller
from engine.keys import KeyRange
from engine.server.optimizers import SGD
from engine.server.pull_filter import make_pull_filter
from engine.server.service import ShardServer
from engine.server.shard import ShardState
from engine.transport import MemoryTransport
from engine.wire.protocol import ANY_CLOCK, MAX_LIST_KEYS, Role
from engine.worker.client import ParameterClient, ShardAddress

TOKEN = "join-token-for-pull-range-tests"
RUN = bytes.fromhex("00112233445566778899aabbccddeeff")
MIB = 2**20
# Three shards of the same size: an answer put in another shard's keys keeps its shape.
SHARDS = [KeyRange(0, 4), KeyRange(4, 8), KeyRange(8, 12)]
START = np.arange(1, 13, dtype=np.float32) * 10


@pytest.fixture
def client() -> Iterator[ParameterClient]:
    transport = MemoryTransport()
    server_loop, io = LoopThread("pull-range-servers"), LoopThread("pull-range-client")
    servers, shards = [], []
    for rank, keys in enumerate(SHARDS):
        state = ShardState(keys, make_controller("asp", workers=1, ranges=1),
                           SGD(len(keys), lr=1.0), workers=1)
        server = ShardServer(state, run=RUN, rank=rank, max_frame_bytes=MIB,
                             pull_filter=make_pull_filter("none", 1000, 1, len(keys)))
        address = server_loop.call(server.start(transport, "127.0.0.1", 0, token=TOKEN), 10)
        servers.append(server)
        shards.append(ShardAddress(rank, address, keys))
    worker = ParameterClient(transport, shards, token=TOKEN, run=RUN, role=Role.WORKER, rank=0,
                             connect_timeout_s=5.0, request_timeout_s=10.0,
                             max_frame_bytes=4 * MIB, io=io)
    try:
        worker.connect()
        worker.wait(worker.init(START.copy()), timeout=5)
        yield worker
    finally:
        worker.close()
        for server in servers:
            server_loop.call(server.close(), 10)
        for thread in (io, server_loop):
            thread.stop()


def pulled(client: ParameterClient, keys: KeyRange | np.ndarray) -> list[float]:
    out = np.zeros(len(keys), dtype=np.float32)
    client.wait(client.pull(keys, out, clock=0), timeout=5)
    return out.tolist()


def test_a_pull_of_every_key_gets_each_shard_s_values_in_place(client: ParameterClient) -> None:
    assert pulled(client, KeyRange(0, 12)) == START.tolist()


@pytest.mark.parametrize("keys", [KeyRange(2, 11), KeyRange(3, 5), KeyRange(4, 8)])
def test_a_pull_of_a_range_across_shards_gets_those_keys(client: ParameterClient,
                                                           keys: KeyRange) -> None:
    assert pulled(client, keys) == START[keys.start:keys.end].tolist()


def test_a_pull_of_a_key_list_across_shards_gets_those_keys(client: ParameterClient) -> None:
    keys = np.array([1, 5, 6, 9, 11], dtype=np.uint32)
    assert pulled(client, keys) == START[keys].tolist()


def test_a_pushed_gradient_lands_on_its_own_shard_s_keys(client: ParameterClient) -> None:
    grad = np.zeros(12, dtype=np.float32)
    grad[5] = 1.0  # on the middle shard only
    client.wait(client.push(KeyRange(0, 12), grad, clock=0, base_versions={}), timeout=5)
    expected = START.copy()
    expected[5] -= 1.0  # lr 1, one worker: the mean is the gradient
    assert pulled(client, KeyRange(0, 12)) == expected.tolist()


def test_a_pull_of_no_keys_asks_every_shard_and_gets_nothing(client: ParameterClient) -> None:
    # A batch of samples without features (label-only libsvm lines) has an empty working set;
    # its pull still reaches every shard, since a pull is also the wait for its clock.
    out = np.zeros(0, dtype=np.float32)
    result = client.wait(client.pull(np.zeros(0, dtype=np.uint32), out, clock=0), timeout=5)
    assert sorted(result.versions) == [0, 1, 2]


def test_a_key_list_pulled_for_a_clock_waits_on_every_shard(client: ParameterClient) -> None:
    # The push the pull gates commits on every shard, and each shard refuses a clock past its
    # own window: a pull that asked only the shards holding its keys let a worker push past
    # the bound on another (a sparse run of batch 1 failed so, 1 run in 4 on a busy machine).
    keys = np.array([1, 2], dtype=np.uint32)  # on the first shard only
    out = np.zeros(2, dtype=np.float32)
    clocked = client.wait(client.pull(keys, out, clock=0), timeout=5)
    assert sorted(clocked.versions) == [0, 1, 2] and out.tolist() == START[keys].tolist()
    newest = client.wait(client.pull(keys, out, clock=ANY_CLOCK), timeout=5)
    assert sorted(newest.versions) == [0]  # served at once: no shard's clock to wait for
    inside = client.wait(client.pull(keys, out, clock=0, span=KeyRange(0, 8)), timeout=5)
    assert sorted(inside.versions) == [0, 1]


def test_a_key_list_longer_than_a_frame_may_name_travels_in_several_and_commits_once() -> None:
    """Issue 57: a server takes at most MAX_LIST_KEYS keys a frame (one 2-million-key push
    held its loop for seconds). A longer push goes as frames of at most that many, committed
    once by the last; a longer pull as several, each filling its part."""
    size = 3 * MAX_LIST_KEYS
    keys = np.arange(0, size, 2, dtype=np.int64)[:MAX_LIST_KEYS + 100]
    transport = MemoryTransport()
    server_loop, io = LoopThread("long-list-server"), LoopThread("long-list-client")
    state = ShardState(KeyRange(0, size), make_controller("bsp", workers=1, ranges=1),
                       SGD(size, lr=1.0), workers=1)
    server = ShardServer(state, run=RUN, rank=0, max_frame_bytes=4 * MIB)
    address = server_loop.call(server.start(transport, "127.0.0.1", 0, token=TOKEN), 10)
    worker = ParameterClient(transport, [ShardAddress(0, address, KeyRange(0, size))],
                             token=TOKEN, run=RUN, role=Role.WORKER, rank=0,
                             connect_timeout_s=5.0, request_timeout_s=20.0,
                             max_frame_bytes=4 * MIB, io=io)
    try:
        worker.connect()
        worker.wait(worker.init(np.zeros(size, dtype=np.float32)), timeout=10)
        frames = server.stats.frames_in
        worker.wait(worker.push(keys, np.ones(len(keys), dtype=np.float32), clock=0,
                                base_versions={}), timeout=20)
        assert server.stats.frames_in - frames == 3  # two pieces, then the commit
        assert state.clocks.next[0].tolist() == [1]  # one clock, committed once
        out = np.zeros(len(keys), dtype=np.float32)
        worker.wait(worker.pull(keys, out, clock=1), timeout=20)  # waits for that commit
        assert (out == -1.0).all()
        assert server.stats.bad_frames == 0
    finally:
        worker.close()
        server_loop.call(server.close(), 10)
        for thread in (io, server_loop):
            thread.stop()
