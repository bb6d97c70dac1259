"""This process's start, to the hundredth of a second, and the cores it may run on.

``psutil.Process().create_time()`` adds the boot time, which Linux gives in whole seconds
(``btime`` in /proc/stat), so it is off by up to a second: too coarse for a start-up that takes
two. Here the process's age comes from two readings of one clock (its start in /proc/self/stat
and /proc/uptime, both since boot) and is taken from now.
"""

from __future__ import annotations

import os
import time


def process_started_at() -> float:
    """This process's start, wall clock; now where /proc cannot be read (not Linux)."""
    try:
        with open("/proc/self/stat", encoding="ascii") as stat:
            # The command name (field 2) may hold spaces and parentheses: count from its end.
            fields = stat.read().rsplit(")", 1)[1].split()
        with open("/proc/uptime", encoding="ascii") as uptime:
            up_s = float(uptime.read().split()[0])
        ticks = os.sysconf("SC_CLK_TCK")
        age = up_s - int(fields[19]) / ticks  # starttime, field 22 of stat
    except (OSError, ValueError, IndexError):
        return time.time()
    return time.time() - max(age, 0.0)


# A process that replaced its program without a fork (the last command of a shell's subshell,
# `(python3 -m venv .venv && ... && psctl launch ...)`, runs so) keeps the older start: when it
# is this much older than the program's first import, the import is the better start (it misses
# the interpreter's own, some 0.05 s).
EXEC_REUSE_S = 2.0


def program_started_at(imported_at: float) -> float:
    """When this program started: the process's start, or ``imported_at`` (its first module's
    import) when the process is much older than that."""
    started = process_started_at()
    return imported_at if imported_at - started > EXEC_REUSE_S else started


def usable_cores() -> int:
    """The cores this process may run on (its affinity, where the system says it)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1
