"""What the coordinator knows of each process of a run, and of the run's progress; shared by the
coordinator (``coordination``) and its fault-tolerance and scaling parts (``recovery``,
``scaling``), which ``CoordinatorBase`` describes to each other."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.config import RunConfig
from engine.faults import FaultPlan
from engine.roles.checkpoints import CheckpointKeeper
from engine.roles.membership import Membership
from engine.roles.placement import Placement
from engine.transport.base import Connection
from engine.wire.messages import Message
from engine.wire.records import EventRecord


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


class CoordinatorBase:
    """The state and helpers the coordinator's parts share (``Coordinator`` and its parts set
    and define them all)."""

    config: RunConfig
    run_id: str
    folder: Path | None
    peers: dict[tuple[str, int], Peer]
    progress: Progress
    placement: Placement
    membership: Membership
    checkpoints: CheckpointKeeper | None
    faults: FaultPlan
    restarts: dict[tuple[str, int], int]
    training: asyncio.Event
    servers_ready: asyncio.Event
    _stop_reason: str | None

    def fail(self, reason: str) -> None:
        raise NotImplementedError

    def _event(self, kind: str, **detail: Any) -> None:
        raise NotImplementedError

    async def _send(self, peer: Peer, message: Message) -> None:
        raise NotImplementedError

    def _spawn(self, coro: Any) -> None:
        raise NotImplementedError

    # One part calls what another defines (the base comes last in the coordinator's MRO).
    def _live_servers(self) -> list[int]:
        raise NotImplementedError

    async def _order(self, server: int, message: Message) -> None:
        raise NotImplementedError

    def _role_config_of(self, config: RunConfig) -> dict[str, Any]:
        raise NotImplementedError

    def _on_members_updated(self, detail: dict[str, Any]) -> None:
        raise NotImplementedError

    def _on_move_event(self, row: EventRecord) -> None:
        raise NotImplementedError

    def _abandon_moves(self, rank: int) -> None:
        raise NotImplementedError

    async def _rereplicate(self, rank: int) -> None:
        raise NotImplementedError

    async def _take_ranges(self, rank: int) -> None:
        raise NotImplementedError

    async def _retire(self, rank: int) -> None:
        raise NotImplementedError

    def move_refusal(self) -> str | None:
        raise NotImplementedError
