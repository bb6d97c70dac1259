"""The coordinator's part for ``psctl scale``: answering its request, telling the launcher whom to
start and the servers who the workers are, welcoming newcomers (``engine.roles.membership``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable
from typing import Any

from engine.errors import ConfigError, PsctlError
from engine.roles.joining import role_config
from engine.roles.membership import check_count, check_scalable, check_servers_scalable
from engine.roles.moves import Moves
from engine.roles.peer import Hub, Peer, RunState
from engine.wire.messages import Members, Stop
from engine.wire.records import EventRecord

log = logging.getLogger(__name__)

# Refused psctl scale requests recorded as events, as refused hellos are (the rest are counted).
REFUSALS_RECORDED = 100


class Scaling:
    """Owns ``psctl scale``: answers its request (``request``), changes the run's
    memberships, tells the launcher whom to start and the servers who the workers are, and
    welcomes newcomers. It asks the moves whether ranges may move (``refusal``, ``busy``) and
    hands leaving servers to them (``retire``)."""

    def __init__(self, state: RunState, hub: Hub, moves: Moves,
                 start: Callable[[list[int], list[int]], None]) -> None:
        """``start(workers, servers)`` tells the launcher every worker and server rank the job
        has (it starts those it has not)."""
        self.state, self.hub, self.moves, self._start = state, hub, moves, start
        self._acked: set[int] = set()  # servers that applied the last set of workers
        self._acks = asyncio.Event()
        self._join_clocks: dict[int, int] = {}
        self._newcomers: dict[int, dict[str, Any]] = {}  # rank -> what its welcome changes
        self.refused = 0  # psctl scale requests refused

    def on_server_event(self, row: EventRecord) -> None:
        if row.kind == "members_updated" and isinstance(row.detail.get("rank"), int):
            self._on_members_updated(row.detail)

    def welcome_of(self, rank: int) -> dict[str, Any]:
        """What a newcomer worker's welcome changes (nothing for one of the first workers)."""
        return self._newcomers.get(rank, {})

    def _on_members_updated(self, detail: dict[str, Any]) -> None:
        """A server applied the new set of workers; a newcomer starts at the smallest clock
        any server gave it."""
        self._acked.add(detail["rank"])
        for worker, clock in dict(detail.get("starts") or {}).items():
            if isinstance(clock, int):
                rank = int(worker)
                self._join_clocks[rank] = min(clock, self._join_clocks.get(rank, clock))
        self._acks.set()

    def request(self, role: str, target: int) -> tuple[str, dict[str, Any]]:
        """``psctl scale``'s request for ``target`` workers or servers, done or refused;
        answered with the event that says so (it is recorded too)."""
        try:
            check_count(role, target)
            if not self.state.training.is_set():
                raise ConfigError("the job takes psctl scale once training has started; ask "
                                  "again then")
            if self.state.stop_reason is not None:
                raise ConfigError(f"the run is stopping ({self.state.stop_reason})")
            change = self._scale if role == "workers" else self._scale_servers
            kind, detail = change(target)
        except PsctlError as exc:
            kind, detail = "scale_refused", {role: target, "reason": str(exc)}
            self._record_refusal(detail)
            return kind, detail
        self.hub.event(kind, **detail)
        return kind, detail

    def _record_refusal(self, detail: dict[str, Any]) -> None:
        """A refusal is answered always, recorded the first REFUSALS_RECORDED times (with the
        count so far) and then only counted and logged once: a loop of requests must not grow
        the database without bound."""
        self.refused += 1
        if self.refused <= REFUSALS_RECORDED:
            self.hub.event("scale_refused", **detail, refused=self.refused)
        elif self.refused == REFUSALS_RECORDED + 1:
            log.warning("refused psctl scale %s times; more refusals are counted, not "
                        "recorded", REFUSALS_RECORDED + 1)

    def _scale(self, target: int) -> tuple[str, dict[str, Any]]:
        config = self.state.config
        check_scalable(config.sync.model, config.learning.rule, config.train.push_every)
        if self.moves.busy():  # a handoff carries no membership change
            raise ConfigError("servers are moving key ranges right now; ask again once they "
                              "are done (the run's events say when)")
        joining, leaving = self.state.membership.scale_to(target)
        if joining:  # the launcher starts them
            self._start_roles()
        for rank in leaving:
            peer = self.state.peers.get(("worker", rank))
            if peer is not None and peer.welcomed:
                stop = Stop(reason=f"scaled down to {target} workers")
                self.hub.spawn(self.hub.send(peer, stop))
        return "membership", {"workers": target, "joining": joining, "leaving": leaving}

    def _scale_servers(self, target: int) -> tuple[str, dict[str, Any]]:
        """Servers join (new ranks: the launcher starts them, each takes ranges from the
        busiest) or leave (the highest ranks: each hands its copies over, then exits)."""
        current = len(self.state.server_members.active)
        check_servers_scalable(current, target, len(self.state.placement.ranges),
                               self.state.config.cluster.replicas)
        refusal = self.moves.refusal()
        if refusal is not None:
            raise ConfigError(refusal)
        joining, leaving = self.state.server_members.scale_to(target)
        if joining:
            self._start_roles()
        for rank in leaving:
            self.hub.spawn(self.moves.retire(rank))
        return "server_membership", {"servers": target, "joining": joining, "leaving": leaving}

    def _start_roles(self) -> None:
        self._start(sorted(self.state.membership.started),
                    sorted(self.state.server_members.started))

    async def admit_newcomer(self, peer: Peer) -> None:
        """The servers count the newcomer before it can ask them anything; it trains on its
        share of the data for the epochs left, from the clock the servers gave it (a restart
        of it gets the same welcome)."""
        await self.update_members()
        self.state.membership.joining.discard(peer.rank)
        workers = len(self.state.membership.active)
        first = self.state.config.cluster.workers  # the run's epochs are its first workers'
        left = max(1, math.ceil(self.state.config.train.epochs - self.state.progress.epoch(first)))
        config = self.state.config.model_copy(update={
            "cluster": self.state.config.cluster.model_copy(update={"workers": workers}),
            "train": self.state.config.train.model_copy(update={"epochs": left})})
        base = self._join_clocks.get(peer.rank, 0)
        self.hub.event("worker_joined", rank=peer.rank, workers=workers, epochs=left, clock=base)
        self._newcomers[peer.rank] = {"config": role_config(config), "clock_base": base}

    async def update_members(self) -> None:
        """Tell every live server who the workers are; returns once all have applied it."""
        workers = sorted((self.state.membership.active | self.state.membership.leaving)
                         - self.state.progress.done)
        servers = self.state.live_servers()
        self._acked = set()
        await asyncio.gather(*(self.hub.order(s, Members(workers=workers)) for s in servers))
        deadline = time.monotonic() + self.state.config.cluster.request_timeout_s
        while not set(servers) <= self._acked:
            self._acks.clear()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.hub.fail("the servers did not take the new set of workers in time")
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._acks.wait(), remaining)
