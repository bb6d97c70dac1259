"""Where each key range's copies live: its primary and ``K`` backups along a consistent-hash ring.

Key range ``i`` (one per server, as without replicas) has server ``i`` as its primary, so the
primaries stay balanced. Its backups are the next ``K`` distinct servers met walking clockwise
from the primary's first virtual node on a ring where every server has ``VNODES`` positions
(blake2b of ``server-<rank>-<vnode>``): each server backs up about ``K`` ranges, and the backups
of one server's ranges are spread over the others rather than all on its neighbour. A chain is
the primary followed by its backups in ring order; the tail is the last one.
"""

from __future__ import annotations

import bisect
import hashlib

from engine.errors import ConfigError

VNODES = 64


def _position(label: str) -> int:
    return int.from_bytes(hashlib.blake2b(label.encode(), digest_size=8).digest(), "big")


def chains(servers: int, replicas: int, vnodes: int = VNODES) -> list[tuple[int, ...]]:
    """For each key range (one per server), the servers holding it: primary first."""
    if replicas < 0 or replicas >= servers:
        raise ConfigError(f"{replicas} replicas need at least {replicas + 1} servers; there are "
                          f"{servers}")
    ring = sorted((_position(f"server-{s}-{v}"), s) for s in range(servers) for v in range(vnodes))
    points = [p for p, _ in ring]
    result = []
    for primary in range(servers):
        chain = [primary]
        at = bisect.bisect_right(points, _position(f"server-{primary}-0"))
        while len(chain) < replicas + 1:
            server = ring[at % len(ring)][1]
            if server not in chain:
                chain.append(server)
            at += 1
        result.append(tuple(chain))
    return result


def held_by(server: int, all_chains: list[tuple[int, ...]]) -> list[int]:
    """The key ranges ``server`` holds a copy of (its own first)."""
    others = [i for i, chain in enumerate(all_chains) if server in chain and i != server]
    return ([server] if server < len(all_chains) and server in all_chains[server] else []) + \
        others
