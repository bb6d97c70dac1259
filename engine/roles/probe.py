"""What the operating system says of a suspected server process of this machine.

A server whose heartbeats stop is either gone, stopped (``SIGSTOP``, a debugger), blocked for
good, or just not given a core on a crowded machine. Only the last must not be fenced: its
process is runnable or its CPU time still moves.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import psutil


class State(enum.Enum):
    GONE = "gone"  # no such process, or a zombie
    STOPPED = "stopped"  # stopped by a signal or a tracer: it will not answer by itself
    WORKING = "working"  # runnable, or its CPU time moved since the last look
    IDLE = "idle"  # asleep and its CPU time did not move: blocked


@dataclass(frozen=True)
class Look:
    state: State
    cpu_s: float


_STOPPED = {psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP}
_GONE = {psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD}


def look(pid: int, cpu_before: float | None) -> Look:
    """The process ``pid``'s state; ``cpu_before`` is its CPU time at the previous look (None
    at the first), against which WORKING and IDLE are told apart."""
    try:
        process = psutil.Process(pid)
        with process.oneshot():
            status = process.status()
            times = process.cpu_times()
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return Look(State.GONE, 0.0)
    except psutil.Error:  # not ours to read: assume the worst case is not ours to decide
        return Look(State.WORKING, 0.0)
    cpu = times.user + times.system
    if status in _GONE:
        return Look(State.GONE, cpu)
    if status in _STOPPED:
        return Look(State.STOPPED, cpu)
    moved = cpu_before is None or cpu > cpu_before
    if status == psutil.STATUS_RUNNING or moved:
        return Look(State.WORKING, cpu)
    return Look(State.IDLE, cpu)
