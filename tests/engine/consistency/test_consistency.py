"""Consistency controllers: when a pull may be answered and which gradient becomes an update."""

from __future__ import annotations

import numpy as np
import pytest

from engine.consistency.base import ASP, BSP, make_controller
from engine.errors import ConfigError, ProtocolError


def grad(*values: float) -> np.ndarray:
    return np.array(values, dtype=np.float32)


def test_bsp_waits_for_every_worker_then_returns_the_mean() -> None:
    bsp = BSP(3, 2)
    assert bsp.on_push(0, 0, grad(3.0, 0.0)) is None
    assert bsp.on_push(2, 0, grad(6.0, 3.0)) is None
    update = bsp.on_push(1, 0, grad(0.0, 6.0))
    assert update is not None
    assert update.dtype == np.float32
    assert update.tolist() == [3.0, 3.0]
    assert bsp.clocks() == [1, 1, 1]


def test_bsp_starts_every_round_from_zero() -> None:
    bsp = BSP(2, 1)
    bsp.on_push(0, 0, grad(10.0))
    first = bsp.on_push(1, 0, grad(20.0))
    assert first is not None and first.tolist() == [15.0]
    assert bsp.on_push(1, 1, grad(1.0)) is None
    second = bsp.on_push(0, 1, grad(3.0))
    assert second is not None and second.tolist() == [2.0]
    assert first.tolist() == [15.0]  # the first update is not an alias of the running sum


def test_bsp_single_worker_applies_every_push() -> None:
    bsp = BSP(1, 2)
    for clock in range(3):
        update = bsp.on_push(0, clock, grad(clock, 1.0))
        assert update is not None and update.tolist() == [clock, 1.0]


@pytest.mark.parametrize(
    ("clock", "version", "ready"),
    [(0, 0, True), (1, 0, False), (1, 1, True), (1, 2, True), (5, 4, False), (5, 5, True)],
)
def test_bsp_pull_ready_when_version_reaches_the_clock(
    clock: int, version: int, ready: bool
) -> None:
    assert BSP(2, 1).pull_ready(0, clock, version) is ready


def test_vector_clock_refuses_a_skipped_clock() -> None:
    asp = ASP(2)
    with pytest.raises(ProtocolError, match="^worker 1 pushed clock 1 but its next clock is 0$"):
        asp.on_push(1, 1, grad(1.0))
    assert asp.clocks() == [0, 0]


def test_bsp_refuses_a_push_from_a_future_round() -> None:
    bsp = BSP(2, 1)
    assert bsp.on_push(0, 0, grad(1.0)) is None
    with pytest.raises(ProtocolError, match="^worker 1 pushed clock 1 during BSP round 0$"):
        bsp.on_push(1, 1, grad(100.0))
    assert bsp.clocks() == [1, 0]
    mean = bsp.on_push(1, 0, grad(3.0))
    assert mean is not None and mean.tolist() == [2.0]


def test_vector_clock_refuses_a_repeated_clock() -> None:
    asp = ASP(2)
    asp.on_push(0, 0, grad(1.0))
    with pytest.raises(ProtocolError, match="^worker 0 pushed clock 0 but its next clock is 1$"):
        asp.on_push(0, 0, grad(1.0))
    assert asp.clocks() == [1, 0]


@pytest.mark.parametrize("rank", [-1, 2, 100])
def test_vector_clock_refuses_an_out_of_range_rank(rank: int) -> None:
    bsp = BSP(2, 1)
    with pytest.raises(ProtocolError, match=rf"^worker rank {rank} is outside 0\.\.1$"):
        bsp.on_push(rank, 0, grad(1.0))


def test_a_refused_push_does_not_count_towards_the_mean() -> None:
    bsp = BSP(2, 1)
    bsp.on_push(0, 0, grad(2.0))
    with pytest.raises(ProtocolError):
        bsp.on_push(0, 0, grad(100.0))  # repeated
    with pytest.raises(ProtocolError):
        bsp.on_push(1, 3, grad(100.0))  # skipped
    update = bsp.on_push(1, 0, grad(4.0))
    assert update is not None and update.tolist() == [3.0]


def test_clocks_is_a_copy() -> None:
    asp = ASP(2)
    clocks = asp.clocks()
    clocks[0] = 99
    assert asp.clocks() == [0, 0]


def test_asp_applies_every_push_at_once() -> None:
    asp = ASP(2)
    pushes = [(0, 0), (0, 1), (1, 0), (0, 2), (1, 1)]
    for worker, clock in pushes:
        g = grad(worker, clock)
        update = asp.on_push(worker, clock, g)
        assert update is not None
        np.testing.assert_array_equal(update, g)
    assert asp.clocks() == [3, 2]


@pytest.mark.parametrize(("clock", "version"), [(0, 0), (10, 0), (3, 7)])
def test_asp_pull_is_always_ready(clock: int, version: int) -> None:
    assert ASP(3).pull_ready(1, clock, version) is True


@pytest.mark.parametrize("controller", [BSP, ASP])
def test_no_workers_is_refused(controller: type) -> None:
    args = (0, 1) if controller is BSP else (0,)
    with pytest.raises(ConfigError, match="at least one worker"):
        controller(*args)


def test_make_controller() -> None:
    bsp = make_controller("bsp", workers=3, keys=4)
    assert isinstance(bsp, BSP) and bsp.name == "bsp" and bsp.clocks() == [0, 0, 0]
    asp = make_controller("asp", workers=2, keys=4)
    assert isinstance(asp, ASP) and asp.name == "asp" and asp.clocks() == [0, 0]


@pytest.mark.parametrize("name", ["sssp", "BSP", ""])
def test_make_controller_refuses_an_unknown_model(name: str) -> None:
    with pytest.raises(ConfigError) as caught:
        make_controller(name, workers=2, keys=4)
    assert str(caught.value) == (f"unknown consistency model {name!r} (known: bsp, asp, ssp, "
                                 "bounded-delay, dssp, elastic)")


def test_one_by_one_models_apply_a_workers_share_of_each_push_by_default() -> None:
    from engine.config import SyncConfig

    for model in ("asp", "ssp", "dssp", "bounded-delay", "elastic"):
        controller = make_controller(model, workers=4, keys=2)
        update = controller.on_push(0, 0, grad(4.0, 8.0))
        assert update is not None and update.tolist() == [1.0, 2.0], model
    summed = make_controller(SyncConfig(model="asp", push_scale="sum"), workers=4, keys=2)
    update = summed.on_push(0, 0, grad(4.0, 8.0))
    assert update is not None and update.tolist() == [4.0, 8.0]
