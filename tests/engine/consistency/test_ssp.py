"""SSP's sliding window and DSSP's run-time bound, driven push by push through a shard (one key
per clock range) and on the controllers directly."""

from __future__ import annotations

import numpy as np
import pytest

from engine.config import SyncConfig
from engine.consistency.base import NO_TIMING, ConsistencyController, PushTiming
from engine.consistency.registry import make_controller
from engine.consistency.ssp import DSSP, SSP, SlidingWindow
from engine.errors import ProtocolError
from engine.keys import KeyRange
from engine.server.optimizers import SGD
from engine.server.shard import ShardState


def shard(controller: ConsistencyController, workers: int = 2, ranges: int = 1) -> ShardState:
    """``ranges`` clock ranges of one key each, starting at zero, moved by SGD(lr=1)."""
    keys = KeyRange(0, ranges)
    state = ShardState(keys, controller, SGD(ranges, lr=1.0), workers=workers,
                       ranges=[KeyRange(k, k + 1) for k in range(ranges)])
    assert state.init(keys, np.zeros(ranges, dtype=np.float32))
    return state


def push(state: ShardState, worker: int, clock: int, timing: PushTiming = NO_TIMING, *,
         span: KeyRange | None = None, value: float = 0.0) -> int:
    keys = span or state.keys
    return state.push(worker, clock, keys, np.full(len(keys), value, dtype=np.float32), timing)


def test_window_shifts_when_the_last_worker_of_the_low_clock_arrives() -> None:
    window = SlidingWindow(workers=3, width=2)
    window.add(0)
    window.add(0)
    assert window.low == 0 and window.admits(1) and not window.admits(2)
    window.add(1)  # a fast worker one clock ahead
    window.add(0)
    assert window.low == 1 and window.admits(2) and not window.admits(3)


def test_window_memory_does_not_grow_with_workers() -> None:
    window = SlidingWindow(workers=10_000, width=4)
    assert window.width == 4 and len(window._counts) == 4


def test_window_refuses_a_clock_past_its_bound() -> None:
    window = SlidingWindow(workers=2, width=3)
    with pytest.raises(ProtocolError, match=r"^clock 3 is outside the open window \[0, 3\): the "
                                            "worker ran past its staleness bound$"):
        window.add(3)
    assert window.low == 0 and window._counts == [0, 0, 0]


def test_ssp_lets_the_fastest_lead_by_at_most_s_clocks() -> None:
    state = shard(SSP(workers=2, staleness=2))
    assert state.controller.accumulates is False
    for clock in range(3):
        assert state.pull_ready(0, clock)
        push(state, 0, clock, value=1.0)
        assert state.params.tolist() == [-0.5 * (clock + 1)]  # applied at once, 1/workers
    assert not state.pull_ready(0, 3)  # 3 ahead of worker 1, which is at 0
    assert state.pull_ready(1, 0) and state.pull_ready(1, 2)
    push(state, 1, 0)
    assert state.pull_ready(0, 3) and not state.pull_ready(0, 4)
    assert state.clocks.shard_clocks() == [3, 1]
    assert state.version == 4


def test_ssp_zero_is_lockstep() -> None:
    state = shard(SSP(workers=2, staleness=0))
    push(state, 0, 0)
    assert not state.pull_ready(0, 1)
    push(state, 1, 0)
    assert state.pull_ready(0, 1) and state.pull_ready(1, 1) and not state.pull_ready(0, 2)


def test_ssp_refuses_a_push_past_the_bound_and_keeps_its_state() -> None:
    state = shard(SSP(workers=2, staleness=0))
    push(state, 0, 0, value=2.0)
    with pytest.raises(ProtocolError, match="staleness bound"):
        push(state, 0, 1, value=2.0)
    assert state.clocks.shard_clocks() == [1, 0]
    assert (state.params.tolist(), state.version, state.pushes) == ([-1.0], 1, 1)
    push(state, 1, 0)
    push(state, 0, 1)  # accepted once worker 1 caught up


def test_ssp_lead_is_bounded_per_clock_range() -> None:
    ssp = SSP(workers=2, staleness=1, ranges=2)
    state = shard(ssp, ranges=2)
    first, second = KeyRange(0, 1), KeyRange(1, 2)
    for clock in range(2):
        push(state, 0, clock)  # worker 0 finishes clocks 0 and 1 on both ranges
    push(state, 1, 0, span=first)  # worker 1 only clock 0 of the first range
    assert [w.low for w in ssp.windows] == [1, 0]
    assert state.clocks.shard_clocks() == [2, 0]
    assert state.pull_ready(0, 2, first)  # leads the first range by 1
    assert not state.pull_ready(0, 2, second)  # leads the second by 2
    assert not state.pull_ready(0, 2)
    assert ssp.pull_ready(0, 2, range(0, 1)) and not ssp.pull_ready(0, 2, range(0, 2))
    push(state, 0, 2, span=first)  # allowed on the first range alone
    with pytest.raises(ProtocolError, match=r"^clock 2 is outside the open window \[0, 2\)"):
        push(state, 0, 2, span=second)
    assert state.clocks.next.tolist() == [[3, 2], [1, 0]]
    push(state, 1, 0, span=second)
    push(state, 0, 2, span=second)
    assert state.clocks.shard_clocks() == [3, 1]
    assert [w.low for w in ssp.windows] == [1, 1]


def at(seconds: float, waited: float = 0.0) -> PushTiming:
    return PushTiming(pushed_at=seconds, waited_s=waited)


def test_dssp_extends_the_bound_only_while_the_leader_would_finish_first() -> None:
    state = shard(DSSP(workers=2, staleness=1, extra=2))
    # worker 1 is slow: one push at t=0 then one at t=10 (interval 10 s)
    push(state, 1, 0, at(0.0))
    push(state, 1, 1, at(10.0))
    # worker 0 runs 1 s iterations: pushes clocks 0..2 at t=1, 2, 3
    for clock in range(3):
        push(state, 0, clock, at(1.0 + clock))
    # clock 3 leads worker 1 (at 2) by 1: within S
    assert state.pull_ready(0, 3)
    push(state, 0, 3, at(4.0))
    # clock 4 leads by 2 > S: next end 5.0 <= worker 1's predicted 20.0, so it may go on
    assert state.pull_ready(0, 4)
    push(state, 0, 4, at(5.0))
    assert state.pull_ready(0, 5)  # lead 3 = S + R still allowed
    push(state, 0, 5, at(6.0))
    assert not state.pull_ready(0, 6)  # lead 4 > S + R
    with pytest.raises(ProtocolError, match="staleness bound"):
        push(state, 0, 6, at(7.0))
    assert state.clocks.shard_clocks() == [6, 2]


def test_dssp_waits_when_the_slowest_is_about_to_finish() -> None:
    state = shard(DSSP(workers=2, staleness=0, extra=3))
    push(state, 0, 0, at(0.0))
    push(state, 0, 1, at(5.0))  # worker 0: 5 s iterations, next end at 10
    for clock, t in enumerate((7.5, 8.5, 9.5)):  # worker 1: 1 s iterations, next end 10.5
        push(state, 1, clock, at(t))
    assert not state.pull_ready(1, 3)  # it would finish after worker 0: waiting costs less
    push(state, 0, 2, at(10.0))
    assert state.pull_ready(1, 3)  # no lead any more


def test_dssp_waits_without_timings_to_predict_from() -> None:
    state = shard(DSSP(workers=2, staleness=0, extra=3))
    push(state, 0, 0, at(1.0))
    assert not state.pull_ready(0, 1)


def test_dssp_observes_a_clock_only_when_every_range_finished_it() -> None:
    dssp = DSSP(workers=2, staleness=0, extra=3, ranges=2)
    state = shard(dssp, ranges=2)
    push(state, 0, 0, at(1.0), span=KeyRange(0, 1))
    assert dssp.timings.last_push(0) is None and dssp._finished == [0, 0]
    push(state, 0, 0, at(2.0), span=KeyRange(1, 2))
    assert dssp.timings.last_push(0) == 2.0 and dssp._finished == [1, 0]


def test_make_controller_builds_each_model_from_its_config() -> None:
    ssp = make_controller(SyncConfig(model="ssp", staleness=5), workers=3)
    assert isinstance(ssp, SSP) and [w.width for w in ssp.windows] == [6]
    ranged = make_controller(SyncConfig(model="ssp", staleness=2), workers=3, ranges=3)
    assert isinstance(ranged, SSP) and [w.width for w in ranged.windows] == [3, 3, 3]
    dssp = make_controller(SyncConfig(model="dssp", staleness=2, range=3), workers=3)
    assert isinstance(dssp, DSSP) and [w.width for w in dssp.windows] == [6]
    assert (dssp.staleness, dssp.extra) == (2, 3)
    delay = make_controller(SyncConfig(model="bounded-delay", delay=2), workers=3)
    assert isinstance(delay, SSP) and delay.name == "bounded-delay"
    assert [w.width for w in delay.windows] == [3]  # T + 1 clocks open
