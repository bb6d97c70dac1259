"""The network model: every endpoint (a worker, a shard server, the evaluator) has one link;
workers' links have ``regime.network``'s bandwidth and latency, servers' links
``regime.server_network``'s (the same unless set). A message occupies the sender's outgoing
side for ``bytes / its bandwidth`` and the receiver's incoming side for ``bytes / its
bandwidth``, first come first served on each side: it leaves when the sender's side has sent
it, its receiving starts when its first byte left or once the receiver's side is free, whichever
is later, and it arrives when both are done plus the larger latency (the real shaper,
``engine.transport.shaping``, paces each side the same way). Without ``--network`` the links
are this machine's loopback: no time of their own (what moving the bytes costs is the CPU's,
``engine.sim.cpu``); the evaluator's link is so always, as the real shaper leaves the
evaluator's connections alone."""

from __future__ import annotations

from engine.transport.shaping import LOOPBACK, NetworkModel, parse_network

__all__ = ["LOOPBACK", "Link", "NetworkModel", "link_of", "transmit"]


class Link:
    """One endpoint's link: its model, and when its outgoing and incoming sides are next free
    (virtual s)."""

    __slots__ = ("in_free", "model", "out_free")

    def __init__(self, model: NetworkModel) -> None:
        self.model = model
        self.in_free = 0.0
        self.out_free = 0.0


def link_of(spec: str | None) -> Link:
    """A link of ``spec`` (``BANDWIDTH:LATENCY``), or of loopback."""
    return Link(LOOPBACK if spec is None else parse_network(spec))


def transmit(now: float, source: Link, target: Link, nbytes: int) -> float:
    """Occupy both sides for the message; returns when it arrives."""
    start = max(now, source.out_free)
    source.out_free = start + source.model.transfer_s(nbytes)
    target.in_free = max(start, target.in_free) + target.model.transfer_s(nbytes)
    latency = max(source.model.latency_s, target.model.latency_s)
    return max(source.out_free, target.in_free) + latency
