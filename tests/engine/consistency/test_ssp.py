"""SSP's sliding window and DSSP's run-time bound, driven push by push."""

from __future__ import annotations

import numpy as np
import pytest

from engine.consistency.base import PushTiming, make_controller
from engine.consistency.ssp import DSSP, SSP, SlidingWindow
from engine.errors import ProtocolError

G = np.zeros(1, dtype=np.float32)


def test_window_shifts_when_the_last_worker_of_the_low_clock_arrives() -> None:
    window = SlidingWindow(workers=3, width=2)
    window.add(0)
    window.add(0)
    assert window.low == 0 and window.admits(1) and not window.admits(2)
    window.add(1)  # a fast worker one clock ahead
    window.add(0)
    assert window.low == 1 and window.admits(2)


def test_window_memory_does_not_grow_with_workers() -> None:
    window = SlidingWindow(workers=10_000, width=4)
    assert window.width == 4 and len(window._counts) == 4


def test_window_refuses_a_clock_past_its_bound() -> None:
    window = SlidingWindow(workers=2, width=3)
    with pytest.raises(ProtocolError, match=r"clock 3 is outside the open window \[0, 3\)"):
        window.add(3)


def test_ssp_lets_the_fastest_lead_by_at_most_s_clocks() -> None:
    ssp = SSP(workers=2, staleness=2)
    for clock in range(3):
        assert ssp.pull_ready(0, clock, version=0)
        assert ssp.on_push(0, clock, G) is G  # applied at once
    assert not ssp.pull_ready(0, 3, version=0)  # 3 ahead of worker 1, which is at 0
    ssp.on_push(1, 0, G)
    assert ssp.pull_ready(0, 3, version=0) and not ssp.pull_ready(0, 4, version=0)
    assert ssp.clocks() == [3, 1]


def test_ssp_zero_is_lockstep() -> None:
    ssp = SSP(workers=2, staleness=0)
    ssp.on_push(0, 0, G)
    assert not ssp.pull_ready(0, 1, version=1)
    ssp.on_push(1, 0, G)
    assert ssp.pull_ready(0, 1, version=2)


def test_ssp_refuses_a_push_past_the_bound_and_keeps_its_state() -> None:
    ssp = SSP(workers=2, staleness=0)
    ssp.on_push(0, 0, G)
    with pytest.raises(ProtocolError, match="staleness bound"):
        ssp.on_push(0, 1, G)
    assert ssp.clocks() == [1, 0]


def at(seconds: float, waited: float = 0.0) -> PushTiming:
    return PushTiming(pushed_at=seconds, waited_s=waited)


def test_dssp_extends_the_bound_only_while_the_leader_would_finish_first() -> None:
    dssp = DSSP(workers=2, staleness=1, extra=2)
    # worker 1 is slow: one push at t=0 then one at t=10 (interval 10 s)
    dssp.on_push(1, 0, G, at(0.0))
    dssp.on_push(1, 1, G, at(10.0))
    # worker 0 runs 1 s iterations: pushes clocks 0..2 at t=1, 2, 3
    for clock in range(3):
        dssp.on_push(0, clock, G, at(1.0 + clock))
    # clock 3 leads worker 1 (at 2) by 1: within S
    assert dssp.pull_ready(0, 3, 0)
    dssp.on_push(0, 3, G, at(4.0))
    # clock 4 leads by 2 > S: next end 5.0 <= worker 1's predicted 20.0, so it may go on
    assert dssp.pull_ready(0, 4, 0)
    dssp.on_push(0, 4, G, at(5.0))
    assert dssp.pull_ready(0, 5, 0)  # lead 3 = S + R still allowed
    dssp.on_push(0, 5, G, at(6.0))
    assert not dssp.pull_ready(0, 6, 0)  # lead 4 > S + R


def test_dssp_waits_when_the_slowest_is_about_to_finish() -> None:
    dssp = DSSP(workers=2, staleness=0, extra=3)
    dssp.on_push(0, 0, G, at(0.0))
    dssp.on_push(0, 1, G, at(5.0))  # worker 0: 5 s iterations, next end at 10
    for clock, t in enumerate((7.5, 8.5, 9.5)):  # worker 1: 1 s iterations, next end 10.5
        dssp.on_push(1, clock, G, at(t))
    assert not dssp.pull_ready(1, 3, 0)  # it would finish after worker 0: waiting costs less
    dssp.on_push(0, 2, G, at(10.0))
    assert dssp.pull_ready(1, 3, 0)  # no lead any more


def test_dssp_waits_without_timings_to_predict_from() -> None:
    dssp = DSSP(workers=2, staleness=0, extra=3)
    dssp.on_push(0, 0, G, at(1.0))
    assert not dssp.pull_ready(0, 1, 0)


def test_make_controller_builds_each_model_from_its_config() -> None:
    from engine.config import SyncConfig

    ssp = make_controller(SyncConfig(model="ssp", staleness=5), workers=3, keys=1)
    assert isinstance(ssp, SSP) and ssp.window.width == 6
    dssp = make_controller(SyncConfig(model="dssp", staleness=2, range=3), workers=3, keys=1)
    assert isinstance(dssp, DSSP) and dssp.window.width == 6
    assert make_controller("bounded-delay", workers=2, keys=1).name == "asp"
