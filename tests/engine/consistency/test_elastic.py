"""ElasticBSP driven push by push through a shard: monitoring, predicted barriers, finished
workers, history, and barriers that count a clock only once every clock range has it."""

from __future__ import annotations

import numpy as np
import pytest

from engine.config import HistorySeed, SyncConfig
from engine.consistency.base import PushTiming
from engine.consistency.elastic import RECORDED_AHEAD, ElasticBSP, decide
from engine.consistency.registry import make_controller
from engine.consistency.timings import predict_end_times
from engine.consistency.zipline import search
from engine.errors import ProtocolError
from engine.keys import KeyRange
from engine.server.optimizers import SGD
from engine.server.shard import ShardState


class Elastic:
    """An ElasticBSP controller inside a shard of ``ranges`` one-key clock ranges."""

    def __init__(self, workers: int, *, ranges: int = 1, **sync: object) -> None:
        self.ctl = ElasticBSP(workers, SyncConfig.model_validate({"model": "elastic", **sync}))
        keys = KeyRange(0, ranges)
        self.state = ShardState(keys, self.ctl, SGD(ranges, lr=1.0), workers=workers,
                                ranges=[KeyRange(k, k + 1) for k in range(ranges)])
        assert self.state.init(keys, np.zeros(ranges, dtype=np.float32))

    def push(self, worker: int, clock: int, at: float, *, waited: float = 0.0,
             final: bool = False, span: KeyRange | None = None) -> None:
        keys = span or self.state.keys
        self.state.push(worker, clock, keys, np.zeros(len(keys), dtype=np.float32),
                        PushTiming(pushed_at=at, waited_s=waited, final=final))

    def ready(self, worker: int, clock: int) -> bool:
        return self.state.pull_ready(worker, clock)

    def monitor(self, intervals: list[float]) -> None:
        """Clocks 0 and 1 of every worker, worker i taking intervals[i] seconds per iteration."""
        for worker, interval in enumerate(intervals):
            self.push(worker, 0, interval)
        for worker, interval in enumerate(intervals):
            self.push(worker, 1, 2 * interval)


def test_monitoring_barrier_holds_everyone_after_two_pushes() -> None:
    run = Elastic(2, lookahead=5, predictor="last")
    assert run.ctl.accumulates is False
    assert run.ready(0, 1) and not run.ready(0, 2)
    run.push(0, 0, 1.0)
    run.push(0, 1, 2.0)
    assert not run.ready(0, 2)  # worker 1 has not reached the barrier
    reports = run.ctl.take_syncs()
    assert [r.predictor for r in reports] == ["monitoring"]
    assert reports[0].barrier_clocks == [1, 1] and reports[0].actual_wait is None
    assert run.ctl.take_syncs() == []


def test_barrier_is_where_zipline_puts_it() -> None:
    run = Elastic(3, lookahead=6, predictor="last")
    run.monitor([1.0, 1.0, 3.0])
    reports = run.ctl.take_syncs()
    assert len(reports) == 3
    done, decision = reports[1], reports[2]
    assert done.sync_index == 0 and done.actual_wait == pytest.approx(4.0)  # arrivals 2, 2, 6
    assert done.arrivals == [2.0, 2.0, 6.0] and done.released_at == 6.0
    expected = predict_end_times(np.full(3, 6.0), np.array([1.0, 1.0, 3.0]), 6)
    r, d = search(expected)
    assert decision.sync_index == 1 and decision.decided_at == 6.0
    assert decision.chosen == r.tolist() == [2, 2, 0]  # the fast ones run 3 while it runs 1
    # each worker's predicted times up to its chosen iteration
    assert decision.predicted == [expected[w, :c + 1].tolist() for w, c in enumerate(r)]
    assert decision.predicted_wait == d == 0.0
    assert run.ctl.barrier_clocks() == [4, 4, 2]
    assert run.ready(0, 4) and not run.ready(0, 5)
    assert run.ready(2, 2) and not run.ready(2, 3)


def test_busy_interval_excludes_the_barrier_wait() -> None:
    run = Elastic(2, lookahead=4, predictor="last")
    run.monitor([1.0, 2.0])  # worker 0 arrives at 2, the release is at 4
    run.push(0, 2, 5.0, waited=2.0)  # 3 s after its last push, of which 2 s waiting
    assert run.ctl.timings.intervals(0)[-1] == pytest.approx(1.0)


def test_completion_updates_the_same_sync_and_the_next_decision_follows() -> None:
    run = Elastic(2, lookahead=3, predictor="last")
    run.monitor([1.0, 1.0])
    run.ctl.take_syncs()
    assert run.ctl.barrier_clocks() == [2, 2]
    run.push(0, 2, 3.0)
    run.push(1, 2, 3.5)
    done, decision = run.ctl.take_syncs()
    assert (done.sync_index, done.arrivals, done.actual_wait) == (1, [3.0, 3.5], 0.5)
    assert decision.sync_index == 2 and decision.base_clocks == [2, 2]


def test_a_finished_worker_counts_as_arrived_and_leaves_later_barriers() -> None:
    run = Elastic(2, lookahead=4, predictor="last")
    run.monitor([1.0, 3.0])  # barrier: worker 0 at clock 4, worker 1 at clock 2
    run.ctl.take_syncs()
    assert run.ctl.barrier_clocks() == [4, 2]
    run.push(1, 2, 9.0, final=True)  # worker 1 had no more data
    for clock in (2, 3, 4):
        run.push(0, clock, 6.0 + clock)
    done, decision = run.ctl.take_syncs()
    assert done.actual_wait == pytest.approx(1.0)
    assert decision.chosen[1] == -1 and decision.predicted[1] == []
    assert decision.barrier_clocks[0] > 4
    assert run.ready(0, 5)


def test_a_push_past_the_barrier_is_refused_and_changes_nothing() -> None:
    run = Elastic(2)
    run.push(0, 0, 1.0)
    run.push(0, 1, 2.0)
    with pytest.raises(ProtocolError, match="^worker 0 pushed clock 2 past its barrier at clock "
                                            "1$"):
        run.push(0, 2, 3.0)
    assert run.state.clocks.shard_clocks() == [2, 0]
    assert run.ctl.timings.last_push(0) == 2.0


def test_a_barrier_counts_a_clock_only_once_every_clock_range_has_it() -> None:
    run = Elastic(2, ranges=2, lookahead=3, predictor="last")
    first, second = KeyRange(0, 1), KeyRange(1, 2)
    run.ctl.take_syncs()
    for worker in (0, 1):
        run.push(worker, 0, 1.0 + worker)
        run.push(worker, 1, 2.0 + worker, span=first)
    # every worker pushed its barrier clock 1 on one range only: nobody has arrived
    assert run.ctl.take_syncs() == []
    assert run.ctl.timings.last_push(0) == 1.0
    run.push(0, 1, 2.0, span=second)
    assert run.ctl.take_syncs() == []
    run.push(1, 1, 4.0, span=second)
    done, decision = run.ctl.take_syncs()
    assert done.sync_index == 0 and done.arrivals == [2.0, 4.0] and done.released_at == 4.0
    assert decision.sync_index == 1 and decision.base_clocks == [1, 1]


def test_history_decides_the_first_barrier_before_training() -> None:
    history = HistorySeed(run="r", intervals=((1.0, 1.0), (2.0, 2.0)))
    run = Elastic(4, lookahead=5, predictor="ewma", history=history)
    (first,) = run.ctl.take_syncs()
    assert first.sync_index == 0 and first.base_clocks == [-1] * 4 and first.decided_at == 0.0
    assert first.chosen == [1, 0, 1, 0]  # ends 2 s (two 1 s iterations) = 2 s (one 2 s one)
    assert run.ctl.barrier_clocks() == [1, 0, 1, 0]
    assert run.ready(0, 1) and not run.ready(1, 1)


def test_make_controller_builds_elastic_from_its_config() -> None:
    ctl = make_controller(SyncConfig(model="elastic", lookahead=7, predictor="last"), workers=3,
                          ranges=2)
    assert isinstance(ctl, ElasticBSP)
    assert (ctl.workers, ctl.lookahead, ctl.predictor) == (3, 7, "last")
    assert ctl.barrier_clocks() == [1, 1, 1]


def test_an_offloaded_decision_holds_the_barriers_until_it_is_finished() -> None:
    inline, offloaded = (Elastic(3, lookahead=6, predictor="last") for _ in range(2))
    offloaded.ctl.offload(3 * 6)  # n x R = 18: this decision goes off the loop
    assert offloaded.ctl.take_deferred() is None
    for run in (inline, offloaded):
        run.monitor([1.0, 1.0, 3.0])
    deferred = offloaded.ctl.take_deferred()
    assert deferred is not None and offloaded.ctl.take_deferred() is None  # handed out once
    assert offloaded.ctl.barrier_clocks() == [1, 1, 1]  # everyone waits at the old barrier
    assert not offloaded.ready(0, 2) and inline.ready(0, 2)
    deferred.finish(deferred.run())
    assert offloaded.ctl.barrier_clocks() == inline.ctl.barrier_clocks() == [4, 4, 2]
    assert offloaded.ready(0, 4) and not offloaded.ready(0, 5)
    assert offloaded.ctl.take_syncs() == inline.ctl.take_syncs()


def test_a_decision_finished_after_a_resume_is_dropped() -> None:
    run = Elastic(2, lookahead=4, predictor="last")
    run.ctl.offload(1)
    run.monitor([1.0, 2.0])
    deferred = run.ctl.take_deferred()
    assert deferred is not None
    run.ctl.resume([2, 2], [False, False])  # restored from a checkpoint meanwhile
    deferred.finish(deferred.run())
    assert run.ctl.barrier_clocks() == [3, 3]  # monitoring again, untouched by the late answer


def test_a_decision_records_predicted_times_up_to_the_chosen_iteration() -> None:
    # worker 1 is 20x faster: it runs about 20 iterations while worker 0 runs 1
    decision = decide(0.0, [[1.0], [0.05]], "last", 40)
    assert decision.chosen[0] == 0 and decision.chosen[1] >= RECORDED_AHEAD
    times = predict_end_times(np.zeros(2), np.array([1.0, 0.05]), 40)
    for worker, chosen in enumerate(decision.chosen):
        kept = decision.predicted[worker]
        assert kept == times[worker, :chosen + 1].tolist()[-RECORDED_AHEAD:]
        assert kept[-1] == times[worker, chosen]
    assert len(decision.predicted[1]) == RECORDED_AHEAD


def test_a_barrier_is_never_placed_past_the_bound_on_its_distance() -> None:
    """Speeds 1 : 2.9: unbounded, ZipLine with R = 60 finds the near-coincidence 29 : 10 far
    out; with max_ahead 6 it must choose among each worker's next six iterations."""
    far = Elastic(2, lookahead=60, max_ahead=60, predictor="last")
    far.monitor([1.0, 2.9])
    near = Elastic(2, lookahead=60, max_ahead=6, predictor="last")
    near.monitor([1.0, 2.9])
    far_decision, near_decision = far.ctl.take_syncs()[-1], near.ctl.take_syncs()[-1]
    assert max(far_decision.chosen) + 1 > 6
    assert max(near_decision.chosen) + 1 <= 6
    expected = predict_end_times(np.full(2, near_decision.decided_at), np.array([1.0, 2.9]), 6)
    r, spread = search(expected)
    assert near_decision.chosen == r.tolist() and near_decision.predicted_wait == spread
    assert near_decision.lookahead == 60  # R as set; the bound cut the candidates


def test_the_default_predictor_is_the_papers() -> None:
    assert SyncConfig().predictor == "last" and SyncConfig().max_ahead == 32
