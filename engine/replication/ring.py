"""Where each key range's copies live: its primary and ``K`` backups along a consistent-hash ring.

Key range ``i`` has server ``i % servers`` as its primary (one range per server unless the run
cuts its keys into more, ``cluster.key_ranges``), so the primaries stay balanced. The ring has
one position per range a server serves (its virtual nodes: blake2b of ``server-<rank>-<vnode>``),
and range ``i`` sits at its primary's ``i // servers``-th. Its backups are the next ``K``
distinct servers met walking clockwise from there, as OSDI'14 (seed 003) places them: "server
nodes store a replica of (key, value) pairs in k nodes counter clockwise to it" (the ring's
direction is a convention). With one range per server the successor of each position is another
server's only position, so every server holds exactly ``K`` backups; with more ranges, about
``K`` per range it serves. Because the positions are hashed, not in rank order, one server's
ranges are backed up by different servers. A chain is the primary followed by its backups in
ring order; the tail is the last one.

(Until issue 40 every server had 64 positions whatever it served, and a range's backups were the
servers after one of them: balls in bins, 0 to 4 backups per server at 32 servers and K = 1.)
"""

from __future__ import annotations

import bisect
import hashlib
import math

from engine.errors import ConfigError

# The most key ranges a server may serve (its positions on the ring).
MAX_VNODES = 64


def _position(label: str) -> int:
    return int.from_bytes(hashlib.blake2b(label.encode(), digest_size=8).digest(), "big")


def chains(servers: int, replicas: int, vnodes: int | None = None,
           ranges: int | None = None) -> list[tuple[int, ...]]:
    """For each key range (``ranges``, one per server by default), the servers holding it:
    primary first. Each server has ``vnodes`` positions on the ring (by default as many as
    the ranges it serves)."""
    if replicas < 0 or replicas >= servers:
        raise ConfigError(f"{replicas} replicas need at least {replicas + 1} servers; there are "
                          f"{servers}")
    count = servers if ranges is None else ranges
    if not servers <= count <= servers * MAX_VNODES:
        raise ConfigError(f"{count} key ranges over {servers} servers: between one and "
                          f"{MAX_VNODES} per server")
    served = math.ceil(count / servers)
    vnodes = served if vnodes is None else vnodes
    if vnodes < served:
        raise ConfigError(f"{vnodes} positions per server cannot place {served} ranges each")
    ring = sorted((_position(f"server-{s}-{v}"), s) for s in range(servers) for v in range(vnodes))
    points = [p for p, _ in ring]
    result = []
    for index in range(count):
        primary, vnode = index % servers, index // servers
        chain = [primary]
        at = bisect.bisect_right(points, _position(f"server-{primary}-{vnode}"))
        while len(chain) < replicas + 1:
            server = ring[at % len(ring)][1]
            if server not in chain:
                chain.append(server)
            at += 1
        result.append(tuple(chain))
    return result


def held_by(server: int, all_chains: list[tuple[int, ...]]) -> list[int]:
    """The key ranges ``server`` holds a copy of: those it is the primary of first."""
    primary = [i for i, chain in enumerate(all_chains) if chain[:1] == (server,)]
    return primary + [i for i, chain in enumerate(all_chains) if server in chain[1:]]
