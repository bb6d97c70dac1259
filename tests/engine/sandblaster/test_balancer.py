"""Sandblaster's balancer: every row counted once, and idle workers finishing a slow worker's
portion with backup copies."""

from __future__ import annotations

import pytest

from engine.errors import RunFailed
from engine.sandblaster.balancer import Pass, portion_count, portions


def test_portions_cover_every_row_once_in_near_equal_parts() -> None:
    cut = portions(10, 4)
    assert cut == [(0, 2), (2, 5), (5, 7), (7, 10)]
    assert portions(5, 5) == [(i, i + 1) for i in range(5)]
    with pytest.raises(RunFailed, match="cannot cut 3 training samples into 4 portions"):
        portions(3, 4)
    assert portion_count(None, 4, 60000) == 32 and portion_count(None, 4, 10) == 10
    assert portion_count(7, 4, 60000) == 7


def test_an_idle_worker_backs_up_the_portion_that_has_run_longest() -> None:
    work = Pass(0, portions(40, 4), first_task=100)
    slow = work.take(0, now=0.0)
    assert slow is not None and slow.task == 100
    for now in (1.0, 2.0, 3.0):  # worker 1 does the other three portions meanwhile
        fast = work.take(1, now=now)
        assert fast is not None and fast.portion != slow.portion
        assert work.finished(1, fast.task)
        work.pushed_by(1, fast.task, 1.0, 10)
    assert work.take(0, now=3.5) is None  # no worker backs up its own portion
    backup = work.take(1, now=4.0)
    assert backup is not None and backup.portion == slow.portion
    assert work.take(2, now=4.0) is None  # two copies at once at most
    assert work.finished(1, backup.task)  # the backup finished first: it counts
    assert not work.finished(0, slow.task)  # the slow original is dropped
    work.pushed_by(1, backup.task, 1.0, 10)
    assert work.complete and work.stats.by_worker == {1: 4}
    assert (work.stats.tasks, work.stats.backups, work.stats.backups_won,
            work.stats.dropped) == (5, 1, 1, 1)


def test_each_portion_is_summed_once_and_the_pass_completes() -> None:
    work = Pass(3, portions(30, 3), first_task=0)
    copies = [work.take(w, now=float(w)) for w in range(3)]
    extra = work.take(3, now=5.0)  # a fourth worker: a backup of portion 0
    assert extra is not None and extra.portion == copies[0].portion  # type: ignore[union-attr]
    for copy in copies:
        assert copy is not None and work.finished(copy.worker, copy.task)
        work.pushed_by(copy.worker, copy.task, 2.0, 10)
    assert not work.finished(3, extra.task)
    assert work.complete and work.samples == 30 and work.loss_sum == 6.0
    with pytest.raises(RunFailed, match="not committed"):
        work.pushed_by(3, extra.task, 2.0, 10)


def test_without_backups_idle_workers_wait() -> None:
    work = Pass(0, portions(20, 2), first_task=0, copies=1)
    assert work.take(0, 0.0) and work.take(1, 0.0)
    assert work.take(2, 1.0) is None


def test_reports_that_do_not_fit_are_refused() -> None:
    work = Pass(0, portions(20, 2), first_task=0)
    copy = work.take(0, 0.0)
    assert copy is not None
    with pytest.raises(RunFailed, match="which it was not given"):
        work.finished(1, copy.task)
    assert work.finished(0, copy.task)
    with pytest.raises(RunFailed, match="summed 3 rows"):
        work.pushed_by(0, copy.task, 1.0, 3)


def test_a_lost_worker_s_portions_go_back_out_but_a_lost_commit_spoils_the_pass() -> None:
    work = Pass(0, portions(30, 3), first_task=0, copies=1)
    a, b = work.take(0, 0.0), work.take(1, 0.0)
    assert a is not None and b is not None
    assert work.forget(0)  # nothing committed: its portion is handed out again
    again = work.take(2, 1.0)
    assert again is not None and again.portion == a.portion
    assert work.finished(1, b.task)
    assert not work.forget(1)  # committed, not pushed: part of it may be on some shards


def test_a_commit_drops_the_other_copies_of_its_portion_at_once() -> None:
    work = Pass(0, portions(20, 2), first_task=0)
    first, second = work.take(0, 0.0), work.take(1, 0.0)
    assert first is not None and second is not None
    assert work.finished(1, second.task)
    work.pushed_by(1, second.task, 1.0, 10)
    backup = work.take(1, 1.0)  # of the first worker's portion
    assert backup is not None and backup.portion == first.portion
    assert work.finished(1, backup.task)
    dropped = work.others(backup.task)
    assert [c.task for c in dropped] == [first.task] and first.task not in work.running
    assert work.stats.dropped == 1
    with pytest.raises(RunFailed, match="which it was not given"):
        work.finished(0, first.task)  # it was told to stop: its late report is not a copy's
