"""One shard's state machine, without I/O: init, pull readiness, pushes, versions, and a shard
cut into clock ranges (split pushes, commits, duplicates, empty and sparse pushes)."""

from __future__ import annotations

import numpy as np
import pytest

from engine.consistency.base import ASP, BSP, ConsistencyController, PushTiming
from engine.consistency.ssp import SSP
from engine.errors import BadPayload, DuplicatePush, ProtocolError, UnsafeUpdate
from engine.keys import KeyRange
from engine.server.optimizers import SGD
from engine.server.shard import ShardState
from engine.server.update import Update
from engine.wire.protocol import ANY_CLOCK

KEYS = KeyRange(10, 14)
START = np.array([1.0, 2.0, 3.0, 4.0], dtype=np.float32)
# three clock ranges: keys 10-11, key 12, key 13
RANGES = [KeyRange(10, 12), KeyRange(12, 13), KeyRange(13, 14)]
HEAD, MIDDLE, TAIL = RANGES
NO_KEYS = np.array([], dtype=np.uint32)
EMPTY = np.zeros(0, dtype=np.float32)


def f32(*values: float) -> np.ndarray:
    return np.array(values, dtype=np.float32)


def keys(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.uint32)


def shard(model: str = "bsp", workers: int = 2, lr: float = 0.5) -> ShardState:
    controller = BSP(workers) if model == "bsp" else ASP(workers)
    return ShardState(KEYS, controller, SGD(len(KEYS), lr=lr), workers=workers)


def ready(model: str = "bsp", workers: int = 2) -> ShardState:
    state = shard(model, workers)
    assert state.init(KEYS, START) is True
    return state


class Recording(BSP):
    """BSP that records every ``on_clock`` call: (worker, clock, pushed_at)."""

    def __init__(self, workers: int, ranges: int) -> None:
        super().__init__(workers, ranges)
        self.finished: list[tuple[int, int, float]] = []

    def on_clock(self, worker: int, clock: int, timing: PushTiming) -> None:
        self.finished.append((worker, clock, timing.pushed_at))


Applied = tuple[tuple[int, int], list[int] | None, list[float], tuple[int, int]]


def ranged(controller: ConsistencyController, workers: int = 2,
           momentum: float = 0.0) -> tuple[ShardState, list[Applied]]:
    """A shard with three clock ranges moved by SGD(lr=1), and the updates it applies as
    ((span start, stop), local index or None, values, (first range, past-last range))."""
    state = ShardState(KEYS, controller, SGD(len(KEYS), lr=1.0, momentum=momentum),
                       workers=workers, ranges=RANGES)
    assert state.init(KEYS, START)
    applied: list[Applied] = []

    def record(update: Update) -> None:
        index = None if update.index is None else update.index.tolist()
        applied.append(((update.span.start, update.span.stop), index, update.values.tolist(),
                        (update.ranges.start, update.ranges.stop)))

    state.hooks.append(record)
    return state, applied


def snapshot(state: ShardState) -> tuple[list[float], list[int], list[list[int]], int]:
    return (state.params.tolist(), state.versions.tolist(), state.clocks.next.tolist(),
            state.pushes)


def test_a_new_shard_is_zero_and_uninitialised() -> None:
    state = shard()
    assert state.params.tolist() == [0.0] * 4
    assert state.params.dtype == np.float32
    assert (state.version, state.initialized, state.pushes, state.duplicates) == (0, False, 0, 0)
    assert state.versions.tolist() == [0]


def test_only_the_first_init_counts() -> None:
    state = shard()
    assert state.init(KEYS, START) is True
    assert state.init(KEYS, START * 10) is False
    assert state.params.tolist() == [1.0, 2.0, 3.0, 4.0]
    assert state.version == 0


def test_init_copies_the_values() -> None:
    state = shard()
    values = START.copy()
    state.init(KEYS, values)
    values[:] = 0.0
    assert state.params.tolist() == [1.0, 2.0, 3.0, 4.0]


def test_partial_init_is_refused() -> None:
    state = shard()
    with pytest.raises(
        BadPayload, match=r"^INIT must cover the whole shard \[10, 14\), got \[10, 12\)$"
    ):
        state.init(KeyRange(10, 12), START[:2])
    assert not state.initialized


@pytest.mark.parametrize("clock", [0, 3, ANY_CLOCK])
def test_pull_before_init_is_not_ready(clock: int) -> None:
    for model in ("bsp", "asp"):
        assert shard(model).pull_ready(0, clock) is False


def test_push_before_init_is_refused() -> None:
    state = shard()
    with pytest.raises(ProtocolError, match="^push before the shard was initialised$"):
        state.push(0, 0, KEYS, np.ones(4, dtype=np.float32))
    assert state.pushes == 0
    assert state.clocks.shard_clocks() == [0, 0]


@pytest.mark.parametrize("span", [KeyRange(10, 12), KeyRange(11, 14)])
def test_a_commit_of_part_of_the_only_clock_range_is_refused(span: KeyRange) -> None:
    state = ready()
    with pytest.raises(BadPayload) as caught:
        state.push(0, 0, span, np.ones(len(span), dtype=np.float32))
    assert str(caught.value) == (f"a commit must cover whole clock ranges; [{span.start}, "
                                 f"{span.end}) cuts one: [10, 14)")
    assert state.pushes == 0
    assert state.clocks.shard_clocks() == [0, 0]


@pytest.mark.parametrize("span", [KeyRange(9, 14), KeyRange(13, 15)])
def test_a_push_outside_the_shard_is_refused(span: KeyRange) -> None:
    state = ready()
    with pytest.raises(BadPayload) as caught:
        state.push(0, 0, span, np.ones(len(span), dtype=np.float32))
    assert str(caught.value) == (f"keys [{span.start}, {span.end}) are not all on this shard, "
                                 "which holds [10, 14)")
    assert state.pushes == 0


def test_bsp_push_is_accepted_at_the_base_version_and_applied_once_per_clock() -> None:
    state = ready(workers=2)
    g0 = np.array([1.0, 1.0, 1.0, 1.0], dtype=np.float32)
    g1 = np.array([3.0, -1.0, 0.0, 2.0], dtype=np.float32)
    assert state.pull_ready(0, 0) and state.pull_ready(1, 0)
    assert not state.pull_ready(0, 1)
    assert state.push(0, 0, KEYS, g0) == 0
    assert state.version == 0
    assert state.params.tolist() == [1.0, 2.0, 3.0, 4.0]
    assert not state.pull_ready(0, 1)
    assert state.push(1, 0, KEYS, g1) == 0  # staleness 0: accepted at the version it pulled
    assert state.version == 1
    assert state.pull_ready(0, 1)
    assert state.params.tolist() == (START - 0.5 * (g0 + g1) / 2).tolist()
    assert state.params.tolist() == [0.0, 2.0, 2.75, 3.25]
    # the next clock: each push is accepted at version 1, the base the workers pulled
    assert state.push(1, 1, KEYS, g0) == 1
    assert state.push(0, 1, KEYS, g1) == 1
    assert (state.version, state.pushes) == (2, 4)


def test_asp_counts_one_version_per_push() -> None:
    state = ready("asp", workers=2)
    g = np.full(4, 2.0, dtype=np.float32)
    accepted = [
        state.push(0, 0, KEYS, g),
        state.push(1, 0, KEYS, g),
        state.push(0, 1, KEYS, g),
        state.push(1, 1, KEYS, g),
    ]
    assert accepted == [0, 1, 2, 3]
    assert (state.version, state.pushes) == (4, 4)
    # each push applies 1/workers of its gradient: 4 pushes * lr 0.5 * 2.0 / 2
    assert state.params.tolist() == (START - 2.0).tolist()
    assert state.pull_ready(0, 0) and state.pull_ready(0, 100)


def test_any_clock_is_ready_whatever_the_model_says() -> None:
    state = ready("bsp")
    assert not state.pull_ready(0, 5)
    assert state.pull_ready(0, ANY_CLOCK)


def test_read_returns_the_owned_piece() -> None:
    state = ready()
    assert state.read(KEYS).tolist() == [1.0, 2.0, 3.0, 4.0]
    assert state.read(KeyRange(11, 13)).tolist() == [2.0, 3.0]
    assert state.read(KeyRange(12, 12)).tolist() == []
    assert state.read(KEYS, keys(11, 13)).tolist() == [2.0, 4.0]


@pytest.mark.parametrize("span", [KeyRange(8, 12), KeyRange(13, 15), KeyRange(0, 2)])
def test_read_outside_the_shard_is_refused(span: KeyRange) -> None:
    with pytest.raises(BadPayload) as caught:
        ready().read(span)
    assert str(caught.value) == (
        f"keys [{span.start}, {span.end}) are not all on this shard, which holds [10, 14)"
    )


def test_a_refused_clock_leaves_the_state_unchanged() -> None:
    state = ready("bsp")
    state.push(0, 0, KEYS, np.ones(4, dtype=np.float32))
    before = snapshot(state)
    with pytest.raises(ProtocolError, match="during BSP round 0"):
        state.push(0, 1, KEYS, np.ones(4, dtype=np.float32))
    with pytest.raises(ProtocolError, match="but its next clock is 0"):
        state.push(1, 1, KEYS, np.ones(4, dtype=np.float32))
    assert snapshot(state) == before
    assert (state.version, state.pushes) == (0, 1)
    assert state.params.tolist() == [1.0, 2.0, 3.0, 4.0]


# -- a shard cut into clock ranges ------------------------------------------------------------


def test_bsp_releases_a_clock_range_only_when_every_worker_committed_it() -> None:
    state, applied = ranged(BSP(2, ranges=3))
    assert state.push(0, 0, KEYS, f32(1.0, 2.0, 3.0, 4.0)) == 0
    assert state.versions.tolist() == [0, 0, 0] and applied == []
    assert state.push(1, 0, HEAD, f32(3.0, 2.0)) == 0
    # the first range's round is complete: 1 - mean(1, 3), 2 - mean(2, 2)
    assert state.params.tolist() == [-1.0, 0.0, 3.0, 4.0]
    assert state.versions.tolist() == [1, 0, 0] and state.version == 0
    assert applied == [((0, 2), None, [2.0, 2.0], (0, 1))]
    assert state.push(1, 0, KeyRange(12, 14), f32(5.0, 0.0)) == 0
    # the last two released together as one update: 3 - mean(3, 5), 4 - mean(4, 0)
    assert state.params.tolist() == [-1.0, 0.0, -1.0, 2.0]
    assert state.versions.tolist() == [1, 1, 1] and state.version == 1
    assert applied[1:] == [((2, 4), None, [4.0, 2.0], (1, 3))]
    assert state.clocks.shard_clocks() == [1, 1]


def test_pulls_over_one_clock_range_become_ready_independently() -> None:
    state, _ = ranged(BSP(2, ranges=3))
    state.push(0, 0, KEYS, f32(1.0, 1.0, 1.0, 1.0))
    state.push(1, 0, TAIL, f32(1.0))  # worker 1 finishes the last range first
    assert state.pull_ready(0, 1, TAIL) and state.pull_ready(1, 1, TAIL)
    assert not state.pull_ready(0, 1, HEAD) and not state.pull_ready(0, 1, MIDDLE)
    assert not state.pull_ready(0, 1, KeyRange(12, 14))  # touches a range still in round 0
    assert not state.pull_ready(0, 1)
    assert state.pull_ready(0, 0, HEAD)
    assert (state.version_of(TAIL), state.version_of(HEAD), state.version_of(KEYS)) == (1, 0, 1)
    state.push(1, 0, HEAD, f32(1.0, 1.0))
    assert state.pull_ready(0, 1, HEAD) and state.pull_ready(0, 1, KeyRange(11, 12))
    assert not state.pull_ready(0, 1, KeyRange(11, 13))
    assert state.versions.tolist() == [1, 0, 1] and state.version == 0
    state.push(1, 0, MIDDLE, f32(1.0))
    assert state.pull_ready(0, 1) and not state.pull_ready(0, 2, TAIL)
    assert state.version == 1


def test_on_clock_fires_once_a_worker_finished_every_clock_range() -> None:
    controller = Recording(2, 3)
    state, _ = ranged(controller)
    state.push(0, 0, TAIL, f32(1.0), PushTiming(pushed_at=1.0))
    state.push(0, 0, HEAD, f32(1.0, 1.0), PushTiming(pushed_at=2.0))
    assert controller.finished == [] and state.clocks.shard_clocks() == [0, 0]
    state.push(0, 0, MIDDLE, f32(1.0), PushTiming(pushed_at=3.0))
    assert controller.finished == [(0, 0, 3.0)]
    assert state.clocks.shard_clocks() == [1, 0]
    state.push(1, 0, KEYS, f32(1.0, 1.0, 1.0, 1.0), PushTiming(pushed_at=4.0))
    assert controller.finished == [(0, 0, 3.0), (1, 0, 4.0)]


def test_pushes_split_over_ranges_are_held_until_the_commit() -> None:
    controller = Recording(2, 3)
    state, applied = ranged(controller)
    assert state.push(0, 0, HEAD, f32(2.0, 4.0), commit=False) == 0
    assert state.push(0, 0, KeyRange(12, 14), f32(6.0, 8.0), commit=False) == 0
    assert state.push(0, 0, TAIL, f32(2.0), commit=False) == 0  # a second piece adds up
    assert state.clocks.next.tolist() == [[0, 0, 0], [0, 0, 0]]
    assert state.versions.tolist() == [0, 0, 0] and applied == []
    assert state.params.tolist() == [1.0, 2.0, 3.0, 4.0] and state.pushes == 3
    assert controller.finished == []
    state.push(1, 0, KEYS, f32(0.0, 0.0, 0.0, 0.0))
    assert state.version == 0 and applied == []  # worker 0 has not committed anything yet
    assert state.push(0, 0, KEYS, EMPTY, PushTiming(pushed_at=5.0), index=NO_KEYS) == 0
    assert controller.finished == [(1, 0, 0.0), (0, 0, 5.0)]
    assert state.clocks.next.tolist() == [[1, 1, 1], [1, 1, 1]]
    assert state.versions.tolist() == [1, 1, 1]
    # 1 - 2/2, 2 - 4/2, 3 - 6/2, 4 - (8 + 2)/2
    assert state.params.tolist() == [0.0, 0.0, 0.0, -1.0]
    assert applied == [((0, 4), None, [1.0, 2.0, 3.0, 5.0], (0, 3))]
    assert state.pushes == 5


def test_asp_applies_each_piece_on_arrival_and_counts_it_on_its_ranges() -> None:
    state, applied = ranged(ASP(2))
    assert state.push(0, 0, HEAD, f32(2.0, 2.0), commit=False) == 0
    assert state.versions.tolist() == [1, 0, 0]
    assert state.push(0, 0, KeyRange(12, 14), f32(4.0, 4.0), commit=False) == 0
    assert state.versions.tolist() == [1, 1, 1]
    assert state.params.tolist() == [0.0, 1.0, 1.0, 2.0]
    assert state.clocks.shard_clocks() == [0, 0]
    assert state.push(0, 0, KEYS, EMPTY, index=NO_KEYS) == 1
    assert state.clocks.shard_clocks() == [1, 0] and state.version == 1
    assert [a[3] for a in applied] == [(0, 1), (1, 3)]


def test_ssp_lead_is_per_clock_range_on_the_shard() -> None:
    state, _ = ranged(SSP(2, staleness=0, ranges=3))
    state.push(0, 0, HEAD, f32(0.0, 0.0))
    state.push(1, 0, HEAD, f32(0.0, 0.0))
    assert state.pull_ready(0, 1, HEAD) and not state.pull_ready(0, 1, MIDDLE)
    state.push(0, 1, HEAD, f32(0.0, 0.0))  # within the bound on its own range
    state.push(0, 0, MIDDLE, f32(0.0))
    with pytest.raises(ProtocolError, match=r"^clock 1 is outside the open window \[0, 1\)"):
        state.push(0, 1, MIDDLE, f32(0.0))  # worker 1 has not finished clock 0 there
    assert state.clocks.next.tolist() == [[2, 1, 0], [1, 0, 0]]


@pytest.mark.parametrize(
    ("span", "message"),
    [
        (KeyRange(11, 13), r"\[11, 13\) cuts one: \[10, 12\), \[12, 13\)"),
        (KeyRange(10, 11), r"\[10, 11\) cuts one: \[10, 12\)"),
    ],
)
def test_a_commit_whose_span_cuts_a_clock_range_is_refused(span: KeyRange, message: str) -> None:
    state, applied = ranged(BSP(2, ranges=3))
    values = np.full(len(span), 100.0, dtype=np.float32)
    before = snapshot(state)
    with pytest.raises(BadPayload, match=f"^a commit must cover whole clock ranges; {message}$"):
        state.push(0, 0, span, values)
    assert snapshot(state) == before and applied == []
    # the same piece without a commit is accepted; the refused one never counted
    state.push(0, 0, span, np.ones(len(span), dtype=np.float32), commit=False)
    state.push(0, 0, KEYS, EMPTY, index=NO_KEYS)
    state.push(1, 0, KEYS, f32(1.0, 1.0, 1.0, 1.0))
    inside = (np.arange(10, 14) >= span.start) & (np.arange(10, 14) < span.end)
    expected = START - np.where(inside, np.float32(1.0), np.float32(0.5))
    assert state.params.tolist() == expected.tolist()


@pytest.mark.parametrize(
    ("span", "committed"),
    [(KEYS, [1, 1, 1]), (MIDDLE, [0, 1, 0]), (KeyRange(12, 14), [0, 1, 1]), (HEAD, [1, 0, 0])],
)
def test_a_commit_of_whole_clock_ranges_advances_exactly_those(
    span: KeyRange, committed: list[int]
) -> None:
    state, _ = ranged(BSP(2, ranges=3))
    state.push(0, 0, span, np.ones(len(span), dtype=np.float32))
    assert state.clocks.next.tolist() == [committed, [0, 0, 0]]


def test_a_duplicate_push_is_refused_counted_and_changes_nothing() -> None:
    state, applied = ranged(BSP(2, ranges=3))
    state.push(0, 0, HEAD, f32(2.0, 2.0))
    before = snapshot(state)
    with pytest.raises(DuplicatePush, match="^worker 0 already committed clock 0 on clock range "
                                            "0$"):
        state.push(0, 0, HEAD, f32(100.0, 100.0))
    assert state.duplicates == 1
    with pytest.raises(DuplicatePush):  # a clock committed on one of the ranges it covers
        state.push(0, 0, KEYS, f32(100.0, 100.0, 100.0, 100.0), commit=False)
    assert state.duplicates == 2
    assert snapshot(state) == before and applied == []
    state.push(0, 0, KeyRange(12, 14), f32(2.0, 2.0))
    state.push(1, 0, KEYS, f32(0.0, 0.0, 0.0, 0.0))
    assert state.params.tolist() == [0.0, 1.0, 2.0, 3.0]  # the refused 100s never counted
    # a repeat of a completed round is a duplicate, not a push from the wrong round
    with pytest.raises(DuplicatePush, match="clock 0 on clock range 0$"):
        state.push(1, 0, KEYS, f32(1.0, 1.0, 1.0, 1.0))
    assert state.duplicates == 3 and state.version == 1


def test_a_duplicate_under_asp_is_not_applied_twice() -> None:
    state, applied = ranged(ASP(1), workers=1)
    state.push(0, 0, KEYS, f32(1.0, 1.0, 1.0, 1.0))
    with pytest.raises(DuplicatePush):
        state.push(0, 0, KEYS, f32(1.0, 1.0, 1.0, 1.0))
    assert state.params.tolist() == [0.0, 1.0, 2.0, 3.0]
    assert (len(applied), state.version, state.duplicates) == (1, 1, 1)


def test_an_empty_push_with_commit_advances_the_clock() -> None:
    state, applied = ranged(BSP(2, ranges=3))
    assert state.push(0, 0, KeyRange(12, 14), EMPTY, index=NO_KEYS) == 0
    assert state.clocks.next.tolist() == [[0, 1, 1], [0, 0, 0]]
    assert state.pushes == 1 and state.params.tolist() == START.tolist()
    state.push(1, 0, KeyRange(12, 14), EMPTY, index=NO_KEYS)
    # a round nobody pushed a key of: a new version, no update
    assert state.versions.tolist() == [0, 1, 1] and applied == []
    assert state.pull_ready(0, 1, KeyRange(12, 14)) and not state.pull_ready(0, 1)
    assert state.params.tolist() == START.tolist()


def test_an_empty_push_under_asp_advances_the_clock_only() -> None:
    state, applied = ranged(ASP(2))
    assert state.push(1, 0, KEYS, EMPTY, index=NO_KEYS) == 0
    assert state.clocks.shard_clocks() == [0, 1]
    assert state.versions.tolist() == [0, 0, 0] and applied == []
    state.push(1, 1, KEYS, f32(2.0, 2.0, 2.0, 2.0))
    assert state.params.tolist() == [0.0, 1.0, 2.0, 3.0]


def test_sparse_bsp_rounds_touch_only_the_pushed_keys_and_their_momentum() -> None:
    state, applied = ranged(BSP(2, ranges=3), momentum=0.5)
    state.push(0, 0, KEYS, f32(2.0, 4.0), index=keys(10, 13))
    state.push(1, 0, KEYS, f32(2.0), index=keys(10))
    # per range, only the keys somebody pushed: key 10 mean(2, 2), key 13 mean(4, 0)
    assert applied == [((0, 2), [0], [2.0], (0, 1)), ((3, 4), [3], [2.0], (2, 3))]
    assert state.versions.tolist() == [1, 1, 1]
    assert state.params.tolist() == [-1.0, 2.0, 3.0, 2.0]
    state.push(0, 1, KEYS, f32(4.0), index=keys(11))
    state.push(1, 1, KEYS, EMPTY, index=NO_KEYS)
    # key 11's first step; keys 10 and 13 keep their momentum but are not moved by it
    assert applied[2:] == [((0, 2), [1], [2.0], (0, 1))]
    assert state.params.tolist() == [-1.0, 0.0, 3.0, 2.0]
    assert state.versions.tolist() == [2, 2, 2]
    state.push(0, 2, KEYS, f32(0.0), index=keys(10))
    state.push(1, 2, KEYS, EMPTY, index=NO_KEYS)
    assert state.params.tolist() == [-2.0, 0.0, 3.0, 2.0]  # buf 0.5 * 2 + 0 on key 10 only


def test_sparse_pieces_and_dense_pieces_mix_in_one_round() -> None:
    state, applied = ranged(BSP(2, ranges=3))
    state.push(0, 0, KEYS, f32(2.0, 2.0, 2.0, 2.0))  # dense, every range
    state.push(1, 0, KEYS, f32(4.0), index=keys(12))  # sparse, one key
    assert applied == [((0, 4), None, [1.0, 1.0, 3.0, 1.0], (0, 3))]
    assert state.params.tolist() == [0.0, 1.0, 0.0, 3.0]


# -- values that would break the model -----------------------------------------------------------


def momentum_shard(model: str, lr: float = 0.5) -> ShardState:
    controller = BSP(2) if model == "bsp" else ASP(2)
    state = ShardState(KEYS, controller, SGD(len(KEYS), lr=lr, momentum=0.9), workers=2)
    state.init(KEYS, START)
    return state


def fingerprint(state: ShardState) -> tuple[bytes, ...]:
    return (state.params.tobytes(), *(slot.tobytes() for slot in state.optimizer.slots()),
            state.versions.tobytes())


@pytest.mark.parametrize("model", ["asp", "bsp"])
def test_huge_finite_pushes_are_refused_and_change_nothing(model: str) -> None:
    state = momentum_shard(model)
    state.push(1, 0, KEYS, f32(1, 1, 1, 1))  # a real push first, so the momentum is non-zero
    before = fingerprint(state)
    with pytest.raises(BadPayload, match="too large"):  # finite in float64, inf in float32
        state.push(0, 0, KEYS, np.full(4, 1e300))
    for _ in range(3):
        with pytest.raises(BadPayload, match="too large"):
            state.push(0, 0, KEYS, np.full(4, 3e38, dtype=np.float32))
    assert fingerprint(state) == before
    state.push(0, 0, KEYS, f32(1, 1, 1, 1))  # the refusals consumed no clock
    assert state.version == (2 if model == "asp" else 1)


def test_an_update_that_would_overflow_is_rolled_back_bit_for_bit() -> None:
    state = momentum_shard("asp", lr=1e30)
    before = fingerprint(state)
    with pytest.raises(UnsafeUpdate, match="non-finite"):
        state.push(0, 0, KEYS, f32(1e10, 0, 0, 0))  # lr * g = 1e40: not a float32
    assert fingerprint(state) == before
    with pytest.raises(UnsafeUpdate):  # a sparse update is rolled back the same way
        state.push(0, 0, KEYS, f32(1e10), index=keys(11))
    assert fingerprint(state) == before


def test_a_bsp_round_that_would_overflow_completes_without_its_update() -> None:
    state = momentum_shard("bsp", lr=1e30)
    params = state.params.tobytes()
    state.push(0, 0, KEYS, f32(1e10, 0, 0, 0))
    with pytest.raises(UnsafeUpdate, match="round this push completed was not applied"):
        state.push(1, 0, KEYS, f32(1e10, 0, 0, 0))
    assert state.params.tobytes() == params
    assert state.version == 1  # the round is over: nobody waits on it forever
    assert state.pull_ready(0, 1)


def test_init_values_must_be_finite_in_float32() -> None:
    state = shard()
    with pytest.raises(BadPayload, match="not finite"):
        state.init(KEYS, np.full(4, 1e300))
    assert not state.initialized


def test_clip_norm_scales_a_push_down_to_the_bound() -> None:
    state = ShardState(KEYS, ASP(1), SGD(len(KEYS), lr=1.0), workers=1, clip_norm=1.0)
    state.init(KEYS, START)
    state.push(0, 0, KEYS, f32(3, 4, 0, 0))  # norm 5 -> scaled to 1
    np.testing.assert_allclose(state.params, START - f32(0.6, 0.8, 0, 0), rtol=1e-6)
    state.push(0, 1, KEYS, f32(0.3, 0.4, 0, 0))  # norm 0.5: untouched
    np.testing.assert_allclose(state.params, START - f32(0.9, 1.2, 0, 0), rtol=1e-6)
