"""What the connections of one shard server process may make it hold, in all.

Bounds per connection alone do not bound a server: 16 connections that never read their replies
grew one from 98 to 608 MB, and pulls for clocks that cannot come, parked from several
connections of one credential, slowed every push. ``ServerBudget`` is shared by every copy
(``ShardServer``) a process holds and keeps the totals: reply bytes held for all connections
(their queues, plus what their transports still hold in this process's memory, also for
connections being closed), and waiting pulls per sender (the role and rank its admission lets it
speak as, over all its connections) and in all.

Past ``max_server_queued_bytes`` the slowest readers are disconnected first: those with more than
one reply queued, or whose one reply has waited ``STALLED_S`` (longer on a crowded machine), the
longest waiting first. A
connection's one fresh reply is never a reason to disconnect it (at a BSP barrier every worker's
reply is queued at once), so the budget may be passed by such replies for that long.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import functools
import time
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Protocol

import psutil

from engine.config import ClusterConfig

MIB = 2**20
# By default the servers' stored sparse keys may take this share of the machine's memory, in
# all (the rest is the workers', the data's and the system's).
MEMORY_SHARE = 0.25
# A connection's first waiting pulls (this many, at most a quarter of the sender's bound) are
# never refused for its sender's bound, so a worker whose credential is also used by a flood
# keeps its own pulls (a worker waits on a few at a time).
RESERVED_PULLS_PER_CONNECTION = 16
_TRIM_EVERY_S = 1.0
# A connection whose only queued reply has waited this long to leave this process's memory
# counts as a slow reader once the budget is full. An honest worker takes a reply in
# milliseconds on loopback, tens of them across a network; on a machine with more busy
# processes than cores it waits for a core too, so the wait is this times that ratio
# (``ServerLimits.from_cluster``): 128 workers pulling at once on 2 cores had their one reply
# each held over a second and were disconnected.
STALLED_S = 1.0


@dataclass(frozen=True)
class ServerLimits:
    """A shard server's bounds; ``docs/security.md`` explains each and how to change it."""

    # Unread reply bytes one connection may have queued; one reply is always let through, so a
    # single frame may be larger. The attack this stops: pulls whose replies are never read.
    max_queued_bytes: int = 32 * MIB
    # The same over every connection of the server process: the slowest readers go first.
    max_server_queued_bytes: int = 32 * MIB
    max_pending_pulls: int = 1024  # pulls of one sender (all its connections) waiting for a clock
    max_server_pending_pulls: int = 8192  # pulls waiting for a clock at the process, in all
    warnings_per_minute: int = 10  # log lines about one peer's refused frames
    stalled_s: float = STALLED_S  # see STALLED_S

    @classmethod
    def from_cluster(cls, cluster: ClusterConfig, cores: int = 1) -> ServerLimits:
        """The run's limits on a machine of ``cores`` cores (its roles' processes share them,
        so an honest reader may wait for one)."""
        busy = cluster.workers + cluster.servers + 1
        return cls(max_queued_bytes=cluster.max_queued_bytes,
                   max_server_queued_bytes=cluster.max_server_queued_bytes,
                   max_pending_pulls=cluster.max_pending_pulls,
                   max_server_pending_pulls=cluster.max_server_pending_pulls,
                   stalled_s=STALLED_S * max(1.0, busy / max(cores, 1)))


def server_memory(cluster: ClusterConfig, machine_bytes: int | None = None) -> int:
    """The bytes one server process's stored sparse keys may take: ``cluster.server_memory``,
    or MEMORY_SHARE of this machine's memory over the run's servers (all on this machine on
    the local backend; on a cluster, set it)."""
    if cluster.server_memory is not None:
        return cluster.server_memory
    total = psutil.virtual_memory().total if machine_bytes is None else machine_bytes
    return int(total * MEMORY_SHARE) // cluster.servers


class Reader(Protocol):
    """A connection as the budget sees it."""

    queued_bytes: int
    head_since: float  # when its oldest unsent reply was queued

    @property
    def queued_frames(self) -> int: ...

    def unsent_bytes(self) -> int: ...


class Unsent(Protocol):
    """A connection being closed: what its transport still holds counts until it is gone."""

    def unsent_bytes(self) -> int: ...


class ServerBudget:
    """The totals of one server process (see the module's doc)."""

    def __init__(self, limits: ServerLimits | None = None) -> None:
        self.limits = limits or ServerLimits()
        self.queued_bytes = 0
        self.waiting = 0
        self._by_sender: dict[Hashable, int] = {}
        self.readers: set[Reader] = set()
        self.closing: set[Unsent] = set()
        self._trimmed_at = 0.0
        self._trim_pending = False

    def refuse_pull(self, sender: Hashable, own_waiting: int) -> str | None:
        """Why a pull of ``sender`` (on a connection with ``own_waiting`` pulls waiting) may
        not wait, or None."""
        limits = self.limits
        if self.waiting >= limits.max_server_pending_pulls:
            return (f"{self.waiting} pulls already wait at this server; the limit is "
                    f"{limits.max_server_pending_pulls} (cluster.max_server_pending_pulls)")
        held = self._by_sender.get(sender, 0)
        reserved = min(RESERVED_PULLS_PER_CONNECTION, max(limits.max_pending_pulls // 4, 1))
        if held >= limits.max_pending_pulls and own_waiting >= reserved:
            return (f"{held} pulls of this sender already wait at this server; the limit is "
                    f"{limits.max_pending_pulls} (cluster.max_pending_pulls)")
        return None

    def pull_waits(self, sender: Hashable) -> None:
        self.waiting += 1
        self._by_sender[sender] = self._by_sender.get(sender, 0) + 1

    def pull_ends(self, sender: Hashable) -> None:
        self.waiting -= 1
        left = self._by_sender[sender] - 1
        if left:
            self._by_sender[sender] = left
        else:
            del self._by_sender[sender]

    def waiting_of(self, sender: Hashable) -> int:
        return self._by_sender.get(sender, 0)

    def held_bytes(self) -> int:
        """Reply bytes this process holds for its connections: queued, and still in their
        transports' buffers (connections being closed included, until they are empty)."""
        gone = [c for c in self.closing if not c.unsent_bytes()]
        if gone:
            self.closing.difference_update(gone)
            self.release_memory()
        return (self.queued_bytes + sum(r.unsent_bytes() for r in self.readers)
                + sum(c.unsent_bytes() for c in self.closing))

    def over(self, size: int) -> bool:
        return self.held_bytes() + size > self.limits.max_server_queued_bytes

    def slowest(self, sender: Reader, now: float | None = None) -> Reader | None:
        """The reader to disconnect to make room for ``sender``'s next reply, among those with
        more than their one reply queued (``sender`` counts its next) or whose one reply has
        waited ``limits.stalled_s``: the one whose oldest unsent reply waits longest of those
        holding more than a fair share of the budget (the budget over the readers), else of
        them all; None if none. The share first: a worker descheduled for a moment on a busy machine
        holds a pull's replies, a client that stopped reading holds all the rest."""
        now = time.monotonic() if now is None else now

        def behind(r: Reader) -> bool:
            if not r.queued_frames:  # nothing queued: its next reply always goes
                return False
            return (r.queued_frames + (r is sender) >= 2
                    or now - r.head_since >= self.limits.stalled_s)

        candidates = [r for r in self.readers if behind(r)]
        share = self.limits.max_server_queued_bytes / max(len(self.readers), 1)
        greedy = [r for r in candidates if r.queued_bytes + r.unsent_bytes() > share]
        return min(greedy or candidates, key=lambda r: r.head_since, default=None)

    def release_memory(self) -> None:
        """Hand freed memory back to the system (at most once a second; a call within the
        second is done at its end): glibc keeps the heap pages of freed replies otherwise, and
        the server's RSS never comes down."""
        now = time.monotonic()
        wait = self._trimmed_at + _TRIM_EVERY_S - now
        if wait > 0:
            self._trim_later(wait)
            return
        self._trimmed_at = now
        _malloc_trim()

    def _trim_later(self, delay: float) -> None:
        # The last connections of a burst leave within the second of an earlier trim: without
        # this, what they held stayed in the server's RSS (38 MB of 16 slow readers' replies).
        if self._trim_pending:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._trim_pending = True
        loop.call_later(delay, self._trim_now)

    def _trim_now(self) -> None:
        self._trim_pending = False
        self.release_memory()


def _malloc_trim() -> None:
    libc = _libc()
    if libc is not None:
        with contextlib.suppress(AttributeError):  # not glibc: nothing to trim
            libc.malloc_trim(0)


@functools.cache
def _libc() -> ctypes.CDLL | None:
    with contextlib.suppress(OSError):
        name = ctypes.util.find_library("c")  # runs ldconfig: once per process
        return None if name is None else ctypes.CDLL(name)
    return None
