"""psctl.log in the worker loops: whatever order a loop records its iterations in (the
overlapped, bounded-delay and Downpour loops record one only after computing the next), each
row gets what the user's code logged while that row's own batch was computed."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

import psctl
from engine.keys import KeyLayout, KeyRange
from engine.plan import build_config
from engine.usermetrics import collecting
from engine.wire.records import IterationRecord, UserMetricRecord
from engine.worker.client import Handle, PullResult, PushResult
from engine.worker.delayed import DelayedLoop
from engine.worker.downpour import DownpourLoop
from engine.worker.loops import OverlappedLoop, PlainLoop, Shard, logged_with
from tests.engine.worker.hosts import timing

KEYS = 4
SAMPLES, BATCH = 40, 4


class AnsweringClient:
    """Every request answered at once: the loops' own order is all that is left."""

    def __init__(self) -> None:
        self._ids = iter(range(1, 10**6))

    def pull(self, keys: KeyRange, out: np.ndarray, *, clock: int) -> Handle[PullResult]:
        return Handle(next(self._ids), PullResult)

    def push(self, keys: KeyRange, values: np.ndarray, **header: Any) -> Handle[PushResult]:
        return Handle(next(self._ids), PushResult)

    def init(self, values: np.ndarray) -> Handle[PushResult]:
        return Handle(next(self._ids), PushResult)

    def done(self, handle: Handle[Any]) -> bool:
        return True

    def wait(self, handle: Handle[Any], timeout: float | None = None) -> Any:
        if handle.kind is PullResult:
            return PullResult({0: 0}, 0.0, 10, 10)
        return PushResult({0: 1}, 0, 10, 10)


@pytest.mark.parametrize(("loop", "settings"), [
    (PlainLoop, {}),
    (OverlappedLoop, {"sync.model": "asp", "train.overlap": True}),
    (DelayedLoop, {"sync.model": "bounded-delay", "sync.delay": 2}),
    (DownpourLoop, {"sync.model": "asp", "train.push_every": 3}),
])
def test_each_row_gets_the_values_its_own_batch_logged(loop: type[PlainLoop],
                                                       settings: dict[str, Any]) -> None:
    config = build_config({}, {"data.dataset": "digits", "train.epochs": 2, **settings})
    recorded: list[tuple[IterationRecord, list[UserMetricRecord]]] = []
    worker = SimpleNamespace(
        client=AnsweringClient(), config=config, layout=KeyLayout.single(KEYS),
        keys=KeyRange(0, KEYS), rank=1, **timing(),
        record=lambda row, layers=None: recorded.append((row, logged_with(row))),
        should_stop=lambda: False, epoch_done=lambda epoch: None)
    model = SimpleNamespace(params_np=np.zeros(KEYS, dtype=np.float32),
                            grads_np=np.ones(KEYS, dtype=np.float32))

    class Logging(loop):  # type: ignore[misc,valid-type]
        def compute(self, shard: Shard, batch: np.ndarray) -> float:
            psctl.log("first_sample", batch[0])  # a numpy integer
            psctl.log("twice", 1.0)
            psctl.log("twice", 2.0)
            return 1.0

    shard = Shard(np.zeros((SAMPLES, 2), dtype=np.float32), np.zeros(SAMPLES, dtype=np.int64),
                  batch_size=BATCH)
    with collecting():
        Logging(worker, model).train(shard)  # type: ignore[arg-type]
    assert sorted(row.iteration for row, _ in recorded) == list(range(2 * SAMPLES // BATCH))
    for row, logged in recorded:
        batches = shard.batches(np.random.default_rng([config.train.seed, 1, row.epoch]))
        batch = batches[row.iteration - row.epoch * shard.iterations_per_epoch]
        assert {m.name: m.value for m in logged} == {"first_sample": batch[0], "twice": 1.5}
        assert {(m.role, m.rank, m.iteration, m.at) for m in logged} == {
            ("worker", 1, row.iteration, row.ended_at)}
