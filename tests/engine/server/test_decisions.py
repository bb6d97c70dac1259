"""A shard server runs a large ElasticBSP decision on a thread: the barriers hold until it is
back, the decision is reported, and a decision that fails drains the server instead of leaving
the workers' pulls waiting forever."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import numpy as np
import pytest

from engine.config import SyncConfig
from engine.consistency import elastic
from engine.consistency.base import PushTiming
from engine.consistency.elastic import ElasticBSP
from engine.keys import KeyRange
from engine.server.optimizers import SGD
from engine.server.service import OFFLOAD_FROM, ShardServer
from engine.server.shard import ShardState
from engine.wire.records import SyncRecord

WORKERS, LOOKAHEAD = 8, OFFLOAD_FROM // 8  # n x R = OFFLOAD_FROM: offloaded
KEYS = KeyRange(0, 1)


def server_at_the_first_barrier() -> tuple[ShardServer, ElasticBSP, list[SyncRecord]]:
    controller = ElasticBSP(WORKERS, SyncConfig(model="elastic", lookahead=LOOKAHEAD,
                                                max_ahead=LOOKAHEAD))
    state = ShardState(KEYS, controller, SGD(1, lr=0.1), workers=WORKERS)
    state.init(KEYS, np.zeros(1, dtype=np.float32))
    reported: list[SyncRecord] = []
    server = ShardServer(state, run=b"decisions", rank=0, max_frame_bytes=1 << 16,
                         on_syncs=reported.extend)
    for clock in (0, 1):
        for worker in range(WORKERS):
            state.push(worker, clock, KEYS, np.zeros(0, dtype=np.float32),
                       PushTiming(pushed_at=(clock + 1) * (1.0 + worker / 10)))
    return server, controller, reported


async def until(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.001)


def test_the_barriers_move_when_the_decision_comes_back_from_its_thread() -> None:
    async def scenario() -> None:
        server, controller, reported = server_at_the_first_barrier()
        server.settle()  # what a push frame ends with: the decision goes to a thread
        assert controller.barrier_clocks() == [1] * WORKERS  # not yet decided
        assert not server.state.pull_ready(0, 2)
        await until(lambda: controller.barrier_clocks()[0] > 1)
        assert server.state.pull_ready(0, 2)
        decided = [r for r in reported if r.predictor != "monitoring"]
        assert len(decided) == 1 and decided[0].sync_index == 1
        assert decided[0].barrier_clocks == controller.barrier_clocks()
        await server.close()

    asyncio.run(scenario())


def test_a_failed_decision_drains_the_server(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: object) -> elastic.Decision:
        raise RuntimeError("injected")

    async def scenario() -> None:
        monkeypatch.setattr(elastic, "decide", broken)
        server, controller, _ = server_at_the_first_barrier()
        server.settle()
        await until(lambda: server._draining)
        assert controller.barrier_clocks() == [1] * WORKERS
        await server.close()

    asyncio.run(scenario())


def test_a_small_decision_is_taken_in_place() -> None:
    controller = ElasticBSP(2, SyncConfig(model="elastic", lookahead=6))
    state = ShardState(KEYS, controller, SGD(1, lr=0.1), workers=2)
    state.init(KEYS, np.zeros(1, dtype=np.float32))
    ShardServer(state, run=b"decisions", rank=0, max_frame_bytes=1 << 16)
    for clock in (0, 1):
        for worker in range(2):
            state.push(worker, clock, KEYS, np.zeros(0, dtype=np.float32),
                       PushTiming(pushed_at=float(clock + 1)))
    assert controller.take_deferred() is None and controller.barrier_clocks()[0] > 1
