"""Busy intervals and the two predictors."""

from __future__ import annotations

import numpy as np
import pytest

from engine.consistency.timings import (
    TimingHistory,
    busy_interval,
    estimate_interval,
    predict_end_times,
)


def test_busy_interval_subtracts_the_wait_and_never_goes_negative() -> None:
    assert busy_interval(10.0, 13.0, 2.0) == 1.0
    assert busy_interval(10.0, 11.0, 5.0) == 0.0


def test_last_is_the_last_interval() -> None:
    assert estimate_interval([1.0, 2.0, 7.0], "last") == 7.0


def test_ewma_follows_a_trend_but_clips_one_spike() -> None:
    steady = [1.0] * 10
    assert estimate_interval(steady, "ewma") == pytest.approx(1.0)
    spiky = estimate_interval([*steady, 50.0], "ewma")
    assert spiky == pytest.approx(1.0 + 0.3 * (3.0 - 1.0))  # clipped to 3 medians
    assert estimate_interval([1.0, 2.0, 2.0, 2.0], "ewma") > 1.5


def test_unknown_predictor_and_empty_history_are_errors() -> None:
    with pytest.raises(ValueError, match="unknown predictor 'mean'"):
        estimate_interval([1.0], "mean")
    with pytest.raises(ValueError, match="no interval"):
        estimate_interval([], "last")


def test_predict_end_times_is_linear_per_worker() -> None:
    times = predict_end_times(np.array([10.0, 20.0]), np.array([1.0, 0.5]), 3)
    assert times.tolist() == [[11.0, 12.0, 13.0], [20.5, 21.0, 21.5]]


def test_history_keeps_recent_intervals_per_worker() -> None:
    history = TimingHistory(2)
    for t in (1.0, 3.0, 6.0):
        history.observe(1, t, 0.0)
    assert history.intervals(1) == [2.0, 3.0] and history.intervals(0) == []
    assert history.last_push(1) == 6.0 and history.estimate(0, "last") is None
