"""ElasticBSP driven push by push: monitoring, predicted barriers, finished workers, history."""

from __future__ import annotations

import numpy as np
import pytest

from engine.config import HistorySeed, SyncConfig
from engine.consistency.base import PushTiming
from engine.consistency.elastic import ElasticBSP
from engine.consistency.timings import predict_end_times
from engine.consistency.zipline import search
from engine.errors import ProtocolError

G = np.zeros(1, dtype=np.float32)


def elastic(workers: int, **sync: object) -> ElasticBSP:
    return ElasticBSP(workers, SyncConfig.model_validate({"model": "elastic", **sync}))


def push(ctl: ElasticBSP, worker: int, clock: int, at: float, *, waited: float = 0.0,
         final: bool = False) -> None:
    ctl.on_push(worker, clock, G, PushTiming(pushed_at=at, waited_s=waited, final=final))


def monitor(ctl: ElasticBSP, intervals: list[float]) -> None:
    """Clocks 0 and 1 of every worker, worker i taking intervals[i] seconds per iteration."""
    for worker, interval in enumerate(intervals):
        push(ctl, worker, 0, interval)
    for worker, interval in enumerate(intervals):
        push(ctl, worker, 1, 2 * interval)


def test_monitoring_barrier_holds_everyone_after_two_pushes() -> None:
    ctl = elastic(2, lookahead=5, predictor="last")
    assert ctl.pull_ready(0, 1, 0) and not ctl.pull_ready(0, 2, 0)
    push(ctl, 0, 0, 1.0)
    push(ctl, 0, 1, 2.0)
    assert not ctl.pull_ready(0, 2, 0)  # worker 1 has not reached the barrier
    reports = ctl.take_syncs()
    assert [r.predictor for r in reports] == ["monitoring"]
    assert reports[0].barrier_clocks == [1, 1] and reports[0].actual_wait is None


def test_barrier_is_where_zipline_puts_it() -> None:
    ctl = elastic(3, lookahead=6, predictor="last")
    monitor(ctl, [1.0, 1.0, 3.0])
    reports = ctl.take_syncs()
    done, decision = reports[1], reports[2]
    assert done.sync_index == 0 and done.actual_wait == pytest.approx(4.0)  # arrivals 2, 2, 6
    assert done.released_at == 6.0
    expected = predict_end_times(np.full(3, 6.0), np.array([1.0, 1.0, 3.0]), 6)
    r, d = search(expected)
    assert decision.sync_index == 1 and decision.decided_at == 6.0
    assert decision.predicted == expected.tolist()
    assert decision.chosen == r.tolist() == [2, 2, 0]  # the fast ones run 3 while it runs 1
    assert decision.predicted_wait == d == 0.0
    assert ctl.barrier_clocks() == [4, 4, 2]
    assert ctl.pull_ready(0, 4, 0) and not ctl.pull_ready(0, 5, 0)


def test_busy_interval_excludes_the_barrier_wait() -> None:
    ctl = elastic(2, lookahead=4, predictor="last")
    monitor(ctl, [1.0, 2.0])  # worker 0 arrives at 2, the release is at 4
    push(ctl, 0, 2, 5.0, waited=2.0)  # 3 s after its last push, of which 2 s waiting
    assert ctl.timings.intervals(0)[-1] == pytest.approx(1.0)


def test_completion_updates_the_same_sync_and_the_next_decision_follows() -> None:
    ctl = elastic(2, lookahead=3, predictor="last")
    monitor(ctl, [1.0, 1.0])
    ctl.take_syncs()
    assert ctl.barrier_clocks() == [2, 2]
    push(ctl, 0, 2, 3.0)
    push(ctl, 1, 2, 3.5)
    done, decision = ctl.take_syncs()
    assert (done.sync_index, done.arrivals, done.actual_wait) == (1, [3.0, 3.5], 0.5)
    assert decision.sync_index == 2 and decision.base_clocks == [2, 2]


def test_a_finished_worker_counts_as_arrived_and_leaves_later_barriers() -> None:
    ctl = elastic(2, lookahead=4, predictor="last")
    monitor(ctl, [1.0, 3.0])  # barrier: worker 0 at clock 4, worker 1 at clock 2
    ctl.take_syncs()
    push(ctl, 1, 2, 9.0, final=True)  # worker 1 had no more data
    for clock in (2, 3, 4):
        push(ctl, 0, clock, 6.0 + clock)
    done, decision = ctl.take_syncs()
    assert done.actual_wait == pytest.approx(1.0)
    assert decision.chosen[1] == -1 and decision.predicted[1] == []
    assert decision.barrier_clocks[0] > 4


def test_a_push_past_the_barrier_is_refused() -> None:
    ctl = elastic(2)
    push(ctl, 0, 0, 1.0)
    push(ctl, 0, 1, 2.0)
    with pytest.raises(ProtocolError, match="past its barrier at clock 1"):
        push(ctl, 0, 2, 3.0)


def test_history_decides_the_first_barrier_before_training() -> None:
    history = HistorySeed(run="r", intervals=((1.0, 1.0), (2.0, 2.0)))
    ctl = elastic(4, lookahead=5, predictor="ewma", history=history)
    (first,) = ctl.take_syncs()
    assert first.sync_index == 0 and first.base_clocks == [-1] * 4 and first.decided_at == 0.0
    assert first.chosen == [1, 0, 1, 0]  # ends 2 s (two 1 s iterations) = 2 s (one 2 s one)
    assert ctl.barrier_clocks() == [1, 0, 1, 0]
