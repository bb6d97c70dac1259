"""The coordinator's part for moving key ranges between servers while a job trains.

Three moves, each a few orders to the servers, one after another, each answered by an event:

- **add a copy** of a range on a server (``Adopt`` an empty copy, if it holds none): the chain's
  tail snapshots its copy and, in the same step, keeps every later update for the newcomer
  (``Handoff``: acknowledgements of pushes wait from then on); the newcomer loads the snapshot
  (``Restore``); the tail links to it and sends what it kept (``Chain``). The newcomer is the
  chain's tail from then on.
- **move a range's primary** to another of its copies: the primary stops serving workers and
  waits until every update it applied reached the tail (``Demote``); every copy is then the
  same, so the chain is relinked with the new primary first (``Chain``, ``Promote``); workers
  are told where the copies are (``Replicas``), and the old primary closes their connections
  (``Release``), which moves them.
- **drop a copy**: its predecessor forwards to its successor (``Chain``), then the copy closes
  (``Drop``).

With them: a server that died and was started again takes back the copies it held and the
ranges it served (re-replication: K + 1 copies again); a server that joins (``psctl scale
--servers``) takes whole ranges from the busiest servers, which drop them; a server that leaves
hands each of its copies to the least busy server first. Only the keys of the moved ranges
travel.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from engine.consistency.registry import CONSISTENCY_MODELS, HANDOFF
from engine.roles.peer import Hub, RunState
from engine.roles.placement import Placement
from engine.wire.messages import (
    Adopt,
    Chain,
    Demote,
    Drop,
    Exit,
    Handoff,
    Message,
    Promote,
    Release,
    Replicas,
    Restore,
)
from engine.wire.records import EventRecord

HANDOFF_ATTEMPTS = 3
# Each order and the event that answers it; failures answer with one of FAILED_KINDS.
ANSWERS: dict[type[Message], str] = {
    Adopt: "copy_listening", Handoff: "handoff_saved", Restore: "handoff_restored",
    Chain: "chain_linked", Promote: "promoted", Demote: "demoted", Release: "released",
    Drop: "copy_dropped"}
FAILED_KINDS = ("handoff_failed", "chain_link_failed", "demote_failed", "order_failed")
MOVE_KINDS = (*ANSWERS.values(), *FAILED_KINDS)
# Learning rules whose per-shard state (staleness windows, per-worker sums) a snapshot lacks.
STATEFUL_RULES = ("dynssgc", "adaptive", "split")


class MoveAborted(Exception):
    """A step of a move did not happen; the reason says why."""


class Moves:
    """Moves key-range copies between servers, one move at a time. It owns the waits for the
    servers' answers (fed by ``on_server_event``) and changes the run's placement; it asks the
    coordinator only to send, record and spawn (``Hub``)."""

    def __init__(self, state: RunState, hub: Hub) -> None:
        self.state, self.hub = state, hub
        self._waiters: dict[tuple[int, int], asyncio.Future[EventRecord]] = {}
        self._moving = asyncio.Lock()

    @property
    def placement(self) -> Placement:
        return self.state.placement

    def busy(self) -> bool:
        """Whether a move is under way (a membership change waits for none: it is refused)."""
        return self._moving.locked()

    # -- answers --------------------------------------------------------------------------------

    def on_server_event(self, row: EventRecord) -> None:
        """A server's answer to a move's order, by (server, range)."""
        rank, index = row.detail.get("rank"), row.detail.get("index")
        if row.kind not in MOVE_KINDS or not (isinstance(rank, int) and isinstance(index, int)):
            return
        if row.kind == "copy_listening" and isinstance(row.detail.get("address"), str):
            self.placement.serving(rank, {index: row.detail["address"]})
        waiter = self._waiters.pop((rank, index), None)
        if waiter is not None and not waiter.done():
            waiter.set_result(row)

    def abandon(self, rank: int) -> None:
        """``rank`` is lost: whatever a move waits of it will not come."""
        for key in [k for k in self._waiters if k[0] == rank]:
            waiter = self._waiters.pop(key)
            if not waiter.done():
                waiter.set_exception(MoveAborted(f"server {rank} was lost"))

    def refusal(self) -> str | None:
        """Why this run cannot move a copy of a range to another server, if it cannot."""
        config = self.state.config
        if self.state.folder is None:
            return "the run has no folder to hand copies over through"
        if not CONSISTENCY_MODELS.can(config.sync.model, HANDOFF):
            return (f"{config.sync.model} keeps state that a copy handed over cannot "
                    "have (ElasticBSP places its barriers from a timing history), so the copy "
                    "would drift from the others")
        if config.learning.rule in STATEFUL_RULES:
            return (f"learning.rule {config.learning.rule} keeps per-shard state that a "
                    "handoff does not carry")
        if self.state.membership.scaled:
            return "the job changed its workers (psctl scale); its copies cannot be handed over"
        return None

    # -- policies -------------------------------------------------------------------------------

    async def rereplicate(self, rank: int) -> None:
        """A server that came back takes back every range it held at the start, and serves
        again those it served."""
        async with self._moving:
            if self.state.leaving_server(rank):  # told to leave before it died: it stays idle
                return
            # A range with no live copy left is gone (the run has failed): nothing to copy from.
            ranges = [i for i in self.placement.rejoining(rank) if self.placement.chains[i]]
            refusal = self.refusal()
            if refusal is not None:
                self.hub.event("rereplication_refused", rank=rank, ranges=ranges, reason=refusal)
                return
            for index in ranges:
                if not await self._try("rereplication_failed", self._add_copy, index, rank):
                    return
            for index in [i for i in ranges if self.placement.first[i][0] == rank]:
                if not await self._try("rereplication_failed", self._move_primary, index, rank):
                    return

    async def take_ranges(self, rank: int) -> None:
        """A server that joined takes ranges from the servers that serve the most, until each
        serves about as many as the others."""
        async with self._moving:
            while not self.state.leaving_server(rank):
                servers = [s for s in self.state.live_servers() if not self.state.leaving_server(s)]
                served = {s: len(self.placement.primaries(s)) for s in servers}
                share = len(self.placement.ranges) // len(servers)
                donor = max((s for s in servers if s != rank), key=lambda s: (served[s], s),
                            default=None)
                if (donor is None or rank not in served or served[rank] >= share
                        or served[donor] <= share):
                    break
                index = self.placement.primaries(donor)[-1]
                if not await self._try("move_failed", self._hand_range, index, donor, rank):
                    return

    async def retire(self, rank: int) -> None:
        """A server that leaves first hands each of its copies to the least busy server that
        holds none of that range, then exits."""
        async with self._moving:
            for index in [i for i, chain in enumerate(self.placement.chains) if rank in chain]:
                holders = self.placement.chains[index]
                servers = [s for s in self.state.live_servers()
                           if not self.state.leaving_server(s) and s not in holders]
                if not servers:
                    self.hub.event("move_failed", index=index, rank=rank,
                                   reason="no server left to take the range")
                    return
                load = self.placement.load(servers)
                heir = min(servers, key=lambda s: (load[s], s))
                if not await self._try("move_failed", self._hand_range, index, rank, heir):
                    return
            self.hub.event("server_left", rank=rank)
            peer = self.state.peers.get(("server", rank))
            if peer is not None and not peer.lost:
                peer.leaving = True
                await self.hub.send(peer, Exit())

    async def _try(self, failed: str, move: Callable[..., Awaitable[None]], *args: int) -> bool:
        """Run a move, again after a failure (``HANDOFF_ATTEMPTS`` in all) while the servers
        it needs live; False once it gives up."""
        for attempt in range(1, HANDOFF_ATTEMPTS + 1):
            try:
                await move(*args)
                return True
            except MoveAborted as exc:
                for index in args[:1]:
                    self.placement.abandon_join(index)
                self.hub.event(failed, index=args[0], servers=list(args[1:]), attempt=attempt,
                               reason=str(exc))
                if not all(self.state.alive_server(s) for s in args[1:]):
                    return False
        return False

    # -- moves ----------------------------------------------------------------------------------

    async def _hand_range(self, index: int, giver: int, taker: int) -> None:
        """``taker`` takes ``giver``'s copy of a range (and serves it, if ``giver`` did)."""
        if taker not in self.placement.chains[index]:
            await self._add_copy(index, taker)
        if self.placement.chains[index][0] == giver:
            await self._move_primary(index, taker)
        if giver in self.placement.chains[index]:
            await self._drop_copy(index, giver)

    async def _add_copy(self, index: int, rank: int) -> None:
        """Hand ``rank`` a copy of the range: it becomes the chain's tail."""
        if rank in self.placement.chains[index]:
            return
        started = time.time()
        if (index, rank) not in self.placement.addresses:
            keys = self.placement.ranges[index]
            await self._step(rank, index, Adopt(index=index, start=keys.start, end=keys.end))
        tail = self.placement.begin_join(index, rank)
        assert self.state.folder is not None  # move_refusal says so
        path = str(self.state.folder / "handoff" / f"shard-{index}-to-{rank}.npz")
        saved = await self._step(tail, index, Handoff(index=index, path=path))
        try:
            restored = await self._step(rank, index, Restore(index=index, path=path))
        except MoveAborted:
            if self.state.alive_server(tail):  # it acknowledges on its own again
                self.hub.spawn(self.hub.send(self.state.peers[("server", tail)],
                                             Chain(index=index, successor=None)))
            raise
        if self.placement.chains[index][-1:] != (tail,):
            raise MoveAborted(f"server {tail} is no longer shard {index}'s tail")
        linked = await self._step(tail, index, Chain(
            index=index, successor=self.placement.addresses[(index, rank)]))
        self.placement.join(index, rank)
        self.hub.event("rereplicated", index=index, rank=rank, tail=tail,
                       chain=list(self.placement.chains[index]), bytes=saved.detail.get("bytes"),
                       restore_s=restored.detail.get("seconds"),
                       held_s=linked.detail.get("held_s"),
                       seconds=round(time.time() - started, 4))
        await self._broadcast_replicas()

    async def _move_primary(self, index: int, rank: int) -> None:
        """``rank``, a copy of the range, serves it from now on."""
        chain = self.placement.chains[index]
        if rank not in chain:
            raise MoveAborted(f"server {rank} holds no copy of shard {index} to serve it from")
        old = chain[0]
        if old == rank:
            return
        started = time.time()
        self.state.failed_over_at.pop(index, None)  # a planned move is no failover to time
        try:
            drained = await self._step(old, index, Demote(index=index))
            for order in self.placement.reorder(index, rank):
                await self._step(order.server, index, order.message)
        except MoveAborted:
            self._serve_anyway(index)
            raise
        await self._broadcast_replicas()
        await self._step(old, index, Release(index=index))
        self.hub.event("primary_moved", index=index, rank=rank, previous=old,
                       chain=list(self.placement.chains[index]),
                       drain_s=drained.detail.get("seconds"),
                       seconds=round(time.time() - started, 4))

    async def _drop_copy(self, index: int, rank: int) -> None:
        for order in self.placement.drop(index, rank):
            await self._step(order.server, index, order.message)
        await self._step(rank, index, Drop(index=index))
        self.hub.event("copy_dropped_from", index=index, rank=rank,
                       chain=list(self.placement.chains[index]))
        await self._broadcast_replicas()

    async def _step(self, rank: int, index: int, message: Message) -> EventRecord:
        """Send one order to a server and wait for its answer."""
        if not self.state.alive_server(rank):
            raise MoveAborted(f"server {rank} is gone")
        waiter: asyncio.Future[EventRecord] = asyncio.get_running_loop().create_future()
        self._waiters[(rank, index)] = waiter
        await self.hub.send(self.state.peers[("server", rank)], message)
        try:
            row = await asyncio.wait_for(waiter, self.state.config.cluster.request_timeout_s)
        except TimeoutError:
            self._waiters.pop((rank, index), None)
            raise MoveAborted(f"server {rank} did not answer {type(message).__name__} in "
                              "time (cluster.request_timeout_s)") from None
        if row.kind != ANSWERS[type(message)]:
            raise MoveAborted(f"server {rank}: {row.detail.get('message', row.kind)}")
        return row

    # -- helpers --------------------------------------------------------------------------------

    def _serve_anyway(self, index: int) -> None:
        """A primary move broke off (a server died, one did not answer): the chain's head, as
        the coordinator has it now, serves the range, so that it is never left unserved (a
        copy demoted but not replaced, or a new head not promoted yet)."""
        chain = self.placement.chains[index]
        if chain and self.state.alive_server(chain[0]):
            head = self.state.peers[("server", chain[0])]
            self.hub.spawn(self.hub.send(head, Promote(index=index)))

    async def _broadcast_replicas(self) -> None:
        """Tell every worker and the evaluator where each range's copies are now (before a
        copy they use stops serving them)."""
        message = Replicas(copies=self.placement.copies_of())
        clients = [peer for peer in self.state.peers.values()
                   if peer.role in ("worker", "evaluator") and peer.welcomed and not peer.leaving]
        await asyncio.gather(*(self.hub.send(peer, message) for peer in clients))
