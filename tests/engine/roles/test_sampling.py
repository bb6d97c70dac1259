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


def test_a_process_whose_memory_is_gone_gives_no_reading() -> None:
    """A role sampled while it exits (its pages released, not yet a zombie) reads rss 0: that
    is no sample of the role, which the run's records would show as a process of no size."""
    import contextlib
    from types import SimpleNamespace
    from typing import Any

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
