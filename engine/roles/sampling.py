"""System metrics: every process of the run, sampled once a second by the coordinator.

A run on 2 cores with 8 busy processes measures CPU contention as much as its consistency model;
these samples (CPU as a percent of one core, resident memory) are stored with the run so that a
comparison can show it. Processes are found by the pid each role sends in its hello, so only
processes on the coordinator's machine are sampled.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import psutil

from engine.wire.records import ProcessSample

SAMPLE_INTERVAL_S = 1.0


class ProcessSampler(Protocol):
    def watch(self, role: str, rank: int, pid: int) -> None:
        """Start sampling this process of the run."""
        ...

    def sample(self) -> list[ProcessSample]:
        """One reading of every watched process that is still alive."""
        ...


@dataclass
class _Watched:
    role: str
    rank: int
    process: psutil.Process


class PsutilSampler:
    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._watched: dict[int, _Watched] = {}

    def watch(self, role: str, rank: int, pid: int) -> None:
        try:
            process = psutil.Process(pid)
            process.cpu_percent(None)  # the first reading only starts the interval
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return  # gone already, or not ours to read: nothing to sample
        self._watched[pid] = _Watched(role, rank, process)

    def sample(self) -> list[ProcessSample]:
        at, rows = self._clock(), []
        for pid, watched in list(self._watched.items()):
            try:
                with watched.process.oneshot():
                    cpu = watched.process.cpu_percent(None)
                    rss = watched.process.memory_info().rss
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                del self._watched[pid]
                continue
            if rss == 0:  # its memory released: a process that is exiting, not a reading
                continue
            rows.append(ProcessSample(at=at, role=watched.role, rank=watched.rank, pid=pid,
                                      cpu_percent=cpu, rss_bytes=rss))
        return rows


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def oversubscription(workers: int, servers: int, cores: int) -> str | None:
    """A warning when the run's busy processes (workers, shard servers, the evaluator) outnumber
    the cores, or None: such a run measures CPU contention as much as its consistency model."""
    busy = workers + servers + 1
    if busy <= cores:
        return None
    return (f"{busy} busy processes ({_count(workers, 'worker')}, {_count(servers, 'server')}, "
            f"1 evaluator) share {_count(cores, 'core')}: timings measure CPU contention as much "
            "as the consistency model")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
