"""Where each key range's copies live: its primary and ``K`` backups along a consistent-hash ring.

Key range ``i`` has server ``i % servers`` as its primary (one range per server unless the run
cuts its keys into more, ``cluster.key_ranges``), so the primaries stay balanced. Its backups are
the next ``K`` distinct servers met walking clockwise from one of the primary's virtual nodes (its
``i // servers``-th) on a ring where every server has ``VNODES`` positions (blake2b of
``server-<rank>-<vnode>``): each server backs up about ``K`` ranges per range it serves, and the
backups of one server's ranges are spread over the others rather than all on its neighbour. A
chain is the primary followed by its backups in ring order; the tail is the last one.
"""

from __future__ import annotations

import bisect
import hashlib

from engine.errors import ConfigError

VNODES = 64


def _position(label: str) -> int:
    return int.from_bytes(hashlib.blake2b(label.encode(), digest_size=8).digest(), "big")


def chains(servers: int, replicas: int, vnodes: int = VNODES,
           ranges: int | None = None) -> list[tuple[int, ...]]:
    """For each key range (``ranges``, one per server by default), the servers holding it:
    primary first."""
    if replicas < 0 or replicas >= servers:
        raise ConfigError(f"{replicas} replicas need at least {replicas + 1} servers; there are "
                          f"{servers}")
    count = servers if ranges is None else ranges
    if not servers <= count <= servers * vnodes:
        raise ConfigError(f"{count} key ranges over {servers} servers: between one and "
                          f"{vnodes} per server")
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
