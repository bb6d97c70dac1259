"""ElasticBSP (Zhao et al., ICDM'19): barriers placed where the predicted waiting is smallest.

Between barriers the workers run asynchronously (every push is applied on arrival). Each worker
has a barrier clock: its pull for the clock after it waits until every worker has pushed its own
barrier clock. When the last one arrives, the controller predicts each worker's next R iteration
end times from its recorded busy intervals (``engine.consistency.timings``) and lets ZipLine
(``engine.consistency.zipline``) choose one future iteration per worker so that the arrivals
spread least.

Monitoring phase: without a history the first barrier is after clock 1, so every worker has pushed
twice (one interval) before the first prediction. With ``sync.history`` (a previous run's
intervals) the first barrier is predicted before training starts, counting from time 0.

Every input to a decision is worker-stamped (push times and waits), so every shard reaches the
same decisions; only shard 0 reports them. A shard server offloads the decisions of large jobs
(``offload``): the prediction and the search run on a thread while every worker waits at its
barrier, so no push comes in meanwhile, and the barriers move when the result is back. A
decision records each worker's predicted times up to its chosen iteration, the last
``RECORDED_AHEAD`` of them at most: n x R times (R may be 10,000) would make a record of
megabytes, whose encoding alone would hold the loop up.

A worker's last push carries a flag: a finished worker counts as arrived and takes no part in
later barriers, so the others never wait for it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from engine.consistency.base import Deferred, ImmediateController, PushTiming, fixed_membership
from engine.consistency.timings import TimingHistory, estimate_interval, predict_end_times
from engine.consistency.zipline import search

if TYPE_CHECKING:
    from engine.config import SyncConfig
from engine.errors import ProtocolError
from engine.wire.records import SyncRecord

MONITOR_CLOCK = 1  # the first barrier without history: two pushes per worker
RECORDED_AHEAD = 16  # predicted times kept per worker in a decision's record, the chosen last


@dataclass(frozen=True)
class Decision:
    """ZipLine's answer for the active workers, in their order: the chosen future iteration of
    each, the predicted spread of their end times, and the predicted times kept for the record
    (up to the chosen iteration's, the last ``RECORDED_AHEAD``)."""

    chosen: list[int]
    spread: float
    predicted: list[list[float]]


def candidates(lookahead: int, max_ahead: int) -> int:
    """The future iterations ZipLine chooses among per worker: R, but none further than the
    bound on a barrier's distance (``sync.max_ahead``), so that a longer R cannot buy a small
    predicted wait by placing the barrier far out (fewer barriers, more staleness)."""
    return min(lookahead, max_ahead)


def decide(start: float, histories: list[list[float]], predictor: str,
           lookahead: int) -> Decision:
    """Estimate each worker's iteration time from its recent busy intervals (none: 0), predict
    its next ``lookahead`` end times from ``start`` (the caller bounds it with ``candidates``)
    and let ZipLine choose. Pure: it may run on another thread."""
    intervals = np.array([estimate_interval(h, predictor) if h else 0.0 for h in histories])
    times = predict_end_times(np.full(len(intervals), start), intervals, lookahead)
    chosen, spread = search(times)
    picks = [int(c) for c in chosen]
    return Decision(picks, float(spread),
                    [times[row, max(0, c + 1 - RECORDED_AHEAD):c + 1].tolist()
                     for row, c in enumerate(picks)])


class ElasticBSP(ImmediateController):
    """Barriers are per worker, not per clock range: a worker arrives at its barrier clock when
    it has finished that clock on every range of the shard (``on_clock``)."""

    name = "elastic"

    def __init__(self, workers: int, sync: SyncConfig) -> None:
        self.workers = workers
        self.lookahead, self.predictor = sync.lookahead, sync.predictor
        self.searched = candidates(sync.lookahead, sync.max_ahead)
        self.timings = TimingHistory(workers)
        self._finished = [False] * workers
        self._arrivals: list[float | None] = [None] * workers
        self._participants = list(range(workers))
        self._reports: list[SyncRecord] = []
        self._offload_from: int | None = None
        self._deferred: Deferred[Decision] | None = None
        self._awaited: int | None = None  # the index of the decision running off the loop
        if sync.history is None:
            self._barrier = [MONITOR_CLOCK] * workers
            self._current = self._record(0, 0.0, [-1] * workers, [[] for _ in range(workers)],
                                         0.0, "monitoring")
        else:
            seeds = sync.history.intervals
            for worker in range(workers):
                self.timings.seed(worker, seeds[worker % len(seeds)])
            self._barrier = [-1] * workers
            self._decide(0, start=0.0)

    def pull_ready(self, worker: int, clock: int, ranges: range) -> bool:
        return clock <= self._barrier[worker]

    def check_push(self, worker: int, clock: int, ranges: range) -> None:
        if clock > self._barrier[worker]:
            raise ProtocolError(f"worker {worker} pushed clock {clock} past its barrier at clock "
                                f"{self._barrier[worker]}")

    def on_clock(self, worker: int, clock: int, timing: PushTiming) -> None:
        self.timings.observe(worker, timing.pushed_at, timing.waited_s)
        if timing.final:
            self._finished[worker] = True
        if clock == self._barrier[worker] or timing.final:
            self._arrivals[worker] = timing.pushed_at
        if all(self._arrivals[w] is not None for w in self._participants):
            self._complete()

    def take_syncs(self) -> list[SyncRecord]:
        reports, self._reports = self._reports, []
        return reports

    def offload(self, min_size: int) -> None:
        self._offload_from = min_size

    def take_deferred(self) -> Deferred[Any] | None:
        deferred, self._deferred = self._deferred, None
        return deferred

    def join(self, worker: int) -> list[int] | None:
        raise fixed_membership(self.name)

    def leave(self, worker: int, next_clocks: list[int]) -> None:
        raise fixed_membership(self.name)

    def resume(self, clocks: list[int], finished: list[bool]) -> None:
        """Monitor again from where each worker is: its barrier two pushes ahead, as at the
        start, since the timing history is gone. Decisions are numbered past any taken before
        (there were at most min(clocks) + 1), so none overwrites a recorded one."""
        self.timings = TimingHistory(self.workers)
        self._deferred = self._awaited = None  # a decision still running is dropped on return
        self._finished = list(finished)  # those take no part in barriers, as before
        self._arrivals = [None] * self.workers
        self._participants = [w for w in range(self.workers) if not finished[w]]
        self._barrier = [clock + MONITOR_CLOCK for clock in clocks]
        self._current = self._record(max(clocks, default=0) + 2, 0.0, [c - 1 for c in clocks],
                                     [[] for _ in clocks], 0.0, "monitoring")

    def barrier_clocks(self) -> list[int]:
        return list(self._barrier)

    def _complete(self) -> None:
        arrivals = [float(self._arrivals[w] or 0.0) for w in range(len(self._barrier))]
        mine = [arrivals[w] for w in self._participants]
        released = max(mine)
        self._reports.append(self._current.model_copy(update={
            "arrivals": arrivals, "actual_wait": released - min(mine), "released_at": released}))
        self._participants = [w for w, done in enumerate(self._finished) if not done]
        if not self._participants:
            return
        for worker in self._participants:
            self._arrivals[worker] = None
        self._decide(self._current.sync_index + 1, start=released)

    def _decide(self, index: int, *, start: float) -> None:
        """Take decision ``index`` now, or hand it to the caller to run off the loop (every
        worker then waits at its barrier until ``_conclude``)."""
        active = list(self._participants)
        histories = [self.timings.intervals(w) for w in active]
        work = functools.partial(decide, start, histories, self.predictor, self.searched)
        finish = functools.partial(self._conclude, index, start, active)
        self._awaited = index
        if self._offload_from is not None and len(active) * self.searched >= self._offload_from:
            self._deferred = Deferred(work, finish)
        else:
            finish(work())

    def _conclude(self, index: int, start: float, active: list[int], decision: Decision) -> None:
        if index != self._awaited:  # overtaken by a resume from a checkpoint
            return
        self._awaited = None
        base = list(self._barrier)
        predicted: list[list[float]] = [[] for _ in base]
        for row, worker in enumerate(active):
            predicted[worker] = decision.predicted[row]
            self._barrier[worker] = base[worker] + 1 + decision.chosen[row]
        self._current = self._record(index, start, base, predicted, decision.spread,
                                     self.predictor)

    def _record(self, index: int, decided_at: float, base: list[int],
                predicted: list[list[float]], spread: float, predictor: str) -> SyncRecord:
        """The decision just taken (``self._barrier`` already holds it), also queued for the
        report; r_i is -1 for a worker that has finished and so takes no part."""
        barrier = list(self._barrier)
        record = SyncRecord(sync_index=index, decided_at=decided_at, predictor=predictor,
                            lookahead=self.lookahead, base_clocks=base, predicted=predicted,
                            chosen=[b - c - 1 for b, c in zip(barrier, base, strict=True)],
                            barrier_clocks=barrier, predicted_wait=spread)
        self._reports.append(record)
        return record


def build_elastic(sync: SyncConfig, workers: int, ranges: int) -> ElasticBSP:
    return ElasticBSP(workers, sync)
