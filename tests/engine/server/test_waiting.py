"""The index of waiting pulls: a release asks only each group's earliest pull."""

from __future__ import annotations

from engine.keys import KeyRange
from engine.server.waiting import WaitingPulls
from engine.wire.protocol import Frame, MsgType, Role


def pull(request_id: int, clock: int, rank: int = 0) -> Frame:
    return Frame(MsgType.PULL, request_id, KeyRange(0, 8), role=Role.WORKER, rank=rank,
                 clock=clock)


def test_a_release_answers_exactly_the_pulls_whose_clock_came_in_order_and_asks_no_other() -> None:
    waiting: WaitingPulls[str] = WaitingPulls()
    for request in range(1000):  # a flood for clocks that cannot come
        waiting.add((0, 0, 1), "flood", pull(request, 10**6 + request), 0.0)
    waiting.add((0, 0, 1), "honest", pull(2001, 2), 0.0)
    waiting.add((0, 0, 1), "honest", pull(2002, 1), 0.0)
    waiting.add((1, 0, 1), "other", pull(2003, 1, rank=1), 0.0)
    waiting.add((0, 0, 1), "honest", pull(2004, 1), 0.0)

    released = waiting.release(lambda f: f.clock <= 1)

    assert [w.frame.request_id for w in released] == [2002, 2003, 2004]  # as they came
    # Per group: one check per pull answered, one for the pull that stops it.
    assert waiting.readiness_checks == (2 + 1) + (1 + 0)
    assert len(waiting) == 1001
    released = waiting.release(lambda f: f.clock <= 2)
    assert [w.frame.request_id for w in released] == [2001]
    assert waiting.readiness_checks == 4 + 2


def test_dropping_a_peer_removes_only_its_pulls() -> None:
    waiting: WaitingPulls[str] = WaitingPulls()
    for request in range(10):
        waiting.add((request % 2, 0, 1), "a" if request < 6 else "b", pull(request, request), 0.0)
    assert sorted(w.frame.request_id for w in waiting.drop("a")) == list(range(6))
    assert len(waiting) == 4
    assert waiting.waits("b", 7) and not waiting.waits("a", 1)
    assert [w.frame.request_id for w in waiting.release(lambda f: True)] == [6, 7, 8, 9]
    assert len(waiting) == 0
