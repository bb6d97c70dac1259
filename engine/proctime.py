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


def usable_cores() -> int:
    """The cores this process may run on (its affinity, where the system says it)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1
