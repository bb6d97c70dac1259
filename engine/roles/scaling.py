"""The coordinator's part for ``psctl scale``: reading the request, telling the launcher whom to
start and the servers who the workers are, welcoming newcomers (``engine.roles.membership``)."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from typing import Any

from engine.errors import PsctlError
from engine.roles.membership import SPAWN_FILE, check_scalable, wanted_workers, write_json
from engine.roles.peer import CoordinatorBase, Peer
from engine.wire.messages import Members, Stop

SCALE_POLL_S = 0.5  # how often the run's folder is read for a psctl scale request


class Scaling(CoordinatorBase):
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
        handled: tuple[int, float] | None = None
        while True:
            await asyncio.sleep(SCALE_POLL_S)
            wanted = wanted_workers(self.folder)
            if wanted is None or wanted == handled or self._stop_reason is not None:
                continue
            handled = wanted
            self._scale(wanted[0])

    def _scale(self, target: int) -> None:
        try:
            check_scalable(self.config.sync.model, self.config.learning.rule,
                           self.config.train.push_every)
        except PsctlError as exc:
            self._event("scale_refused", workers=target, reason=str(exc))
            return
        joining, leaving = self.membership.scale_to(target)
        self._event("membership", workers=target, joining=joining, leaving=leaving)
        if joining and self.folder is not None:  # the launcher starts them
            write_json(self.folder / SPAWN_FILE, {"ranks": sorted(self.membership.started)})
        for rank in leaving:
            peer = self.peers.get(("worker", rank))
            if peer is not None and peer.welcomed:
                self._spawn(self._send(peer, Stop(reason=f"scaled down to {target} workers")))

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
