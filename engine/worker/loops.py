"""A worker: pull parameters, compute a gradient on its shard of the data, push it, report.

Each iteration's wall time is split into the time the loop was blocked in each phase, so that
compute_s + push_s + pull_s + wait_s equals it exactly (wait_s is the part of a pull the servers
held back for consistency: idle time). With ``train.overlap`` (asp only) the pull for the next
iteration is issued before computing, so communication runs while torch computes; bounded delay
has its own loop (``engine.worker.delayed``). The regime's compute time and injected slowness
(``engine.worker.timing.Pace``) are spent inside the compute phase.

Every loop is written once, against its ``Host``: a real worker process (``Worker`` below) or a
simulated one (``engine.sim.runtime``). The host gives the loop its clock, its pace, its
parameter client and the run's control; a loop reads the time only from ``host.clock``.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from engine import usermetrics
from engine.budget import budget_of, epochs_to_run
from engine.config import RunConfig
from engine.datasets.sparse import SparseSplit
from engine.errors import Diverged, PsctlError, RunFailed, ShuttingDown
from engine.keys import KeyLayout, KeyRange
from engine.transport.control import Lost, SyncControl
from engine.wire.messages import (
    MAX_REPORTED_METRICS,
    ControlMessage,
    Done,
    EpochDone,
    Exit,
    Fatal,
    Iterations,
    Ready,
    Start,
    Stop,
    Task,
    Verdict,
    Welcome,
    layout_of,
)
from engine.wire.records import IterationRecord, LayerRecord, UserMetricRecord
from engine.worker.cache import ReadCache, read_cache
from engine.worker.client import (
    ParameterClient,
    PullHandle,
    PullResult,
    PushHandle,
    PushResult,
)
from engine.worker.filters import make_filter
from engine.worker.heterogeneity import Slowdown
from engine.worker.timing import WALL, Clock, Pace, seconds

if TYPE_CHECKING:  # torch is imported by the worker role, not by whoever lists the loops
    from engine.models.flat import FlatModel
    from engine.models.rows import RowsModel

REPORT_EVERY_S = 0.5
# Under a budget of samples or updates the coordinator counts what the workers report, so they
# report ten times as often: the run then overshoots its budget by a few iterations, not by
# half a second of training.
COUNTED_REPORT_EVERY_S = 0.05
# The longest a worker that waits for the start blocks on its inbox at a time (it wakes at once
# for a message): long, since 128 idle workers waking every 5 ms kept two cores busy.
START_WAIT_S = 0.5


@dataclass(frozen=True)
class Shard:
    """This worker's part of the training set, and how it is cut into batches."""

    inputs: np.ndarray | SparseSplit
    targets: np.ndarray
    batch_size: int

    @property
    def iterations_per_epoch(self) -> int:
        return math.ceil(len(self.targets) / self.batch_size)

    def batches(self, rng: np.random.Generator) -> list[np.ndarray]:
        order = rng.permutation(len(self.targets))
        return [order[i:i + self.batch_size] for i in range(0, len(order), self.batch_size)]


def shard_for(inputs: np.ndarray | SparseSplit, targets: np.ndarray, *, rank: int, workers: int,
              seed: int,
              batch_size: int) -> Shard:
    """Equal-sized disjoint shards, so every worker runs the same number of iterations (which
    BSP needs); at most ``workers - 1`` samples are left out."""
    per_worker = len(targets) // workers
    if per_worker == 0:
        raise RunFailed(f"{len(targets)} training samples cannot feed {workers} workers")
    order = np.random.default_rng(seed).permutation(len(targets))
    mine = np.sort(order[rank * per_worker:(rank + 1) * per_worker])
    rows = inputs.rows(mine) if isinstance(inputs, SparseSplit) else inputs[mine]
    return Shard(rows, targets[mine], batch_size)


class Host(Protocol):
    """What a worker loop is given by the process it runs in (``Worker`` for a real worker,
    ``engine.sim.runtime.SimulatedWorker`` in the simulator)."""

    config: RunConfig
    rank: int
    keys: KeyRange
    layout: KeyLayout
    client: ParameterClient
    clock: Clock
    pace: Pace

    def should_stop(self) -> bool: ...

    def stop_with(self, reason: str) -> None:
        """The loop ends early for ``reason`` (a server is draining)."""
        ...

    def record(self, row: IterationRecord, layers: list[LayerRecord] | None = None) -> None: ...

    def epoch_done(self, epoch: int) -> None: ...

    def inbox(self) -> list[ControlMessage]: ...

    def send(self, message: ControlMessage) -> None:
        """To the coordinator (Sandblaster's reports)."""
        ...


class Worker:
    """A real worker process's host: the control channel to the coordinator, the wall clock."""

    def __init__(self, welcome: Welcome, rank: int, control: SyncControl,
                 client: ParameterClient) -> None:
        self.config = RunConfig.model_validate(welcome.config)
        self.rank, self.control, self.client = rank, control, client
        self.keys = KeyRange(0, welcome.num_keys)
        self.clock_base = welcome.clock_base  # above 0 for a worker that joined a running job
        self.layout = layout_of(welcome)
        self._pending: list[IterationRecord] = []
        self._pending_layers: list[LayerRecord] = []
        self._pending_metrics: list[UserMetricRecord] = []  # psctl.log's, per recorded row
        self._last_iteration = -1
        self._last_report = time.monotonic()
        self._stopping: str | None = None
        # Messages for the loop itself that came with or before the start (a Sandblaster task).
        self._backlog: list[ControlMessage | Lost] = []
        self.clock: Clock = WALL
        self.pace = Pace(WALL, Slowdown(self.config.heterogeneity, rank=rank,
                                        seed=self.config.train.seed),
                         floor_s=seconds(self.config.regime.compute_ms))
        budget = budget_of(self.config.stop.budget)
        self.report_every_s = (COUNTED_REPORT_EVERY_S if budget is not None and budget.unit != "s"
                               else REPORT_EVERY_S)

    def run(self, shard: Shard, model: FlatModel | RowsModel,
            loop_class: Callable[[Worker, Any], PlainLoop]) -> int:
        """Train in ``loop_class`` (the worker registry's choice for the run) until the epochs
        are done or the coordinator says stop; returns iterations. A restarted (or resumed)
        worker starts at the clock the servers hold for it."""
        # Worker 0 sends the starting values (the servers keep the first INIT: a restarted
        # worker 0's is ignored); a sparse model sends none, its keys starting at 0 there.
        initial = model.initial_values() if self.rank == 0 else None
        if initial is not None:
            self.client.wait(self.client.init(initial))
        loop = loop_class(self, model)  # each loop its model
        base = self.clock_base
        first = loop.resume_iteration(max(self.client.clock() - base, 0))
        self.control.send(Ready(iterations_per_epoch=shard.iterations_per_epoch,
                                train_samples=len(shard.targets), first_iteration=first))
        self._await_start()
        try:
            done = loop.train(shard, first, base)
        except Diverged as exc:
            self._report_divergence(exc)
            raise
        self._flush()
        self.control.send_and_wait(Done(iterations=done, reason=self._stopping or "epochs done"))
        return done

    def _report_divergence(self, exc: Diverged) -> None:
        """The run ends saying which worker diverged, where, and what to try."""
        self._flush()
        message = diverged(self.rank, self._last_iteration + 1, self.config.optimizer.lr, exc)
        with contextlib.suppress(PsctlError):
            self.control.send_and_wait(Fatal(message=message, diverged=True), timeout=5.0)
        raise Diverged(message) from exc

    def _await_start(self) -> None:
        """Block until the coordinator says every worker is ready (or the run ends first)."""
        limit = self.config.cluster.connect_timeout_s
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            messages = self.control.poll(wait_s=START_WAIT_S)
            for index, message in enumerate(messages):
                if isinstance(message, Start):
                    self._backlog.extend(messages[index + 1:])
                    return
                if isinstance(message, Task | Verdict):
                    self._backlog.append(message)
                else:
                    self._obey(message)
            if self._stopping is not None:
                return
        raise RunFailed(f"no start from the coordinator within {limit:.0f} s (cluster."
                        "connect_timeout_s): another worker never became ready")

    def should_stop(self) -> bool:
        self._backlog = list(self.inbox())  # the loop's own messages wait for it
        return self._stopping is not None

    def inbox(self) -> list[ControlMessage]:
        """The messages for the loop itself (a Sandblaster task or verdict); the run's own
        (stop, exit, a lost coordinator) are obeyed on the way."""
        mine: list[ControlMessage] = []
        for message in self._take():
            if isinstance(message, Task | Verdict):
                mine.append(message)
            else:
                self._obey(message)
        return mine

    def put_back(self, messages: list[ControlMessage]) -> None:
        """Messages the loop took but is not ready for: the next ``inbox`` returns them first."""
        self._backlog[:0] = messages

    def stop_with(self, reason: str) -> None:
        self._stopping = self._stopping or reason

    def send(self, message: ControlMessage) -> None:
        self.control.send(message)

    def _take(self) -> list[ControlMessage | Lost]:
        messages, self._backlog = [*self._backlog, *self.control.poll()], []
        return messages

    def _obey(self, message: object) -> None:
        if isinstance(message, Lost):
            raise RunFailed(message.reason)
        if isinstance(message, Exit):
            raise RunFailed("the coordinator ended the run")
        if isinstance(message, Stop):
            self._stopping = message.reason

    def record(self, row: IterationRecord, layers: list[LayerRecord] | None = None) -> None:
        self._last_iteration = row.iteration
        self._pending.append(row)
        self._pending_layers.extend(layers or ())
        self._pending_metrics.extend(logged_with(row))
        # Early when the user's metrics pile up: a report must stay under the wire's bound.
        if (time.monotonic() - self._last_report >= self.report_every_s
                or len(self._pending_metrics) > MAX_REPORTED_METRICS - usermetrics.MAX_NAMES):
            self._flush()

    def epoch_done(self, epoch: int) -> None:
        self._flush()
        self.control.send(EpochDone(epoch=epoch))

    def _flush(self) -> None:
        if self._pending:
            self.control.send(Iterations(rows=self._pending, layers=self._pending_layers,
                                         metrics=self._pending_metrics))
            self._pending, self._pending_layers, self._pending_metrics = [], [], []
        self._last_report = time.monotonic()


class PlainLoop:
    """pull -> compute -> push, each waited for: the textbook loop, right for every model.

    With ``train.pipeline`` (the default) the pull of clock c + 1 goes out right behind the push
    of clock c, before its ack: the round trip of the ack no longer delays the next pull. The
    consistency model is unchanged: a shard handles a connection's frames in order, so the pull
    sees this worker's push, and it answers the pull only when the model lets clock c + 1 start
    (BSP: once every worker has pushed c), as it would a pull sent after the ack.
    """

    def __init__(self, worker: Host, model: FlatModel) -> None:
        self.worker, self.model = worker, model
        self.client = worker.client
        self.timer = worker.clock
        self.next_batch: np.ndarray | None = None
        self.last_clock = -1
        self.first_clock = 0  # above 0 for a restarted or resumed worker
        self.filter = make_filter(worker.config.comm,
                                  [segment.keys for segment in worker.layout.segments],
                                  worker.keys.end, worker.config.cluster.workers)
        self.pipelined = worker.config.train.pipeline
        self._next_pull: tuple[int, list[PullHandle]] | None = None  # (clock, requests) in flight
        # SSP's cache: reads within the bound are answered from the copy in the parameters.
        self.cache: ReadCache | None = read_cache(worker.config)

    def prepare(self, clock: int, pulled: PullResult, waited_s: float) -> None:
        """Before computing clock ``clock`` (loops that push from inside backward get ready)."""

    def compute(self, shard: Shard, batch: np.ndarray) -> float:
        """One gradient into ``model.grads_np``, its phase paced (``Host.pace``)."""
        started = self.timer.perf()
        loss = compute_gradient(self.model, shard, batch)
        usermetrics.hold(self.worker.rank)  # what the user's code logged is this worker's
        self.worker.pace.computed(started)
        return loss

    def push(self, clock: int, pulled: PullResult,
             waited_s: float) -> tuple[list[PushHandle], float]:
        """Send this clock's gradient stamped with its timing, committing the clock on every
        key; (the requests in flight, pushed_at)."""
        pushed_at = self.timer.now()
        requests = self.send(self.model.grads_np, clock=clock, base_versions=pulled.versions,
                             pushed_at=pushed_at, waited_s=waited_s,
                             final=clock == self.last_clock)
        return requests, pushed_at

    def send(self, grads: np.ndarray, **header: Any) -> list[PushHandle]:
        """Push ``grads`` in ``push_order``'s pieces; through the push filter, if the run has
        one, as sparse frames that still commit every piece's clock."""
        if self.filter is None:
            return [self.client.push(keys, grads[keys.start:keys.end], **header)
                    for keys in self.push_order()]
        keys, values = self.filter.apply(grads)
        requests = []
        for span in self.push_order():
            lo, hi = np.searchsorted(keys, (span.start, span.end))
            requests.append(self.client.push(keys[lo:hi], values[lo:hi], span=span, **header))
        return requests

    def push_order(self) -> list[KeyRange]:
        """The key ranges pushed per clock, one frame (per shard) each: the whole model."""
        return [self.worker.keys]

    def pull(self, clock: int) -> list[PullHandle]:
        """Ask for clock ``clock``'s values of the whole model, straight into the parameters."""
        return [self.pull_range(self.worker.keys, clock)]

    def pull_range(self, keys: KeyRange, clock: int) -> PullHandle:
        return self.client.pull(keys, self.model.params_np[keys.start:keys.end], clock=clock)

    def settle(self, requests: list[PushHandle]) -> PushResult:
        """Wait for a clock's pushes; one result for all of them (worst staleness)."""
        return merge_pushes([self.client.wait(request) for request in requests])

    def pushes_done(self, requests: list[PushHandle]) -> bool:
        return all(self.client.done(request) for request in requests)

    def resume_iteration(self, clock: int) -> int:
        """The iteration to start from when the servers hold ``clock`` for this worker (one
        clock per iteration)."""
        return clock

    def train(self, shard: Shard, start: int = 0, base: int = 0) -> int:
        """Run the epochs from iteration ``start`` of this worker's own, one ``step`` per
        batch, at clock ``base`` + iteration (a worker that joined a running job starts at the
        job's clock); returns the iterations done (counting those before ``start``). A run that
        is stopping (the coordinator said so, or a server is draining) ends after the step."""
        cfg, done = self.worker.config.train, start
        per_epoch = shard.iterations_per_epoch
        epochs = epochs_to_run(cfg.epochs, self.worker.config.stop.budget)
        self.last_clock = base + epochs * per_epoch - 1
        self.first_clock = base + start
        try:
            self.begin()
            for epoch in range(start // per_epoch, epochs):
                if self.filter is not None:
                    self.filter.start_epoch(epoch)  # DGC's warm-up counts epochs
                rng = np.random.default_rng([cfg.seed, self.worker.rank, epoch])
                # The same batches in the same order as before a restart, from where it was.
                batches = shard.batches(rng)[done - epoch * per_epoch:]
                for index, batch in enumerate(batches):
                    if self.worker.should_stop():
                        return done
                    # Loops that prefetch what the next batch needs look here (None: the last).
                    self.next_batch = batches[index + 1] if index + 1 < len(batches) else None
                    self.step(shard, batch, epoch, base + done)
                    done += 1
                self.worker.epoch_done(epoch)
            return done
        except ShuttingDown as exc:
            self.worker.stop_with(str(exc))
            return done
        finally:
            self.end()

    def begin(self) -> None:
        """Before the first step (loops that keep requests in flight start them here)."""

    def end(self) -> None:
        """After the last step, also on a stop or an error: settle what is still in flight."""
        ahead, self._next_pull = self._next_pull, None
        if ahead is not None:
            self._forget(ahead[1])

    def step(self, shard: Shard, batch: np.ndarray, epoch: int, clock: int) -> None:
        self.worker.record(self._iteration(shard, batch, epoch, clock))

    def _iteration(self, shard: Shard, batch: np.ndarray, epoch: int,
                   clock: int) -> IterationRecord:
        started, t0 = self.timer.now(), self.timer.perf()
        pulled, saved = self._read(clock)
        t1 = self.timer.perf()
        wait_s = min(pulled.wait_s, t1 - t0)
        self.prepare(clock, pulled, wait_s)
        loss = self.compute(shard, batch)
        t2 = self.timer.perf()
        requests, pushed_at = self.push(clock, pulled, wait_s)
        cached = self.cache is not None and self.cache.serves(clock + 1)
        if self.pipelined and clock < self.last_clock and not cached:
            self._next_pull = (clock + 1, self.pull_ahead(clock + 1))
        pushed = self.settle(requests)
        if self.cache is not None and self._next_pull is None:  # no fetch will overwrite it
            self.cache.write(self.model.params_np, self.model.grads_np, pushed)
        t3 = self.timer.perf()
        row = iteration_row(self.worker.rank, clock, epoch, started, t3 - t0, t2 - t1, t3 - t2, t1 -
                            t0 - wait_s, wait_s, pushed, pulled, loss, len(batch))
        return row.model_copy(update={"pushed_at": pushed_at, "acked_at": pushed.answered_at,
                                      "pull_bytes_saved": saved})

    def _read(self, clock: int) -> tuple[PullResult, int]:
        """This clock's values: from the cache while it serves the clock, else fetched; (the
        read, the bytes a read from the cache saved)."""
        cache = self.cache
        if cache is not None and self._next_pull is None and cache.serves(clock):
            return cache.read(self.timer.now()), cache.saved_per_read
        pulled = merge_pulls([self.client.wait(request) for request in self._clock_pull(clock)])
        if cache is not None:
            cache.fetched(pulled)
        return pulled, 0


    def pull_ahead(self, clock: int) -> list[PullHandle]:
        """With ``train.pipeline``: the pulls of clock ``clock``, sent once this clock's pushes
        are out (loops that push layer by layer send each layer's pull behind its push)."""
        return self.pull(clock)

    def _clock_pull(self, clock: int) -> list[PullHandle]:
        """This clock's pulls: those sent behind the last pushes, or new ones."""
        ahead, self._next_pull = self._next_pull, None
        if ahead is not None and ahead[0] == clock:
            return ahead[1]
        if ahead is not None:  # sent for another clock (cannot happen in order): drop them
            self._forget(ahead[1])
        return self.pull(clock)

    def _forget(self, requests: list[PullHandle]) -> None:
        """Pulls sent ahead that no step will use (the run stops before that clock): taken if
        answered, else cancelled at once (the model may hold them back for good: BSP, with the
        other workers stopped), so that no answer lands in the parameters later."""
        for request in requests:
            with contextlib.suppress(PsctlError):
                self.client.wait(request, timeout=0.0)


class OverlappedLoop(PlainLoop):
    """Prefetch the next pull while computing and leave the push in flight (asp).

    The next pull is issued before this iteration's push, so every gradient is at least one
    update stale; in exchange the round trip hides behind computation.
    """

    def begin(self) -> None:
        self._unacked: tuple[list[PushHandle], PullResult, IterationRecord] | None = None
        self._staging = np.empty_like(self.model.params_np)
        self._in_flight = self.client.pull(self.worker.keys, self._staging,
                                           clock=self.first_clock)

    def step(self, shard: Shard, batch: np.ndarray, epoch: int, clock: int) -> None:
        started, t0 = self.timer.now(), self.timer.perf()
        pulled = self.client.wait(self._in_flight)
        np.copyto(self.model.params_np, self._staging)
        if clock < self.last_clock:
            self._in_flight = self.client.pull(self.worker.keys, self._staging, clock=clock + 1)
        t1 = self.timer.perf()
        loss = self.compute(shard, batch)
        t2 = self.timer.perf()
        unacked, self._unacked = self._unacked, None  # settled once, even if it fails
        self._settle(unacked)
        wait_s = min(pulled.wait_s, t1 - t0)
        requests, pushed_at = self.push(clock, pulled, wait_s)
        t3 = self.timer.perf()
        provisional = iteration_row(self.worker.rank, clock, epoch, started, t3 - t0, t2 - t1, t3 -
                                    t2, t1 - t0 - wait_s, wait_s, None, pulled, loss, len(batch))
        self._unacked = (requests, pulled, provisional.model_copy(update={"pushed_at": pushed_at}))

    def end(self) -> None:
        unacked, self._unacked = self._unacked, None
        self._settle(unacked)

    def _settle(self, unacked: tuple[list[PushHandle], PullResult, IterationRecord] | None) -> None:
        """Wait for the previous push's ack and record that iteration with its staleness."""
        if unacked is None:
            return
        requests, pulled, row = unacked
        pushed = self.settle(requests)
        self.worker.record(row.model_copy(update={
            "staleness": pushed.staleness,
            "lr_scale": pushed.lr_scale,
            **push_bytes(pushed),
            "bytes_sent": pushed.bytes_sent + pulled.bytes_sent,
            "bytes_received": pushed.bytes_received + pulled.bytes_received,
            "acked_at": pushed.answered_at,
        }))


class LayeredLoop(PlainLoop):
    """The plain loop, but each layer's gradient is its own push frame, last layer first (the
    order backward produces them), each committing that layer's clock on its own."""

    def push_order(self) -> list[KeyRange]:
        return [segment.keys for segment in reversed(self.worker.layout.segments)]


def merge_pushes(results: list[PushResult]) -> PushResult:
    """Several pushes of one clock as one: worst staleness, bytes summed, last ack."""
    versions: dict[int, int] = {}
    for result in results:
        for shard, version in result.versions.items():
            versions[shard] = max(version, versions.get(shard, version))
    keys = sum(r.scaled_keys for r in results)
    scale = (sum(r.lr_scale * r.scaled_keys for r in results if r.lr_scale is not None) / keys
             if keys else None)
    return PushResult(versions, max(r.staleness for r in results),
                      sum(r.bytes_sent for r in results), sum(r.bytes_received for r in results),
                      max(r.answered_at for r in results), scale, keys,
                      sum(r.dense_bytes for r in results))


def merge_pulls(results: list[PullResult], *, one_by_one: bool = False) -> PullResult:
    """A clock's pulls as one: bytes summed, the last answer, the slowest clock. Sent together
    (the default), per shard the newest version (what one pull of all their keys would have
    said) and the longest hold; sent ``one_by_one``, the oldest version and the holds added up
    (each waited for the one before; the caller caps the sum at the pull phase's wall time)."""
    if len(results) == 1:
        return results[0]
    pick = min if one_by_one else max
    versions: dict[int, int] = {}
    for result in results:
        for shard, version in result.versions.items():
            versions[shard] = pick(version, versions.get(shard, version))
    waits = [r.wait_s for r in results]
    return PullResult(versions, sum(waits) if one_by_one else max(waits),
                      sum(r.bytes_sent for r in results), sum(r.bytes_received for r in results),
                      max(r.answered_at for r in results),
                      min(r.slowest_clock for r in results))


def compute_gradient(model: FlatModel, shard: Shard, batch: np.ndarray, *,
                     to_host: bool = True) -> float:
    assert isinstance(shard.inputs, np.ndarray), "sparse rows train in engine.worker.sparse"
    return finite_loss(model.step(shard.inputs[batch], shard.targets[batch], to_host=to_host))


def diverged(rank: int, iteration: int, lr: float, exc: Diverged) -> str:
    """Why a run whose worker ``rank`` diverged ends: where, and what to try."""
    return (f"the model diverged: worker {rank} at iteration {iteration}: {exc}; try a lower "
            f"learning rate (optimizer.lr is {lr:g}), gradient clipping (--clip-norm), or less "
            "staleness")


def finite_loss(loss: float) -> float:
    """``loss``, unless it is NaN or infinite: the model diverged, and its gradient must not
    reach the servers."""
    if not math.isfinite(loss):
        raise Diverged(f"its training loss is {loss}")
    return loss


def iteration_row(rank: int, clock: int, epoch: int, started: float, wall: float, compute: float,
                  push: float, pull: float, wait: float, pushed: PushResult | None, pulled:
                  PullResult, loss: float, samples: int) -> IterationRecord:
    # Every loop builds a clock's row right after its gradient, even those that record it only
    # after the next one: what the user's code logged so far belongs to this clock.
    usermetrics.seal(rank, clock)
    sent = pulled.bytes_sent + (pushed.bytes_sent if pushed else 0)
    received = pulled.bytes_received + (pushed.bytes_received if pushed else 0)
    return IterationRecord(
        worker=rank, iteration=clock, epoch=epoch, started_at=started, ended_at=started + wall,
        compute_s=compute, push_s=push, pull_s=max(pull, 0.0), wait_s=wait,
        staleness=pushed.staleness if pushed else 0, loss=loss, samples=samples,
        bytes_sent=sent, bytes_received=received, lr_scale=pushed.lr_scale if pushed else None,
        **push_bytes(pushed))


def logged_with(row: IterationRecord) -> list[UserMetricRecord]:
    """What the user's code logged (``psctl.log``) in the iteration of ``row``."""
    return [UserMetricRecord(role="worker", rank=row.worker, iteration=row.iteration,
                             at=row.ended_at, name=name, value=value)
            for name, value in usermetrics.take(row.worker, row.iteration).items()]


def push_bytes(pushed: PushResult | None) -> dict[str, int]:
    """An iteration's push bytes as sent, and as dense frames would have been (before the
    push filter)."""
    if pushed is None:
        return {"push_bytes": 0, "push_bytes_dense": 0}
    return {"push_bytes": pushed.bytes_sent, "push_bytes_dense": pushed.dense_bytes}
