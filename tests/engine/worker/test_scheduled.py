"""Request schedules order a clock's layer requests exactly as documented, and the pool keeps at
most its size in flight, finishing the oldest first."""

from __future__ import annotations

import pytest

from engine.worker.scheduled import REQUEST_SCHEDULES, run_pool


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
