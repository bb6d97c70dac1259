"""The process sampler reads real processes: CPU and memory of each, and forgets the dead."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from engine.roles.sampling import PsutilSampler, oversubscription


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


def test_oversubscription_counts_read_as_english() -> None:
    assert oversubscription(workers=2, servers=1, cores=1) == (
        "4 busy processes (2 workers, 1 server, 1 evaluator) share 1 core: timings measure "
        "CPU contention as much as the consistency model")
