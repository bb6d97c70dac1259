"""Workers joining and leaving a running job, as the consistency controllers and the shard count
them (``psctl scale``): RangeClocks.add, the immediate models, SSP's sliding window, DSSP's
comparison with the slowest worker, the fixed-membership models refusing, and ShardState.join and
ShardState.leave."""

from __future__ import annotations

import numpy as np
import pytest

from engine.config import SyncConfig
from engine.consistency.base import ASP, BSP, NO_TIMING, PushTiming, RangeClocks
from engine.consistency.elastic import ElasticBSP
from engine.consistency.registry import make_controller
from engine.consistency.ssp import DSSP, LEFT, SSP, SlidingWindow
from engine.errors import ConfigError, DuplicatePush, ProtocolError
from engine.keys import KeyRange
from engine.server.optimizers import SGD
from engine.server.shard import ShardState

pytestmark = pytest.mark.timeout(10)
ALL = range(0, 1)  # the one clock range of a single-range controller
FIXED = "counts a fixed set of workers in every round"
SCALABLE = "psctl scale works with asp, ssp, dssp and bounded-delay"


def shard(controller: object, workers: int = 2, ranges: int = 1) -> ShardState:
    """``ranges`` clock ranges of one key each, at zero, moved by SGD(lr=1)."""
    keys = KeyRange(0, ranges)
    state = ShardState(keys, controller, SGD(ranges, lr=1.0),  # type: ignore[arg-type]
                       workers=workers, ranges=[KeyRange(k, k + 1) for k in range(ranges)])
    assert state.init(keys, np.zeros(ranges, dtype=np.float32))
    return state


def push(state: ShardState, worker: int, clock: int, *, span: KeyRange | None = None,
         value: float = 0.0, timing: PushTiming = NO_TIMING) -> int:
    keys = span or state.keys
    return state.push(worker, clock, keys, np.full(len(keys), value, dtype=np.float32), timing)


def commit(controller: SSP, worker: int, clock: int, at: float | None = None) -> None:
    """``worker`` finished ``clock`` on the single range (and so on the shard)."""
    controller.on_commit(worker, clock, ALL)
    controller.on_clock(worker, clock, NO_TIMING if at is None else PushTiming(pushed_at=at))


# -- RangeClocks.add -----------------------------------------------------------------------------


def test_range_clocks_add_grows_by_one_row_at_the_start_clocks() -> None:
    clocks = RangeClocks(2, 3)
    clocks.commit(0, range(0, 3))
    clocks.commit(1, range(0, 1))
    clocks.add(2, [1, 0, 0])
    assert clocks.workers == 3
    assert clocks.next.tolist() == [[1, 1, 1], [1, 0, 0], [1, 0, 0]]
    clocks.check(2, 1, range(0, 1))  # its next clock on range 0
    clocks.check(2, 0, range(1, 3))
    with pytest.raises(DuplicatePush):
        clocks.check(2, 0, range(0, 1))


def test_range_clocks_add_without_starts_begins_at_zero() -> None:
    clocks = RangeClocks(1, 2)
    clocks.commit(0, range(0, 2))
    clocks.add(1, None)
    assert clocks.next.tolist() == [[1, 1], [0, 0]]
    assert clocks.shard_clocks() == [1, 0]


def test_range_clocks_add_past_the_end_adds_the_unused_rows_below() -> None:
    clocks = RangeClocks(2, 1)
    clocks.add(4, [3])
    assert clocks.workers == 5
    assert clocks.next[:, 0].tolist() == [0, 0, 0, 0, 3]
    clocks.check_rank(4)
    with pytest.raises(ProtocolError, match=r"outside 0\.\.4"):
        clocks.check_rank(5)


def test_range_clocks_add_of_an_existing_row_resets_only_that_row() -> None:
    clocks = RangeClocks(3, 2)
    clocks.commit(0, range(0, 2))
    clocks.commit(2, range(0, 2))
    clocks.add(1, [1, 1])
    assert clocks.workers == 3
    assert clocks.next.tolist() == [[1, 1], [1, 1], [1, 1]]


# -- the immediate models -----------------------------------------------------------------------


def test_immediate_models_start_a_joiner_at_zero_and_ignore_a_leaver() -> None:
    controller = make_controller("asp", workers=2)
    assert controller.join(2) is None
    assert controller.join(7) is None
    controller.leave(0, [5])
    controller.leave(2, [0])
    assert controller.pull_ready(7, 100, ALL)
    controller.check_push(7, 100, ALL)
    assert controller.on_commit(7, 0, ALL) == []


def test_an_asp_shard_starts_a_joiner_at_clock_zero() -> None:
    state = shard(ASP(2))
    for clock in range(3):
        push(state, 0, clock, value=1.0)
    assert state.join(2) == 0
    assert state.clocks.next[2].tolist() == [0]
    push(state, 2, 0, value=1.0)
    assert state.pushes == 4


# -- the fixed-membership models refuse ---------------------------------------------------------


def test_bsp_refuses_a_joiner_and_a_leaver() -> None:
    controller = BSP(2)
    with pytest.raises(ConfigError) as joined:
        controller.join(2)
    with pytest.raises(ConfigError) as left:
        controller.leave(1, [0])
    for caught in (joined, left):
        assert str(caught.value).startswith(f"bsp {FIXED}")
        assert SCALABLE in str(caught.value)
    assert controller.workers == 2


def test_elastic_refuses_a_joiner_and_a_leaver() -> None:
    controller = ElasticBSP(2, SyncConfig.model_validate({"model": "elastic"}))
    with pytest.raises(ConfigError, match=f"elastic {FIXED}"):
        controller.join(2)
    with pytest.raises(ConfigError, match=SCALABLE):
        controller.leave(0, [0])
    assert controller.barrier_clocks() == [1, 1]


def test_a_bsp_shard_refuses_a_joiner_and_changes_nothing() -> None:
    state = shard(BSP(2))
    with pytest.raises(ConfigError, match=f"bsp {FIXED}"):
        state.join(2)
    assert state.members == {0, 1}
    assert state.clocks.workers == 2
    assert state.finished == [False, False]
    with pytest.raises(ConfigError, match=f"bsp {FIXED}"):
        state.leave(1)
    assert state.members == {0, 1}


# -- SSP's sliding window -----------------------------------------------------------------------


def test_window_join_returns_the_low_bound_and_waits_for_the_joiner() -> None:
    window = SlidingWindow(workers=2, width=2)
    for clock in (0, 0, 1):
        window.add(clock)
    assert window.low == 1
    assert window.join() == 1
    assert window.workers == 3
    window.add(1)  # the second old worker: without the joiner the window would shift
    assert window.low == 1
    window.add(1)  # the joiner
    assert window.low == 2


def test_window_leave_of_the_slowest_releases_the_others() -> None:
    window = SlidingWindow(workers=2, width=2)
    window.add(0)
    window.add(1)  # worker 0 is at the edge: clock 2 is not admitted
    assert not window.admits(2)
    window.leave(0)  # worker 1 pushed nothing
    assert window.workers == 1
    assert window.low == 2
    assert window.admits(3)


def test_window_leave_does_not_count_the_leavers_open_pushes_twice() -> None:
    """3 workers: worker 2 pushed clocks 0 and 1, worker 0 too, worker 1 nothing. Counting
    worker 2's pushes after it left (2 >= the 2 workers left) would shift the window past
    clocks worker 1 has not pushed."""
    window = SlidingWindow(workers=3, width=2)
    for clock in (0, 1, 0, 1):  # workers 2 and 0
        window.add(clock)
    window.leave(2)
    assert window.workers == 2
    assert window.low == 0
    assert not window.admits(2)
    window.add(0)  # worker 1
    assert window.low == 1
    window.add(1)
    assert window.low == 2


def test_window_leave_of_the_last_worker_leaves_the_window_where_it_was() -> None:
    window = SlidingWindow(workers=1, width=3)
    window.add(0)
    window.leave(1)
    assert (window.workers, window.low) == (0, 1)


def test_a_window_rejoined_after_everybody_left_starts_at_its_low() -> None:
    window = SlidingWindow(workers=1, width=2)
    window.add(0)
    window.leave(1)
    assert window.join() == 1
    window.add(1)
    assert window.low == 2


# -- SSP through a shard ------------------------------------------------------------------------


def test_ssp_joiner_starts_at_the_windows_low_and_is_waited_for() -> None:
    """2 workers, staleness 1: after both pushed clock 0 and worker 0 pushed clock 1, a joiner
    starts at clock 1 (the low), and the window waits for it before it shifts to 2."""
    state = shard(SSP(2, staleness=1))
    push(state, 0, 0)
    push(state, 1, 0)
    push(state, 0, 1)
    assert state.join(2) == 1
    assert state.clocks.next[2].tolist() == [1]
    assert state.members == {0, 1, 2}
    push(state, 1, 1)
    # Worker 0 may pull clock 2 (it leads the low by 1) but not clock 3.
    assert state.pull_ready(0, 2) and not state.pull_ready(0, 3)
    push(state, 0, 2)
    with pytest.raises(ProtocolError, match="outside the open window"):
        push(state, 0, 3)
    with pytest.raises(DuplicatePush):
        push(state, 2, 0)  # before its start: already behind the window
    push(state, 2, 1)
    assert state.pull_ready(0, 3)
    assert state.slowest_clock(state.keys) == 2


def test_ssp_join_per_range_starts_at_each_ranges_low() -> None:
    state = shard(SSP(2, staleness=2, ranges=2), ranges=2)
    first = KeyRange(0, 1)
    for worker in (0, 1):
        push(state, worker, 0, span=first)
        push(state, worker, 1, span=first)
    push(state, 0, 0, span=KeyRange(1, 2))
    assert state.join(2) == 0  # the smallest of its starts
    assert state.clocks.next[2].tolist() == [2, 0]
    push(state, 2, 2, span=first)
    push(state, 2, 0, span=KeyRange(1, 2))


def test_ssp_leaver_that_held_the_others_back_releases_the_blocked_pull() -> None:
    state = shard(SSP(2, staleness=1))
    push(state, 0, 0)
    push(state, 0, 1)
    push(state, 1, 0)
    assert not state.pull_ready(0, 3)  # the low is 1: worker 1 has not pushed clock 1
    state.leave(1)
    assert state.members == {0}
    assert state.pull_ready(0, 3)
    push(state, 0, 2)
    push(state, 0, 3)


def test_ssp_leavers_earlier_pushes_are_not_counted_twice() -> None:
    """3 workers, staleness 1: worker 2 pushed clocks 0 and 1 and leaves; worker 0 pushed
    0 and 1 too; worker 1 pushed nothing. Were worker 2's open pushes still counted, every open
    clock would hold 2 pushes for the 2 workers left, and the window would move past clocks
    worker 1 has not pushed, letting worker 0 pull clock 2 and refusing worker 1's clock 0."""
    state = shard(SSP(3, staleness=1), workers=3)
    for worker in (2, 0):
        push(state, worker, 0)
        push(state, worker, 1)
    assert not state.pull_ready(0, 2)
    state.leave(2)
    assert not state.pull_ready(0, 2)  # worker 1 still holds it back
    push(state, 1, 0)  # would be "outside the open window" had the low moved
    assert state.pull_ready(0, 2) and not state.pull_ready(0, 3)
    push(state, 1, 1)
    assert state.pull_ready(0, 3)


def test_ssp_leaver_that_pushed_every_open_clock_is_subtracted_from_each() -> None:
    """A leaver at the window's edge pushed every open clock; each loses its push."""
    controller = SSP(3, staleness=1)
    for clock in (0, 1):
        controller.on_commit(2, clock, ALL)
    controller.on_commit(0, 0, ALL)
    controller.leave(2, [2])
    window = controller.windows[0]
    assert (window.workers, window.low) == (2, 0)
    controller.on_commit(1, 0, ALL)
    assert window.low == 1
    controller.on_commit(0, 1, ALL)
    controller.on_commit(1, 1, ALL)
    assert window.low == 2


@pytest.mark.parametrize("model", ["ssp", "bounded-delay"])
def test_ssp_join_and_leave_through_the_controller(model: str) -> None:
    controller = make_controller(SyncConfig(model=model, staleness=1, delay=1), workers=2,
                                 ranges=3)
    assert isinstance(controller, SSP)
    controller.on_commit(0, 0, range(0, 3))
    controller.on_commit(1, 0, range(0, 1))
    assert controller.join(2) == [1, 0, 0]
    assert [w.workers for w in controller.windows] == [3, 3, 3]
    controller.leave(1, [1, 0, 0])
    assert [w.workers for w in controller.windows] == [2, 2, 2]
    assert [w.low for w in controller.windows] == [1, 0, 0]


# -- DSSP ---------------------------------------------------------------------------------------


def test_dssp_join_grows_its_timings_and_starts_the_joiner_at_the_low() -> None:
    controller = DSSP(2, staleness=1, extra=1)
    commit(controller, 0, 0, at=1.0)
    commit(controller, 1, 0, at=1.0)
    assert controller.join(2) == [1]
    assert controller.timings.last_push(2) is None
    assert controller.timings.estimate(2, "ewma") is None
    commit(controller, 2, 1, at=2.0)  # its timings have a row now
    commit(controller, 2, 2, at=3.5)
    assert controller.timings.intervals(2) == [1.5]
    assert controller.windows[0].workers == 3


def test_dssp_join_of_a_rank_further_up_grows_every_row_below() -> None:
    controller = DSSP(2, staleness=1, extra=1)
    controller.join(4)
    commit(controller, 4, 0, at=1.0)
    assert controller.timings.last_push(4) == 1.0
    assert controller.windows[0].workers == 3


def dssp_with_two_timed_workers(workers: int) -> DSSP:
    """Staleness 1, extra 1: worker 0 pushed clocks 0-2 at 1, 2, 3 (next end 4.0), worker 1
    clocks 0-1 at 0 and 3 (next end 6.0); any other worker pushed nothing."""
    controller = DSSP(workers, staleness=1, extra=1)
    for clock, at in enumerate((1.0, 2.0, 3.0)):
        commit(controller, 0, clock, at)
    for clock, at in enumerate((0.0, 3.0)):
        commit(controller, 1, clock, at)
    return controller


def test_dssp_stretches_past_the_slowest_of_the_workers_left() -> None:
    """Worker 2 leaves before pushing anything; it is never the slowest again (LEFT), so worker
    0, 2 clocks past the low, is compared with worker 1, ends its next iteration first, and may
    go on. Had the leaver stayed the slowest (it has no timings), worker 0 would wait."""
    controller = DSSP(3, staleness=1, extra=1)
    controller.leave(2, [0])
    for clock, at in enumerate((1.0, 2.0, 3.0)):
        commit(controller, 0, clock, at)
    for clock, at in enumerate((0.0, 3.0)):
        commit(controller, 1, clock, at)
    assert controller.windows[0].low == 2
    assert controller.pull_ready(0, 4, ALL)  # lead 2 = S + R, 4.0 <= 6.0
    assert not controller.pull_ready(0, 5, ALL)  # past S + R


def test_dssp_without_the_leave_would_not_stretch() -> None:
    """The counterpart: with the same pushes, a controller of 2 workers stretches, one whose
    third worker never pushed does not even admit the clock (its low is 0)."""
    assert dssp_with_two_timed_workers(2).pull_ready(0, 4, ALL)
    assert not dssp_with_two_timed_workers(3).pull_ready(0, 4, ALL)


def test_dssp_leave_marks_the_leaver_as_left() -> None:
    controller = dssp_with_two_timed_workers(3)
    controller.leave(2, [0])
    assert controller._finished[2] == LEFT
    assert controller.windows[0].workers == 2
    assert controller.pull_ready(0, 4, ALL)


def test_dssp_leave_of_the_slowest_worker_compares_with_the_next_slowest() -> None:
    """Worker 1 (the slowest by its clocks) leaves; worker 0 is then compared with worker 2,
    whose next end (5.0) is after worker 0's (4.0); compared with the leaver (one push,
    no timings) it would wait."""
    controller = DSSP(3, staleness=1, extra=1)
    for clock, at in enumerate((1.0, 2.0, 3.0)):
        commit(controller, 0, clock, at)
    for clock, at in enumerate((1.0, 3.0)):  # interval 2: next end 5.0
        commit(controller, 2, clock, at)
    commit(controller, 1, 0, at=0.0)
    assert controller.windows[0].low == 1
    controller.leave(1, [1])
    assert controller.windows[0].low == 2
    assert controller.pull_ready(0, 4, ALL)  # 4.0 <= 5.0


def test_dssp_joiner_is_the_slowest_until_it_has_timings() -> None:
    """A joiner starts with the low as its finished clocks and no timings: while it is the
    slowest (lowest finished clocks, then lowest rank), nobody stretches past S."""
    controller = DSSP(1, staleness=1, extra=1)
    for clock, at in enumerate((1.0, 2.0)):
        commit(controller, 0, clock, at)
    assert controller.windows[0].low == 2
    assert controller.join(1) == [2]
    commit(controller, 0, 2, at=3.0)
    assert controller.pull_ready(0, 3, ALL)  # lead 1 = S
    assert not controller.pull_ready(0, 4, ALL)  # lead 2: the joiner has no next end
    commit(controller, 1, 2, at=2.5)  # the joiner's first push moves the low
    assert controller.windows[0].low == 3
    assert controller.pull_ready(0, 4, ALL)


# -- ShardState.join / leave --------------------------------------------------------------------


def test_shard_join_of_a_member_changes_nothing() -> None:
    state = shard(SSP(2, staleness=1))
    push(state, 0, 0)
    assert state.join(0) == 1
    assert state.join(1) == 0
    assert state.members == {0, 1}
    assert state.clocks.workers == 2
    assert state.controller.windows[0].workers == 2  # type: ignore[attr-defined]


def test_shard_join_returns_the_smallest_start_clock() -> None:
    state = shard(SSP(2, staleness=3, ranges=3), ranges=3)
    for worker in (0, 1):
        for clock in range(3):
            push(state, worker, clock, span=KeyRange(0, 1))
        push(state, worker, 0, span=KeyRange(2, 3))
    assert state.join(2) == 0  # range 1: nobody pushed it
    assert state.clocks.next[2].tolist() == [3, 0, 1]


def test_shard_join_grows_the_finished_flags() -> None:
    state = shard(SSP(2, staleness=1))
    state.join(2)
    assert state.finished == [False, False, False]
    state.join(5)
    assert len(state.finished) == 6 and not any(state.finished)
    push(state, 5, 0, timing=PushTiming(final=True))
    assert state.finished == [False] * 5 + [True]


def test_shard_pushes_of_a_joiner_at_its_start_clock_are_accepted() -> None:
    state = shard(SSP(2, staleness=1))
    push(state, 0, 0, value=1.0)
    push(state, 1, 0, value=1.0)
    start = state.join(2)
    assert start == 1
    with pytest.raises(ProtocolError, match="next clock is 1"):
        push(state, 2, 2, value=1.0)
    assert push(state, 2, start, value=1.0) == 2
    assert state.pushes == 3
    assert state.worker_clock(2, state.keys) == 2
    assert state.versions.tolist() == [3]


def test_shard_a_rank_that_left_cannot_rejoin() -> None:
    state = shard(SSP(3, staleness=1), workers=3)
    push(state, 2, 0)
    state.leave(2)
    assert state.members == {0, 1}
    with pytest.raises(ProtocolError, match="worker 2 left this job; a rank is not used twice"):
        state.join(2)
    assert state.members == {0, 1}
    assert state.controller.windows[0].workers == 2  # type: ignore[attr-defined]


def test_shard_leave_of_a_non_member_is_a_no_op() -> None:
    state = shard(SSP(2, staleness=1))
    state.leave(1)
    state.leave(1)  # twice: the window counts it once
    state.leave(9)  # never a member
    assert state.controller.windows[0].workers == 1  # type: ignore[attr-defined]
    assert state.members == {0}


def test_shard_leave_passes_the_leavers_next_clocks_per_range() -> None:
    seen: list[tuple[int, list[int]]] = []

    class Recording(SSP):
        def leave(self, worker: int, next_clocks: list[int]) -> None:
            seen.append((worker, next_clocks))
            super().leave(worker, next_clocks)

    state = shard(Recording(2, staleness=2, ranges=2), ranges=2)
    push(state, 1, 0)
    push(state, 1, 1, span=KeyRange(0, 1))
    state.leave(1)
    assert seen == [(1, [2, 1])]
    assert all(isinstance(c, int) for c in seen[0][1])


def test_shard_a_rank_skipped_by_a_later_join_can_still_join() -> None:
    state = shard(SSP(2, staleness=1))
    push(state, 0, 0)
    push(state, 1, 0)
    assert state.join(3) == 1
    assert state.join(2) == 1
    assert state.members == {0, 1, 2, 3}


def test_shard_a_push_from_a_worker_that_left_is_refused_and_changes_nothing() -> None:
    state = shard(SSP(2, staleness=1), workers=2)
    push(state, 0, 0)
    push(state, 1, 0)
    state.leave(1)
    before = (state.params.copy(), state.controller.windows[0].low)  # type: ignore[attr-defined]
    with pytest.raises(ProtocolError, match="^worker 1 has left this job$"):
        push(state, 1, 1, value=5.0)
    assert state.params.tolist() == before[0].tolist()
    assert state.controller.windows[0].low == before[1]  # type: ignore[attr-defined]
    push(state, 0, 1)  # the one left goes on


def test_shard_the_slowest_clock_counts_members_only() -> None:
    state = shard(SSP(2, staleness=3), workers=2)
    push(state, 0, 0)
    push(state, 0, 1)
    assert state.slowest_clock(state.keys) == 0  # worker 1 has committed nothing
    state.leave(1)
    assert state.slowest_clock(state.keys) == 2
