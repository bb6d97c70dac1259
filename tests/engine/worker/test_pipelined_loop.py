"""The plain loop's pipelined pull: the pull of clock c + 1 leaves right behind the push of c,
before its ack is awaited; without ``train.pipeline`` only after it. A stop cancels a pull sent
ahead. Driven with a client that records the calls (no servers)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from engine.errors import RequestTimeout
from engine.keys import KeyLayout, KeyRange
from engine.plan import build_config
from engine.worker.client import Handle, PullResult, PushResult
from engine.worker.loops import PlainLoop, Shard
from tests.engine.worker.hosts import timing

KEYS = 6


class RecordingClient:
    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []
        self._ids = iter(range(1, 10**6))
        self._clocks: dict[int, int] = {}
        self.unanswered: set[int] = set()  # request ids a wait times out on (held back)

    def pull(self, keys: KeyRange, out: np.ndarray, *, clock: int) -> Handle[PullResult]:
        handle = Handle(next(self._ids), PullResult)
        self._clocks[handle.request_id] = clock
        self.calls.append(("pull", clock))
        return handle

    def push(self, keys: KeyRange, values: np.ndarray, *, clock: int,
             **header: Any) -> Handle[PushResult]:
        handle = Handle(next(self._ids), PushResult)
        self._clocks[handle.request_id] = clock
        self.calls.append(("push", clock))
        return handle

    def wait(self, handle: Handle[Any], timeout: float | None = None) -> Any:
        clock = self._clocks.pop(handle.request_id)
        kind = "pull" if handle.kind is PullResult else "push"
        if handle.request_id in self.unanswered:
            self.calls.append((f"cancel {kind}", clock))
            raise RequestTimeout("held back")
        self.calls.append((f"wait {kind}", clock))
        if handle.kind is PullResult:
            return PullResult({0: clock}, 0.0, 10, 10)
        return PushResult({0: clock}, 0, 10, 10)


def make_loop(pipeline: bool, stop_after: int | None = None) -> tuple[PlainLoop, RecordingClient]:
    config = build_config({}, {"data.dataset": "digits", "train.epochs": 1,
                               "train.pipeline": pipeline})
    client = RecordingClient()
    steps: list[int] = []
    worker = SimpleNamespace(
        client=client, config=config, layout=KeyLayout.single(KEYS), keys=KeyRange(0, KEYS),
        rank=0, **timing(),
        record=lambda row, layers=None: steps.append(row.iteration),
        should_stop=lambda: stop_after is not None and len(steps) >= stop_after,
        epoch_done=lambda epoch: None)
    model = SimpleNamespace(params_np=np.zeros(KEYS, dtype=np.float32),
                            grads_np=np.ones(KEYS, dtype=np.float32))

    class Constant(PlainLoop):
        def compute(self, shard: Shard, batch: np.ndarray) -> float:
            return 1.0

    return Constant(worker, model), client  # type: ignore[arg-type]


SHARD = Shard(np.zeros((9, 2), dtype=np.float32), np.zeros(9, dtype=np.int64), batch_size=3)


def test_the_next_pull_leaves_before_the_push_is_awaited() -> None:
    loop, client = make_loop(pipeline=True)
    assert loop.train(SHARD) == 3
    assert client.calls == [
        ("pull", 0), ("wait pull", 0), ("push", 0), ("pull", 1), ("wait push", 0),
        ("wait pull", 1), ("push", 1), ("pull", 2), ("wait push", 1),
        ("wait pull", 2), ("push", 2), ("wait push", 2)]  # no pull after the last clock


def test_without_pipeline_each_pull_waits_for_the_previous_ack() -> None:
    loop, client = make_loop(pipeline=False)
    assert loop.train(SHARD) == 3
    assert client.calls == [
        ("pull", 0), ("wait pull", 0), ("push", 0), ("wait push", 0),
        ("pull", 1), ("wait pull", 1), ("push", 1), ("wait push", 1),
        ("pull", 2), ("wait pull", 2), ("push", 2), ("wait push", 2)]


@pytest.mark.parametrize("answered", [True, False])
def test_a_stop_takes_or_cancels_the_pull_sent_ahead(answered: bool) -> None:
    loop, client = make_loop(pipeline=True, stop_after=1)
    if not answered:
        client.unanswered.add(3)  # after pull 0 and push 0: the pull of clock 1
    assert loop.train(SHARD) == 1
    assert client.calls[:4] == [("pull", 0), ("wait pull", 0), ("push", 0), ("pull", 1)]
    assert client.calls[4:] == [("wait push", 0),
                                ("wait pull" if answered else "cancel pull", 1)]
