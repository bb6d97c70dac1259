"""The process sampler reads real processes: CPU and memory of each (PSS in turn, within a CPU
budget), and forgets the dead."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from types import SimpleNamespace
from typing import Any

import numpy as np
import psutil
import pytest
from pydantic import ValidationError

from engine.roles.sampling import PsutilSampler, oversubscription, read_pss
from engine.wire.records import ProcessSample


def test_samples_each_watched_process_and_drops_one_that_ended() -> None:
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        sampler = PsutilSampler(clock=lambda: 1234.5)
        sampler.watch("coordinator", 0, os.getpid())
        sampler.watch("worker", 3, busy.pid)
        sampler.watch("worker", 4, 2**22 + 12345)  # no such process: ignored
        time.sleep(0.5)
        rows = {row.role: row for row in sampler.sample()}
        assert set(rows) == {"coordinator", "worker"}
        worker = rows["worker"]
        assert (worker.rank, worker.pid, worker.at) == (3, busy.pid, 1234.5)
        # it spins: some CPU in the window, however crowded the machine (a share of the cores
        # was a bound once, and failed at load 9)
        assert worker.cpu_percent > 0
        assert worker.rss_bytes > 2**20
    finally:
        busy.kill()
        busy.wait(5)
    assert [row.role for row in sampler.sample()] == ["coordinator"]


def test_oversubscription_is_said_only_when_busy_processes_outnumber_cores() -> None:
    assert oversubscription(workers=2, servers=1, cores=4) is None
    assert oversubscription(workers=4, servers=2, cores=2) == (
        "7 busy processes (4 workers, 2 servers, 1 evaluator) share 2 cores: timings measure "
        "CPU contention as much as the consistency model")


def test_a_crowded_machine_is_said_to_measure_the_protocol_not_speed() -> None:
    said = oversubscription(workers=128, servers=8, cores=2)
    assert said is not None and said.startswith("137 busy processes (128 workers, 8 servers")
    assert "each process runs about 1 % of the time" in said
    assert "measures the protocol at scale" in said
    assert "protocol at scale" not in (oversubscription(workers=4, servers=2, cores=2) or "")


def test_oversubscription_counts_read_as_english() -> None:
    assert oversubscription(workers=2, servers=1, cores=1) == (
        "4 busy processes (2 workers, 1 server, 1 evaluator) share 1 core: timings measure "
        "CPU contention as much as the consistency model")


def test_a_process_whose_memory_is_gone_gives_no_reading() -> None:
    """A role sampled while it exits (its pages released, not yet a zombie) reads rss 0: that
    is no sample of the role, which the run's records would show as a process of no size."""

    class Exiting:
        def oneshot(self) -> Any:
            return contextlib.nullcontext()

        def cpu_percent(self, interval: float | None) -> float:
            return 0.0

        def memory_info(self) -> Any:
            return SimpleNamespace(rss=0)

    sampler = PsutilSampler(clock=lambda: 1.0)
    sampler.watch("coordinator", 0, os.getpid())
    sampler._watched[2**22 + 1] = type(sampler._watched[os.getpid()])(  # the one exiting
        "worker", 1, Exiting())  # type: ignore[arg-type]
    assert [row.role for row in sampler.sample()] == ["coordinator"]


# -- PSS: read in turn within a CPU budget ---------------------------------------------------------


class _Fake:
    """A process as psutil shows it, for the sampler: CPU, RSS and (by the reader) PSS."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def oneshot(self) -> Any:
        return contextlib.nullcontext()

    def cpu_percent(self, interval: float | None) -> float:
        return 10.0

    def memory_info(self) -> Any:
        return SimpleNamespace(rss=100 * 2**20)


class _Clock:
    """perf_counter as the sampler sees it: each PSS read costs ``cost_s``."""

    def __init__(self, cost_s: float) -> None:
        self.now, self.cost_s, self.read = 0.0, cost_s, list[int]()

    def reader(self, process: Any) -> int | None:
        self.now += self.cost_s
        self.read.append(process.pid)
        return None if process.pid == 13 else 7 * process.pid  # pid 13: not ours to read


def _sampler(monkeypatch: pytest.MonkeyPatch, pids: range, cost_s: float
             ) -> tuple[PsutilSampler, _Clock]:
    monkeypatch.setattr(psutil, "Process", _Fake)
    clock = _Clock(cost_s)
    sampler = PsutilSampler(clock=lambda: 5.0, pss_reader=clock.reader, timer=lambda: clock.now,
                            pss_budget_s=0.02)
    for pid in pids:
        sampler.watch("worker", pid, pid)
    return sampler, clock


def test_a_small_run_has_every_process_read_every_sample(monkeypatch: pytest.MonkeyPatch) -> None:
    sampler, clock = _sampler(monkeypatch, range(1, 5), cost_s=0.004)
    for _ in range(3):
        clock.read.clear()
        rows = sampler.sample()
        assert sorted(clock.read) == [1, 2, 3, 4]
        assert {row.pid: row.pss_bytes for row in rows} == {1: 7, 2: 14, 3: 21, 4: 28}


def test_a_large_run_is_read_in_turn_within_the_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """4 ms a read, 20 ms a sample: five processes per sample, each in its turn, and a row
    carries PSS only in the sample that read it."""
    sampler, clock = _sampler(monkeypatch, range(1, 13), cost_s=0.004)
    turns = []
    for _ in range(3):
        clock.read.clear()
        rows = sampler.sample()
        assert len(rows) == 12 and {row.at for row in rows} == {5.0}  # every process sampled
        assert {row.pid for row in rows if row.pss_bytes is not None} == set(clock.read)
        turns.append(list(clock.read))
    assert [len(t) for t in turns] == [5, 5, 5]
    # Round robin: no process read twice until all were, whatever order they joined in.
    assert sorted(turns[0] + turns[1] + turns[2][:2]) == list(range(1, 13))
    assert turns[2][2:] == turns[0][:3]


def test_one_process_is_read_however_slow_a_read(monkeypatch: pytest.MonkeyPatch) -> None:
    sampler, clock = _sampler(monkeypatch, range(1, 4), cost_s=0.5)
    read = []
    for _ in range(4):
        clock.read.clear()
        sampler.sample()
        read.extend(clock.read)
    assert len(read) == 4 and sorted(read[:3]) == [1, 2, 3] and read[3] == read[0]


def test_however_slow_a_read_every_process_is_read_within_a_sweep(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """137 processes, each read over the budget alone: 35 a sample (137 / PSS_SWEEP_SAMPLES,
    rounded up), so that every one has a reading within PSS_SWEEP_SAMPLES samples (the run's
    summed PSS needs them all)."""
    from engine.roles.sampling import PSS_SWEEP_SAMPLES

    sampler, clock = _sampler(monkeypatch, range(1, 138), cost_s=0.5)
    read: list[int] = []
    for _ in range(PSS_SWEEP_SAMPLES):
        clock.read.clear()
        sampler.sample()
        assert len(clock.read) == -(-137 // PSS_SWEEP_SAMPLES)
        read.extend(clock.read)
    assert set(read) == set(range(1, 138))


def test_an_unreadable_pss_is_none_and_an_ended_process_leaves_the_turn(
        monkeypatch: pytest.MonkeyPatch) -> None:
    sampler, clock = _sampler(monkeypatch, range(12, 15), cost_s=0.001)
    rows = sampler.sample()
    assert {row.pid: row.pss_bytes for row in rows} == {12: 84, 13: None, 14: 98}
    del sampler._watched[12]  # what sample() does when psutil says the process is gone
    clock.read.clear()
    assert {row.pid for row in sampler.sample()} == {13, 14}
    assert sorted(clock.read) == [13, 14] and 12 not in sampler._pss_turn


def test_read_pss_says_none_where_it_cannot_read() -> None:
    class Denied:
        def memory_full_info(self) -> Any:
            raise psutil.AccessDenied(1)

    class NotLinux:  # macOS and Windows have uss but no pss
        def memory_full_info(self) -> Any:
            return SimpleNamespace(rss=1, uss=1)

    assert read_pss(Denied()) is None
    assert read_pss(NotLinux()) is None
    if sys.platform == "linux":  # this process's own
        assert (read_pss(psutil.Process()) or 0) > 2**20


def test_a_sample_without_pss_still_validates_and_a_negative_one_does_not() -> None:
    old = ProcessSample(at=1.0, role="worker", rank=0, pid=5, cpu_percent=1.0, rss_bytes=10)
    assert old.pss_bytes is None
    with pytest.raises(ValidationError):
        ProcessSample(at=1.0, role="worker", rank=0, pid=5, cpu_percent=1.0, rss_bytes=10,
                      pss_bytes=-1)


@pytest.mark.integration  # forks a real process holding 200 MB
@pytest.mark.timeout(60)
def test_a_forked_childs_pss_counts_its_share_of_the_pages_it_shares() -> None:
    """A role forked from the template shares the data set's pages with it copy-on-write: RSS
    counts them in full in each process, PSS splits them between the two."""
    data = np.ones(200 * 2**20 // 8)  # written: resident in the parent before the fork
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # the child touches nothing: it waits for the parent, then leaves
        try:
            os.close(write_end)
            os.read(read_end, 1)
        finally:
            os._exit(0)
    os.close(read_end)
    try:
        sampler = PsutilSampler()
        sampler.watch("worker", 0, child)
        (row,) = sampler.sample()
    finally:
        os.close(write_end)
        os.waitpid(child, 0)
        del data
    assert row.pid == child and row.rss_bytes > 200 * 2**20
    assert row.pss_bytes is not None and row.pss_bytes < 0.65 * row.rss_bytes
