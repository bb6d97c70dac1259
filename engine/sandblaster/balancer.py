"""Which worker computes which data portion of a pass: Sandblaster's load balancer.

A pass cuts the training rows into equal portions. An idle worker takes the next portion nobody
has; when every portion is out, it takes a backup copy of the one that has run longest (at most
``copies`` copies of a portion at once), so that fast workers finish a slow worker's portion
(DistBelief's backup tasks). The first copy to finish is committed, and only it pushes its
gradient; the other copies are dropped (their workers are told to stop at once), so every row
is counted exactly once.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from engine.errors import RunFailed


def portions(samples: int, count: int) -> list[tuple[int, int]]:
    """``count`` contiguous row ranges covering ``[0, samples)``, sizes differing by at most 1."""
    if not 1 <= count <= samples:
        raise RunFailed(f"cannot cut {samples} training samples into {count} portions "
                        "(optimizer.portions, --portions): use at most one per sample")
    edges = [samples * i // count for i in range(count + 1)]
    return list(itertools.pairwise(edges))


@dataclass
class Copy:
    task: int
    portion: int
    worker: int
    started: float


@dataclass
class PassStats:
    tasks: int = 0  # copies handed out
    backups: int = 0  # of them, copies of a portion another worker had
    backups_won: int = 0  # portions a backup copy finished first
    dropped: int = 0  # copies stopped or discarded because another copy finished first
    by_worker: dict[int, int] = field(default_factory=dict)  # portions committed per worker


class Pass:
    """One pass over the data: hands out copies, commits the first of each portion."""

    def __init__(self, evaluation: int, ranges: list[tuple[int, int]], *, first_task: int,
                 copies: int = 2) -> None:
        self.evaluation, self.ranges, self.copies = evaluation, ranges, copies
        self._next_task = first_task
        self._unassigned = list(range(len(ranges)))
        self.running: dict[int, Copy] = {}  # task -> copy
        self._first: dict[int, int] = {}  # portion -> its first copy's task
        self.committed: dict[int, int] = {}  # portion -> the task committed
        self.pushed: set[int] = set()  # portions whose gradient is on the shards
        self._committer: dict[int, int] = {}  # committed task -> its worker
        self.loss_sum = 0.0
        self.samples = 0
        self.stats = PassStats()

    @property
    def next_task(self) -> int:
        return self._next_task

    @property
    def complete(self) -> bool:
        return len(self.pushed) == len(self.ranges)

    def take(self, worker: int, now: float) -> Copy | None:
        """A copy for an idle ``worker``, or None when it has nothing useful to do."""
        if self._unassigned:
            portion = self._unassigned.pop(0)
        else:
            backup = self._backup_for(worker)
            if backup is None:
                return None
            portion = backup
            self.stats.backups += 1
        copy = Copy(self._next_task, portion, worker, now)
        self._next_task += 1
        self.running[copy.task] = copy
        self._first.setdefault(portion, copy.task)
        self.stats.tasks += 1
        return copy

    def finished(self, worker: int, task: int) -> bool:
        """A copy's sums are ready: True if it is committed (it pushes), False to drop it."""
        copy = self.running.get(task)
        if copy is None or copy.worker != worker:
            raise RunFailed(f"worker {worker} reported task {task}, which it was not given")
        del self.running[task]
        if copy.portion in self.committed:
            self.stats.dropped += 1
            return False
        self.committed[copy.portion] = task
        self._committer[task] = worker
        if self._first[copy.portion] != task:
            self.stats.backups_won += 1
        self.stats.by_worker[worker] = self.stats.by_worker.get(worker, 0) + 1
        return True

    def others(self, task: int) -> list[Copy]:
        """The copies still running of committed ``task``'s portion: they are dropped now (their
        workers are told to stop), and no longer count as running."""
        portion = next(p for p, t in self.committed.items() if t == task)
        dropped = [c for c in self.running.values() if c.portion == portion]
        for copy in dropped:
            del self.running[copy.task]
        self.stats.dropped += len(dropped)
        return dropped

    def pushed_by(self, worker: int, task: int, loss_sum: float, samples: int) -> None:
        portion = next((p for p, t in self.committed.items() if t == task), None)
        if portion is None or portion in self.pushed:
            raise RunFailed(f"worker {worker} pushed task {task}, which was not committed")
        start, end = self.ranges[portion]
        if samples != end - start:
            raise RunFailed(f"worker {worker} summed {samples} rows for task {task}, whose "
                            f"portion has {end - start}")
        self.pushed.add(portion)
        self.loss_sum += loss_sum
        self.samples += samples

    def forget(self, worker: int) -> bool:
        """A worker was lost: its running copies are gone (their portions go back out). False
        if it held a commit it had not pushed: part of that gradient may be on some shards,
        so the pass cannot be completed and must be run again."""
        for task in [t for t, c in self.running.items() if c.worker == worker]:
            portion = self.running.pop(task).portion
            if portion not in self.committed and not any(
                    c.portion == portion for c in self.running.values()):
                self._unassigned.insert(0, portion)
        return not any(self._committer[self.committed[portion]] == worker
                       for portion in set(self.committed) - self.pushed)

    def _backup_for(self, worker: int) -> int | None:
        """The outstanding portion that has run longest with room for one more copy and no
        copy on ``worker`` already."""
        counts: dict[int, int] = {}
        for copy in self.running.values():
            counts[copy.portion] = counts.get(copy.portion, 0) + 1
        mine = {c.portion for c in self.running.values() if c.worker == worker}
        candidates = sorted((c.started, c.portion) for c in self.running.values()
                            if c.portion not in self.committed and c.portion not in mine
                            and counts[c.portion] < self.copies)
        return candidates[0][1] if candidates else None


PORTIONS_PER_WORKER = 8


def portion_count(portions_setting: int | None, workers: int, samples: int) -> int:
    """A pass's portions: the setting, else 8 per worker (room for a fast worker to take
    over part of a slow one's share), never more than the rows."""
    return portions_setting or min(samples, PORTIONS_PER_WORKER * workers)
