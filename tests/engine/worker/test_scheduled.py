"""Request schedules order a clock's layer requests exactly as documented, the pool keeps at
most its size in flight, finishing the oldest first, and the forward pass starts on each layer as
soon as that layer's pulls are answered."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from torch import nn

from engine.keys import KeyRange
from engine.models.flat import FlatModel, train_step_np
from engine.models.spec import MLPSpec
from engine.plan import build_config
from engine.worker.client import Handle, PullResult, PushResult
from engine.worker.loops import Shard
from engine.worker.scheduled import REQUEST_SCHEDULES, RequestWindow, ScheduledLoop, run_pool
from tests.engine.worker.hosts import timing


def test_fifo_and_filo_follow_the_order_requests_arise_in_and_its_reverse() -> None:
    fifo, filo = REQUEST_SCHEDULES.get("fifo"), REQUEST_SCHEDULES.get("filo")
    assert fifo.pulls([5, 0, 9, 1]) == [0, 1, 2, 3]  # forward needs the input layer first
    assert fifo.pushes(7, [7, 3, 7, 7]) == [3, 2, 1, 0]  # backward makes the output layer first
    assert filo.pulls([5, 0, 9, 1]) == [3, 2, 1, 0]
    assert filo.pushes(7, [7, 3, 7, 7]) == [0, 1, 2, 3]


def test_stalest_first_pulls_the_most_updated_layer_and_pushes_what_advances_c_l() -> None:
    stalest = REQUEST_SCHEDULES.get("stalest-first")
    assert stalest.pulls([1, 4, 0, 4]) == [1, 3, 0, 2]  # ties keep the forward order
    # Pushing clock 7, this worker has committed 7 clocks everywhere: where c_l is 7 too
    # (layers 0 and 2) it is the slowest, and its push advances c_l; output layer first within
    # each group.
    assert stalest.pushes(7, [7, 5, 7, 6]) == [2, 0, 3, 1]
    assert stalest.pushes(7, [5, 5, 5, 5]) == [3, 2, 1, 0]


@pytest.mark.parametrize("size", [1, 2, 5])
def test_the_pool_keeps_at_most_its_size_in_flight(size: int) -> None:
    in_flight: list[int] = []
    events: list[tuple[str, int]] = []
    peak = 0

    def start(item: int) -> int:
        nonlocal peak
        in_flight.append(item)
        peak = max(peak, len(in_flight))
        events.append(("start", item))
        return item * 10

    def finish(item: int, handle: int) -> None:
        assert handle == item * 10
        in_flight.remove(item)
        events.append(("finish", item))

    run_pool([3, 1, 4, 0], start, finish, size)
    assert peak == min(size, 4) and in_flight == []
    assert [i for kind, i in events if kind == "start"] == [3, 1, 4, 0]
    assert [i for kind, i in events if kind == "finish"] == [3, 1, 4, 0]  # oldest first
    if size == 1:
        assert events == [(kind, i) for i in (3, 1, 4, 0) for kind in ("start", "finish")]


def test_the_window_finishes_in_order_only_as_far_as_the_item_needed() -> None:
    events: list[tuple[str, int]] = []
    window = RequestWindow([2, 0, 1, 3], lambda item: events.append(("start", item)) or item,
                           lambda item, handle: events.append(("finish", item)), 2)
    assert events == [("start", 2), ("start", 0)]
    window.need(0)  # 2 is older: finished first, each finish starting the next
    assert events[2:] == [("finish", 2), ("start", 1), ("finish", 0), ("start", 3)]
    window.need(2)  # already finished: nothing waits
    assert len(events) == 6
    window.drain()
    assert events[6:] == [("finish", 1), ("finish", 3)]
    assert window.waited_s >= 0.0


class ArrivingClient:
    """Pulls whose values arrive when waited for (each layer its own fill), pushes answered."""

    def __init__(self, model: FlatModel, events: list[str]) -> None:
        self.model, self.events = model, events
        self._pulls: dict[int, tuple[KeyRange, np.ndarray]] = {}
        self._ids = iter(range(1, 10**6))

    def pull(self, keys: KeyRange, out: np.ndarray, *, clock: int) -> Handle[PullResult]:
        handle = Handle(next(self._ids), PullResult)
        self._pulls[handle.request_id] = (keys, out)
        return handle

    def push(self, keys: Any, values: np.ndarray, **header: Any) -> Handle[PushResult]:
        return Handle(next(self._ids), PushResult)

    def wait(self, handle: Handle[Any], timeout: float | None = None) -> Any:
        if handle.kind is PushResult:
            return PushResult({0: 0}, 0, 10, 10)
        keys, out = self._pulls.pop(handle.request_id)
        index = next(i for i, s in enumerate(self.model.layout.segments) if s.keys == keys)
        self.events.append(f"pull {index}")
        out[:] = 0.01 * (index + 1)
        return PullResult({0: 0}, 0.0, 10, 10)


def test_forward_starts_on_a_layer_once_its_own_pulls_are_answered() -> None:
    model = FlatModel(MLPSpec(input_dim=4, hidden=(6, 5), num_classes=3), seed=0)
    events: list[str] = []
    linears = [m for m in model.module.modules() if isinstance(m, nn.Linear)]
    for number, layer in enumerate(linears):
        layer.register_forward_hook(lambda *_, n=number: events.append(f"forward {n}"))
    config = build_config({}, {"data.dataset": "digits", "train.epochs": 1,
                               "comm.schedule": "fifo", "sync.model": "ssp"})
    worker = SimpleNamespace(
        client=ArrivingClient(model, events), config=config, layout=model.layout,
        keys=KeyRange(0, model.num_keys), rank=0,
        **timing(),
        record=lambda row, layers=None: rows.append(row), should_stop=lambda: False,
        epoch_done=lambda epoch: None, _stopping=None)
    rows: list[Any] = []
    shard = Shard(np.ones((3, 4), dtype=np.float32), np.array([0, 1, 2]), batch_size=3)
    loop = ScheduledLoop(worker, model)  # type: ignore[arg-type]
    assert loop.train(shard) == 1
    # One request in flight: a layer's weight and bias, then that layer computes, and so on.
    assert events == ["pull 0", "pull 1", "forward 0", "pull 2", "pull 3", "forward 1",
                      "pull 4", "pull 5", "forward 2"]
    reference = FlatModel(MLPSpec(input_dim=4, hidden=(6, 5), num_classes=3), seed=0)
    for index, segment in enumerate(model.layout.segments):
        reference.params_np[segment.keys.start:segment.keys.end] = 0.01 * (index + 1)
    loss = train_step_np(reference, shard.inputs, shard.targets)
    assert rows[0].loss == loss  # computed on every layer's pulled values
    assert rows[0].compute_s >= 0 and rows[0].pull_s >= 0
