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
same decisions; only shard 0 reports them. A worker's last push carries a flag: a finished worker
counts as arrived and takes no part in later barriers, so the others never wait for it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from engine.consistency.base import ImmediateController, PushTiming, fixed_membership
from engine.consistency.timings import TimingHistory, predict_end_times
from engine.consistency.zipline import search

if TYPE_CHECKING:
    from engine.config import SyncConfig
from engine.errors import ProtocolError
from engine.wire.records import SyncRecord

MONITOR_CLOCK = 1  # the first barrier without history: two pushes per worker


class ElasticBSP(ImmediateController):
    """Barriers are per worker, not per clock range: a worker arrives at its barrier clock when
    it has finished that clock on every range of the shard (``on_clock``)."""

    name = "elastic"

    def __init__(self, workers: int, sync: SyncConfig) -> None:
        self.workers = workers
        self.lookahead, self.predictor = sync.lookahead, sync.predictor
        self.timings = TimingHistory(workers)
        self._finished = [False] * workers
        self._arrivals: list[float | None] = [None] * workers
        self._participants = list(range(workers))
        self._reports: list[SyncRecord] = []
        if sync.history is None:
            self._barrier = [MONITOR_CLOCK] * workers
            self._current = self._record(0, 0.0, [-1] * workers, [[] for _ in range(workers)],
                                         0.0, "monitoring")
        else:
            seeds = sync.history.intervals
            for worker in range(workers):
                self.timings.seed(worker, seeds[worker % len(seeds)])
            self._barrier = [-1] * workers
            self._current = self._decide(0, start=0.0)

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

    def join(self, worker: int) -> list[int] | None:
        raise fixed_membership(self.name)

    def leave(self, worker: int, next_clocks: list[int]) -> None:
        raise fixed_membership(self.name)

    def resume(self, clocks: list[int], finished: list[bool]) -> None:
        """Monitor again from where each worker is: its barrier two pushes ahead, as at the
        start, since the timing history is gone. Decisions are numbered past any taken before
        (there were at most min(clocks) + 1), so none overwrites a recorded one."""
        self.timings = TimingHistory(self.workers)
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
        self._current = self._decide(self._current.sync_index + 1, start=released)

    def _decide(self, index: int, *, start: float) -> SyncRecord:
        active = self._participants
        interval = np.array([self.timings.estimate(w, self.predictor) or 0.0 for w in active])
        times = predict_end_times(np.full(len(active), start), interval, self.lookahead)
        chosen, spread = search(times)
        base = list(self._barrier)
        predicted: list[list[float]] = [[] for _ in base]
        for row, worker in enumerate(active):
            predicted[worker] = times[row].tolist()
            self._barrier[worker] = base[worker] + 1 + int(chosen[row])
        return self._record(index, start, base, predicted, float(spread), self.predictor)

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
