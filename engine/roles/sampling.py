"""System metrics: every process of the run, sampled once a second by the coordinator.

A run on 2 cores with 8 busy processes measures CPU contention as much as its consistency model;
these samples (CPU as a percent of one core, resident memory) are stored with the run so that a
comparison can show it. Processes are found by the pid each role sends in its hello, so only
processes on the coordinator's machine are sampled.

Roles forked from a warm template share its library and data pages copy-on-write, and RSS counts
each shared page in every process that maps it: summed over a run it can exceed the machine's
memory. Proportional set size (PSS) splits each shared page among its sharers, so it sums to what
the run really holds. Reading it makes the kernel walk the process's pages, so it is read for a
few processes per sample, in turn, within :data:`PSS_BUDGET_S`.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import psutil

from engine.wire.records import ProcessSample

SAMPLE_INTERVAL_S = 1.0
# Busy processes per core from which a run is said to measure the protocol, not speed.
CROWDED_PER_CORE = 8
# The CPU one sample may spend reading PSS: 2 % of a core, a few processes per sample (a read
# measured 0.4 to 4 ms, the kernel walking the process's pages, more as it maps more). A run of
# up to about 5 processes is read whole every second; one of 137 in turn (see PSS_SWEEP_SAMPLES).
# At least one process is read per sample, whatever one read costs. Counted in the
# thread's CPU time, not the wall clock: on a crowded machine (the case PSS matters most in) a
# read waits for a core as long as it works, and wall time would read a fraction as many.
PSS_BUDGET_S = 0.02
# But every process is read at least once in this many samples, whatever it costs: a run's
# summed PSS at its peak needs a reading of every process, and a run of 128 workers may last
# seconds (137 processes: 35 reads a sample, measured below 10 % of a core on this machine).
PSS_SWEEP_SAMPLES = 4

# Reads one process's proportional set size in bytes; None where it cannot be read.
PssReader = Callable[[psutil.Process], int | None]


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


def read_pss(process: psutil.Process) -> int | None:
    """The process's PSS (Linux: /proc/PID/smaps_rollup), or None: not Linux, not ours to read,
    or gone."""
    try:
        pss = getattr(process.memory_full_info(), "pss", None)  # only Linux has the field
    except (psutil.Error, OSError):
        return None
    return None if pss is None else int(pss)


class PsutilSampler:
    def __init__(self, clock: Callable[[], float] = time.time, *,
                 pss_reader: PssReader = read_pss,
                 timer: Callable[[], float] = time.thread_time,
                 pss_budget_s: float = PSS_BUDGET_S) -> None:
        self._clock = clock
        self._watched: dict[int, _Watched] = {}
        self._read_pss, self._timer, self._pss_budget_s = pss_reader, timer, pss_budget_s
        self._pss_turn: deque[int] = deque()  # pids, the next one due for a PSS read first

    def watch(self, role: str, rank: int, pid: int) -> None:
        try:
            process = psutil.Process(pid)
            process.cpu_percent(None)  # the first reading only starts the interval
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return  # gone already, or not ours to read: nothing to sample
        if pid not in self._pss_turn:
            self._pss_turn.appendleft(pid)  # a newcomer's PSS first: its footprint is news
        self._watched[pid] = _Watched(role, rank, process)

    def sample(self) -> list[ProcessSample]:
        at, read = self._clock(), []
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
            read.append((pid, watched, cpu, rss))
        pss = self._pss_in_turn({pid for pid, *_ in read})
        return [ProcessSample(at=at, role=watched.role, rank=watched.rank, pid=pid,
                              cpu_percent=cpu, rss_bytes=rss, pss_bytes=pss.get(pid))
                for pid, watched, cpu, rss in read]

    def _pss_in_turn(self, sampled: set[int]) -> dict[int, int | None]:
        """PSS of the sampled processes whose turn it is, until the budget is spent (at least
        a sweep's share: every process within PSS_SWEEP_SAMPLES samples); each read process goes
        to the back of the turn."""
        start = self._timer()
        out: dict[int, int | None] = {}
        due = max(1, -(-len(self._pss_turn) // PSS_SWEEP_SAMPLES))  # rounded up
        for _ in range(len(self._pss_turn)):
            if len(out) >= due and self._timer() - start >= self._pss_budget_s:
                break
            pid = self._pss_turn.popleft()
            if pid not in self._watched:
                continue  # ended: it leaves the turn
            self._pss_turn.append(pid)
            if pid in sampled:
                out[pid] = self._read_pss(self._watched[pid].process)
        return out


def oversubscription(workers: int, servers: int, cores: int) -> str | None:
    """A warning when the run's busy processes (workers, shard servers, the evaluator) outnumber
    the cores, or None: such a run measures CPU contention as much as its consistency model."""
    busy = workers + servers + 1
    if busy <= cores:
        return None
    said = (f"{busy} busy processes ({_count(workers, 'worker')}, {_count(servers, 'server')}, "
            f"1 evaluator) share {_count(cores, 'core')}: timings measure CPU contention as much "
            "as the consistency model")
    if busy < CROWDED_PER_CORE * cores:
        return said
    return (f"{said}; each process runs about {100 * cores / busy:.0f} % of the time, so such a "
            "run measures the protocol at scale (its messages, sockets, memory per process, "
            "joins and staleness under delay), not how fast any model trains")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
