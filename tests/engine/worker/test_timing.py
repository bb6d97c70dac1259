"""A compute phase's pace, the same on both clocks: max(its own time, the regime's compute_ms)
times the worker's slowdown; the simulator's clock spends the gradient's CPU first."""

from __future__ import annotations

import pytest

from engine.config import HeterogeneityConfig, Straggler
from engine.worker.heterogeneity import Slowdown
from engine.worker.timing import WALL, Pace


class Ticking:
    """A clock that moves only when slept on (or spent), as the simulator's."""

    def __init__(self) -> None:
        self.at, self.slept = 100.0, []

    def now(self) -> float:
        return self.at

    def perf(self) -> float:
        return self.at

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.at += max(seconds, 0.0)


def slowdown(factor: float = 1.0) -> Slowdown:
    stragglers = (Straggler(rank=0, factor=factor),) if factor != 1.0 else ()
    return Slowdown(HeterogeneityConfig(stragglers=stragglers), rank=0, seed=0)


@pytest.mark.parametrize(("took", "floor", "factor", "phase"), [
    (0.010, None, 1.0, 0.010), (0.010, None, 3.0, 0.030), (0.010, 0.100, 1.0, 0.100),
    (0.010, 0.100, 3.0, 0.300), (0.150, 0.100, 1.0, 0.150), (0.150, 0.100, 2.0, 0.300)])
def test_a_phase_lasts_the_longer_of_its_time_and_the_floor_times_the_slowdown(
        took: float, floor: float | None, factor: float, phase: float) -> None:
    clock = Ticking()
    started = clock.perf()
    clock.at += took  # the gradient's own time
    Pace(clock, slowdown(factor), floor_s=floor).computed(started)
    assert clock.perf() - started == pytest.approx(phase)


def test_the_simulators_pace_spends_the_gradients_cpu_before_padding() -> None:
    clock = Ticking()
    pace = Pace(clock, slowdown(2.0), floor_s=0.050, spend=lambda: clock.sleep(0.040))
    started = clock.perf()
    pace.computed(started)
    assert clock.slept == [pytest.approx(0.040), pytest.approx(0.060)]  # to 0.05 x 2
    assert pace.active


def test_time_left_out_is_neither_padded_nor_stretched() -> None:
    clock = Ticking()
    started = clock.perf()
    clock.at += 0.030  # 0.020 of it waited for values: 0.010 of computing, stretched 3x
    Pace(clock, slowdown(3.0)).computed(started, left_out=0.020)
    assert clock.slept == [pytest.approx(0.020)]


def test_a_real_batch_is_padded_with_a_sleep() -> None:
    started = WALL.perf()
    Pace(WALL, slowdown(), floor_s=0.03).computed(started)
    assert WALL.perf() - started >= 0.03
    assert not Pace(WALL, slowdown()).active
