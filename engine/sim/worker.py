"""A simulated worker: the worker role's loops as coroutines in virtual time.

Each loop mirrors its real counterpart (``engine.worker.loops``, ``downpour``, ``delayed``,
``sparse``): the same order of pulls, computations and pushes, the same push filter, the same
rows. The gradient is real, computed on one model shared by every simulated worker (the values
each worker pulled are copied in first; a model of sparse samples holds no values and computes
on the pulled working set); the virtual time it takes is the compute model's, stretched by the
worker's straggler factor and jitter.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from engine import usermetrics
from engine.budget import epochs_to_run
from engine.config import RunConfig
from engine.consistency.registry import CONSISTENCY_MODELS, OWN_DELAY, asynchronous
from engine.datasets.sparse import SparseSplit
from engine.keys import KeyLayout, KeyRange
from engine.models.logreg import kkt_mask
from engine.registry import Registry
from engine.sim.client import SimClient
from engine.wire.protocol import ANY_CLOCK
from engine.wire.records import IterationRecord
from engine.worker.cache import read_cache
from engine.worker.client import PullResult, PushResult
from engine.worker.filters import GradientFilter
from engine.worker.heterogeneity import Slowdown
from engine.worker.local_step import LocalStep
from engine.worker.loops import Shard, finite_loss, iteration_row, merge_pushes, push_bytes

if TYPE_CHECKING:
    from engine.models.flat import FlatModel
    from engine.models.rows import RowsModel

WARM_START_POLL_S = 0.05


class SharedModel:
    """One torch model for all simulated workers: computations happen one at a time."""

    def __init__(self, model: FlatModel) -> None:
        self.model = model

    def gradient(self, params: np.ndarray, shard: Shard, batch: np.ndarray) -> tuple[float,
                                                                                    np.ndarray]:
        from engine.models.flat import train_step_np

        np.copyto(self.model.params_np, params)
        assert isinstance(shard.inputs, np.ndarray)  # sparse samples train in SparseWorker
        loss = train_step_np(self.model, shard.inputs[batch], shard.targets[batch])
        return loss, self.model.grads_np.copy()


@dataclass
class WorkerContext:
    """What a simulated worker needs from the cluster."""

    config: RunConfig
    layout: KeyLayout
    shared: SharedModel | None  # None: a model of sparse samples (``rows``)
    compute_s: float
    should_stop: Callable[[], bool]
    record: Callable[[IterationRecord], None]
    epoch_done: Callable[[int, int], None]  # (rank, epoch)
    rows: RowsModel | None = None


class SimWorker:
    """The plain loop: pull, compute, push (the next pull right behind it with
    ``train.pipeline``). Subclasses change the order."""

    def __init__(self, rank: int, ctx: WorkerContext, client: SimClient, shard: Shard,
                 params: np.ndarray, grad_filter: GradientFilter | None) -> None:
        self.rank, self.ctx, self.client, self.shard = rank, ctx, client, shard
        self.config = ctx.config
        self.keys = KeyRange(0, ctx.layout.num_keys)
        self.params = params
        self.filter = grad_filter
        self.loop = asyncio.get_running_loop()
        self.slowdown = Slowdown(self.config.heterogeneity, rank=rank,
                                 seed=self.config.train.seed, clock=self.loop.time)
        self.last_clock = -1
        self.next_batch: np.ndarray | None = None
        self._ahead: tuple[int, asyncio.Future[PullResult]] | None = None
        self.cache = read_cache(self.config)  # SSP's: reads within the bound from the copy

    async def run(self) -> int:
        """Train until the epochs are done or the run stops; returns iterations done."""
        epochs = epochs_to_run(self.config.train.epochs, self.config.stop.budget)
        self.last_clock = epochs * self.shard.iterations_per_epoch - 1
        await self.begin()
        # Cancelled, the run is failing: what is in flight will never be answered, so end()
        # (which waits for it) is skipped.
        clock = await self._epochs(epochs, 0)
        await self.end()
        return clock

    async def _epochs(self, epochs: int, clock: int) -> int:
        for epoch in range(epochs):
            if self.filter is not None:
                self.filter.start_epoch(epoch)
            rng = np.random.default_rng([self.config.train.seed, self.rank, epoch])
            batches = self.shard.batches(rng)
            for index, batch in enumerate(batches):
                if self.ctx.should_stop():
                    return clock
                # As the real loops: the sparse loop prefetches what the next batch needs
                # (None: the epoch's last batch, whose successor is pulled when it comes).
                self.next_batch = batches[index + 1] if index + 1 < len(batches) else None
                await self.step(batch, epoch, clock)
                clock += 1
            self.ctx.epoch_done(self.rank, epoch)
        return clock

    async def begin(self) -> None:
        """Before the first step."""

    async def end(self) -> None:
        """After the last step: settle what is in flight (a pull sent ahead for a clock that
        will not run is dropped: BSP may hold it back for good)."""
        if self._ahead is not None:
            self._ahead[1].cancel()
            self._ahead = None

    async def compute(self, batch: np.ndarray) -> tuple[float, np.ndarray]:
        assert self.ctx.shared is not None  # a dense model's loop
        loss, grads = self.ctx.shared.gradient(self.params, self.shard, batch)
        await self.computing()
        return loss, grads

    async def computing(self) -> None:
        """The virtual time of the gradient just computed."""
        # Before another worker computes: what the user's code logged since is this worker's.
        usermetrics.hold(self.rank)
        await asyncio.sleep(self.ctx.compute_s * self.slowdown.factor_now())

    def push_order(self) -> list[KeyRange]:
        return [self.keys]

    def start_send(self, grads: np.ndarray, **header: Any) -> list[asyncio.Future[PushResult]]:
        """Push in ``push_order``'s pieces, through the push filter when the run has one. The
        pieces are tasks started here, so their frames take the link before any request
        started after this call."""
        if self.filter is None:
            pushes = [self.client.push(span, grads[span.start:span.end], **header)
                      for span in self.push_order()]
        else:
            keys, values = self.filter.apply(grads)
            pushes = []
            for span in self.push_order():
                lo, hi = np.searchsorted(keys, (span.start, span.end))
                pushes.append(self.client.push(span, values[lo:hi], index=keys[lo:hi],
                                               **header))
        return [asyncio.ensure_future(push) for push in pushes]

    async def send(self, grads: np.ndarray, **header: Any) -> PushResult:
        return merge_pushes(list(await asyncio.gather(*self.start_send(grads, **header))))

    async def step(self, batch: np.ndarray, epoch: int, clock: int) -> None:
        """As the real plain loop: with ``train.pipeline`` the pull of clock + 1 leaves right
        behind this clock's push, before its ack."""
        started, t0 = self.client.now(), self.loop.time()
        pulled, saved = await self._read(clock)
        t1 = self.loop.time()
        loss, grads = await self.compute(batch)
        t2 = self.loop.time()
        wait_s = min(pulled.wait_s, t1 - t0)
        pushed_at = self.client.now()
        pushes = self.start_send(grads, clock=clock, base_versions=pulled.versions,
                                 pushed_at=pushed_at, waited_s=wait_s,
                                 final=clock == self.last_clock)
        cached = self.cache is not None and self.cache.serves(clock + 1)
        if self.config.train.pipeline and clock < self.last_clock and not cached:
            self._ahead = (clock + 1, asyncio.ensure_future(
                self.client.pull(self.keys, self.params, clock + 1)))
        pushed = merge_pushes(list(await asyncio.gather(*pushes)))
        if self.cache is not None and self._ahead is None:  # no fetch will overwrite it
            self.cache.write(self.params, grads, pushed)
        t3 = self.loop.time()
        row = iteration_row(self.rank, clock, epoch, started, t3 - t0, t2 - t1, t3 - t2,
                            t1 - t0 - wait_s, wait_s, pushed, pulled, loss, len(batch))
        self.ctx.record(row.model_copy(update={"pushed_at": pushed_at,
                                               "acked_at": pushed.answered_at,
                                               "pull_bytes_saved": saved}))

    async def _read(self, clock: int) -> tuple[PullResult, int]:
        """As the real plain loop: from the cache while it serves the clock, else fetched."""
        cache = self.cache
        if cache is not None and self._ahead is None and cache.serves(clock):
            read = cache.read()
            return PullResult(read.versions, 0.0, 0, 0, self.client.now(),
                              read.slowest_clock), cache.saved_per_read
        pulled = await self._clock_pull(clock)
        if cache is not None:
            cache.fetched(pulled)
        return pulled, 0

    async def _clock_pull(self, clock: int) -> PullResult:
        """This clock's pull: the one sent behind the last push, or a new one."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None and ahead[0] == clock:
            return await ahead[1]
        if ahead is not None:  # for another clock (cannot happen in order)
            ahead[1].cancel()
        return await self.client.pull(self.keys, self.params, clock)


class LayeredWorker(SimWorker):
    """One push per layer, last layer first, each committing that layer's clock."""

    def push_order(self) -> list[KeyRange]:
        return [segment.keys for segment in reversed(self.ctx.layout.segments)]


def settled_row(row: IterationRecord, pushed: PushResult, pulled: PullResult) -> IterationRecord:
    """A provisional row completed once its push is acknowledged."""
    return row.model_copy(update={
        "staleness": pushed.staleness, "lr_scale": pushed.lr_scale, **push_bytes(pushed),
        "bytes_sent": pushed.bytes_sent + pulled.bytes_sent,
        "bytes_received": pushed.bytes_received + pulled.bytes_received,
        "acked_at": pushed.answered_at})


class OverlappedWorker(SimWorker):
    """asp: the next pull is in flight while computing; the push is left in flight."""

    async def begin(self) -> None:
        self._staging = np.empty_like(self.params)
        self._pull = asyncio.ensure_future(self.client.pull(self.keys, self._staging, 0))
        self._unacked: tuple[asyncio.Future[PushResult], PullResult, IterationRecord] | None = \
            None

    async def step(self, batch: np.ndarray, epoch: int, clock: int) -> None:
        started, t0 = self.client.now(), self.loop.time()
        pulled = await self._pull
        np.copyto(self.params, self._staging)
        if clock < self.last_clock:
            self._pull = asyncio.ensure_future(self.client.pull(self.keys, self._staging,
                                                                clock + 1))
        t1 = self.loop.time()
        loss, grads = await self.compute(batch)
        t2 = self.loop.time()
        await self._settle()
        wait_s = min(pulled.wait_s, t1 - t0)
        pushed_at = self.client.now()
        push = asyncio.ensure_future(self.send(grads, clock=clock, base_versions=pulled.versions,
                                               pushed_at=pushed_at, waited_s=wait_s,
                                               final=clock == self.last_clock))
        t3 = self.loop.time()
        row = iteration_row(self.rank, clock, epoch, started, t3 - t0, t2 - t1, t3 - t2,
                            t1 - t0 - wait_s, wait_s, None, pulled, loss, len(batch))
        self._unacked = (push, pulled, row.model_copy(update={"pushed_at": pushed_at}))

    async def _settle(self) -> None:
        if self._unacked is not None:
            push, pulled, row = self._unacked
            self._unacked = None
            self.ctx.record(settled_row(row, await push, pulled))

    async def end(self) -> None:
        await self._settle()
        if not self._pull.done():
            self._pull.cancel()


class DownpourWorker(SimWorker):
    """Downpour SGD as the real loop (DistBelief's Algorithm 1.1): a fetch every
    ``fetch_every`` left in flight and taken when it has arrived, the replica's own step after
    every gradient, the sum pushed every ``push_every`` without waiting (one push in flight)."""

    async def begin(self) -> None:
        train = self.config.train
        self._fetch: asyncio.Future[PullResult] | None = None
        self._in_flight: tuple[asyncio.Future[PushResult], IterationRecord] | None = None
        self.local = LocalStep(train.local_lr, train.local_momentum, self.params.size)
        self._sum = np.zeros_like(self.params)
        self._held, self._pushes = 0, 0
        if train.warm_start and self.rank != 0:
            await self._wait_for_warm_start(math.ceil(train.warm_start / train.push_every))
        self._staging = np.empty_like(self.params)
        self._copy = await self.client.pull(self.keys, self.params, ANY_CLOCK)
        self._landed: PullResult | None = self._copy
        self._base = self._copy

    async def _wait_for_warm_start(self, pushes: int) -> None:
        probe = np.empty_like(self.params)
        while not self.ctx.should_stop():
            pulled = await self.client.pull(self.keys, probe, ANY_CLOCK)
            if min(pulled.versions.values(), default=0) >= pushes:
                return
            await asyncio.sleep(WARM_START_POLL_S)

    async def step(self, batch: np.ndarray, epoch: int, clock: int) -> None:
        train = self.config.train
        started, t0 = self.client.now(), self.loop.time()
        if clock % train.fetch_every == 0 and clock > 0 and self._fetch is None:
            self._fetch = asyncio.ensure_future(self.client.pull(self.keys, self._staging,
                                                                 ANY_CLOCK))
        if self._fetch is not None and self._fetch.done():
            self._copy = self._landed = self._fetch.result()
            self._fetch = None
            np.copyto(self.params, self._staging)
        landed, self._landed = self._landed, None
        if self._held == 0:
            self._base = self._copy
        t1 = self.loop.time()
        loss, grads = await self.compute(batch)
        self._sum += grads
        self._held += 1
        self.local.apply(self.params, grads)
        t2 = self.loop.time()
        pushing = self._held == train.push_every or clock == self.last_clock
        if pushing:
            await self._settle_push()
        t3 = self.loop.time()
        row = iteration_row(self.rank, clock, epoch, started, t3 - t0, t2 - t1, t3 - t2,
                            t1 - t0, 0.0, None, landed or PullResult({}, 0.0, 0, 0), loss,
                            len(batch))
        if not pushing:
            self.ctx.record(row)
            return
        pushed_at = self.client.now()
        push = asyncio.ensure_future(self.send(
            self._sum.copy(), clock=self._pushes, base_versions=self._base.versions,
            pushed_at=pushed_at, waited_s=0.0, final=clock == self.last_clock))
        self._pushes += 1
        self._sum.fill(0.0)
        self._held = 0
        self._in_flight = (push, row.model_copy(update={"pushed_at": pushed_at}))

    async def _settle_push(self) -> None:
        if self._in_flight is None:
            return
        push, row = self._in_flight
        self._in_flight = None
        pushed = await push
        self.ctx.record(row.model_copy(update={
            "staleness": pushed.staleness, "lr_scale": pushed.lr_scale, **push_bytes(pushed),
            "bytes_sent": row.bytes_sent + pushed.bytes_sent,
            "bytes_received": row.bytes_received + pushed.bytes_received,
            "acked_at": pushed.answered_at}))

    async def end(self) -> None:
        await self._settle_push()
        if self._fetch is not None and not self._fetch.done():
            self._fetch.cancel()
        self._fetch = None


@dataclass
class _Task:
    clock: int
    push: asyncio.Future[PushResult]
    pull: asyncio.Future[PullResult] | None  # None: no later iteration needs it
    values: np.ndarray
    row: IterationRecord


class DelayedWorker(SimWorker):
    """Bounded delay (seed 003), as the real delayed loop: iteration c computes once this
    worker's tasks before c - T are done; each task's push leaves first and the pull behind it,
    stamped with the iteration it gates, so the servers answer it once every worker has pushed
    the task's clock. Only the servers' hold of a pull counts as waiting."""

    async def begin(self) -> None:
        self._tasks: deque[_Task] = deque()
        self._free = [np.empty_like(self.params) for _ in range(self.config.sync.delay + 1)]
        self._newest = await self.client.pull(self.keys, self.params, ANY_CLOCK)

    async def step(self, batch: np.ndarray, epoch: int, clock: int) -> None:
        delay = self.config.sync.delay
        started, t0 = self.client.now(), self.loop.time()
        held = 0.0
        while self._tasks and (self._tasks[0].clock < clock - delay or self._done(self._tasks[0])):
            held += await self._finish(self._tasks.popleft())
        t1 = self.loop.time()
        loss, grads = await self.compute(batch)
        t2 = self.loop.time()
        wait_s = min(held, t1 - t0)
        pushed_at = self.client.now()
        # The push's frames take the link before the pull's (as on one real connection).
        pushes = self.start_send(grads, clock=clock, base_versions=self._newest.versions,
                                 pushed_at=pushed_at, waited_s=wait_s,
                                 final=clock == self.last_clock)
        push = asyncio.ensure_future(_merged(pushes))
        values, pull = self._free.pop(), None
        if clock + delay + 1 <= self.last_clock:
            pull = asyncio.ensure_future(self.client.pull(self.keys, values, clock + delay + 1))
        t3 = self.loop.time()
        row = iteration_row(self.rank, clock, epoch, started, t3 - t0, t2 - t1, t3 - t2,
                            t1 - t0 - wait_s, wait_s, None, self._newest, loss, len(batch))
        self._tasks.append(_Task(clock, push, pull, values,
                                 row.model_copy(update={"pushed_at": pushed_at})))

    @staticmethod
    def _done(task: _Task) -> bool:
        return task.push.done() and (task.pull is None or task.pull.done())

    async def _finish(self, task: _Task) -> float:
        pushed = await task.push
        pulled = PullResult({}, 0.0, 0, 0)
        if task.pull is not None:
            pulled = await task.pull
            np.copyto(self.params, task.values)
            self._newest = pulled
        self._free.append(task.values)
        self.ctx.record(settled_row(task.row, pushed, pulled))
        return pulled.wait_s

    async def end(self) -> None:
        """Settle every task; a pull no iteration will use (the run stopped early) is dropped
        unless answered."""
        while self._tasks:
            task = self._tasks.popleft()
            if task.pull is not None and not task.pull.done():
                task.pull.cancel()
                task.pull = None
            await self._finish(task)


@dataclass
class _WorkingSet:
    keys: np.ndarray  # sorted global keys
    values: np.ndarray
    pulled: asyncio.Future[PullResult]


@dataclass
class _SparseTask:
    clock: int
    push: asyncio.Future[PushResult]
    row: IterationRecord  # provisional until the push is acknowledged


class SparseWorker(SimWorker):
    """A model of sparse samples, as the real sparse loop (``engine.worker.sparse``): bounded
    delay's tasks, each compute, push, then the pull of the next batch's working set right
    behind the push; task c computes once the pushes of tasks older than c - T are
    acknowledged. Pulls and pushes are key lists of the batch's working set (the KKT filter
    leaves out what the proximal step would keep at 0); each pull asks for the clock of the
    batch it feeds (the newest values under an asynchronous model)."""

    async def begin(self) -> None:
        config = self.config
        assert self.ctx.rows is not None
        self.sparse: RowsModel = self.ctx.rows
        self.l1 = config.optimizer.l1
        self.kkt = config.comm.kkt_filter and self.l1 > 0
        self.newest = asynchronous(config)
        self.delay = (config.sync.delay if CONSISTENCY_MODELS.can(config.sync.model, OWN_DELAY)
                      else 0)
        self._tasks: deque[_SparseTask] = deque()
        self._next: _WorkingSet | None = None

    async def step(self, batch: np.ndarray, epoch: int, clock: int) -> None:
        rows = self.shard.inputs
        assert isinstance(rows, SparseSplit)
        current = rows.rows(np.sort(batch))
        following = None if self.next_batch is None else rows.rows(np.sort(self.next_batch))
        started, t0 = self.client.now(), self.loop.time()
        while self._tasks and self._tasks[0].clock < clock - self.delay:
            await self._finish(self._tasks.popleft())
        pull = self._next or self._pull(current, clock)
        self._next = None  # taken: end() must not wait for it again
        pulled = await pull.pulled
        t1 = self.loop.time()
        loss, grad = self.sparse.gradient(current, pull.keys, pull.values)
        finite_loss(loss)
        await self.computing()
        keys, values = pull.keys, grad
        if self.kkt:
            mask = kkt_mask(pull.values, grad, self.l1)
            keys, values = keys[mask], grad[mask]
        t2 = self.loop.time()
        pushed_at = self.client.now()
        # Every shard gets a frame (an empty one commits the clock), as the real push's span.
        push = asyncio.ensure_future(self.client.push(
            self.keys, values, index=keys, clock=clock, base_versions=pulled.versions,
            pushed_at=pushed_at, waited_s=0.0, final=clock == self.last_clock))
        # Started after the push's task, so its frames take the link behind the push's.
        self._next = self._pull(following, clock + 1) if following is not None else None
        t3 = self.loop.time()
        wait_s = min(pulled.wait_s, t1 - t0)
        row = iteration_row(self.rank, clock, epoch, started, t3 - t0, t2 - t1, t3 - t2,
                            t1 - t0 - wait_s, wait_s, None, pulled, loss, len(batch))
        self._tasks.append(_SparseTask(clock, push,
                                       row.model_copy(update={"pushed_at": pushed_at})))

    def _pull(self, batch: SparseSplit, clock: int) -> _WorkingSet:
        keys = self.sparse.working_set(batch)
        values = np.empty(len(keys), dtype=np.float32)
        return _WorkingSet(keys, values, asyncio.ensure_future(self.client.pull_keys(
            keys, values, ANY_CLOCK if self.newest else clock)))

    async def _finish(self, task: _SparseTask) -> None:
        pushed = await task.push
        self.ctx.record(task.row.model_copy(update={
            "staleness": pushed.staleness, "lr_scale": pushed.lr_scale, **push_bytes(pushed),
            "bytes_sent": task.row.bytes_sent + pushed.bytes_sent,
            "bytes_received": task.row.bytes_received + pushed.bytes_received,
            "acked_at": pushed.answered_at}))

    async def end(self) -> None:
        """Settle every task; a prefetch no step will use (the run stopped between it and its
        batch) is dropped unless answered, as the other loops' pulls sent ahead."""
        while self._tasks:
            await self._finish(self._tasks.popleft())
        if self._next is not None and not self._next.pulled.done():
            self._next.pulled.cancel()
        self._next = None


async def _merged(pushes: list[asyncio.Future[PushResult]]) -> PushResult:
    return merge_pushes(list(await asyncio.gather(*pushes)))


# The simulated counterpart of each worker loop in engine.policies.loops, by the same name.
SIM_LOOPS: Registry[type[SimWorker]] = Registry("simulated worker loop")
SIM_LOOPS.register("plain", SimWorker, "pull, compute, push; the next pull leaves behind the "
                   "push (--no-pipeline: after its ack)")
SIM_LOOPS.register("layered", LayeredWorker, "one push per layer, last layer first")
SIM_LOOPS.register("overlapped", OverlappedWorker, "asp: the next pull in flight while computing")
SIM_LOOPS.register("downpour", DownpourWorker, "asp: fetch every N, push the sum every M, "
                   "the replica's own step between fetches")
SIM_LOOPS.register("delayed", DelayedWorker, "bounded delay: up to T iterations of "
                   "communication in flight, the global dependency kept by the servers")
SIM_LOOPS.register("sparse", SparseWorker, "sparse samples: pull and push each batch's working "
                   "set by key, KKT filter, bounded delay's tasks")
