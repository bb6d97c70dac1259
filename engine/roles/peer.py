"""What the coordinator knows of each process of a run and of the run's progress (``RunState``),
shared with its parts (``recovery``, ``moves``, ``scaling``, ``evaluations``, ``parties``), and
what a part may ask of the coordinator (``Hub``)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from engine.config import RunConfig
from engine.roles.membership import Membership
from engine.roles.placement import Placement
from engine.transport.base import Connection
from engine.wire.messages import Message


@dataclass
class Peer:
    role: str
    rank: int
    connection: Connection
    leaving: bool = False
    welcomed: bool = False  # a role reads its welcome first: nothing else may reach it before
    pid: int = 0
    ours: bool = True  # it runs on the coordinator's machine: its pid may be signalled
    lost: bool = False  # a worker that died; its restart takes its place
    fenced: bool = False  # a server killed for not answering heartbeats
    rejoined: bool = False  # a server started again after it died: it starts empty
    newcomer: bool = False  # a server that joined a running job (psctl scale): it starts empty
    incarnation: int = 0  # a server's: drawn at its welcome, carried by each of its heartbeats

    def __str__(self) -> str:
        return f"{self.role} {self.rank}"


@dataclass
class Progress:
    iterations_per_epoch: dict[int, int] = field(default_factory=dict)
    iterations: dict[int, int] = field(default_factory=dict)
    epochs_done: dict[int, int] = field(default_factory=dict)
    done: set[int] = field(default_factory=set)
    # A resumed run's highest evaluated epoch: its epochs never go back, even while only some
    # of its workers have said where they start again.
    epoch_floor: float = 0.0

    def epoch(self, workers: int) -> float:
        """Training progress in epochs, averaged over the job's first ``workers`` workers
        (newcomers of a scaled job count epochs of their own)."""
        fractions = [self.iterations.get(w, 0) / ipe
                     for w, ipe in self.iterations_per_epoch.items() if w < workers]
        return max(self.epoch_floor, sum(fractions) / workers if fractions else 0.0)


@dataclass
class RunState:
    """What the coordinator and its parts (recovery, moves, scaling) know of the run: each
    part reads it and changes only its own share, as its docstring says."""

    config: RunConfig
    run_id: str
    folder: Path | None  # the run's folder (checkpoints, handoffs, psctl scale); None: none
    placement: Placement
    membership: Membership  # worker ranks: started, joining, leaving (psctl scale)
    server_members: Membership  # server ranks: started, leaving (psctl scale --servers)
    peers: dict[tuple[str, int], Peer] = field(default_factory=dict)
    progress: Progress = field(default_factory=Progress)
    restarts: dict[tuple[str, int], int] = field(default_factory=dict)  # (role, rank) -> count
    failed_over_at: dict[int, float] = field(default_factory=dict)  # range -> primary lost at
    training: asyncio.Event = field(default_factory=asyncio.Event)
    servers_ready: asyncio.Event = field(default_factory=asyncio.Event)
    training_at: float = 0.0  # time.monotonic() when training started
    stop_reason: str | None = None  # set once the run is stopping

    def servers(self) -> list[Peer]:
        return [p for p in self.peers.values() if p.role == "server"]

    def live_servers(self) -> list[int]:
        return [p.rank for p in self.servers() if not p.lost]

    def alive_server(self, rank: int) -> bool:
        peer = self.peers.get(("server", rank))
        return peer is not None and not peer.lost and not peer.fenced

    def leaving_server(self, rank: int) -> bool:
        peer = self.peers.get(("server", rank))
        return peer is None or peer.leaving or rank in self.server_members.leaving


class Hub(Protocol):
    """What a part of the coordinator may ask of the coordinator itself (``Coordinator`` is
    one): the parts never call each other through it."""

    def fail(self, reason: str) -> None:
        """End the run as failed, saying why."""

    def stop(self, reason: str) -> None:
        """Stop training (the workers and servers are told), saying why; the run then ends
        with its final evaluation."""

    def event(self, kind: str, **detail: Any) -> None:
        """Record an event of the run."""

    async def send(self, peer: Peer, message: Message) -> None:
        """Send a control message to a role (a lost one's replacement gets its own)."""

    async def order(self, server: int, message: Message) -> None:
        """Send an order to a server by rank; the run fails if it is gone."""

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run a task of the run: its error ends the run."""
