"""Iteration timings as the servers see them, and predictions of when iterations will end.

A push carries the worker's send time and how long that iteration's pull was held back. The
*busy interval* of iteration c is the time between the pushes of c - 1 and c minus that wait:
what the worker needs for one iteration when nobody holds it back. Predictions extrapolate it.

The same functions serve the live controllers (``engine.consistency.ssp``,
``engine.consistency.elastic``) and the offline replay of recorded runs
(``engine.analysis.replay``), so a replay reproduces the live decisions.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Sequence

import numpy as np

PREDICTORS = ("last", "ewma")
KEEP_INTERVALS = 32
EWMA_WEIGHT = 0.3  # weight of the newest interval
OUTLIER_FACTOR = 3.0  # an interval above this many medians is clipped before averaging


def busy_interval(previous_push: float, push: float, waited_s: float) -> float:
    return max(push - previous_push - waited_s, 0.0)


def estimate_interval(intervals: Sequence[float], predictor: str) -> float:
    """One iteration's expected duration from recent busy intervals (oldest first).

    ``last`` is the ElasticBSP paper's linear extrapolation from the last interval. ``ewma``
    is an exponentially weighted mean after clipping spikes to a few medians, so one slow
    iteration (a page-fault storm, a GC pause) does not move a barrier far.
    """
    if not intervals:
        raise ValueError("no interval recorded yet")
    if predictor == "last":
        return float(intervals[-1])
    if predictor != "ewma":
        raise ValueError(f"unknown predictor {predictor!r} (known: {', '.join(PREDICTORS)})")
    # Plain Python on at most 32 floats: np.median's overhead (about 40 us a call) made a
    # barrier decision over 1,000 workers take 47 ms on the shard's event loop.
    recent = [float(value) for value in intervals[-KEEP_INTERVALS:]]
    cap = OUTLIER_FACTOR * statistics.median(recent)
    estimate = min(recent[0], cap)
    for value in recent[1:]:
        estimate += EWMA_WEIGHT * (min(value, cap) - estimate)
    return estimate


def predict_end_times(start: np.ndarray, interval: np.ndarray, lookahead: int) -> np.ndarray:
    """(n, lookahead) end times: worker i's j-th next iteration ends at start_i + (j+1)·Δ_i."""
    steps = np.arange(1, lookahead + 1, dtype=np.float64)
    return np.asarray(start, dtype=np.float64)[:, None] + np.outer(interval, steps)


class TimingHistory:
    """Per worker: the last push time and the recent busy intervals. O(workers·KEEP) memory."""

    def __init__(self, workers: int) -> None:
        self._last_push: list[float | None] = [None] * workers
        self._intervals: list[deque[float]] = [deque(maxlen=KEEP_INTERVALS)
                                               for _ in range(workers)]

    def observe(self, worker: int, pushed_at: float, waited_s: float) -> None:
        previous = self._last_push[worker]
        if previous is not None:
            self._intervals[worker].append(busy_interval(previous, pushed_at, waited_s))
        self._last_push[worker] = pushed_at

    def grow(self) -> None:
        """Room for one more worker (one that joined the running job)."""
        self._last_push.append(None)
        self._intervals.append(deque(maxlen=KEEP_INTERVALS))

    def seed(self, worker: int, intervals: Sequence[float]) -> None:
        self._intervals[worker].extend(intervals)

    def intervals(self, worker: int) -> list[float]:
        return list(self._intervals[worker])

    def last_push(self, worker: int) -> float | None:
        return self._last_push[worker]

    def estimate(self, worker: int, predictor: str) -> float | None:
        recent = self._intervals[worker]
        return estimate_interval(list(recent), predictor) if recent else None
