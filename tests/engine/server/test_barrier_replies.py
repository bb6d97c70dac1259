"""A BSP barrier's release queues one reply for every worker at once: however small the server's
reply budget, none of them is a slow reader for it, the releasing worker included, whose push's
ACK was queued just before its pull's reply (the simulator, which runs the real ShardServer,
showed a 64-worker run failing so: the ACK made that worker's reply its second frame)."""

from __future__ import annotations

from typing import Any

from engine.wire.records import RunStatus
from tests.engine.sim.test_cluster import config, simulate


def test_a_barrier_release_over_the_budget_disconnects_nobody() -> None:
    tight: dict[str, Any] = {"cluster.max_server_queued_bytes": 2**16, "cluster.servers": 1,
                             "cluster.workers": 8, "train.epochs": 2}
    # 8 replies of 19 KB (the 64-wide MLP's 4,810 keys) at each release: 150 KB > 64 KB
    status, _, sink = simulate(config(**tight))
    assert status is RunStatus.FINISHED, [e.detail for e in sink.events
                                          if e.kind == "run_failed"]
    assert len(sink.rows) == 8 * 2 * 3
