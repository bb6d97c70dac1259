"""The coordinator: admits every role of a run, relays reports to the recorder, decides the end.

Roles connect with the run's join token and say hello; servers get their key range, workers and
the evaluator get the shard map once every server is listening. From then on the coordinator
only listens: iteration rows, evaluations and events go to the recorder; epoch ends and a timer
trigger evaluations; the run ends when every worker is done, a stop condition holds, a role
fails or disconnects, the recorder cannot write, or the user interrupts.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

from engine.config import RunConfig
from engine.errors import (
    AuthenticationError,
    ConnectionClosed,
    ProtocolError,
    PsctlError,
    StoreError,
)
from engine.faults import FaultPlan
from engine.keys import KeyLayout, Partitioner, RangePartitioner
from engine.roles.checkpoints import CheckpointKeeper
from engine.roles.membership import (
    SPAWN_FILE,
    Membership,
    check_scalable,
    wanted_workers,
    write_json,
)
from engine.roles.placement import Placement
from engine.roles.sampling import SAMPLE_INTERVAL_S, ProcessSampler
from engine.transport.base import Connection, Listener, Transport
from engine.wire.messages import (
    Checkpoint,
    ControlMessage,
    Done,
    EpochDone,
    Evaluate,
    Evaluation,
    Event,
    Exit,
    Fatal,
    Heartbeat,
    Hello,
    Iterations,
    Members,
    Message,
    Ready,
    Serving,
    ShardInfo,
    Start,
    Stop,
    Syncs,
    Welcome,
    dump_control,
    layout_info,
    parse_control,
)
from engine.wire.records import (
    EvaluationRecord,
    EventRecord,
    IterationRecord,
    LayerRecord,
    ProcessSample,
    RunStatus,
    SyncRecord,
    divergence,
)

log = logging.getLogger(__name__)
_Row = TypeVar("_Row")

# Seconds of the join deadline per process of the run, on top of cluster.connect_timeout_s: a
# machine with few cores starts processes (each imports torch) only a few at a time. Measured on
# 2 cores: 1.4 s a process for 15, slowing to 3 s a process past 50 (the joined ones idle, but
# not for free); 103 processes need about 290 s.
JOIN_S_PER_PROCESS = 3.0
_NAMES_SHOWN = 8
SCALE_POLL_S = 0.5  # how often the run's folder is read for a psctl scale request


@dataclass(frozen=True)
class Resume:
    """A run continued from a checkpoint: the folder whose shard files the servers load."""

    folder: Path
    seq: int


def process_count(config: RunConfig) -> int:
    """Every role process of a run: servers, workers and the evaluator."""
    return config.cluster.servers + config.cluster.workers + 1


def join_deadline_s(config: RunConfig) -> float:
    """How long every role of the run has, from the coordinator's start, to join it."""
    return config.cluster.connect_timeout_s + JOIN_S_PER_PROCESS * process_count(config)


def join_failure(missing: list[str], config: RunConfig) -> str:
    """Why the run failed when ``missing`` did not join in time, and which setting to raise."""
    shown = ", ".join(missing[:_NAMES_SHOWN])
    if len(missing) > _NAMES_SHOWN:
        shown += f" and {len(missing) - _NAMES_SHOWN} more"
    processes = process_count(config)
    return (f"{len(missing)} of {processes} processes ({shown}) did not join within "
            f"{join_deadline_s(config):.0f} s (cluster.connect_timeout_s = "
            f"{config.cluster.connect_timeout_s:g} s plus {JOIN_S_PER_PROCESS:g} s for each of "
            f"the {processes} processes); see their logs. If the machine is just slow to start "
            f"them, raise cluster.connect_timeout_s (a [cluster] connect_timeout_s in the "
            f"--config file, or PSCTL_CLUSTER__CONNECT_TIMEOUT_S), or start fewer workers")


def _role_config(config: RunConfig) -> dict[str, Any]:
    """The configuration the roles get in their welcome: the user's, except that a role waits
    for its peers (a worker for the start of training) as long as the run gives them to join,
    since the first worker to start waits for the last."""
    patient = config.cluster.model_copy(
        update={"connect_timeout_s": max(config.cluster.connect_timeout_s,
                                         join_deadline_s(config))})
    return config.model_copy(update={"cluster": patient}).to_json_dict()


class RecorderSink(Protocol):
    """What the coordinator needs of the recorder (``engine.recorder.Recorder`` fits). A method
    that raises :class:`StoreError` ends the run as failed."""

    def record_iterations(self, rows: list[IterationRecord]) -> None: ...

    def record_evaluation(self, row: EvaluationRecord) -> None: ...

    def record_event(self, row: EventRecord) -> None: ...

    def record_sync(self, row: SyncRecord) -> None: ...

    def record_process_samples(self, rows: list[ProcessSample]) -> None: ...

    def record_layers(self, rows: list[LayerRecord]) -> None: ...


@dataclass
class Peer:
    role: str
    rank: int
    connection: Connection
    leaving: bool = False
    welcomed: bool = False  # a role reads its welcome first: nothing else may reach it before
    pid: int = 0
    lost: bool = False  # a worker that died; its restart takes its place
    fenced: bool = False  # a server killed for not answering heartbeats

    def __str__(self) -> str:
        return f"{self.role} {self.rank}"


@dataclass
class _Progress:
    iterations_per_epoch: dict[int, int] = field(default_factory=dict)
    iterations: dict[int, int] = field(default_factory=dict)
    epochs_done: dict[int, int] = field(default_factory=dict)
    done: set[int] = field(default_factory=set)

    def epoch(self, workers: int) -> float:
        """Training progress in epochs, averaged over the job's first ``workers`` workers
        (newcomers of a scaled job count epochs of their own)."""
        fractions = [self.iterations.get(w, 0) / ipe
                     for w, ipe in self.iterations_per_epoch.items() if w < workers]
        return sum(fractions) / workers if fractions else 0.0


class Coordinator:
    def __init__(self, config: RunConfig, *, run_id: str, token: str, layout: KeyLayout,
                 recorder: RecorderSink, partitioner: Partitioner | None = None,
                 sampler: ProcessSampler | None = None, folder: Path | None = None,
                 resume: Resume | None = None,
                 kill: Callable[[int], None] = lambda pid: os.kill(pid, signal.SIGKILL)) -> None:
        self.config, self.run_id, self.token, self.recorder = config, run_id, token, recorder
        # The run's folder (its checkpoints go in it); None: no checkpoints.
        self.folder, self.resume, self._kill = folder, resume, kill
        self.faults = FaultPlan.of(config.fault.inject)
        self.restarts: dict[int, int] = {}
        self.training = asyncio.Event()
        self._training_at = 0.0
        self.sampler = sampler
        self.layout = layout
        num_keys = self.num_keys = layout.num_keys
        self.ranges = (partitioner or RangePartitioner()).ranges(num_keys, config.cluster.servers)
        self.checkpoints = None if folder is None else CheckpointKeeper(
            folder, len(self.ranges), first_seq=resume.seq if resume else 0,
            send=self._order_server, event=self._event)
        self.peers: dict[tuple[str, int], Peer] = {}
        self.placement = Placement(self.ranges, config.cluster.replicas)
        self.servers_ready = asyncio.Event()
        self._linked = 0
        self.membership = Membership(config.cluster.workers)
        self._members_acked: set[int] = set()
        self._join_clocks: dict[int, int] = {}
        self._newcomers: dict[int, dict[str, Any]] = {}  # rank -> what its welcome changes
        self._members_changed = asyncio.Event()
        self._failed_over_at: dict[int, float] = {}  # range -> when its primary was lost
        self._killed_at: dict[tuple[str, int], float] = {}
        self._heard: dict[int, float] = {}  # server -> when it last answered a heartbeat
        self.progress = _Progress()
        self.outcome: asyncio.Future[tuple[RunStatus, str | None]] = \
            asyncio.get_running_loop().create_future()
        self.started_at = time.time()
        self.join_deadline_s = join_deadline_s(config)
        self._role_config = _role_config(config)
        self.best_accuracy = 0.0
        self._stop_reason: str | None = None
        self._eval_pending = False
        self._final: asyncio.Future[EvaluationRecord] | None = None
        self._all_done = asyncio.Event()
        self._listener: Listener | None = None
        self._tasks: list[asyncio.Task[Any]] = []

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self, transport: Transport, host: str, port: int) -> str:
        self._listener = await transport.listen(host, port, self._serve, token=self.token)
        self._tasks = [asyncio.create_task(coro) for coro in
                       (self._watch_registration(), self._evaluation_timer(), self._deadline(),
                        self._sample_processes(), self._inject_kills(), self._checkpoints(),
                        self._watch_scale(), self._heartbeats())]
        return self._listener.address

    async def run(self) -> tuple[RunStatus, str | None]:
        """Wait for the run to end, wind every role down, and return (status, reason)."""
        finisher = asyncio.create_task(self._finish_when_done())
        status, reason = await self.outcome
        finisher.cancel()
        for task in self._tasks:
            task.cancel()
        if self._wants_final_checkpoint(status):
            await self._checkpoint()
        await self._dismiss_all()
        if self._listener is not None:
            await self._listener.close()
        return status, reason

    def fail(self, reason: str) -> None:
        # Settled before it is recorded: a recorder that cannot write must not keep the run alive.
        self._settle(RunStatus.FAILED, reason)
        self._event("run_failed", reason=reason)

    def recorder_failed(self, error: StoreError) -> None:
        """The run can no longer be recorded, so it ends now (nothing more is written)."""
        if not self.outcome.done():
            log.error("ending the run: %s", error)
        self._settle(RunStatus.FAILED, str(error))

    def interrupt(self) -> None:
        self._event("interrupted")
        self._settle(RunStatus.INTERRUPTED, "interrupted by the user")

    def _settle(self, status: RunStatus, reason: str | None) -> None:
        if not self.outcome.done():
            self.outcome.set_result((status, reason))

    # -- connections ----------------------------------------------------------------------------

    async def _serve(self, connection: Connection) -> None:
        try:
            peer = await self._admit(connection)
        except AuthenticationError as exc:  # an impostor: refused, but the run goes on
            log.warning("refused %s: %s", connection.remote, exc)
            with contextlib.suppress(PsctlError):
                await connection.close(1008, str(exc))
            return
        except PsctlError as exc:
            with contextlib.suppress(PsctlError):
                await connection.close(1008, str(exc))
            self.fail(f"a process could not join: {exc}")
            return
        try:
            while True:
                self._on_message(peer, parse_control(await connection.recv()))
        except ConnectionClosed as exc:
            if peer.leaving or self.outcome.done():
                return
            if self._restartable(peer):
                self._lose(peer)
            elif peer.role == "server" and self.config.cluster.replicas and peer.welcomed:
                self._fail_over(peer)
            else:
                self.fail(f"{peer} disconnected unexpectedly ({exc}); {self._loss_hint(peer)}")
        except PsctlError as exc:
            self.fail(f"{peer} sent an invalid message: {exc}")

    async def _admit(self, connection: Connection) -> Peer:
        timeout = self.config.cluster.connect_timeout_s
        try:
            hello = parse_control(await asyncio.wait_for(connection.recv(), timeout))
        except TimeoutError:
            raise ProtocolError("no hello within the connect timeout") from None
        if not isinstance(hello, Hello):
            raise ProtocolError(f"expected hello, got {hello.type}")
        admission = connection.admission
        if admission is not None and not admission.permits(hello.role, hello.rank):
            raise AuthenticationError(f"admitted as {admission}, it said hello as "
                                      f"{hello.role} {hello.rank}")
        peer = self._register(hello, connection)
        if hello.role == "server":
            shard = self.ranges[hello.rank]
            own = ShardInfo(index=hello.rank, address="", start=shard.start, end=shard.end)
            welcome = self._welcome(shards=[], own=own).model_copy(update={
                "held": self.placement.held(hello.rank),
                "checkpoint": None if self.resume is None else str(self.resume.folder)})
            await self._send(peer, welcome)
        else:
            try:
                await asyncio.wait_for(self.servers_ready.wait(), self.join_deadline_s)
            except TimeoutError:
                raise ProtocolError(f"shard servers did not start listening within "
                                    f"{self.join_deadline_s:.0f} s") from None
            welcome = self._welcome(shards=self.placement.shard_map(), own=None)
            welcome = welcome.model_copy(update={"backups": self.placement.backups()})
            if peer.role == "worker" and hello.rank in self.membership.joining:
                await self._admit_newcomer(peer)
            if peer.role == "worker" and hello.rank in self._newcomers:
                welcome = welcome.model_copy(update=self._newcomers[hello.rank])
            await self._send(peer, welcome)
        peer.welcomed = True
        if self._stop_reason is not None and peer.role in ("worker", "server"):
            # the stop went out before its welcome (a tiny stop.max_seconds): it must stop too
            await self._send(peer, Stop(reason=self._stop_reason))
        elif peer.role == "worker" and peer.rank in self.membership.leaving:
            await self._send(peer, Stop(reason="scaled down before it joined"))
        return peer

    def _register(self, hello: Hello, connection: Connection) -> Peer:
        limit = {"server": self.config.cluster.servers, "worker": self.config.cluster.workers,
                 "evaluator": 1}[hello.role]
        newcomer = hello.role == "worker" and hello.rank in self.membership.started
        if hello.rank >= limit and not newcomer:
            raise ProtocolError(f"{hello.role} rank {hello.rank} is outside 0..{limit - 1}")
        before = self.peers.get((hello.role, hello.rank))
        if before is not None and not before.lost:
            raise ProtocolError(f"{hello.role} {hello.rank} joined twice")
        peer = Peer(hello.role, hello.rank, connection, pid=hello.pid)
        self.peers[(hello.role, hello.rank)] = peer
        if before is not None:  # a restarted worker takes the dead one's place
            self._event("worker_rejoined", rank=hello.rank, pid=hello.pid,
                        restarts=self.restarts.get(hello.rank, 0))
        else:
            self._event("process_joined", role=hello.role, rank=hello.rank, pid=hello.pid)
        if self.sampler is not None:
            self.sampler.watch(hello.role, hello.rank, hello.pid)
        return peer

    def _welcome(self, *, shards: list[ShardInfo], own: ShardInfo | None) -> Welcome:
        return Welcome(run_id=self.run_id, config=self._role_config,
                       num_keys=self.num_keys, segments=layout_info(self.layout),
                       shards=shards, own_range=own,
                       started_at=self.started_at)

    # -- messages -------------------------------------------------------------------------------

    def _on_message(self, peer: Peer, message: ControlMessage) -> None:
        if isinstance(message, Iterations):
            self._on_iterations(peer, message.rows)
            if message.layers:
                if any(row.worker != peer.rank for row in message.layers):
                    raise ProtocolError(f"{peer} reported layers of another worker")
                self._record(self.recorder.record_layers, message.layers)
        elif isinstance(message, Evaluation):
            self._on_evaluation(message)
        elif isinstance(message, Event):
            self._record(self.recorder.record_event, message.row)
            if peer.role == "server":
                self._on_server_event(message.row)
        elif isinstance(message, Syncs):
            for row in message.rows:
                self._record(self.recorder.record_sync, row)
        elif isinstance(message, Serving):
            self.placement.serving(peer.rank, message.address, message.backups)
            self._event("server_listening", rank=peer.rank, address=message.address,
                        backups={b.index: b.address for b in message.backups})
            if self.placement.all_serving():
                if self.config.cluster.replicas:  # the chains are linked before any push
                    for order in self.placement.links():
                        self._spawn(self._order(order.server, order.message))
                else:
                    self.servers_ready.set()
        elif isinstance(message, Heartbeat) and peer.role == "server":
            self._heard[peer.rank] = time.monotonic()
        elif isinstance(message, Ready):
            self.progress.iterations_per_epoch[peer.rank] = message.iterations_per_epoch
            if message.first_iteration:
                self.progress.iterations[peer.rank] = message.first_iteration
            # Each worker is ready once its data is loaded; the displays count these to say
            # what start-up is waiting for, and take the run's total from training_started.
            self._event("worker_ready", rank=peer.rank,
                        iterations_per_epoch=message.iterations_per_epoch,
                        first_iteration=message.first_iteration)
            if self.training.is_set():  # a restarted worker: the others are training already
                self._spawn(self._send(peer, Start()))
            elif len(self.progress.iterations_per_epoch) == self.config.cluster.workers:
                planned = self.config.train.epochs * sum(
                    self.progress.iterations_per_epoch.values())
                self.training.set()
                self._training_at = time.monotonic()
                if self.resume is None:
                    self._event("training_started", total_iterations=planned)
                else:
                    self._event("training_resumed", total_iterations=planned,
                                checkpoint=self.resume.seq,
                                first_iterations=dict(sorted(self.progress.iterations.items())))
                self._spawn(self._start_training(
                    min(self.progress.iterations_per_epoch.values())))
        elif isinstance(message, EpochDone):
            self._on_epoch_done(peer.rank, message.epoch)
        elif isinstance(message, Done):
            self._on_done(peer, message)
        elif isinstance(message, Fatal):
            self._event("process_error", role=peer.role, rank=peer.rank,
                        message=message.message, traceback=message.traceback[-4000:])
            self.fail(f"{peer} failed: {message.message}")
        else:
            raise ProtocolError(f"{peer} may not send {message.type}")

    def _on_iterations(self, peer: Peer, rows: list[IterationRecord]) -> None:
        if any(row.worker != peer.rank for row in rows):
            raise ProtocolError(f"{peer} reported iterations of another worker")
        self._record(self.recorder.record_iterations, rows)
        if rows:
            self.progress.iterations[peer.rank] = rows[-1].iteration + 1

    def _on_evaluation(self, message: Evaluation) -> None:
        diverged = divergence(message.row)
        if diverged is not None:  # a NaN loss cannot be stored, and training on is pointless
            self._event("diverged", accuracy=message.row.accuracy, step=message.row.step)
            self.fail(diverged)
            return
        self._record(self.recorder.record_evaluation, message.row)
        self._eval_pending = False
        self.best_accuracy = max(self.best_accuracy, message.row.accuracy)
        target = self.config.stop.target_accuracy
        if target is not None and message.row.accuracy >= target:
            self._begin_stop(f"target accuracy {target:.4f} reached")
        if message.final and self._final is not None and not self._final.done():
            self._final.set_result(message.row)

    def _on_epoch_done(self, rank: int, epoch: int) -> None:
        # The run's epochs are its first workers' (still there): newcomers count their own.
        workers = [w for w in range(self.config.cluster.workers) if w in self.membership.active]
        if rank not in workers:
            return
        before = min((self.progress.epochs_done.get(w, -1) for w in workers), default=-1)
        self.progress.epochs_done[rank] = epoch
        after = min((self.progress.epochs_done.get(w, -1) for w in workers), default=-1)
        if after > before:
            self._event("epoch_done", epoch=after)
            if after + 1 < self.config.train.epochs:
                self._request_evaluation(float(after + 1), final=False)

    def _on_done(self, peer: Peer, message: Done) -> None:
        peer.leaving = True  # a worker that is done closes its connection; that is no failure
        self.progress.done.add(peer.rank)
        self._event("worker_done", rank=peer.rank, iterations=message.iterations,
                    reason=message.reason)
        if self.membership.scaled:  # its last push is in: nobody waits for it any more
            self.membership.leaving.discard(peer.rank)
            self._spawn(self._update_members())
        if self.membership.active <= self.progress.done:
            self._all_done.set()

    # -- ending ---------------------------------------------------------------------------------

    def _begin_stop(self, reason: str) -> None:
        if self._stop_reason is not None:
            return
        self._stop_reason = reason
        self._event("stop", reason=reason)
        for peer in list(self.peers.values()):
            if peer.role in ("worker", "server") and peer.welcomed:  # _admit stops the others
                self._spawn(self._send(peer, Stop(reason=reason)))

    async def _finish_when_done(self) -> None:
        await self._all_done.wait()
        if self._stop_reason is None:  # every epoch ran: freeze the model for the final test
            self._begin_stop("all epochs done")
        if not any(self.progress.iterations.values()):
            self.fail(f"no worker completed an iteration before the run stopped "
                      f"({self._stop_reason})")
            return
        self._final = asyncio.get_running_loop().create_future()
        self._request_evaluation(self.progress.epoch(self.config.cluster.workers), final=True)
        try:
            await asyncio.wait_for(self._final, self.config.cluster.request_timeout_s)
        except TimeoutError:
            self.fail("the evaluator did not deliver the final evaluation in time")
            return
        self._settle(RunStatus.FINISHED, self._stop_reason)

    async def _dismiss_all(self) -> None:
        for peer in self.peers.values():
            peer.leaving = True
        await asyncio.gather(*(self._send(peer, Exit()) for peer in self.peers.values()),
                             return_exceptions=True)
        # Give roles a moment to send their last events and close on their side.
        await asyncio.sleep(0.2)
        await asyncio.gather(*(peer.connection.close() for peer in self.peers.values()),
                             return_exceptions=True)

    # -- failures, restarts, faults and checkpoints ---------------------------------------------

    def _on_server_event(self, row: EventRecord) -> None:
        detail = row.detail
        if row.kind in ("checkpoint_saved", "checkpoint_failed") and self.checkpoints:
            self.checkpoints.on_saved(row.kind, detail)
        elif row.kind == "chain_linked" and not self.servers_ready.is_set():
            self._linked += 1
            if self._linked == self.placement.copies:
                self.servers_ready.set()
        elif row.kind == "members_updated" and isinstance(detail.get("rank"), int):
            self._members_acked.add(detail["rank"])
            for worker, clock in dict(detail.get("starts") or {}).items():
                if isinstance(clock, int):  # a newcomer starts at the smallest, on any server
                    rank = int(worker)
                    self._join_clocks[rank] = min(clock, self._join_clocks.get(rank, clock))
            self._members_changed.set()
        elif row.kind == "failover_served" and isinstance(detail.get("index"), int):
            lost_at = self._failed_over_at.get(detail["index"])
            served = detail.get("first_pull_at")
            if lost_at is not None and isinstance(served, float):
                self._event("failover_complete", index=detail["index"], rank=detail.get("rank"),
                            seconds=round(served - lost_at, 4))

    def _fail_over(self, dead: Peer) -> None:
        """A server died: its backups take over its keys; every chain it was in is repaired."""
        dead.lost = True
        lost_at = self._killed_at.get(("server", dead.rank), time.time())
        orders, failed_over, gone = self.placement.lose(dead.rank)
        self._event("server_lost", rank=dead.rank, pid=dead.pid)
        if gone:
            self.fail(f"server {dead.rank} died holding the last copy of shards "
                      f"{', '.join(map(str, gone))}; resume the run from its last checkpoint "
                      f"with psctl resume {self.run_id[:8]}")
            return
        for index in failed_over:
            self._failed_over_at[index] = lost_at
            self._event("failover", index=index, lost=dead.rank,
                        primary=self.placement.chains[index][0],
                        chain=list(self.placement.chains[index]))
        for order in orders:
            self._spawn(self._order(order.server, order.message))

    async def _order(self, server: int, message: Message) -> None:
        peer = self.peers.get(("server", server))
        if peer is None or peer.lost:
            self.fail(f"server {server} is gone; it cannot take {type(message).__name__}")
            return
        await self._send(peer, message)

    # -- membership (psctl scale) ---------------------------------------------------------------

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
        self._newcomers[peer.rank] = {"config": _role_config(config), "clock_base": base}

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

    async def _heartbeats(self) -> None:
        """With replicas, a server that stops answering (hung, not dead: its sockets stay
        open) is killed, which closes its connection and fails its keys over. Killing it
        first means it can never serve workers that have not moved yet (no split brain)."""
        if not self.config.cluster.replicas:
            return
        await self.training.wait()
        limit = self.config.cluster.heartbeat_timeout_s
        for peer in self.peers.values():
            if peer.role == "server":
                self._heard[peer.rank] = time.monotonic()
        for seq in itertools.count():
            await asyncio.sleep(limit / 5)
            now = time.monotonic()
            for peer in [p for p in self.peers.values() if p.role == "server" and not p.lost]:
                silent = now - self._heard.get(peer.rank, now)
                if peer.fenced:
                    continue
                if silent > limit and not peer.leaving:
                    self._fence(peer, silent)
                else:
                    self._spawn(self._send(peer, Heartbeat(seq=seq)))

    def _fence(self, peer: Peer, silent: float) -> None:
        peer.fenced = True
        self._event("server_unresponsive", rank=peer.rank, pid=peer.pid,
                    silent_s=round(silent, 3))
        self._killed_at[("server", peer.rank)] = time.time() - silent
        try:
            self._kill(peer.pid)  # its connection closes: the failover follows
        except OSError:  # not on this machine: fail over now, and stop listening to it
            self._fail_over(peer)
            self._spawn(peer.connection.close())

    def _restartable(self, peer: Peer) -> bool:
        """A worker that dies mid-run is restarted by the launcher while it has restarts left."""
        return (peer.role == "worker" and peer.welcomed
                and self.restarts.get(peer.rank, 0) < self.config.fault.max_restarts)

    def _lose(self, peer: Peer) -> None:
        peer.lost = True
        count = self.restarts[peer.rank] = self.restarts.get(peer.rank, 0) + 1
        self._event("worker_lost", rank=peer.rank, pid=peer.pid, restart=count,
                    max_restarts=self.config.fault.max_restarts)
        self._spawn(self._await_rejoin(peer))

    async def _await_rejoin(self, lost: Peer) -> None:
        limit = self.config.cluster.connect_timeout_s
        await asyncio.sleep(limit)
        if self.peers.get((lost.role, lost.rank)) is lost:
            self.fail(f"{lost} died and was not restarted within {limit:g} s "
                      "(cluster.connect_timeout_s); see its log")

    def _loss_hint(self, peer: Peer) -> str:
        if peer.role == "worker" and peer.welcomed:
            used = self.restarts.get(peer.rank, 0)
            return (f"it was restarted {used} times already (fault.max_restarts = "
                    f"{self.config.fault.max_restarts}); see its log")
        if peer.role == "server":
            return ("a shard's values live on its server alone, so the run ends; continue it "
                    f"from its last checkpoint with psctl resume {self.run_id[:8]}")
        return "see its log"

    async def _inject_kills(self) -> None:
        """The ``kill:ROLE:RANK@S`` faults, timed from the start of training."""
        await self.training.wait()
        for spec in (f"drop:{self.faults.drop * 100:g}%" if self.faults.drop else None,
                     f"delay:{self.faults.delay_s * 1000:g}ms" if self.faults.delay_s else None):
            if spec is not None:  # the workers apply these from the start of training
                self._event("fault_injected", spec=spec, role="worker", rank=None, pid=None)
        for kill in self.faults.kills:
            await asyncio.sleep(max(0.0, self._training_at + kill.at_s - time.monotonic()))
            peer = self.peers.get((kill.role, kill.rank))
            if peer is None or peer.leaving or not peer.pid:
                self._event("fault_skipped", spec=kill.spec, reason="the process has left")
                continue
            try:
                self._killed_at[(kill.role, kill.rank)] = time.time()
                self._kill(peer.pid)
            except OSError as exc:
                self._event("fault_skipped", spec=kill.spec, reason=str(exc))
                continue
            self._event("fault_injected", spec=kill.spec, role=kill.role, rank=kill.rank,
                        pid=peer.pid)

    async def _checkpoints(self) -> None:
        every = self.config.fault.checkpoint_every_s
        if every is None or self.checkpoints is None:
            return
        await self.training.wait()
        while True:
            await asyncio.sleep(every)
            if self._stop_reason is None:
                await self.checkpoints.save(self._live_servers())

    def _live_servers(self) -> list[int]:
        return [p.rank for p in self.peers.values() if p.role == "server" and not p.lost]

    def _wants_final_checkpoint(self, status: RunStatus) -> bool:
        """At the end: with periodic checkpoints, or for a run that could be resumed, while
        a server is still there to save each shard."""
        if self.checkpoints is None or not self.training.is_set():
            return False
        servers = [p for p in self.peers.values() if p.role == "server"]
        if len(servers) < self.config.cluster.servers:
            return False
        if any(p.lost for p in servers) and not self.config.cluster.replicas:
            return False
        return (self.config.fault.checkpoint_every_s is not None
                or status is not RunStatus.FINISHED)

    async def _checkpoint(self) -> None:
        if self.checkpoints is not None:
            await self.checkpoints.save(self._live_servers())

    async def _order_server(self, rank: int, message: Checkpoint) -> bool:
        peer = self.peers.get(("server", rank))
        if peer is None or peer.leaving:
            return False
        try:
            await peer.connection.send(dump_control(message))
        except ConnectionClosed:
            return False
        return True

    # -- timers ---------------------------------------------------------------------------------

    async def _watch_registration(self) -> None:
        await asyncio.sleep(self.join_deadline_s)
        expected = [("server", r) for r in range(self.config.cluster.servers)]
        expected += [("worker", r) for r in range(self.config.cluster.workers)]
        expected.append(("evaluator", 0))
        missing = [f"{role} {rank}" for role, rank in expected if (role, rank) not in self.peers]
        if missing:
            self.fail(join_failure(missing, self.config))

    async def _evaluation_timer(self) -> None:
        while True:
            await asyncio.sleep(self.config.eval.interval_s)
            if self.progress.iterations and self._stop_reason is None:
                self._request_evaluation(self.progress.epoch(self.config.cluster.workers),
                                         final=False)

    async def _sample_processes(self) -> None:
        if self.sampler is None:
            return
        while True:
            await asyncio.sleep(SAMPLE_INTERVAL_S)
            rows = self.sampler.sample()
            if rows:
                self._record(self.recorder.record_process_samples, rows)

    async def _deadline(self) -> None:
        if self.config.stop.max_seconds is None:
            return
        await asyncio.sleep(self.config.stop.max_seconds)
        self._begin_stop(f"time limit of {self.config.stop.max_seconds:g} s reached")

    def _request_evaluation(self, epoch: float, *, final: bool) -> None:
        evaluator = self.peers.get(("evaluator", 0))
        if evaluator is None or (self._eval_pending and not final):
            return
        self._eval_pending = True
        self._spawn(self._send(evaluator, Evaluate(epoch=epoch, final=final)))

    # -- helpers --------------------------------------------------------------------------------

    async def _start_training(self, iterations_per_epoch: int) -> None:
        """Tell the servers an epoch's clocks (for schedules by epoch), then start the workers:
        the servers' Start is on their sockets before any worker can push."""
        clocks = iterations_per_epoch / self.config.train.push_every  # Downpour: one per push
        by_role = {role: [p for p in self.peers.values() if p.role == role]
                   for role in ("server", "worker")}
        await asyncio.gather(*(self._send(server, Start(clocks_per_epoch=clocks))
                               for server in by_role["server"]))
        await asyncio.gather(*(self._send(worker, Start()) for worker in by_role["worker"]))

    async def _send(self, peer: Peer, message: Message) -> None:
        if peer.lost:  # a dead worker or server: its replacement gets its own messages
            return
        try:
            await peer.connection.send(dump_control(message))
        except ConnectionClosed:
            # A worker that can be restarted, or a replicated server: its reader sees the
            # close too, and decides (restart, failover); anyone else's loss ends the run.
            replicated = peer.role == "server" and self.config.cluster.replicas > 0
            if not (peer.leaving or replicated or self._restartable(peer)):
                self.fail(f"{peer} disconnected unexpectedly")

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.append(task)

    def _event(self, kind: str, **detail: Any) -> None:
        self._record(self.recorder.record_event,
                     EventRecord(at=time.time(), kind=kind, detail=detail))

    def _record(self, write: Callable[[_Row], None], row: _Row) -> None:
        # Every write goes through here: a failing recorder ends the run instead of escaping
        # into whichever task or connection handler happened to record, which left it hanging.
        try:
            write(row)
        except StoreError as exc:
            self.recorder_failed(exc)

