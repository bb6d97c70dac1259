"""The simulated cluster: builds the servers, workers and evaluator of a run in one process and
runs them on a virtual-time loop, recording as the coordinator does (same tables, same events),
with every timestamp virtual: the run's start plus virtual seconds."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from engine import usermetrics
from engine.budget import budget_of
from engine.config import RunConfig
from engine.datasets.sparse import SparseSplit
from engine.errors import PsctlError, RunFailed
from engine.keys import KeyLayout, partition, split_keys_by_shard
from engine.sim.client import SimClient
from engine.sim.compute import Costs, costs_for, sparse_costs_for
from engine.sim.network import Link, parse_network
from engine.sim.server import Network, SimServer
from engine.sim.worker import SIM_LOOPS, SharedModel, SimWorker, WorkerContext
from engine.wire.records import (
    EvaluationRecord,
    EventRecord,
    IterationRecord,
    RunStatus,
    SyncRecord,
    UserMetricRecord,
    divergence,
)
from engine.worker.loops import Shard, logged_with, shard_for

if TYPE_CHECKING:
    from engine.models.rows import Measured, RowsEvaluation, RowsModel

# Rows go to the recorder in batches of this many (it queues them; the writer batches again).
FLUSH_ROWS = 512
# A server's inbox holds at most this many requests per worker (a delayed worker has up to
# delay + 1 pushes and pulls in flight; more than this is a bug in a loop).
QUEUED_PER_WORKER = 64


class Sink(Protocol):
    def record_iterations(self, rows: list[IterationRecord]) -> None: ...

    def record_evaluation(self, row: EvaluationRecord) -> None: ...

    def record_event(self, row: EventRecord) -> None: ...

    def record_sync(self, row: SyncRecord) -> None: ...

    def record_user_metrics(self, rows: list[UserMetricRecord]) -> None: ...


@dataclass
class _Progress:
    per_epoch: dict[int, int] = field(default_factory=dict)
    iterations: dict[int, int] = field(default_factory=dict)
    epochs_done: dict[int, int] = field(default_factory=dict)

    def epoch(self, workers: int) -> float:
        return sum(self.iterations.get(w, 0) / ipe for w, ipe in self.per_epoch.items()) / workers


@dataclass
class _Model:
    """What the run's model gives the cluster."""

    layout: KeyLayout
    costs: Costs
    initial: np.ndarray | None  # what worker 0 sends the servers; None: they start every key
    inputs: np.ndarray | SparseSplit  # the training set
    targets: np.ndarray
    update_keys: int  # the keys of the reference update (the ``simulated`` event's update_ms)
    detail: dict[str, Any] = field(default_factory=dict)  # more for the ``simulated`` event


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
        self._metrics: list[UserMetricRecord] = []  # what the user's code logged (psctl.log)
        self.servers: list[SimServer] = []
        # As the coordinator's budget (engine.roles.spending), in virtual time.
        self.budget = budget_of(config.stop.budget)
        self._marks = list(self.budget.marks()) if self.budget else []
        self._spent = 0
        self._evaluated_at: float | None = None
        # The model: a dense one shared by every simulated worker, or one of sparse samples.
        self.shared: SharedModel | None = None
        self.rows: RowsModel | None = None
        self._test: tuple[np.ndarray, np.ndarray] | None = None
        self._evaluation: RowsEvaluation | None = None

    # -- building ---------------------------------------------------------------------------

    async def run(self) -> tuple[RunStatus, str | None, float]:
        """Simulate the run; (status, reason, virtual seconds it took)."""
        with usermetrics.collecting():
            return await self._run()

    async def _run(self) -> tuple[RunStatus, str | None, float]:
        workers = self._build()
        usermetrics.take_open()  # what measuring the compute cost logged is no iteration's
        serving: list[asyncio.Future[Any]] = [asyncio.ensure_future(server.serve())
                                              for server in self.servers]
        timers: list[asyncio.Future[Any]] = [asyncio.ensure_future(self._evaluations()),
                                             asyncio.ensure_future(self._deadline()),
                                             asyncio.ensure_future(self._spend_seconds())]
        try:
            done = await self._train(workers, serving)
        except PsctlError as exc:  # a refused push (a diverged model), a deadlock: the run fails
            self._flush()
            self._event("run_failed", reason=str(exc))
            return RunStatus.FAILED, str(exc), asyncio.get_running_loop().time()
        finally:
            await _cancel(serving + timers)
        return self._finish(done, asyncio.get_running_loop().time())

    def _build(self) -> list[SimWorker]:
        """The data, the model, the costs, the servers (initialised) and the workers."""
        from engine.datasets.sources import is_sparse_source

        cfg = self.config
        built = (self._sparse_model() if is_sparse_source(cfg.data.dataset)
                 else self._dense_model())
        layout, costs = built.layout, built.costs
        self._event("simulated", network=cfg.sim.network,
                    server_network=cfg.sim.server_network or cfg.sim.network,
                    **costs.as_detail(built.update_keys), **built.detail)
        self.network = Network()
        self.servers = self._servers(layout, costs, built.initial)
        workers = [self._worker(rank, layout, costs, built.inputs, built.targets)
                   for rank in range(cfg.cluster.workers)]
        per_epoch = workers[0].shard.iterations_per_epoch
        for server in self.servers:  # schedules by epoch: as the coordinator's Start tells them
            server.state.learning.start(per_epoch / cfg.train.push_every)
        self._event("training_started", total_iterations=(
            None if self.budget is not None else
            per_epoch * cfg.train.epochs * cfg.cluster.workers))
        return workers

    def _dense_model(self) -> _Model:
        import torch

        from engine.datasets import load_dataset
        from engine.models.flat import FlatModel

        cfg = self.config
        # As each worker process does: more intra-op threads than cores spin against each other.
        torch.set_num_threads(cfg.train.torch_threads)
        data_dir = Path(cfg.data.data_dir) if cfg.data.data_dir else None
        data = load_dataset(cfg.data.dataset, data_dir, train_limit=cfg.data.train_limit)
        model = FlatModel.for_run(cfg.model, data.spec, seed=cfg.train.seed)
        costs = costs_for(cfg, model, data.train_x, data.train_y)
        self.shared = SharedModel(model)
        self._test = data.test_x, data.test_y
        return _Model(model.layout, costs, model.params_np, data.train_x, data.train_y,
                      model.num_keys)

    def _sparse_model(self) -> _Model:
        """A model of sparse samples (engine.models.rows), as its workers and evaluator build
        it: no torch, no values held; the servers start every key (worker 0 sends no INIT
        unless the model gives initial values)."""
        from engine.datasets.sources import load_sparse
        from engine.models.rows import rows_model

        cfg = self.config
        data = load_sparse(cfg.data.dataset, train_limit=cfg.data.train_limit,
                           hash_features=cfg.data.hash_features)
        model = rows_model(cfg.model, data.spec.input_dim)
        layout = model.layout()
        costs, update_keys = sparse_costs_for(cfg, model, layout, data.train)
        self.rows = model
        self._evaluation = model.evaluation(data.train, data.test, cfg.optimizer.l1)
        return _Model(layout, costs, model.initial_values(), data.train, data.train.labels,
                      update_keys, {"update_keys": update_keys,
                                    "update_of": "push of a batch's working set"})

    def _servers(self, layout: KeyLayout, costs: Costs,
                 initial: np.ndarray | None) -> list[SimServer]:
        from engine.roles.server import build_shard
        from engine.server.pull_filter import make_pull_filter

        cfg = self.config
        servers = []
        # As the coordinator cuts them: a mixed layout (the embedding model's sparse table and
        # dense layers) never puts both kinds on one shard.
        ranges = partition(layout, cfg.cluster.servers)
        for index, keys in enumerate(ranges):
            state = build_shard(cfg, keys, layout)
            if initial is not None:  # worker 0's INIT; sparse shards and rules start alone
                state.init(keys, initial[keys.start:keys.end])
            link = Link(parse_network(cfg.sim.server_network or cfg.sim.network))
            pulls = make_pull_filter(cfg.comm.pull_filter, cfg.comm.refresh_every,
                                     cfg.cluster.workers, state.size)
            servers.append(SimServer(index, state, self.network, link, costs,
                                     max_queued=QUEUED_PER_WORKER * cfg.cluster.workers,
                                     on_syncs=self._syncs if index == 0 else None,
                                     pull_filter=pulls))
        return servers

    def _worker(self, rank: int, layout: KeyLayout, costs: Costs,
                inputs: np.ndarray | SparseSplit, targets: np.ndarray) -> SimWorker:
        from engine.policies.loops import loop_name
        from engine.wire.protocol import numpy_dtype, wire_dtype
        from engine.worker.filters import make_filter

        cfg = self.config
        shard: Shard = shard_for(inputs, targets, rank=rank, workers=cfg.cluster.workers,
                                 seed=cfg.train.seed, batch_size=cfg.train.batch_size)
        self.progress.per_epoch[rank] = shard.iterations_per_epoch
        ctx = WorkerContext(cfg, layout, self.shared, costs.compute_s, self._should_stop,
                            self._record, self._epoch_done, self.rows)
        client = SimClient(rank, self.servers, Link(parse_network(cfg.sim.network)),
                           dtype=numpy_dtype(wire_dtype(cfg.comm.wire_dtype)), epoch=self.epoch,
                           keeps_copy=cfg.comm.pull_filter != "none")
        grad_filter, params = None, np.empty(0, dtype=np.float32)
        if self.rows is None:  # the sparse loop has no push filter and holds no values
            grad_filter = make_filter(cfg.comm, [s.keys for s in layout.segments],
                                      layout.num_keys, cfg.cluster.workers)
            params = np.empty(layout.num_keys, dtype=np.float32)
        return SIM_LOOPS.get(loop_name(cfg))(rank, ctx, client, shard, params, grad_filter)

    # -- running ----------------------------------------------------------------------------

    async def _train(self, workers: list[SimWorker], serving: list[asyncio.Future[Any]]) -> int:
        """Every worker to its end; a server that fails fails the run at once."""
        runs = [asyncio.ensure_future(w.run()) for w in workers]
        pending = set(runs) | set(serving)
        while any(not r.done() for r in runs):
            finished, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in finished:
                error = task.exception()
                if error is not None:
                    await _cancel(list(pending))
                    raise error
                if task in serving:
                    raise RunFailed("a simulated server stopped serving")
        total = 0
        for rank, task in enumerate(runs):
            total += task.result()
            self._event("worker_done", rank=rank, iterations=task.result(),
                        reason=self.stop_reason or "epochs done")
        return total

    def _should_stop(self) -> bool:
        if self.interrupted.is_set() and self.stop_reason is None:
            self._stop("interrupted")
        return self.stop_reason is not None

    def _stop(self, reason: str) -> None:
        if self.stop_reason is None:
            self.stop_reason = reason
            self._event("stop", reason=reason)
            for server in self.servers:  # a worker held at a barrier must see the stop too
                server.drain()

    def _record(self, row: IterationRecord) -> None:
        self._rows.append(row)
        self._metrics.extend(logged_with(row))
        self.progress.iterations[row.worker] = row.iteration + 1
        budget = self.budget
        if budget is not None and budget.unit != "s":
            self._spent += row.samples if budget.unit == "samples" else 1
            while self._marks and self._spent >= self._marks[0]:
                self._marks.pop(0)
                self._evaluate(self.progress.epoch(self.config.cluster.workers))
            if self._spent >= budget.amount:
                self._stop(f"budget of {budget.text} spent")
        if len(self._rows) >= FLUSH_ROWS:
            self._flush()

    def _flush(self) -> None:
        if self._rows:
            self.sink.record_iterations(self._rows)
            self._rows = []
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
                self._evaluate(float(after + 1))

    async def _evaluations(self) -> None:
        """Every eval.interval_s until the run stops: then no timer is left to tick, so roles
        that wait for what never comes are a deadlock, reported, not an endless virtual time."""
        while self.stop_reason is None:
            await asyncio.sleep(self.config.eval.interval_s)
            if self.progress.iterations and self.stop_reason is None:
                self._evaluate(self.progress.epoch(self.config.cluster.workers))

    async def _deadline(self) -> None:
        limit = self.config.stop.max_seconds
        if limit is not None:
            await asyncio.sleep(limit)
            self._stop(f"time limit of {limit:g} s reached")

    async def _spend_seconds(self) -> None:
        """A budget in seconds: the model tested at each mark, the run stopped at its end,
        counted from virtual time 0, when the workers start."""
        budget = self.budget
        if budget is None or budget.unit != "s":
            return
        loop = asyncio.get_running_loop()
        for mark in self._marks:
            await asyncio.sleep(max(0.0, mark - loop.time()))
            if self.stop_reason is None:
                self._evaluate(self.progress.epoch(self.config.cluster.workers))
        await asyncio.sleep(max(0.0, budget.amount - loop.time()))
        self._stop(f"budget of {budget.text} spent")

    def _evaluate(self, epoch: float) -> EvaluationRecord | None:
        """Test the model the servers hold now (once per virtual instant: a budget's mark and
        the periodic timer may fall together)."""
        usermetrics.take_open()  # only what testing logs is the evaluation's
        if self._evaluation is not None:
            measured, step = self._measure_sparse(self._evaluation)
            accuracy, loss, facts = measured.accuracy, measured.loss, measured.facts
        else:
            (accuracy, loss), step, facts = self._measure_dense(), self._newest_version(), {}
        logged = usermetrics.take_open()
        now = asyncio.get_running_loop().time()
        if now == self._evaluated_at:
            return None
        self._evaluated_at = now
        row = EvaluationRecord(at=self.epoch + now, elapsed_s=now, step=step, accuracy=accuracy,
                               loss=loss, epoch=epoch)
        if facts:  # as the real evaluator: how sparse the model is, per measurement
            self._event("sparse_model", epoch=row.epoch, objective=row.loss, **facts)
        self._metrics.extend(UserMetricRecord(role="evaluator", rank=0, iteration=row.step,
                                              at=row.at, name=name, value=value)
                             for name, value in logged.items())
        self._flush()  # the iterations before it reach the database first
        diverged = divergence(row)
        if diverged is not None:  # as the coordinator: stop, and fail the run with the reason
            self._event("diverged", accuracy=accuracy, step=row.step)
            self.failure = self.failure or diverged
            self._stop(diverged)
            return row
        self.sink.record_evaluation(row)
        self.best_accuracy = max(self.best_accuracy, accuracy)
        target = self.config.stop.target_accuracy
        if target is not None and accuracy >= target:
            self._stop(f"target accuracy {target:.4f} reached")
        return row

    def _measure_dense(self) -> tuple[float, float]:
        """(accuracy, loss) of the servers' values on the test set, by the shared model."""
        import torch

        from engine.models.flat import evaluate

        assert self.shared is not None and self._test is not None
        model = self.shared.model
        for server in self.servers:
            keys = server.state.keys
            np.copyto(model.params_np[keys.start:keys.end], server.state.params)
        inputs, targets = self._test
        return evaluate(model.module, torch.from_numpy(inputs), torch.from_numpy(targets))

    def _newest_version(self) -> int:
        return max(int(s.state.versions.max()) for s in self.servers)

    def _measure_sparse(self, evaluation: RowsEvaluation) -> tuple[Measured, int]:
        """As the real evaluator (engine.roles.evaluator.SparseEvaluator): the values of the
        keys its evaluation asks for, read as its pulls are (any clock, no pull filter), and
        the newest version of a shard they were read from; its metrics (``auc``) logged as the
        evaluator's."""
        keys = evaluation.keys
        values = np.empty(len(keys), dtype=np.float32)
        step = 0
        ranges = [server.state.keys for server in self.servers]
        for index, mine in split_keys_by_shard(keys, ranges):
            state = self.servers[index].state
            values[mine] = state.read(state.keys, keys[mine])
            step = max(step, state.version_of(state.keys))
        measured = evaluation.measure(values)
        for name, value in measured.metrics.items():
            usermetrics.log(name, value)
        return measured, step

    def _finish(self, done: int, now: float) -> tuple[RunStatus, str | None, float]:
        self._flush()
        if self.stop_reason is None:
            self._stop("all epochs done")
        if self.stop_reason == "interrupted" and done == 0:
            return RunStatus.INTERRUPTED, "interrupted before any iteration", now
        if done == 0:
            return RunStatus.FAILED, f"no worker completed an iteration ({self.stop_reason})", now
        if self.failure is None:  # the final evaluation, of the model the servers hold now
            self._evaluate(self.progress.epoch(self.config.cluster.workers))
        for server in self.servers:
            self._event("server_stats", rank=server.index, version=server.state.version,
                        pushes=server.state.pushes, busy_s=server.busy_s,
                        range_versions=server.state.versions.tolist())
        if self.failure is not None:
            return RunStatus.FAILED, self.failure, now
        status = (RunStatus.INTERRUPTED if self.stop_reason == "interrupted"
                  else RunStatus.FINISHED)
        return status, self.stop_reason, now

    def _event(self, kind: str, **detail: Any) -> None:
        now = asyncio.get_running_loop().time()
        self.sink.record_event(EventRecord(at=self.epoch + now, kind=kind, detail=detail))


async def _cancel(tasks: list[asyncio.Future[Any]]) -> None:
    """Cancel and let them finish cancelling, so none is left pending when the loop closes."""
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
