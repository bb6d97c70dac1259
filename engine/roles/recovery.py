"""The coordinator's part for failures: restarting workers, failing a dead or silent server's
keys over to their backups, injected kills, and checkpoints (``docs/fault-tolerance.md``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from engine.errors import ConnectionClosed
from engine.faults import FaultPlan
from engine.replication.detector import Detector
from engine.roles.checkpoints import CheckpointKeeper
from engine.roles.liveness import ServerWatch
from engine.roles.peer import Hub, Peer, RunState
from engine.wire.beats import Beat
from engine.wire.messages import Checkpoint, dump_control
from engine.wire.records import EventRecord, RunStatus

# Refused heartbeats recorded as events one by one; after these, at each power of two.
BEATS_RECORDED = 10


class Recovery:
    """Owns the server watch, the restarts' bookkeeping and the checkpoints; fed every server
    event (``on_server_event``) and a server's or worker's loss by the coordinator, which runs
    its loops (``heartbeats``, ``inject_kills``, ``checkpoint_loop``) as tasks. It changes the
    run's placement when a server is lost, and tells the moves to give up waiting on it
    (``abandon``)."""

    def __init__(self, state: RunState, hub: Hub, *, abandon: Callable[[int], None],
                 kill: Callable[[int], None], first_checkpoint: int = 0) -> None:
        self.state, self.hub = state, hub
        self._abandon, self._kill = abandon, kill
        config = state.config
        self.faults = FaultPlan.of(config.fault.inject)
        self.watch = ServerWatch(
            Detector(config.cluster.heartbeat_timeout_s, config.cluster.heartbeat_timeout_s / 5),
            config.cluster.server_stall_s)
        self.checkpoints = None if state.folder is None else CheckpointKeeper(
            state.folder, len(state.placement.ranges), first_seq=first_checkpoint,
            send=self._order_server, event=hub.event)
        self._linked = 0  # chains linked at the start: the servers are ready once all are
        self._ended: dict[tuple[str, int], str] = {}  # role -> why it will not come back
        self._awaited: dict[tuple[str, int], Peer] = {}  # lost, its restart awaited
        self._killed_at: dict[tuple[str, int], float] = {}
        self.beats_refused = 0  # signed beats of another incarnation than the rank's present one

    def on_server_event(self, row: EventRecord) -> None:
        detail = row.detail
        if row.kind in ("checkpoint_saved", "checkpoint_failed") and self.checkpoints:
            self.checkpoints.on_saved(row.kind, detail)
        elif row.kind == "chain_linked" and not self.state.servers_ready.is_set():
            self._linked += 1
            if self._linked == self.state.placement.copies:
                self.state.servers_ready.set()
        elif row.kind == "failover_served" and isinstance(detail.get("index"), int):
            lost_at = self.state.failed_over_at.get(detail["index"])
            served = detail.get("first_pull_at")
            if lost_at is not None and isinstance(served, float):
                self.hub.event("failover_complete", index=detail["index"],
                               rank=detail.get("rank"), seconds=round(served - lost_at, 4))

    def fail_over(self, dead: Peer) -> None:
        """A server died: its backups take over its keys; every chain it was in is repaired."""
        if dead.lost:  # fenced, and now its connection closed too
            return
        dead.lost = True
        lost_at = self._killed_at.get(("server", dead.rank), time.time())
        orders, failed_over, gone = self.state.placement.lose(dead.rank)
        self._abandon(dead.rank)
        self.hub.event("server_lost", rank=dead.rank, pid=dead.pid)
        if gone:
            self.hub.fail(f"server {dead.rank} died holding the last copy of shards "
                          f"{', '.join(map(str, gone))}; resume the run from its last checkpoint "
                          f"with psctl resume {self.state.run_id[:8]}")
            return
        for index in failed_over:
            self.state.failed_over_at[index] = lost_at
            self.hub.event("failover", index=index, lost=dead.rank,
                           primary=self.state.placement.chains[index][0],
                           chain=list(self.state.placement.chains[index]))
        for order in orders:
            self.hub.spawn(self.hub.order(order.server, order.message))

    async def heartbeats(self) -> None:
        """With replicas, a server that stops beating and whose process is gone, stopped or
        blocked (hung, not dead: its sockets stay open) is killed, which closes its connection
        and fails its keys over. Killing it first means it can never serve workers that have
        not moved yet (no split brain). One that is only slow is waited for
        (``engine.roles.liveness``)."""
        if not self.state.config.cluster.replicas:
            return
        await self.state.training.wait()
        detector = self.watch.detector  # each server is watched from its first look (judge)
        while True:
            await asyncio.sleep(detector.interval_s)
            detector.tick(time.monotonic())
            for peer in self.state.servers():
                if not (peer.lost or peer.fenced or peer.leaving):
                    self.judge(peer)

    def on_beat(self, beat: Beat) -> None:
        peer = self.state.peers.get(("server", beat.rank))
        if peer is None or beat.incarnation != peer.incarnation:
            self._refuse_beat(beat)
            return
        self.watch.detector.heard(beat.rank, beat.seq, beat.loop_lag_s)

    def _refuse_beat(self, beat: Beat) -> None:
        """A signed beat of no server process the coordinator admitted as that rank now: an
        earlier process's (a replay, or a late datagram) would else count as the new one's,
        and its higher sequence number would hide the new one's beats. Counted; recorded the
        first times and then at each power of two, so that a flood writes few rows."""
        self.beats_refused += 1
        count = self.beats_refused
        if count <= BEATS_RECORDED or count & (count - 1) == 0:
            self.hub.event("heartbeat_refused", rank=beat.rank, refused=count,
                           reason=f"a heartbeat of another process than server {beat.rank}'s "
                                  "present one (an earlier process's, replayed or late)")

    def judge(self, peer: Peer) -> None:
        if peer.rank not in self.watch.detector.arrivals:  # joined since (psctl scale)
            self.watch.watch(peer.rank)
            return
        only = self.state.placement.only_copies(peer.rank)
        verdict = self.watch.judge(peer.rank, peer.pid, ours=peer.ours, last_copy=bool(only))
        detail = {"rank": peer.rank, "pid": peer.pid, "silent_s": round(verdict.silent_s, 3),
                  "state": verdict.state, "reason": verdict.reason}
        if verdict.action == "slow":
            self.hub.event("server_slow", **detail)
        elif verdict.action == "withheld":
            self.hub.event("fence_withheld", **detail, ranges=only,
                           message=f"server {peer.rank} {verdict.reason}, but it holds the "
                                   f"last copy of key ranges {', '.join(map(str, only))}: "
                                   "waiting for it rather than losing them")
        elif verdict.action == "fence":
            self.fence(peer, verdict.silent_s, verdict.reason)

    def fence(self, peer: Peer, silent: float, reason: str) -> None:
        peer.fenced = True
        self.watch.forget(peer.rank)
        self.hub.event("server_unresponsive", rank=peer.rank, pid=peer.pid,
                       silent_s=round(silent, 3), reason=reason)
        self._killed_at[("server", peer.rank)] = time.time() - silent
        if peer.ours:  # its pid is a process of this machine
            try:
                self._kill(peer.pid)  # its connection closes: the failover follows
                return
            except OSError:
                pass
        # Elsewhere (or gone): fail over now and stop listening to it.
        self.fail_over(peer)
        self.hub.spawn(peer.connection.close())

    def restartable(self, peer: Peer) -> bool:
        """A worker or the evaluator that dies mid-run is restarted by the launcher while it
        has restarts left (one that fails with an error says so first, and the run ends)."""
        return (peer.role in ("worker", "evaluator") and peer.welcomed
                and self.state.restarts.get((peer.role, peer.rank), 0)
                < self.state.config.fault.max_restarts)

    def lose(self, peer: Peer) -> None:
        peer.lost = True
        key = (peer.role, peer.rank)
        count = self.state.restarts[key] = self.state.restarts.get(key, 0) + 1
        self.hub.event(f"{peer.role}_lost", rank=peer.rank, pid=peer.pid, restart=count,
                       max_restarts=self.state.config.fault.max_restarts)
        why = self._ended.get(key)
        if why is not None:  # the launcher said so before its connection closed here
            self.hub.fail(f"{peer} {why}")
            return
        self._awaited[key] = peer
        self.hub.spawn(self._await_rejoin(peer))

    def ended_for_good(self, role: str, rank: int, why: str) -> None:
        """The launcher says ``role rank`` will not come back (it exited with an error, or
        crashed the same way again): the run fails with that at once instead of waiting out
        its rejoin, if it is lost (else when it is)."""
        self._ended[(role, rank)] = why
        awaited = self._awaited.get((role, rank))
        if awaited is not None and self.state.peers.get((role, rank)) is awaited:
            self.hub.fail(f"{awaited} {why}")

    async def _await_rejoin(self, lost: Peer) -> None:
        """Until its restart takes its place, at most cluster.connect_timeout_s."""
        limit = self.state.config.cluster.connect_timeout_s
        await asyncio.sleep(limit)
        key = (lost.role, lost.rank)
        if self._awaited.get(key) is lost:
            del self._awaited[key]
        if self.state.peers.get(key) is lost:
            self.hub.fail(f"{lost} died and was not restarted within {limit:g} s "
                          "(cluster.connect_timeout_s); see its log")

    def loss_hint(self, peer: Peer) -> str:
        if peer.role in ("worker", "evaluator") and peer.welcomed:
            used = self.state.restarts.get((peer.role, peer.rank), 0)
            return (f"it was restarted {used} times already (fault.max_restarts = "
                    f"{self.state.config.fault.max_restarts}); see its log")
        if peer.role == "server":
            return ("a shard's values live on its server alone, so the run ends; continue it "
                    f"from its last checkpoint with psctl resume {self.state.run_id[:8]}")
        return "see its log"

    async def inject_kills(self) -> None:
        """The ``kill:ROLE:RANK@S`` faults, timed from the start of training."""
        await self.state.training.wait()
        for spec in (f"drop:{self.faults.drop * 100:g}%" if self.faults.drop else None,
                     f"delay:{self.faults.delay_s * 1000:g}ms" if self.faults.delay_s else None):
            if spec is not None:  # the workers apply these from the start of training
                self.hub.event("fault_injected", spec=spec, role="worker", rank=None, pid=None)
        for kill in self.faults.kills:
            await asyncio.sleep(max(0.0, self.state.training_at + kill.at_s - time.monotonic()))
            peer = self.state.peers.get((kill.role, kill.rank))
            if peer is None or peer.leaving or not peer.pid:
                self.hub.event("fault_skipped", spec=kill.spec, reason="the process has left")
                continue
            if not peer.ours:
                self.hub.event("fault_skipped", spec=kill.spec,
                               reason="it runs on another machine, where its pid is not ours")
                continue
            try:
                self._killed_at[(kill.role, kill.rank)] = time.time()
                self._kill(peer.pid)
            except OSError as exc:
                self.hub.event("fault_skipped", spec=kill.spec, reason=str(exc))
                continue
            self.hub.event("fault_injected", spec=kill.spec, role=kill.role, rank=kill.rank,
                           pid=peer.pid)

    async def checkpoint_loop(self) -> None:
        every = self.state.config.fault.checkpoint_every_s
        if every is None or self.checkpoints is None:
            return
        await self.state.training.wait()
        while True:
            await asyncio.sleep(every)
            if self.state.stop_reason is None:
                await self.checkpoints.save(self.state.live_servers())

    def wants_final_checkpoint(self, status: RunStatus) -> bool:
        """At the end: with periodic checkpoints, or for a run that could be resumed, while
        a server is still there to save each shard."""
        if self.checkpoints is None or not self.state.training.is_set():
            return False
        servers = self.state.servers()
        if len(servers) < self.state.config.cluster.servers:
            return False
        if any(p.lost for p in servers) and not self.state.config.cluster.replicas:
            return False
        if not all(self.state.placement.chains):  # a range with no copy: no checkpoint is whole
            return False
        return (self.state.config.fault.checkpoint_every_s is not None
                or status is not RunStatus.FINISHED)

    async def checkpoint(self) -> None:
        if self.checkpoints is not None:
            await self.checkpoints.save(self.state.live_servers())

    async def _order_server(self, rank: int, message: Checkpoint) -> bool:
        peer = self.state.peers.get(("server", rank))
        if peer is None or peer.leaving:
            return False
        try:
            await peer.connection.send(dump_control(message))
        except ConnectionClosed:
            return False
        return True
