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
import logging
import os
import secrets
import signal
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from engine.config import RunConfig
from engine.errors import (
    AuthenticationError,
    ConnectionClosed,
    ProtocolError,
    PsctlError,
    RunFailed,
    StoreError,
)
from engine.keys import KeyLayout, Partitioner, partition
from engine.policies.optimizers import DRIVES_TRAINING, SERVER_OPTIMIZERS
from engine.roles.evaluations import Evaluations
from engine.roles.joining import join_deadline_s, join_failure, role_config, start_up
from engine.roles.lifecycle import this_machine
from engine.roles.liveness import open_receiver
from engine.roles.membership import Membership, write_control_credential
from engine.roles.moves import Moves
from engine.roles.parties import Parties
from engine.roles.peer import Peer, Progress, RunState
from engine.roles.placement import Placement
from engine.roles.recording import RecorderSink, Records
from engine.roles.recovery import Recovery
from engine.roles.sampling import SAMPLE_INTERVAL_S, ProcessSampler
from engine.roles.sandblaster import Sandblaster
from engine.roles.scaling import Scaling
from engine.roles.spending import Spending
from engine.transport.admission import credential
from engine.transport.base import Connection, Listener, Transport
from engine.wire.messages import (
    Attach,
    ControlMessage,
    Done,
    EpochDone,
    Evaluation,
    Event,
    Exit,
    Fatal,
    Hello,
    Iterations,
    Message,
    Ready,
    RunEnded,
    Serving,
    ShardInfo,
    Start,
    Stop,
    Syncs,
    TaskDone,
    TaskPushed,
    VectorResults,
    Welcome,
    dump_control,
    layout_info,
    parse_control,
)
from engine.wire.records import (
    RunStatus,
)

log = logging.getLogger(__name__)
_Row = TypeVar("_Row")

# Refused hellos recorded as events and logged, at most (the rest are counted), and how long
# closing a refused connection may take.
REFUSALS_RECORDED = 100
# A role says hello as soon as it is connected (engine.transport.control): a connection silent this
# long (or cluster.connect_timeout_s, if shorter) never will.
HELLO_TIMEOUT_S = 10.0
_CLOSE_WAIT_S = 5.0
_CLOSE_REASON_BYTES = 120


@dataclass(frozen=True)
class Resume:
    """A run continued from a checkpoint: the folder whose shard files the servers load."""

    folder: Path
    seq: int


class Coordinator:
    """Admits every role, routes what they send, and decides the run's end; what it knows of
    the run is ``state``, shared with its parts: ``records`` (every row written), ``moves``
    (key ranges between servers), ``recovery`` (failures, heartbeats, checkpoints) and
    ``scaling`` (``psctl scale``). The parts ask the coordinator only what ``Hub`` lists."""

    def __init__(self, config: RunConfig, *, run_id: str, token: str, layout: KeyLayout,
                 recorder: RecorderSink, partitioner: Partitioner | None = None,
                 sampler: ProcessSampler | None = None, folder: Path | None = None,
                 resume: Resume | None = None,
                 kill: Callable[[int], None] = lambda pid: os.kill(pid, signal.SIGKILL)) -> None:
        self.config, self.run_id, self.token = config, run_id, token
        self.resume, self.sampler, self.layout = resume, sampler, layout
        self.records = Records(recorder, self.recorder_failed)
        self.num_keys = layout.num_keys
        self.ranges = partition(layout, config.cluster.ranges, partitioner)
        self.state = RunState(
            config, run_id, folder,
            placement=Placement(self.ranges, config.cluster.replicas, config.cluster.servers),
            membership=Membership(config.cluster.workers),
            server_members=Membership(config.cluster.servers))
        # started_at moves back by a resumed run's active time (its evaluations' clock).
        self.started_at = time.time()
        self.moves = Moves(self.state, self)
        self.recovery = Recovery(self.state, self, abandon=self.moves.abandon, kill=kill,
                                 first_checkpoint=resume.seq if resume else 0)
        self.evaluations = Evaluations(self.state, self, self.records)
        self.spending = Spending(self.state, self, self.evaluations)
        self.parties = Parties(self, run_id, ended_for_good=self.recovery.ended_for_good,
                               scale=lambda role, count: self.scaling.request(role, count))
        self.scaling = Scaling(self.state, self, self.moves, start=self.parties.start_roles)
        self._refused = 0  # connections refused for a bad hello
        self._beats: asyncio.DatagramTransport | None = None
        self._beats_port: int | None = None
        self._clocks_per_epoch: float | None = None  # the servers' Start: a rejoined one's too
        self.outcome: asyncio.Future[tuple[RunStatus, str | None]] = \
            asyncio.get_running_loop().create_future()
        self.join_deadline_s = join_deadline_s(config)
        self._role_config = role_config(config)
        self._all_done = asyncio.Event()
        self._listener: Listener | None = None
        self._tasks: set[asyncio.Task[Any]] = set()  # each leaves the set when it ends
        # Sandblaster L-BFGS (--optimizer lbfgs): made when training starts.
        self.sandblaster: Sandblaster | None = None
        self._sandblaster_task: asyncio.Task[None] | None = None
        self._train_samples = 0
        self._handlers = self._message_handlers()

    # The run's state, as the coordinator's own code reads it.
    @property
    def peers(self) -> dict[tuple[str, int], Peer]:
        return self.state.peers

    @property
    def progress(self) -> Progress:
        return self.state.progress

    @property
    def placement(self) -> Placement:
        return self.state.placement

    @property
    def membership(self) -> Membership:
        return self.state.membership

    @property
    def training(self) -> asyncio.Event:
        return self.state.training

    @property
    def servers_ready(self) -> asyncio.Event:
        return self.state.servers_ready

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self, transport: Transport, host: str, port: int) -> str:
        self._listener = await transport.listen(host, port, self._serve, token=self.token)
        if self.config.cluster.replicas:
            self._beats, _, self._beats_port = await open_receiver(host, self.token,
                                                                   self.recovery.on_beat)
        for coro in (self._watch_registration(), self.evaluations.timer(), self._deadline(),
                     self._sample_processes(), self.recovery.inject_kills(),
                     self.recovery.checkpoint_loop(), self.recovery.heartbeats()):
            self.spawn(coro)
        if self.state.folder is not None:  # psctl scale attaches with it
            try:
                write_control_credential(self.state.folder, credential(self.token, "scale", 0))
            except StoreError as exc:  # the run goes on; psctl scale says it cannot attach
                self.event("scale_unavailable", reason=str(exc))
        return self._listener.address

    async def run(self) -> tuple[RunStatus, str | None]:
        """Wait for the run to end, wind every role down, and return (status, reason)."""
        finisher = asyncio.create_task(self._finish_when_done())
        status, reason = await self.outcome
        finisher.cancel()
        for task in list(self._tasks):
            task.cancel()
        if self.recovery.wants_final_checkpoint(status):
            await self.recovery.checkpoint()
        await self._dismiss_all()
        return status, reason

    async def close(self, ended: RunEnded | None = None) -> None:
        """After the run's end is recorded: tell the launcher how it ended, stop listening."""
        if ended is not None:
            await self.parties.tell_end(ended)
        if self._listener is not None:
            await self._listener.close()
        if self._beats is not None:
            self._beats.close()

    def fail(self, reason: str) -> None:
        # Settled before it is recorded: a recorder that cannot write must not keep the run alive.
        self._settle(RunStatus.FAILED, reason)
        self.event("run_failed", reason=reason)

    def recorder_failed(self, error: StoreError) -> None:
        """The run can no longer be recorded, so it ends now (nothing more is written)."""
        if not self.outcome.done():
            log.error("ending the run: %s", error)
        self._settle(RunStatus.FAILED, str(error))

    def interrupt(self) -> None:
        self.event("interrupted")
        self._settle(RunStatus.INTERRUPTED, "interrupted by the user")

    def _settle(self, status: RunStatus, reason: str | None) -> None:
        if not self.outcome.done():
            self.outcome.set_result((status, reason))

    # -- connections ----------------------------------------------------------------------------

    async def _serve(self, connection: Connection) -> None:
        try:
            hello = await self._hello(connection)
            if isinstance(hello, Attach):  # the launcher or psctl scale: no process of the run
                await self.parties.serve(connection, hello)
                return
            peer = self._register(hello, connection)
        except PsctlError as exc:  # one bad hello is refused; the run goes on
            await self._refuse(connection, exc)
            return
        try:
            await self._admit(peer, hello)
        except PsctlError as exc:  # admitted, but the run cannot welcome it: the run ends
            with contextlib.suppress(PsctlError):
                await connection.close(1008, str(exc))
            if not self.outcome.done():  # else it failed for its own reason, recorded once
                self.fail(f"a process could not join: {exc}")
            return
        try:
            while True:
                self._on_message(peer, parse_control(await connection.recv()))
        except ConnectionClosed as exc:
            if peer.leaving or self.outcome.done():
                return
            if peer.role == "worker" and self.sandblaster is not None:
                self.sandblaster.lost(peer.rank)  # its tasks go to the others
            if self.recovery.restartable(peer):
                self.recovery.lose(peer)
            elif peer.role == "server" and self.config.cluster.replicas and peer.welcomed:
                self.recovery.fail_over(peer)
            else:
                hint = self.recovery.loss_hint(peer)
                self.fail(f"{peer} disconnected unexpectedly ({exc}); {hint}")
        except PsctlError as exc:
            self.fail(f"{peer} sent an invalid message: {exc}")

    async def _hello(self, connection: Connection) -> Hello | Attach:
        """The hello (or a party's attach) a connection opens with, or a PsctlError saying why
        it is refused."""
        timeout = min(self.config.cluster.connect_timeout_s, HELLO_TIMEOUT_S)
        try:
            hello = parse_control(await asyncio.wait_for(connection.recv(), timeout))
        except TimeoutError:
            raise ProtocolError(f"no hello within {timeout:g} s of connecting") from None
        role: str
        if isinstance(hello, Attach):
            role, rank = hello.client, 0
        elif isinstance(hello, Hello):
            role, rank = hello.role, hello.rank
        else:
            raise ProtocolError(f"expected hello, got {hello.type}")
        admission = connection.admission
        if admission is not None and not admission.permits(role, rank):
            raise AuthenticationError(f"admitted as {admission}, it said hello as "
                                      f"{role} {rank}")
        return hello

    async def _refuse(self, connection: Connection, why: PsctlError) -> None:
        """Close a connection whose hello is bad, and record and log it a bounded number of
        times (a flood of them is only counted)."""
        self._refused += 1
        if self._refused <= REFUSALS_RECORDED:
            log.warning("refused %s: %s", connection.remote, why)
            self.event("hello_refused", reason=str(why), remote=connection.remote,
                       refused=self._refused)
        elif self._refused == REFUSALS_RECORDED + 1:
            log.warning("refused %s: %s; more refusals are counted, not logged",
                        connection.remote, why)
        # A websocket's close reason holds at most 123 bytes.
        reason = str(why).encode()[:_CLOSE_REASON_BYTES].decode(errors="ignore")
        with contextlib.suppress(PsctlError, TimeoutError):
            await asyncio.wait_for(connection.close(1008, reason), _CLOSE_WAIT_S)

    async def _admit(self, peer: Peer, hello: Hello) -> None:
        if hello.role == "server":
            empty = peer.rejoined or peer.newcomer  # it takes copies by handoffs
            peer.incarnation = secrets.randbits(64)
            welcome = self._welcome(shards=[]).model_copy(update={
                "held": [] if empty else self.placement.held(hello.rank),
                "primaries": [] if empty else self.placement.primaries(hello.rank),
                "checkpoint": None if self.resume is None or empty
                else str(self.resume.folder), "heartbeat_port": self._beats_port,
                "heartbeat_incarnation": peer.incarnation})
            await self.send(peer, welcome)
            if empty and self._clocks_per_epoch is not None:
                await self.send(peer, Start(clocks_per_epoch=self._clocks_per_epoch))
        else:
            await self._await_servers()
            welcome = self._welcome(shards=self.placement.shard_map())
            welcome = welcome.model_copy(update={"backups": self.placement.backups()})
            if peer.role == "worker" and hello.rank in self.membership.joining:
                await self.scaling.admit_newcomer(peer)
            if peer.role == "worker":
                welcome = welcome.model_copy(update=self.scaling.welcome_of(hello.rank))
            await self.send(peer, welcome)
        peer.welcomed = True
        if self.state.stop_reason is not None and peer.role in ("worker", "server"):
            # the stop went out before its welcome (a tiny stop.max_seconds): it must stop too
            await self.send(peer, Stop(reason=self.state.stop_reason))
        elif peer.role == "worker" and peer.rank in self.membership.leaving:
            await self.send(peer, Stop(reason="scaled down before it joined"))
        elif peer.role == "evaluator":
            self.evaluations.evaluator_back()

    async def _await_servers(self) -> None:
        """Until the shard servers listen; a ProtocolError if the run ends first (a role that
        joins as the run fails is not held until the join deadline, nor the coordinator's
        exit with it) or past the join deadline."""
        ready: asyncio.Future[Any] = asyncio.ensure_future(self.servers_ready.wait())
        waited: set[asyncio.Future[Any]] = {ready, self.outcome}
        try:
            await asyncio.wait(waited, timeout=self.join_deadline_s,
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            ready.cancel()
        if self.servers_ready.is_set():
            return
        if self.outcome.done():
            raise ProtocolError("the run ended before the shard servers listened")
        raise ProtocolError(f"shard servers did not start listening within "
                            f"{self.join_deadline_s:.0f} s")

    def _register(self, hello: Hello, connection: Connection) -> Peer:
        limit = {"server": self.config.cluster.servers, "worker": self.config.cluster.workers,
                 "evaluator": 1}[hello.role]
        started = {"worker": self.membership.started, "server": self.state.server_members.started}
        newcomer = hello.rank >= limit and hello.rank in started.get(hello.role, set())
        if hello.rank >= limit and not newcomer:
            raise ProtocolError(f"{hello.role} rank {hello.rank} is outside 0..{limit - 1}")
        before = self.peers.get((hello.role, hello.rank))
        if before is not None and not before.lost:
            raise ProtocolError(f"{hello.role} {hello.rank} joined twice")
        if before is not None and hello.role == "server" and not self.config.cluster.replicas:
            raise ProtocolError(f"server {hello.rank} joined again, but without replicas a "
                                "server's keys cannot be handed back to it")
        server = hello.role == "server"
        peer = Peer(hello.role, hello.rank, connection, pid=hello.pid,
                    ours=hello.machine in ("", this_machine()),
                    rejoined=server and before is not None,
                    newcomer=server and before is None and newcomer)
        self.peers[(hello.role, hello.rank)] = peer
        if peer.rejoined:  # a server started again: it is heard from now on
            self.recovery.watch.watch(hello.rank)
            self.event("server_rejoined", rank=hello.rank, pid=hello.pid,
                       ranges=self.placement.rejoining(hello.rank), node=hello.node,
                       machine=hello.machine, **start_up(hello))
        elif before is not None:  # a restarted worker or evaluator takes the dead one's place
            self.event(f"{hello.role}_rejoined", role=hello.role, rank=hello.rank,
                       pid=hello.pid, restarts=self.state.restarts.get((hello.role, hello.rank), 0),
                       node=hello.node, machine=hello.machine, **start_up(hello))
        else:
            self.event("process_joined", role=hello.role, rank=hello.rank, pid=hello.pid,
                       node=hello.node, machine=hello.machine, **start_up(hello))
            self.parties.one_joined()
        if self.sampler is not None and peer.ours:
            self.sampler.watch(hello.role, hello.rank, hello.pid)
        return peer

    def _welcome(self, *, shards: list[ShardInfo]) -> Welcome:
        return Welcome(run_id=self.run_id, config=self._role_config,
                       num_keys=self.num_keys, segments=layout_info(self.layout),
                       shards=shards, started_at=self.started_at)

    # -- messages -------------------------------------------------------------------------------

    def _on_message(self, peer: Peer, message: ControlMessage) -> None:
        handler = self._handlers.get(type(message))
        if handler is None:
            raise ProtocolError(f"{peer} may not send {message.type}")
        handler(peer, message)

    def _message_handlers(self) -> dict[type[Message], Callable[[Peer, Any], None]]:
        sandblaster = self._on_sandblaster
        return {Iterations: self._on_iterations, Event: self._on_event, Syncs: self._on_syncs,
                Serving: self._on_serving, Ready: self._on_ready, Done: self._on_done,
                Evaluation: lambda _, m: self.evaluations.on_evaluation(m),
                EpochDone: lambda p, m: self.evaluations.on_epoch_done(p.rank, m.epoch),
                VectorResults: sandblaster, TaskDone: sandblaster, TaskPushed: sandblaster,
                Fatal: self._on_fatal}

    def _on_iterations(self, peer: Peer, message: Iterations) -> None:
        if any(row.worker != peer.rank for row in message.rows):
            raise ProtocolError(f"{peer} reported iterations of another worker")
        self.records.iterations(message.rows)
        if message.rows:
            self.progress.iterations[peer.rank] = message.rows[-1].iteration + 1
        self.spending.on_rows(message.rows)
        if message.layers:
            if any(row.worker != peer.rank for row in message.layers):
                raise ProtocolError(f"{peer} reported layers of another worker")
            self.records.layers(message.layers)
        if message.metrics:
            if any(m.role != "worker" or m.rank != peer.rank for m in message.metrics):
                raise ProtocolError(f"{peer} reported metrics of another process")
            self.records.user_metrics(message.metrics)

    def _on_event(self, peer: Peer, message: Event) -> None:
        self.records.event_row(message.row)
        if peer.role == "server":  # each part takes the kinds it waits for
            for part in (self.moves, self.recovery, self.scaling):
                part.on_server_event(message.row)

    def _on_syncs(self, peer: Peer, message: Syncs) -> None:
        for row in message.rows:
            self.records.sync(row)

    def _on_serving(self, peer: Peer, message: Serving) -> None:
        copies = {c.index: c.address for c in message.copies}
        self.placement.serving(peer.rank, copies)
        served = self.placement.primaries(peer.rank)
        self.event("server_listening", rank=peer.rank, copies=copies,
                   address=copies.get(served[0]) if served else None)
        if peer.rejoined and peer.rank < self.config.cluster.servers:
            self.spawn(self.moves.rereplicate(peer.rank))
        elif peer.rejoined or peer.newcomer:
            self.spawn(self.moves.take_ranges(peer.rank))
        elif self.placement.all_serving():
            if self.config.cluster.replicas:  # the chains are linked before any push
                for order in self.placement.links():
                    self.spawn(self.order(order.server, order.message))
            else:
                self.servers_ready.set()

    def _on_ready(self, peer: Peer, message: Ready) -> None:
        self.progress.iterations_per_epoch[peer.rank] = message.iterations_per_epoch
        if message.first_iteration:
            self.progress.iterations[peer.rank] = message.first_iteration
        # Each worker is ready once its data is loaded; the displays count these to say
        # what start-up is waiting for, and take the run's total from training_started.
        self.event("worker_ready", rank=peer.rank,
                   iterations_per_epoch=message.iterations_per_epoch,
                   first_iteration=message.first_iteration)
        self._train_samples = message.train_samples
        if self.training.is_set():  # a restarted worker: the others are training already
            self.spawn(self.send(peer, Start()))
            if self.sandblaster is not None:
                self.sandblaster.joined(peer.rank)
        elif len(self.progress.iterations_per_epoch) == self.config.cluster.workers:
            self._training_begins()

    def _training_begins(self) -> None:
        planned = (None if self.config.stop.budget is not None else
                   self.config.train.epochs * sum(self.progress.iterations_per_epoch.values()))
        self.training.set()
        self.state.training_at = time.monotonic()
        if self.resume is None:
            self.event("training_started", total_iterations=planned)
        else:
            self.event("training_resumed", total_iterations=planned,
                       checkpoint=self.resume.seq,
                       first_iterations=dict(sorted(self.progress.iterations.items())))
        self.spawn(self._start_training(min(self.progress.iterations_per_epoch.values())))

    def _on_sandblaster(self, peer: Peer,
                        message: VectorResults | TaskDone | TaskPushed) -> None:
        if self.sandblaster is None or (peer.role == "server") != isinstance(
                message, VectorResults):
            raise ProtocolError(f"{peer} may not send {message.type}")
        try:
            self.sandblaster.on_message(peer, message)
        except RunFailed as exc:
            self.fail(str(exc))

    def _on_fatal(self, peer: Peer, message: Fatal) -> None:
        if message.diverged:
            self.event("diverged", role=peer.role, rank=peer.rank, message=message.message)
            self.fail(message.message)
            return
        self.event("process_error", role=peer.role, rank=peer.rank,
                   message=message.message, traceback=message.traceback[-4000:])
        if not self.outcome.done():  # a role failing as the run ends does not change how
            self.fail(f"{peer} failed: {message.message}")

    def _on_done(self, peer: Peer, message: Done) -> None:
        peer.leaving = True  # a worker that is done closes its connection; that is no failure
        self.progress.done.add(peer.rank)
        self.event("worker_done", rank=peer.rank, iterations=message.iterations,
                   reason=message.reason)
        if self.membership.scaled:  # its last push is in: nobody waits for it any more
            self.membership.leaving.discard(peer.rank)
            self.spawn(self.scaling.update_members())
        if self.membership.active <= self.progress.done:
            self._all_done.set()

    # -- ending ---------------------------------------------------------------------------------

    def stop(self, reason: str) -> None:
        if self.state.stop_reason is not None:
            return
        self.state.stop_reason = reason
        self.event("stop", reason=reason)
        for peer in list(self.peers.values()):
            if peer.role in ("worker", "server") and peer.welcomed:  # _admit stops the others
                self.spawn(self.send(peer, Stop(reason=reason)))

    async def _finish_when_done(self) -> None:
        await self._all_done.wait()
        if self.state.stop_reason is None:  # every epoch ran: freeze the model for the final test
            self.stop("all epochs done")
        if not any(self.progress.iterations.values()):
            self.fail(f"no worker completed an iteration before the run stopped "
                      f"({self.state.stop_reason})")
            return
        await self._settle_sandblaster()
        if not await self.evaluations.final():
            self.fail("the evaluator did not deliver the final evaluation in time")
            return
        self._settle(RunStatus.FINISHED, self.state.stop_reason)

    async def _dismiss_all(self) -> None:
        for peer in self.peers.values():
            peer.leaving = True
        await asyncio.gather(*(self.send(peer, Exit()) for peer in self.peers.values()),
                             return_exceptions=True)
        # Give roles a moment to send their last events and close on their side.
        await asyncio.sleep(0.2)
        await asyncio.gather(*(peer.connection.close() for peer in self.peers.values()),
                             return_exceptions=True)

    # -- timers ---------------------------------------------------------------------------------

    async def _watch_registration(self) -> None:
        await asyncio.sleep(self.join_deadline_s)
        expected = [("server", r) for r in range(self.config.cluster.servers)]
        expected += [("worker", r) for r in range(self.config.cluster.workers)]
        expected.append(("evaluator", 0))
        missing = [f"{role} {rank}" for role, rank in expected if (role, rank) not in self.peers]
        if missing:
            self.fail(join_failure(missing, self.config))

    async def _sample_processes(self) -> None:
        if self.sampler is None:
            return
        while True:
            await asyncio.sleep(SAMPLE_INTERVAL_S)
            rows = self.sampler.sample()
            if rows:
                self.records.samples(rows)

    async def _deadline(self) -> None:
        if self.config.stop.max_seconds is None:
            return
        await asyncio.sleep(self.config.stop.max_seconds)
        self.stop(f"time limit of {self.config.stop.max_seconds:g} s reached")

    # -- helpers --------------------------------------------------------------------------------

    async def _start_training(self, iterations_per_epoch: int) -> None:
        """Tell the servers an epoch's clocks (for schedules by epoch), then start the workers:
        the servers' Start is on their sockets before any worker can push."""
        clocks = iterations_per_epoch / self.config.train.push_every  # Downpour: one per push
        self._clocks_per_epoch = clocks
        by_role = {role: [p for p in self.peers.values() if p.role == role]
                   for role in ("server", "worker")}
        await asyncio.gather(*(self.send(server, Start(clocks_per_epoch=clocks))
                               for server in by_role["server"]))
        await asyncio.gather(*(self.send(worker, Start()) for worker in by_role["worker"]))
        self.spending.start()
        if SERVER_OPTIMIZERS.can(self.config.optimizer.name, DRIVES_TRAINING):
            self._sandblaster_task = asyncio.create_task(self._run_sandblaster())
            self._tasks.add(self._sandblaster_task)

    async def _run_sandblaster(self) -> None:
        """The coordinator's L-BFGS: its end (epochs spent, converged) stops the run."""
        try:
            self.sandblaster = Sandblaster(
                self.config, samples=self._train_samples,
                peers=lambda role: [p for p in self.peers.values() if p.role == role],
                send=self.send, event=self.event,
                stopping=lambda: self.state.stop_reason is not None)
            reason = await self.sandblaster.minimise(self.config.train.epochs)
        except RunFailed as exc:
            self.fail(str(exc))
            return
        except Exception as exc:  # a bug must end the run, not leave it waiting forever
            log.exception("the L-BFGS driver failed")
            self.fail(f"the L-BFGS driver failed: {exc!r}")
            return
        self.stop(reason)

    async def _settle_sandblaster(self) -> None:
        """Before the final test: a line search cut off by the stop leaves a trial point in
        the shards; the last accepted iterate goes back."""
        task, self._sandblaster_task = self._sandblaster_task, None
        if task is None or self.sandblaster is None:
            return
        task.cancel()  # it ends by itself once it sees the stop; this covers a round trip
        with contextlib.suppress(asyncio.CancelledError):
            await task
        try:
            await self.sandblaster.settle()
        except RunFailed as exc:
            self.fail(f"could not put the last L-BFGS iterate back: {exc}")

    async def send(self, peer: Peer, message: Message) -> None:
        if peer.lost:  # a dead worker or server: its replacement gets its own messages
            return
        try:
            await peer.connection.send(dump_control(message))
        except ConnectionClosed:
            # A worker that can be restarted, or a replicated server: its reader sees the
            # close too, and decides (restart, failover); anyone else's loss ends the run.
            replicated = peer.role == "server" and self.config.cluster.replicas > 0
            if not (peer.leaving or replicated or self.recovery.restartable(peer)):
                self.fail(f"{peer} disconnected unexpectedly")

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        task.add_done_callback(self._task_ended)
        self._tasks.add(task)

    def _task_ended(self, task: asyncio.Task[Any]) -> None:
        """A background task's error is the run's: recorded, and it ends the run, instead of
        asyncio's "Task exception was never retrieved" long after."""
        self._tasks.discard(task)
        if task.cancelled() or task.exception() is None:
            return
        error = task.exception()
        name = getattr(task.get_coro(), "__qualname__", task.get_name())
        log.error("the coordinator's %s failed", name, exc_info=error)
        self.event("task_failed", task=name, error=repr(error))
        self.fail(f"the coordinator's {name} failed: {error!r}")

    def event(self, kind: str, **detail: Any) -> None:
        self.records.event(kind, **detail)

    async def order(self, server: int, message: Message) -> None:
        peer = self.peers.get(("server", server))
        if peer is None or peer.lost:
            self.fail(f"server {server} is gone; it cannot take {type(message).__name__}")
            return
        await self.send(peer, message)
