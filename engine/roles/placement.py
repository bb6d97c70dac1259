"""The coordinator's map of where every key range's copies live, and what changes when a server
dies (``engine.replication``): which backup becomes the primary, which copy forwards to whom.

Without replicas every chain is one server long and a lost server cannot be replaced.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.keys import KeyRange
from engine.replication.ring import chains, held_by
from engine.wire.messages import Chain, Message, Promote, ShardInfo


@dataclass(frozen=True)
class Order:
    """A message for one server."""

    server: int
    message: Message


class Placement:
    def __init__(self, ranges: list[KeyRange], replicas: int) -> None:
        self.ranges, self.replicas = ranges, replicas
        self.chains = chains(len(ranges), replicas)  # alive copies only, primary first
        self.addresses: dict[tuple[int, int], str] = {}  # (range, server) -> its listener
        self.lost: set[int] = set()

    def held(self, server: int) -> list[ShardInfo]:
        """The ranges ``server`` backs up (its welcome lists them)."""
        return [self._info(i, "") for i in held_by(server, self.chains) if i != server]

    def serving(self, server: int, own: str, backups: list[ShardInfo]) -> None:
        self.addresses[(server, server)] = own
        for info in backups:
            self.addresses[(info.index, server)] = info.address

    @property
    def copies(self) -> int:
        return sum(len(chain) for chain in self.chains)

    def all_serving(self) -> bool:
        return len(self.addresses) == self.copies

    def links(self) -> list[Order]:
        """Every copy's successor, once all listen (None for a tail)."""
        return [Order(server, Chain(index=i, successor=self._next(i, pos)))
                for i, chain in enumerate(self.chains) for pos, server in enumerate(chain)]

    def shard_map(self) -> list[ShardInfo]:
        return [self._info(i, self.addresses[(i, chain[0])])
                for i, chain in enumerate(self.chains)]

    def backups(self) -> dict[int, list[str]]:
        """Per range, the addresses of its backups in chain order (a client tries them when its
        primary is gone)."""
        return {i: [self.addresses[(i, s)] for s in chain[1:]]
                for i, chain in enumerate(self.chains) if len(chain) > 1}

    def lose(self, server: int) -> tuple[list[Order], list[int], list[int]]:
        """``server`` died: (the orders that repair every chain it was in, the ranges whose
        primary it was and that fail over, the ranges left without any copy)."""
        self.lost.add(server)
        orders, failed_over, gone = [], [], []
        for i, chain in enumerate(self.chains):
            if server not in chain:
                continue
            position = chain.index(server)
            self.chains[i] = chain = tuple(s for s in chain if s != server)
            if not chain:
                gone.append(i)
            elif position == 0:
                failed_over.append(i)
                orders.append(Order(chain[0], Promote(index=i)))
            else:  # its predecessor forwards to its successor (or is the tail now)
                orders.append(Order(chain[position - 1],
                                    Chain(index=i, successor=self._next(i, position - 1))))
        return orders, failed_over, gone

    def _next(self, index: int, position: int) -> str | None:
        chain = self.chains[index]
        return self.addresses[(index, chain[position + 1])] if position + 1 < len(chain) else None

    def _info(self, index: int, address: str) -> ShardInfo:
        keys = self.ranges[index]
        return ShardInfo(index=index, address=address, start=keys.start, end=keys.end)
