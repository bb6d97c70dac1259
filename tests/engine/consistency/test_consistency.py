"""Consistency controllers decide *when*; the shard applies *what*. The BSP and ASP rules are
checked on the controllers directly and end to end through a ``ShardState`` with SGD(lr=1), where
the change of the parameters is exactly minus the applied update."""

from __future__ import annotations

import numpy as np
import pytest

from engine.config import SyncConfig
from engine.consistency.base import ASP, BSP, ConsistencyController, RangeClocks
from engine.consistency.elastic import ElasticBSP
from engine.consistency.registry import CONSISTENCY_MODELS, make_controller
from engine.consistency.ssp import DSSP, SSP
from engine.errors import ConfigError, DuplicatePush, ProtocolError
from engine.keys import KeyRange
from engine.server.aggregation import make_aggregator
from engine.server.optimizers import SGD
from engine.server.shard import ShardState
from engine.server.update import Update

ONE = range(0, 1)  # the only clock range of a one-range shard


def grad(*values: float) -> np.ndarray:
    return np.array(values, dtype=np.float32)


def shard(controller: ConsistencyController, workers: int, keys: int = 1,
          rule: str = "mean") -> ShardState:
    """A one-range shard of ``keys`` zeros whose params move by exactly minus each update."""
    span = KeyRange(0, keys)
    state = ShardState(span, controller, SGD(keys, lr=1.0), workers=workers,
                       aggregator=make_aggregator(rule, span, [span], workers))
    assert state.init(span, np.zeros(keys, dtype=np.float32))
    return state


def push(state: ShardState, worker: int, clock: int, values: np.ndarray) -> int:
    return state.push(worker, clock, state.keys, values)


# -- BSP ----------------------------------------------------------------------------------------


def test_bsp_waits_for_every_worker_then_applies_the_mean() -> None:
    state = shard(BSP(3), workers=3, keys=2)
    assert push(state, 0, 0, grad(3.0, 0.0)) == 0
    assert push(state, 2, 0, grad(6.0, 3.0)) == 0
    assert state.params.tolist() == [0.0, 0.0] and state.version == 0
    assert state.clocks.shard_clocks() == [1, 0, 1]
    assert push(state, 1, 0, grad(0.0, 6.0)) == 0
    assert state.params.dtype == np.float32
    assert state.params.tolist() == [-3.0, -3.0]
    assert state.version == 1
    assert state.clocks.shard_clocks() == [1, 1, 1]


def test_bsp_controller_releases_a_round_on_the_last_commit() -> None:
    bsp = BSP(3)
    assert bsp.accumulates is True and bsp.name == "bsp"
    assert bsp.on_commit(0, 0, ONE) == []
    assert bsp.on_commit(2, 0, ONE) == []
    assert bsp.on_commit(1, 0, ONE) == [0]
    assert bsp.round.tolist() == [1]
    assert bsp.on_commit(1, 1, ONE) == []  # the next round counts from zero
    assert bsp.take_syncs() == []


def test_bsp_starts_every_round_from_zero() -> None:
    state = shard(BSP(2), workers=2)
    push(state, 0, 0, grad(10.0))
    push(state, 1, 0, grad(20.0))
    assert state.params.tolist() == [-15.0]
    push(state, 1, 1, grad(1.0))
    assert state.params.tolist() == [-15.0] and state.version == 1
    push(state, 0, 1, grad(3.0))
    assert state.params.tolist() == [-17.0]  # -15 - mean(1, 3)
    assert state.version == 2


def test_a_released_round_is_not_an_alias_of_the_running_sum() -> None:
    keys = KeyRange(0, 1)
    aggregator = make_aggregator("mean", keys, [keys], 2)
    aggregator.add(Update(slice(0, 1), grad(10.0), None, ONE))
    aggregator.add(Update(slice(0, 1), grad(20.0), None, ONE))
    (first,) = aggregator.release([0])
    assert first.values.tolist() == [15.0] and first.index is None and first.ranges == ONE
    aggregator.add(Update(slice(0, 1), grad(1.0), None, ONE))
    aggregator.add(Update(slice(0, 1), grad(3.0), None, ONE))
    (second,) = aggregator.release([0])
    assert second.values.tolist() == [2.0]
    assert first.values.tolist() == [15.0]


def test_bsp_single_worker_applies_every_push() -> None:
    state = shard(BSP(1), workers=1, keys=2)
    expected = np.zeros(2, dtype=np.float32)
    for clock in range(3):
        push(state, 0, clock, grad(clock, 1.0))
        expected -= grad(clock, 1.0)
        assert state.params.tolist() == expected.tolist()
        assert state.version == clock + 1
    assert state.params.tolist() == [-3.0, -3.0]
    bsp = BSP(1)
    assert [bsp.on_commit(0, clock, ONE) for clock in range(3)] == [[0], [0], [0]]


@pytest.mark.parametrize(
    ("clock", "rounds", "ready"),
    [(0, 0, True), (1, 0, False), (1, 1, True), (1, 2, True), (5, 4, False), (5, 5, True)],
)
def test_bsp_pull_ready_when_the_round_reaches_the_clock(
    clock: int, rounds: int, ready: bool
) -> None:
    bsp = BSP(2)
    for done in range(rounds):
        bsp.on_commit(0, done, ONE)
        assert bsp.pull_ready(0, done + 1, ONE) is False  # worker 1 has not committed yet
        assert bsp.on_commit(1, done, ONE) == [0]
    assert bsp.pull_ready(0, clock, ONE) is ready
    assert bsp.pull_ready(1, clock, ONE) is ready


def test_bsp_pull_ready_through_the_shard_follows_its_version() -> None:
    state = shard(BSP(2), workers=2)
    assert state.pull_ready(0, 0) and not state.pull_ready(0, 1)
    push(state, 0, 0, grad(1.0))
    assert not state.pull_ready(0, 1) and not state.pull_ready(1, 1)
    push(state, 1, 0, grad(1.0))
    assert state.pull_ready(0, 1) and state.pull_ready(1, 1) and not state.pull_ready(0, 2)


def test_bsp_refuses_a_push_from_a_future_round() -> None:
    state = shard(BSP(2), workers=2)
    push(state, 0, 0, grad(1.0))
    with pytest.raises(ProtocolError,
                       match="^worker 0 pushed clock 1 during BSP round 0 of clock range 0$"):
        push(state, 0, 1, grad(100.0))
    assert state.clocks.shard_clocks() == [1, 0]
    assert state.params.tolist() == [0.0] and state.pushes == 1
    push(state, 1, 0, grad(3.0))
    assert state.params.tolist() == [-2.0]  # mean(1, 3); the refused 100 never counted


def test_bsp_check_push_changes_nothing() -> None:
    bsp = BSP(2, ranges=2)
    with pytest.raises(ProtocolError,
                       match="^worker 1 pushed clock 1 during BSP round 0 of clock range 0$"):
        bsp.check_push(1, 1, range(0, 2))
    bsp.check_push(1, 0, range(0, 2))
    assert bsp.round.tolist() == [0, 0]
    assert bsp.on_commit(0, 0, range(0, 2)) == []
    assert bsp.on_commit(1, 0, range(0, 2)) == [0, 1]


# -- per-worker clocks --------------------------------------------------------------------------


def test_vector_clock_refuses_a_skipped_clock() -> None:
    state = shard(ASP(2), workers=2)
    with pytest.raises(
        ProtocolError, match="^worker 1 pushed clock 1 but its next clock is 0 on clock range 0$"
    ) as caught:
        push(state, 1, 1, grad(1.0))
    assert not isinstance(caught.value, DuplicatePush)
    assert state.clocks.shard_clocks() == [0, 0]
    assert (state.params.tolist(), state.version, state.pushes, state.duplicates) == ([0.0], 0,
                                                                                      0, 0)


def test_vector_clock_refuses_a_repeated_clock_as_a_duplicate() -> None:
    assert issubclass(DuplicatePush, ProtocolError)
    state = shard(ASP(2), workers=2)
    push(state, 0, 0, grad(2.0))
    with pytest.raises(DuplicatePush, match="^worker 0 already committed clock 0 on clock "
                                            "range 0$"):
        push(state, 0, 0, grad(2.0))
    assert state.duplicates == 1
    assert state.clocks.shard_clocks() == [1, 0]
    assert state.params.tolist() == [-1.0] and state.version == 1 and state.pushes == 1


def test_range_clocks_check_changes_nothing_and_commit_advances() -> None:
    clocks = RangeClocks(2, 3)
    with pytest.raises(ProtocolError,
                       match="^worker 1 pushed clock 2 but its next clock is 0 on clock range 1$"):
        clocks.check(1, 2, range(1, 3))
    assert clocks.next.tolist() == [[0, 0, 0], [0, 0, 0]]
    assert clocks.commit(1, range(0, 2)) is False  # range 2 is still at clock 0
    assert clocks.shard_clocks() == [0, 0]
    clocks.check(1, 0, range(2, 3))
    assert clocks.commit(1, range(2, 3)) is True
    assert clocks.next.tolist() == [[0, 0, 0], [1, 1, 1]]
    assert clocks.shard_clocks() == [0, 1]
    with pytest.raises(DuplicatePush, match="on clock range 1$"):
        clocks.check(1, 0, range(1, 2))
    assert clocks.duplicates == 1


@pytest.mark.parametrize("rank", [-1, 2, 100])
def test_vector_clock_refuses_an_out_of_range_rank(rank: int) -> None:
    state = shard(BSP(2), workers=2)
    with pytest.raises(ProtocolError, match=rf"^worker rank {rank} is outside 0\.\.1$"):
        push(state, rank, 0, grad(1.0))
    assert state.pushes == 0 and state.params.tolist() == [0.0]


def test_a_refused_push_does_not_count_towards_the_mean() -> None:
    state = shard(BSP(2), workers=2)
    push(state, 0, 0, grad(2.0))
    with pytest.raises(DuplicatePush):
        push(state, 0, 0, grad(100.0))  # repeated
    with pytest.raises(ProtocolError):
        push(state, 1, 3, grad(100.0))  # skipped
    assert state.version == 0
    push(state, 1, 0, grad(4.0))
    assert state.params.tolist() == [-3.0]
    assert (state.version, state.pushes, state.duplicates) == (1, 2, 1)


def test_shard_clocks_is_a_copy() -> None:
    state = shard(ASP(2), workers=2)
    clocks = state.clocks.shard_clocks()
    clocks[0] = 99
    assert state.clocks.shard_clocks() == [0, 0]


# -- ASP and the models that apply every push on arrival -------------------------------------


def test_asp_applies_a_workers_share_of_every_push_at_once() -> None:
    state = shard(ASP(2), workers=2, keys=2)
    expected = np.zeros(2, dtype=np.float32)
    pushes = [(0, 0), (0, 1), (1, 0), (0, 2), (1, 1)]
    for count, (worker, clock) in enumerate(pushes, start=1):
        g = grad(2.0 * worker, 2.0 * clock)
        assert push(state, worker, clock, g) == count - 1
        expected -= g / 2
        assert state.params.tolist() == expected.tolist()
        assert state.version == count
    assert state.params.tolist() == [-2.0, -4.0]
    assert state.clocks.shard_clocks() == [3, 2]


@pytest.mark.parametrize(("clock", "ranges"), [(0, ONE), (10, ONE), (3, range(0, 3))])
def test_asp_pull_is_always_ready(clock: int, ranges: range) -> None:
    asp = ASP(3)
    assert asp.pull_ready(1, clock, ranges) is True
    assert asp.accumulates is False
    asp.check_push(1, clock, ranges)
    assert asp.on_commit(1, clock, ranges) == []
    assert asp.take_syncs() == []


def test_no_workers_is_refused() -> None:
    with pytest.raises(ConfigError, match="^a consistency controller needs at least one worker$"):
        RangeClocks(0, 1)
    with pytest.raises(ConfigError, match="at least one worker"):
        ShardState(KeyRange(0, 1), ASP(1), SGD(1, lr=1.0), workers=0)


def test_make_controller() -> None:
    bsp = make_controller("bsp", workers=3)
    assert isinstance(bsp, BSP) and bsp.name == "bsp" and bsp.workers == 3
    assert bsp.round.tolist() == [0]
    ranged = make_controller("bsp", workers=3, ranges=3)
    assert isinstance(ranged, BSP) and ranged.round.tolist() == [0, 0, 0]
    asp = make_controller("asp", workers=2, ranges=4)
    assert isinstance(asp, ASP) and asp.name == "asp" and asp.workers == 2
    assert isinstance(make_controller("ssp", workers=2), SSP)
    assert isinstance(make_controller("dssp", workers=2), DSSP)
    assert isinstance(make_controller("elastic", workers=2), ElasticBSP)
    assert CONSISTENCY_MODELS.names() == ("bsp", "asp", "ssp", "bounded-delay", "dssp",
                                          "elastic")


@pytest.mark.parametrize("name", ["sssp", "BSP", ""])
def test_make_controller_refuses_an_unknown_model(name: str) -> None:
    with pytest.raises(ConfigError) as caught:
        make_controller(name, workers=2)
    assert str(caught.value) == (f"unknown consistency model {name!r} (known: bsp, asp, ssp, "
                                 "bounded-delay, dssp, elastic)")


@pytest.mark.parametrize("model", ["asp", "ssp", "dssp", "bounded-delay", "elastic"])
def test_one_by_one_models_apply_a_workers_share_of_each_push_by_default(model: str) -> None:
    controller = make_controller(model, workers=4)
    assert controller.accumulates is False
    state = shard(controller, workers=4, keys=2)
    push(state, 0, 0, grad(4.0, 8.0))
    assert state.params.tolist() == [-1.0, -2.0]
    assert state.version == 1


def test_push_scale_sum_applies_the_whole_push() -> None:
    config = SyncConfig(model="asp", push_scale="sum")
    state = shard(make_controller(config, workers=4), workers=4, keys=2, rule=config.push_scale)
    push(state, 0, 0, grad(4.0, 8.0))
    assert state.params.tolist() == [-4.0, -8.0]


def test_bsp_with_the_sum_rule_applies_the_round_sum() -> None:
    state = shard(BSP(2), workers=2, keys=2, rule="sum")
    push(state, 0, 0, grad(1.0, 2.0))
    push(state, 1, 0, grad(3.0, 4.0))
    assert state.params.tolist() == [-4.0, -6.0]
