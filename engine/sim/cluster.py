"""The simulated cluster: a run's real roles in one process, in virtual time.

The shard servers are the real ``ShardServer``s, the workers run the real worker loops
(``engine.policies.loops``) with the real ``ParameterClient``, and the evaluator is the real
one; they talk through the simulator's transport (``engine.sim.transport``) on a virtual-time
event loop. What is modelled is what each piece of work costs: the CPU of the simulated
machine's processes (``engine.sim.cpu``, its costs measured on this machine:
``engine.sim.costs``) and the links (``engine.sim.network``). This module does what the
coordinator does: it starts the roles, keeps the budget, asks for evaluations, stops the run,
and records as the coordinator does (same tables, same events), every timestamp virtual: the
run's start plus virtual seconds.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

from engine import usermetrics
from engine.budget import budget_of
from engine.config import RunConfig
from engine.errors import PsctlError, RunFailed
from engine.keys import KeyRange, partition
from engine.sim.building import Built, build_model, machine_cores
from engine.sim.cpu import Machine, Process
from engine.sim.green import run_blocking, wait_for
from engine.sim.network import LOOPBACK, Link, link_of
from engine.sim.runtime import SimulatedWorker, VirtualClock, VirtualIO
from engine.sim.transport import Endpoint, VirtualNetwork
from engine.transport.base import Message
from engine.wire.protocol import MsgType, Role, peek_kind
from engine.wire.records import (
    EvaluationRecord,
    EventRecord,
    IterationRecord,
    LayerRecord,
    RunStatus,
    SyncRecord,
    UserMetricRecord,
    divergence,
)
from engine.worker.loops import Shard, logged_with, shard_for
from engine.worker.timing import Pace, seconds

if TYPE_CHECKING:
    from engine.roles.evaluator import Measures
    from engine.server.service import ShardServer
    from engine.worker.client import ParameterClient

# Rows go to the recorder in batches of this many (it queues them; the writer batches again).
FLUSH_ROWS = 512
RUN = bytes(16)  # the run's id on the simulated wire
TOKEN = "psctl-simulated-run"  # the simulated roles' secret: admits them as the operator


class Sink(Protocol):
    def record_iterations(self, rows: list[IterationRecord]) -> None: ...

    def record_evaluation(self, row: EvaluationRecord) -> None: ...

    def record_event(self, row: EventRecord) -> None: ...

    def record_sync(self, row: SyncRecord) -> None: ...

    def record_user_metrics(self, rows: list[UserMetricRecord]) -> None: ...

    def record_layers(self, rows: list[LayerRecord]) -> None: ...


@dataclass
class _Progress:
    per_epoch: dict[int, int] = field(default_factory=dict)
    iterations: dict[int, int] = field(default_factory=dict)
    epochs_done: dict[int, int] = field(default_factory=dict)

    def epoch(self, workers: int) -> float:
        return sum(self.iterations.get(w, 0) / ipe for w, ipe in self.per_epoch.items()) / workers


def simulation_note(detail: dict[str, Any]) -> str:
    """How a simulated run turned work into virtual time, in words (``runs show``, its page)."""
    update = (f"{detail['update_of']} ({int(detail['update_keys']):,} keys)"
              if "update_of" in detail else "dense update of the whole model")
    floor = detail.get("compute_floor_ms")
    network = f"network {detail['network']}"
    if detail["server_network"] != detail["network"]:
        network += f" (servers' {detail['server_network']})"
    if not detail["compute_measured"]:  # sim.costs given
        return (f"costs given: a batch {floor:g} ms, {network}, {detail['update_ms']:.3g} ms per "
                f"{update}; every role on a machine of its own")
    padded = f", padded to {floor:g} ms (--compute-ms)" if floor is not None else ""
    cores = (f"{detail['cores']} cores shared by the run's processes" if detail["cores"]
             else "every role on a core of its own")
    how = "measured" if detail["update_measured"] else "given"
    return (f"{cores}: a batch {detail['compute_ms']:.3g} ms of CPU (measured){padded}, "
            f"{network}, {detail['update_ms']:.3g} ms per {update} ({how}), frames, rows and "
            f"tests as a local run spends them (measured)")


class SimCluster:
    def __init__(self, config: RunConfig, sink: Sink, *, epoch: float,
                 interrupted: threading.Event) -> None:
        self.config, self.sink, self.epoch = config, sink, epoch
        self.interrupted = interrupted
        self.progress = _Progress()
        self.stop_reason: str | None = None
        self.failure: str | None = None  # set when the model diverged
        self.best_accuracy = 0.0
        self._rows: list[IterationRecord] = []
        self._layers: list[LayerRecord] = []
        self._metrics: list[UserMetricRecord] = []  # what the user's code logged (psctl.log)
        self.servers: list[ShardServer] = []
        self._server_processes: list[Process] = []
        # As the coordinator's budget (engine.roles.spending), in virtual time.
        self.budget = budget_of(config.stop.budget)
        self._marks = list(self.budget.marks()) if self.budget else []
        self._spent = 0
        self._asked: asyncio.Queue[float] = asyncio.Queue()  # evaluations asked for (epochs)
        self._asked_at: float | None = None
        self._started = 0.0  # virtual time training started

    # -- building ---------------------------------------------------------------------------

    async def run(self) -> tuple[RunStatus, str | None, float]:
        """Simulate the run; (status, reason, virtual seconds it took)."""
        with usermetrics.collecting():
            return await self._run()

    async def _run(self) -> tuple[RunStatus, str | None, float]:
        loop = asyncio.get_running_loop()
        self.clock = VirtualClock(loop, self.epoch)
        built = build_model(self.config)
        usermetrics.take_open()  # what measuring the costs logged is no iteration's
        self.machine = Machine(machine_cores(self.config), built.costs.overheads.contention)
        self.network = VirtualNetwork()
        detail = {"network": self.config.regime.network or LOOPBACK.spec,
                  "server_network": (self.config.regime.server_network
                                     or self.config.regime.network or LOOPBACK.spec),
                  "cores": self.machine.cores, "compute_floor_ms": self.config.regime.compute_ms,
                  **built.costs.as_detail(built.update_keys), **built.detail}
        self._event("simulated", note=simulation_note(detail), **detail)
        try:
            workers, evaluate = await self._start(built)
        except PsctlError as exc:
            return self._failed(exc)
        timers = [asyncio.ensure_future(coro) for coro in (
            self._evaluations(), self._deadline(), self._spend_seconds())]
        evaluating = asyncio.ensure_future(evaluate)
        try:
            done = await self._train(workers, evaluating)
            await self._finish_evaluations(evaluating)
        except PsctlError as exc:  # a refused push (a diverged model), a deadlock: it fails
            return self._failed(exc)
        finally:  # what failed with the first failure is retrieved, what waits is ended
            await _cancel([*timers, evaluating, *workers])
            await self._close()
        return self._finish(done, loop.time())

    async def _start(self, built: Built) -> tuple[list[asyncio.Future[int]],
                                                  Coroutine[Any, Any, None]]:
        """The servers listening, the workers and the evaluator connected, worker 0's INIT in;
        returns the workers' training (started) and the evaluator's loop (not started)."""
        cfg = self.config
        self.costs = built.costs
        # The coordinator and the launcher's recorder: CPU for every row recorded.
        self._recording = self.machine.process("coordinator")
        self.servers = [await self._server(index, keys, built)
                        for index, keys in enumerate(partition(built.layout,
                                                                 cfg.cluster.servers))]
        shards = [(i, server.address, server.state.keys) for i, server in enumerate(self.servers)]
        trainers = []
        for rank in range(cfg.cluster.workers):
            process = self.machine.process(f"worker-{rank}")
            client = await self._client(shards, Role.WORKER, rank, process,
                                        link_of(cfg.regime.network))
            trainers.append(self._trainer(rank, client, process, built))
        evaluator = self.machine.process("evaluator")
        client = await self._client(shards, Role.EVALUATOR, 0, evaluator, Link(LOOPBACK))
        if built.initial is not None:  # worker 0's INIT (the servers keep the first)
            first = trainers[0][0].client
            initial = built.initial
            await run_blocking(lambda: first.wait(first.init(initial)))
        self._started = asyncio.get_running_loop().time()
        evaluate_s = self.costs.evaluate_s
        measures = built.evaluator(client, self.clock,
                                   lambda: wait_for(evaluator.work(evaluate_s)), self.clock.now())
        per_epoch = trainers[0][2].iterations_per_epoch
        for server in self.servers:  # schedules by epoch: as the coordinator's Start tells them
            server.state.learning.start(per_epoch / cfg.train.push_every)
        self._event("training_started", total_iterations=(
            None if self.budget is not None else
            per_epoch * cfg.train.epochs * cfg.cluster.workers))
        workers: list[asyncio.Future[int]] = [
            asyncio.ensure_future(run_blocking(partial(host.train, loop, shard)))
            for host, loop, shard in trainers]
        return workers, run_blocking(partial(self._evaluator, measures))

    async def _server(self, index: int, keys: KeyRange, built: Built) -> ShardServer:
        from engine.proctime import usable_cores
        from engine.roles.copies import build_shard
        from engine.server.limits import ServerLimits
        from engine.server.pull_filter import make_pull_filter
        from engine.server.service import ShardServer

        cfg = self.config
        state = build_shard(cfg, keys, built.layout)
        pulls = make_pull_filter(cfg.comm.pull_filter, cfg.comm.refresh_every,
                                 cfg.cluster.workers, state.size)
        process = self.machine.process(f"server-{index}")
        self._server_processes.append(process)
        overheads = self.costs.overheads
        server = ShardServer(
            state, run=RUN, rank=index, max_frame_bytes=cfg.cluster.max_frame_bytes,
            limits=ServerLimits.from_cluster(cfg.cluster, usable_cores()),
            on_syncs=self._syncs if index == 0 else None, pull_filter=pulls,
            monotonic=asyncio.get_running_loop().time, offload_from=None,
            made=lambda size: process.then(overheads.send_s(True, size), _nothing))
        link = link_of(cfg.regime.server_network or cfg.regime.network)
        endpoint = Endpoint(f"server-{index}", process, link, self._server_costs())
        await server.start(self.network.transport(endpoint), endpoint.name, 0, token=TOKEN)
        return server

    async def _client(self, shards: list[tuple[int, str, KeyRange]], role: Role, rank: int,
                      process: Process, link: Link) -> ParameterClient:
        """A role's parameter client, connected, as the worker role builds it (its wire format:
        the evaluator's stays float32)."""
        from engine.worker.client import PLAIN_WIRE, ParameterClient, ShardAddress, WireFormat

        cfg = self.config
        name = f"{role.name.lower()}-{rank}"
        endpoint = Endpoint(name, process, link, self._client_costs())
        wire = PLAIN_WIRE if role is Role.EVALUATOR else WireFormat.of(
            cfg.comm.wire_dtype, cfg.comm.compress, keeps_copy=cfg.comm.pull_filter != "none",
            range_size=cfg.comm.range_size)
        client = ParameterClient(
            self.network.transport(endpoint),
            [ShardAddress(index, address, keys) for index, address, keys in shards],
            token=TOKEN, run=RUN, role=role, rank=rank,
            connect_timeout_s=cfg.cluster.connect_timeout_s,
            request_timeout_s=cfg.cluster.request_timeout_s,
            max_frame_bytes=cfg.cluster.max_frame_bytes,
            io=VirtualIO(asyncio.get_running_loop()), wire=wire,
            duplicates_ok=role is Role.WORKER, now=self.clock.now)
        await run_blocking(client.connect)
        return client

    def _trainer(self, rank: int, client: ParameterClient, process: Process,
                 built: Built) -> tuple[SimulatedWorker, Any, Shard]:
        """Worker ``rank``: its host, its loop (the run's, from the registry) and its shard."""
        from engine.policies.loops import WORKER_LOOPS, loop_name
        from engine.worker.heterogeneity import Slowdown

        cfg, loop = self.config, asyncio.get_running_loop()
        shard = shard_for(built.inputs, built.targets, rank=rank, workers=cfg.cluster.workers,
                          seed=cfg.train.seed, batch_size=cfg.train.batch_size)
        self.progress.per_epoch[rank] = shard.iterations_per_epoch
        compute_s = built.costs.compute_s
        pace = Pace(self.clock, Slowdown(cfg.heterogeneity, rank=rank, seed=cfg.train.seed,
                                         clock=loop.time),
                    floor_s=seconds(cfg.regime.compute_ms),
                    spend=lambda: wait_for(process.work(compute_s)))
        overhead_s = built.costs.overheads.worker_iteration_s

        def record(row: IterationRecord, layers: list[LayerRecord]) -> None:
            self._record(row, layers)
            wait_for(process.work(overhead_s))  # the loop building and reporting its row

        host = SimulatedWorker(cfg, rank, KeyRange(0, built.layout.num_keys), built.layout,
                               client, self.clock, pace, should_stop=self._should_stop,
                               record=record, epoch_done=self._epoch_done)
        return host, WORKER_LOOPS.get(loop_name(cfg))(host, built.seat()), shard

    # -- what a message costs -----------------------------------------------------------------

    def _server_costs(self) -> Callable[[bool, Message], float]:
        """A server's: receiving a frame, and applying a push (or INIT) to its keys (sending one is
        charged as the server makes it)."""
        costs = self.costs
        wire = costs.overheads

        def charge(sending: bool, message: Message) -> float:
            size = len(message)
            if sending:  # charged when the server made the frame (ShardServer's ``made``)
                return 0.0
            kind, keys = peek_kind(message)
            update = costs.update_s(keys) if kind in (MsgType.PUSH, MsgType.INIT) else 0.0
            return wire.recv_s(True, size) + update
        return charge

    def _client_costs(self) -> Callable[[bool, Message], float]:
        """A worker's or the evaluator's: sending and receiving a frame."""
        wire = self.costs.overheads
        return lambda sending, message: (wire.send_s(False, len(message)) if sending
                                         else wire.recv_s(False, len(message)))

    # -- running ----------------------------------------------------------------------------

    async def _train(self, workers: list[asyncio.Future[int]],
                     evaluating: asyncio.Future[None]) -> int:
        """Every worker to its end; a failing worker or evaluator fails the run at once."""
        pending: set[asyncio.Future[Any]] = {*workers, evaluating}
        while any(not w.done() for w in workers):
            finished, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            # In rank order (a set's order is not the same twice): the same failure is the
            # run's reason every time.
            for task in [t for t in (*workers, evaluating) if t in finished]:
                error = task.exception()
                if error is not None:
                    raise error
                if task is evaluating:
                    raise RunFailed("the simulated evaluator stopped")
        total = 0
        for rank, task in enumerate(workers):
            total += task.result()
            self._event("worker_done", rank=rank, iterations=task.result(),
                        reason=self.stop_reason or "epochs done")
        return total

    def _should_stop(self) -> bool:
        if self.interrupted.is_set() and self.stop_reason is None:
            self._stop("interrupted")
        return self.stop_reason is not None

    def _stop(self, reason: str) -> None:
        """As the coordinator's Stop: the workers stop at their next step, and the servers
        drain (a worker held at a barrier is let go with the reason)."""
        if self.stop_reason is None:
            self.stop_reason = reason
            self._event("stop", reason=reason)
            for server in self.servers:
                server.drain(reason)

    def _record(self, row: IterationRecord, layers: list[LayerRecord]) -> None:
        self._recording.then(self.costs.overheads.row_s, _nothing)
        self._rows.append(row)
        self._layers.extend(layers)
        self._metrics.extend(logged_with(row))
        self.progress.iterations[row.worker] = row.iteration + 1
        budget = self.budget
        if budget is not None and budget.unit != "s":
            self._spent += row.samples if budget.unit == "samples" else 1
            while self._marks and self._spent >= self._marks[0]:
                self._marks.pop(0)
                self._ask(self.progress.epoch(self.config.cluster.workers))
            if self._spent >= budget.amount:
                self._stop(f"budget of {budget.text} spent")
        if len(self._rows) >= FLUSH_ROWS:
            self._flush()

    def _flush(self) -> None:
        if self._rows:
            self.sink.record_iterations(self._rows)
            self._rows = []
        if self._layers:
            self.sink.record_layers(self._layers)
            self._layers = []
        if self._metrics:
            self.sink.record_user_metrics(self._metrics)
            self._metrics = []

    def _syncs(self, rows: list[SyncRecord]) -> None:
        for row in rows:
            self.sink.record_sync(row)

    def _epoch_done(self, rank: int, epoch: int) -> None:
        workers = self.config.cluster.workers
        before = min(self.progress.epochs_done.get(w, -1) for w in range(workers))
        self.progress.epochs_done[rank] = epoch
        after = min(self.progress.epochs_done.get(w, -1) for w in range(workers))
        if after > before:
            self._event("epoch_done", epoch=after)
            if after + 1 < self.config.train.epochs and self.budget is None:
                self._ask(float(after + 1))

    # -- evaluations --------------------------------------------------------------------------

    def _ask(self, epoch: float) -> None:
        """An evaluation, as the coordinator asks its evaluator for one (once per instant: a
        budget's mark and the periodic timer may fall together)."""
        now = asyncio.get_running_loop().time()
        if now != self._asked_at:
            self._asked_at = now
            self._asked.put_nowait(epoch)

    async def _evaluations(self) -> None:
        """Every eval.interval_s until the run stops: then no timer is left to tick, so roles
        that wait for what never comes are a deadlock, reported, not an endless virtual time."""
        while self.stop_reason is None:
            await asyncio.sleep(self.config.eval.interval_s)
            if self.progress.iterations and self.stop_reason is None:
                self._ask(self.progress.epoch(self.config.cluster.workers))

    def _evaluator(self, measures: Measures) -> None:
        """The evaluator's loop (blocking code: its pulls and its test take virtual time): one
        evaluation after another, as asked; a None asks it to end."""
        while (epoch := wait_for(self._asked.get())) >= 0:
            usermetrics.take_open()  # only what testing logs is the evaluation's
            self._recorded(measures.measure(epoch), measures)

    def _recorded(self, row: EvaluationRecord, measures: Measures) -> None:
        logged = usermetrics.take_open()
        facts = getattr(measures, "facts", {})
        if facts:  # as the real evaluator: how sparse the model is, per measurement
            self._event("sparse_model", epoch=row.epoch, objective=row.loss, **facts)
        self._metrics.extend(UserMetricRecord(role="evaluator", rank=0, iteration=row.step,
                                              at=row.at, name=name, value=value)
                             for name, value in logged.items())
        self._flush()  # the iterations before it reach the database first
        diverged = divergence(row)
        if diverged is not None:  # as the coordinator: stop, and fail the run with the reason
            self._event("diverged", accuracy=row.accuracy, step=row.step)
            self.failure = self.failure or diverged
            self._stop(diverged)
            return
        self.sink.record_evaluation(row)
        self.best_accuracy = max(self.best_accuracy, row.accuracy)
        target = self.config.stop.target_accuracy
        if target is not None and row.accuracy >= target:
            self._stop(f"target accuracy {target:.4f} reached")

    async def _finish_evaluations(self, evaluating: asyncio.Future[None]) -> None:
        """The final evaluation, of the model the servers hold now, after those asked for."""
        if self.failure is None and self.progress.iterations:
            self._asked_at = None
            self._ask(self.progress.epoch(self.config.cluster.workers))
        self._asked.put_nowait(-1.0)
        await evaluating

    async def _deadline(self) -> None:
        limit = self.config.stop.max_seconds
        if limit is not None:
            await asyncio.sleep(self._started + limit - asyncio.get_running_loop().time())
            self._stop(f"time limit of {limit:g} s reached")

    async def _spend_seconds(self) -> None:
        """A budget in seconds: the model tested at each mark, the run stopped at its end,
        counted from when the workers start."""
        budget = self.budget
        if budget is None or budget.unit != "s":
            return
        loop = asyncio.get_running_loop()
        for mark in self._marks:
            await asyncio.sleep(max(0.0, self._started + mark - loop.time()))
            if self.stop_reason is None:
                self._ask(self.progress.epoch(self.config.cluster.workers))
        await asyncio.sleep(max(0.0, self._started + budget.amount - loop.time()))
        self._stop(f"budget of {budget.text} spent")

    # -- the end ------------------------------------------------------------------------------

    async def _close(self) -> None:
        for server in self.servers:
            await server.close()
        await _cancel(list(self.network.tasks))

    def _failed(self, exc: PsctlError) -> tuple[RunStatus, str | None, float]:
        self._flush()
        self._event("run_failed", reason=str(exc))
        return RunStatus.FAILED, str(exc), asyncio.get_running_loop().time()

    def _finish(self, done: int, took: float) -> tuple[RunStatus, str | None, float]:
        self._flush()
        if self.stop_reason is None:
            self._stop("all epochs done")
        if self.stop_reason == "interrupted" and done == 0:
            return RunStatus.INTERRUPTED, "interrupted before any iteration", took
        if done == 0:
            return RunStatus.FAILED, f"no worker completed an iteration ({self.stop_reason})", took
        for index, server in enumerate(self.servers):
            self._event("server_stats", rank=server.rank, version=server.state.version,
                        pushes=server.state.pushes,
                        busy_s=self._server_processes[index].busy_s,
                        range_versions=server.state.versions.tolist())
        if self.failure is not None:
            return RunStatus.FAILED, self.failure, took
        status = (RunStatus.INTERRUPTED if self.stop_reason == "interrupted"
                  else RunStatus.FINISHED)
        return status, self.stop_reason, took

    def _event(self, kind: str, **detail: Any) -> None:
        self.sink.record_event(EventRecord(at=self.clock.now(), kind=kind, detail=detail))


def _nothing() -> None:
    pass


async def _cancel(tasks: list[asyncio.Future[Any]]) -> None:
    """Cancel and let them finish cancelling, so none is left pending when the loop closes."""
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


