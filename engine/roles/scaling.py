"""The coordinator's part for ``psctl scale``: reading the request, telling the launcher whom to
start and the servers who the workers are, welcoming newcomers (``engine.roles.membership``)."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from typing import Any

from engine.errors import ConfigError, PsctlError
from engine.roles.membership import (
    SPAWN_FILE,
    Membership,
    check_scalable,
    check_servers_scalable,
    wanted_servers,
    wanted_workers,
    write_json,
)
from engine.roles.peer import CoordinatorBase, Peer
from engine.wire.messages import Members, Stop

SCALE_POLL_S = 0.5  # how often the run's folder is read for a psctl scale request


class Scaling(CoordinatorBase):
    server_members: Membership
    _moving: asyncio.Lock
    _members_acked: set[int]
    _members_changed: asyncio.Event
    _join_clocks: dict[int, int]
    _newcomers: dict[int, dict[str, Any]]  # rank -> what its welcome changes

    def _on_members_updated(self, detail: dict[str, Any]) -> None:
        """A server applied the new set of workers; a newcomer starts at the smallest clock
        any server gave it."""
        self._members_acked.add(detail["rank"])
        for worker, clock in dict(detail.get("starts") or {}).items():
            if isinstance(clock, int):
                rank = int(worker)
                self._join_clocks[rank] = min(clock, self._join_clocks.get(rank, clock))
        self._members_changed.set()

    async def _watch_scale(self) -> None:
        if self.folder is None:
            return
        await self.training.wait()
        handled: dict[str, tuple[int, float] | None] = {"workers": None, "servers": None}
        while True:
            await asyncio.sleep(SCALE_POLL_S)
            for role, read, scale in (("workers", wanted_workers, self._scale),
                                      ("servers", wanted_servers, self._scale_servers)):
                wanted = read(self.folder)
                if wanted is None or wanted == handled[role] or self._stop_reason is not None:
                    continue
                handled[role] = wanted
                scale(wanted[0])

    def _scale(self, target: int) -> None:
        try:
            check_scalable(self.config.sync.model, self.config.learning.rule,
                           self.config.train.push_every)
            if self._moving.locked():  # a handoff carries no membership change
                raise ConfigError("servers are moving key ranges right now; ask again once "
                                  "they are done (the run's events say when)")
        except PsctlError as exc:
            self._event("scale_refused", workers=target, reason=str(exc))
            return
        joining, leaving = self.membership.scale_to(target)
        self._event("membership", workers=target, joining=joining, leaving=leaving)
        if joining:  # the launcher starts them
            self._write_spawn()
        for rank in leaving:
            peer = self.peers.get(("worker", rank))
            if peer is not None and peer.welcomed:
                self._spawn(self._send(peer, Stop(reason=f"scaled down to {target} workers")))

    def _scale_servers(self, target: int) -> None:
        """Servers join (new ranks: the launcher starts them, each takes ranges from the
        busiest) or leave (the highest ranks: each hands its copies over, then exits)."""
        current = len(self.server_members.active)
        try:
            check_servers_scalable(current, target, len(self.placement.ranges),
                                   self.config.cluster.replicas)
            refusal = self.move_refusal()
            if refusal is not None:
                raise ConfigError(refusal)
        except PsctlError as exc:
            self._event("scale_refused", servers=target, reason=str(exc))
            return
        joining, leaving = self.server_members.scale_to(target)
        self._event("server_membership", servers=target, joining=joining, leaving=leaving)
        if joining:
            self._write_spawn()
        for rank in leaving:
            self._spawn(self._retire(rank))

    def _write_spawn(self) -> None:
        if self.folder is not None:
            write_json(self.folder / SPAWN_FILE, {"ranks": sorted(self.membership.started),
                                                  "servers": sorted(self.server_members.started)})

    async def _admit_newcomer(self, peer: Peer) -> None:
        """The servers count the newcomer before it can ask them anything; it trains on its
        share of the data for the epochs left, from the clock the servers gave it (a restart
        of it gets the same welcome)."""
        await self._update_members()
        self.membership.joining.discard(peer.rank)
        workers = len(self.membership.active)
        first = self.config.cluster.workers  # the run's epochs are its first workers'
        left = max(1, math.ceil(self.config.train.epochs - self.progress.epoch(first)))
        config = self.config.model_copy(update={
            "cluster": self.config.cluster.model_copy(update={"workers": workers}),
            "train": self.config.train.model_copy(update={"epochs": left})})
        base = self._join_clocks.get(peer.rank, 0)
        self._event("worker_joined", rank=peer.rank, workers=workers, epochs=left, clock=base)
        self._newcomers[peer.rank] = {"config": self._role_config_of(config), "clock_base": base}

    async def _update_members(self) -> None:
        """Tell every live server who the workers are; returns once all have applied it."""
        workers = sorted((self.membership.active | self.membership.leaving)
                         - self.progress.done)
        servers = self._live_servers()
        self._members_acked = set()
        await asyncio.gather(*(self._order(s, Members(workers=workers)) for s in servers))
        deadline = time.monotonic() + self.config.cluster.request_timeout_s
        while not set(servers) <= self._members_acked:
            self._members_changed.clear()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.fail("the servers did not take the new set of workers in time")
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._members_changed.wait(), remaining)
