"""The coordinator's map of where every key range's copies live, and what changes when a server
dies, comes back, joins or leaves (``engine.replication``): which copy is the primary, which
copy forwards to whom.

Without replicas every chain is one server long and a lost server cannot be replaced. A chain
grows by a copy appended after its tail (``begin_join`` .. ``join``: the tail hands its copy
over), changes its primary by putting another of its copies first (``reorder``: every copy is
the same then, the old primary having drained), and shrinks by dropping a copy (``drop``: its
predecessor forwards to its successor from then on).
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
    def __init__(self, ranges: list[KeyRange], replicas: int, servers: int | None = None) -> None:
        self.ranges, self.replicas = ranges, replicas
        count = len(ranges) if servers is None else servers
        # alive copies only, primary first
        self.chains = chains(count, replicas, ranges=len(ranges))
        self.first = list(self.chains)  # as the run started
        self.addresses: dict[tuple[int, int], str] = {}  # (range, server) -> its listener
        self.lost: set[int] = set()
        self.joining: dict[int, int] = {}  # range -> the server its tail hands a copy to

    def held(self, server: int) -> list[ShardInfo]:
        """Every range ``server`` holds a copy of at the start, those it serves first (its
        welcome lists them); the same when it comes back after dying."""
        return [self._info(i, "") for i in held_by(server, self.first)]

    def primaries(self, server: int) -> list[int]:
        return [i for i, chain in enumerate(self.chains) if chain[:1] == (server,)]

    def rejoining(self, server: int) -> list[int]:
        """The ranges a server that came back should hold again (those it served first)."""
        return [i for i in held_by(server, self.first) if server not in self.chains[i]]

    def serving(self, server: int, copies: dict[int, str]) -> None:
        for index, address in copies.items():
            self.addresses[(index, server)] = address

    @property
    def copies(self) -> int:
        return sum(len(chain) for chain in self.chains)

    def all_serving(self) -> bool:
        return all((i, s) in self.addresses for i, chain in enumerate(self.chains)
                   for s in chain)

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

    def copies_of(self) -> dict[int, list[str]]:
        """Per range, the addresses of its copies in chain order, the primary first."""
        return {i: [self.addresses[(i, s)] for s in chain] for i, chain in enumerate(self.chains)
                if chain}

    def only_copies(self, server: int) -> list[int]:
        """The ranges whose last live copy ``server`` holds: lost with it."""
        return [i for i, chain in enumerate(self.chains) if chain == (server,)]

    def load(self, servers: list[int]) -> dict[int, tuple[int, int]]:
        """Per server of ``servers``: (ranges it serves, copies it holds)."""
        return {s: (len(self.primaries(s)), sum(s in chain for chain in self.chains))
                for s in servers}

    # -- changes ---------------------------------------------------------------------------------

    def begin_join(self, index: int, server: int) -> int:
        """``server`` is joining range ``index``'s chain; returns the tail that hands over."""
        self.joining[index] = server
        return self.chains[index][-1]

    def join(self, index: int, server: int) -> None:
        """The joining copy has everything: it is the chain's tail from now on."""
        self.joining.pop(index, None)
        self.chains[index] = (*self.chains[index], server)
        self.lost.discard(server)

    def abandon_join(self, index: int) -> None:
        self.joining.pop(index, None)

    def reorder(self, index: int, primary: int) -> list[Order]:
        """``primary`` (a copy of the range) serves it from now on, the others following in
        their order: the orders that link the new chain, from its tail back to its head, and
        promote it. Only while no copy takes updates (every copy is then the same, and any
        order is a chain); tail first, so that the links ordered so far never form a cycle,
        should the move break off."""
        chain = self.chains[index]
        if primary not in chain:
            raise ValueError(f"server {primary} holds no copy of range {index}")
        self.chains[index] = (primary, *(s for s in chain if s != primary))
        links = [Order(s, Chain(index=index, successor=self._next(index, pos)))
                 for pos, s in enumerate(self.chains[index])]
        return [*reversed(links), Order(primary, Promote(index=index))]

    def drop(self, index: int, server: int) -> list[Order]:
        """``server`` no longer holds range ``index`` (it is not its primary): its predecessor
        forwards to its successor, or is the tail now."""
        chain = self.chains[index]
        position = chain.index(server)
        if position == 0:
            raise ValueError(f"server {server} serves range {index}; move it first")
        self.chains[index] = tuple(s for s in chain if s != server)
        self.addresses.pop((index, server), None)
        return [Order(chain[position - 1],
                      Chain(index=index, successor=self._next(index, position - 1)))]

    def lose(self, server: int) -> tuple[list[Order], list[int], list[int]]:
        """``server`` died: (the orders that repair every chain it was in, the ranges whose
        primary it was and that fail over, the ranges left without any copy)."""
        self.lost.add(server)
        for key in [k for k in self.addresses if k[1] == server]:  # it listens nowhere now
            del self.addresses[key]
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
        for i, joining in list(self.joining.items()):
            if joining == server and self.chains[i]:  # the tail stops holding updates for it
                del self.joining[i]
                orders.append(Order(self.chains[i][-1], Chain(index=i, successor=None)))
        return orders, failed_over, gone

    def _next(self, index: int, position: int) -> str | None:
        chain = self.chains[index]
        return self.addresses[(index, chain[position + 1])] if position + 1 < len(chain) else None

    def _info(self, index: int, address: str) -> ShardInfo:
        keys = self.ranges[index]
        return ShardInfo(index=index, address=address, start=keys.start, end=keys.end)
