"""A run's memory at its peak, from the proportional memory (PSS) its processes were sampled at.

RSS counts a page shared copy-on-write (the template's libraries, a data set loaded before the
roles were forked) in every process that maps it, so summed over a run it overstates what the
run held, by far with many workers. PSS splits each shared page among its sharers and sums.

The sampler reads PSS for a few processes per second in turn (engine/roles/sampling.py), so a
process's PSS at a given moment is its latest reading then. The run's PSS at a sample time is
the sum over the processes alive then (from their first reading to their last sample) of their
latest readings; the peak is that sum's maximum. Between two readings the sum only falls (as
processes end), so the readings' times are the only candidates for the peak.

The readings are taken at different moments, and a page's share depends on how many processes
map it then (a worker read while the template had forked ten roles counts a tenth of the shared
pages, one read once all 137 run a 137th): while roles start or end, the sum mixes moments.
bench/startup.py reads every process at once, from outside, for comparison.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from sqlalchemy import Connection, func, select

from engine.db.schema import process_samples

# A process alive at the peak was sampled within a second or two of it; its RSS then is its
# latest row in this window (bounding the read to the index's last seconds of the run).
_RSS_LOOKBACK_S = 30.0

_Process = tuple[str, int, int]  # (role, rank, pid): a restarted role is another process


@dataclass(frozen=True)
class MemoryPeak:
    """The run's summed PSS at its peak, and what made it up."""

    peak_pss_bytes: int
    at: float  # seconds of training (engine/db/clock.py; negative: during start-up)
    processes: int  # the processes counted in the sum
    rss_bytes: int  # the same processes' RSS summed then: shared pages counted in each
    # Mean PSS per process of each role counted ("worker", "server", ...), in bytes.
    pss_by_role: dict[str, int]
    # Processes sampled at the peak that had no PSS reading yet (a run too short for the
    # sampler to read every process of it), so not in the sum.
    unread: int = 0


@dataclass(frozen=True)
class _Reading:
    at: float
    process: _Process
    pss: int


def memory_peak(conn: Connection, run_id: str,
                seconds: Callable[[float], float]) -> MemoryPeak | None:
    """The run's PSS peak, its moment as ``seconds`` tells it (the run's seconds of training,
    engine.db.clock.TrainingClock.seconds); None for a run with no PSS reading (recorded before
    schema 8, or where PSS could not be read)."""
    readings = _pss_readings(conn, run_id)
    if not readings:
        return None
    at, current = _peak(readings, _last_samples(conn, run_id))
    by_role: dict[str, list[int]] = defaultdict(list)
    for (role, _rank, _pid), pss in current.items():
        by_role[role].append(pss)
    return MemoryPeak(
        peak_pss_bytes=sum(current.values()),
        at=seconds(at),
        processes=len(current),
        rss_bytes=sum(_rss_at(conn, run_id, at, current).values()),
        pss_by_role={role: round(sum(v) / len(v)) for role, v in sorted(by_role.items())},
        unread=len(_sampled_at(conn, run_id, at) - current.keys()),
    )


def _sampled_at(conn: Connection, run_id: str, at: float) -> set[_Process]:
    """The processes in the sample taken at ``at`` (one sample's rows share its time)."""
    pc = process_samples.c
    rows = conn.execute(select(pc.role, pc.rank, pc.pid)
                        .where(pc.run_id == run_id, pc.at == at))
    return {(str(role), int(rank), int(pid)) for role, rank, pid in rows}


def _pss_readings(conn: Connection, run_id: str) -> list[_Reading]:
    pc = process_samples.c
    rows = conn.execute(select(pc.at, pc.role, pc.rank, pc.pid, pc.pss_bytes)
                        .where(pc.run_id == run_id, pc.pss_bytes.is_not(None))
                        .order_by(pc.at))
    return [_Reading(float(at), (str(role), int(rank), int(pid)), int(pss))
            for at, role, rank, pid, pss in rows]


def _last_samples(conn: Connection, run_id: str) -> dict[_Process, float]:
    """When each process was last sampled: it counts until then."""
    pc = process_samples.c
    rows = conn.execute(select(pc.role, pc.rank, pc.pid, func.max(pc.at))
                        .where(pc.run_id == run_id).group_by(pc.role, pc.rank, pc.pid))
    return {(str(role), int(rank), int(pid)): float(last) for role, rank, pid, last in rows}


def _peak(readings: list[_Reading], last: dict[_Process, float]
          ) -> tuple[float, dict[_Process, int]]:
    """The time of the largest sum of latest readings, and the readings summed then."""
    best, best_at = -1, readings[0].at
    for at, total, _ in _sums(readings, last):
        if total > best:
            best, best_at = total, at
    for at, _, current in _sums(readings, last):  # again, to the peak: no copy at each new high
        if at == best_at:
            return at, dict(current)
    raise AssertionError("the peak is one of the readings' times")


def _sums(readings: list[_Reading], last: dict[_Process, float]
          ) -> Iterator[tuple[float, int, dict[_Process, int]]]:
    """At each reading time: the time, the sum of the latest readings of the processes alive
    then, and those readings (a dict the next step changes)."""
    ends = sorted((t, process) for process, t in last.items())
    current: dict[_Process, int] = {}
    total, i, j = 0, 0, 0
    while i < len(readings):
        at = readings[i].at
        while j < len(ends) and ends[j][0] < at:  # sampled for the last time before now
            total -= current.pop(ends[j][1], 0)
            j += 1
        while i < len(readings) and readings[i].at == at:  # one sample's readings together
            reading = readings[i]
            total += reading.pss - current.get(reading.process, 0)
            current[reading.process] = reading.pss
            i += 1
        yield at, total, current


def _rss_at(conn: Connection, run_id: str, at: float, counted: dict[_Process, int]
            ) -> dict[_Process, int]:
    """Each counted process's RSS in its latest sample at or before ``at``."""
    pc = process_samples.c
    rows = conn.execute(select(pc.role, pc.rank, pc.pid, pc.rss_bytes)
                        .where(pc.run_id == run_id, pc.at <= at, pc.at >= at - _RSS_LOOKBACK_S)
                        .order_by(pc.at))
    rss: dict[_Process, int] = {}
    for role, rank, pid, value in rows:  # in time order: the latest one stays
        process = (str(role), int(rank), int(pid))
        if process in counted:
            rss[process] = int(value)
    return rss
