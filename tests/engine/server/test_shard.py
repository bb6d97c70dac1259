"""One shard's state machine, without I/O: init, pull readiness, pushes and versions."""

from __future__ import annotations

import numpy as np
import pytest

from engine.consistency.base import ASP, BSP
from engine.errors import BadPayload, ProtocolError
from engine.keys import KeyRange
from engine.server.optimizers import SGD
from engine.server.shard import ShardState
from engine.wire.protocol import ANY_CLOCK

KEYS = KeyRange(10, 14)
START = np.array([1.0, 2.0, 3.0, 4.0], dtype=np.float32)


def shard(model: str = "bsp", workers: int = 2, lr: float = 0.5) -> ShardState:
    controller = BSP(workers, len(KEYS)) if model == "bsp" else ASP(workers)
    return ShardState(KEYS, controller, SGD(len(KEYS), lr=lr))


def ready(model: str = "bsp", workers: int = 2) -> ShardState:
    state = shard(model, workers)
    assert state.init(KEYS, START) is True
    return state


def test_a_new_shard_is_zero_and_uninitialised() -> None:
    state = shard()
    assert state.params.tolist() == [0.0] * 4
    assert state.params.dtype == np.float32
    assert (state.version, state.initialized, state.pushes) == (0, False, 0)


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


@pytest.mark.parametrize("keys", [KeyRange(10, 12), KeyRange(11, 14), KeyRange(9, 14)])
def test_partial_range_push_is_refused(keys: KeyRange) -> None:
    state = ready()
    with pytest.raises(BadPayload) as caught:
        state.push(0, 0, keys, np.ones(len(keys), dtype=np.float32))
    assert str(caught.value) == (
        f"PUSH must cover the whole shard [10, 14), got [{keys.start}, {keys.end})"
    )
    assert state.pushes == 0
    assert state.controller.clocks() == [0, 0]


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
    np.testing.assert_allclose(state.params, START - 0.5 * (g0 + g1) / 2)
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
    np.testing.assert_allclose(state.params, START - 4 * 0.5 * 2.0)
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


@pytest.mark.parametrize("keys", [KeyRange(8, 12), KeyRange(13, 15), KeyRange(0, 2)])
def test_read_outside_the_shard_is_refused(keys: KeyRange) -> None:
    with pytest.raises(BadPayload) as caught:
        ready().read(keys)
    assert str(caught.value) == (
        f"keys [{keys.start}, {keys.end}) are not all on this shard, which holds [10, 14)"
    )


def test_a_refused_clock_leaves_the_state_unchanged() -> None:
    state = ready("bsp")
    with pytest.raises(ProtocolError, match="during BSP round 0"):
        state.push(0, 1, KEYS, np.ones(4, dtype=np.float32))
    assert (state.version, state.pushes) == (0, 0)
    assert state.params.tolist() == [1.0, 2.0, 3.0, 4.0]
