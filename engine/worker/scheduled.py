"""Request scheduling by layer (seed 002): a worker's per-layer pulls and pushes go through a
request pool that keeps ``comm.pool_size`` of them in flight, in the order a schedule picks.

Seed 002 asks the client to change its request order to reduce suspend time (pulls the servers
hold back for the staleness bound) and staleness; the servers keep c_l, the minimum iteration of
each layer. Every layer has its own clock range, so under SSP each layer's pull waits for that
layer alone, and with one request in flight (the default) a pull held back blocks the ones queued
behind it: the order decides who waits. The schedules:

- ``fifo``: in the order the requests arise: pulls input layer first (as the forward pass uses
  them), pushes output layer first (as backward produces the gradients);
- ``filo``: the reverse of each (seed 002 notes it can starve the layers that come first);
- ``stalest-first``: pull first the layer whose copy here is stalest: the most updates the
  servers applied to it since this worker received it, as far as the worker knows (the version of
  its last pull against the version its last push of the layer was acknowledged at, plus that
  push); push first the layers whose push advances the servers' minimum layer clock c_l (those
  where this worker is the slowest: c_l equals the clock it pushes), then the others, each group
  output layer first. c_l arrives with every pull (a VALUES frame's clock). Ties keep fifo's
  order.

Each layer's suspend time (how long the servers held its pull) and staleness are recorded in
``layer_iterations``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Generic, Protocol, TypeVar

import numpy as np

from engine import usermetrics
from engine.keys import KeyRange
from engine.registry import Registry
from engine.wire.records import IterationRecord, LayerRecord
from engine.worker.client import PullHandle, PullResult, PushHandle, PushResult
from engine.worker.loops import (
    PlainLoop,
    Shard,
    compute_gradient,
    iteration_row,
    merge_pulls,
    merge_pushes,
)

T = TypeVar("T")
H = TypeVar("H")


class RequestSchedule(Protocol):
    def pulls(self, behind: Sequence[int]) -> list[int]:
        """The order of this clock's layer pulls; ``behind[l]``: the updates the servers are
        known to have applied to layer l since this worker's copy of it."""
        ...

    def pushes(self, clock: int, slowest: Sequence[int]) -> list[int]:
        """The order of this clock's layer pushes; ``slowest[l]``: c_l, the clocks the slowest
        worker has committed on layer l, as the last pull of it said."""
        ...


class Fifo:
    def pulls(self, behind: Sequence[int]) -> list[int]:
        return list(range(len(behind)))

    def pushes(self, clock: int, slowest: Sequence[int]) -> list[int]:
        return list(reversed(range(len(slowest))))


class Filo:
    def pulls(self, behind: Sequence[int]) -> list[int]:
        return list(reversed(range(len(behind))))

    def pushes(self, clock: int, slowest: Sequence[int]) -> list[int]:
        return list(range(len(slowest)))


class StalestFirst:
    def pulls(self, behind: Sequence[int]) -> list[int]:
        return sorted(range(len(behind)), key=lambda layer: (-behind[layer], layer))

    def pushes(self, clock: int, slowest: Sequence[int]) -> list[int]:
        backward = reversed(range(len(slowest)))
        return sorted(backward, key=lambda layer: 0 if slowest[layer] >= clock else 1)


REQUEST_SCHEDULES: Registry[RequestSchedule] = Registry("request schedule")
REQUEST_SCHEDULES.register("fifo", Fifo(), "pulls input layer first, pushes output layer first")
REQUEST_SCHEDULES.register("filo", Filo(), "the reverse of fifo for both")
REQUEST_SCHEDULES.register(
    "stalest-first", StalestFirst(),
    "pull the layer with the oldest copy first; push first where it advances the minimum clock")


class RequestWindow(Generic[T, H]):
    """Requests started in ``order``, at most ``size`` in flight: finishing the oldest starts
    the next beyond the window. ``need(item)`` finishes them in order up to ``item`` (the time
    it waits adds up in ``waited_s``), ``drain()`` all of them."""

    def __init__(self, order: Sequence[T], start: Callable[[T], H],
                 finish: Callable[[T, H], None], size: int,
                 perf: Callable[[], float] = lambda: 0.0) -> None:
        self._start, self._finish, self._size, self._perf = start, finish, size, perf
        self._waiting: deque[T] = deque(order)
        self._in_flight: deque[tuple[T, H]] = deque()
        self._finished: set[T] = set()
        self.waited_s = 0.0
        self._fill()

    def need(self, item: T) -> None:
        began = self._perf()
        while item not in self._finished and self._in_flight:
            self._finish_oldest()
        self.waited_s += self._perf() - began

    def drain(self) -> None:
        while self._in_flight:
            self._finish_oldest()

    def _fill(self) -> None:
        while self._waiting and len(self._in_flight) < self._size:
            item = self._waiting.popleft()
            self._in_flight.append((item, self._start(item)))

    def _finish_oldest(self) -> None:
        item, handle = self._in_flight.popleft()
        self._finish(item, handle)
        self._finished.add(item)
        self._fill()


def run_pool(order: Sequence[T], start: Callable[[T], H], finish: Callable[[T, H], None],
             size: int) -> None:
    """Start the requests in ``order`` with at most ``size`` in flight, finishing the oldest
    before starting the next beyond the window."""
    RequestWindow(order, start, finish, size).drain()


class ScheduledLoop(PlainLoop):
    """The plain loop with one pull and one push per layer, each through the request pool.

    The forward pass starts before every pull is answered: each layer waits, from a forward
    pre-hook, only for its own values (``FlatModel.watch_values``), so the first layers compute
    while the pool still fetches the last. A model with custom modules, whose reads psctl
    cannot see, waits for every pull first."""

    def begin(self) -> None:
        comm = self.worker.config.comm
        self.schedule = REQUEST_SCHEDULES.get(comm.schedule)
        self.pool_size = comm.pool_size
        self.layers = [segment.keys for segment in self.worker.layout.segments]
        self.received = [0] * len(self.layers)  # the version of each layer's last pull
        self.known = [0] * len(self.layers)  # the newest version of it the worker has seen
        self.slowest = [0] * len(self.layers)
        self._window: RequestWindow[int, PullHandle] | None = None  # while computing
        self._unwatch = self.model.watch_values(self._need)

    def end(self) -> None:
        if self._unwatch is not None:
            self._unwatch()
        super().end()

    def _need(self, layer: int) -> None:
        if self._window is not None:
            self._window.need(layer)

    def compute(self, shard: Shard, batch: np.ndarray) -> float:
        """The gradient, with the time forward waited for values left out of what a slowed
        worker's compute phase is stretched by."""
        started = self.timer.perf()
        loss = compute_gradient(self.model, shard, batch)
        usermetrics.hold(self.worker.rank)
        waited = self._window.waited_s if self._window is not None else 0.0
        self.worker.pace.computed(started, left_out=waited)
        return loss

    def _iteration(self, shard: Shard, batch: np.ndarray, epoch: int,
                   clock: int) -> IterationRecord:
        started, t0 = self.timer.now(), self.timer.perf()
        window, pulled = self._pull_layers(clock)
        if self._unwatch is None:
            window.drain()
        t1 = self.timer.perf()
        self._window = window
        try:
            loss = self.compute(shard, batch)
        finally:
            self._window = None
        t2 = self.timer.perf()
        window.drain()  # the layers forward never read (the loss does not reach them)
        t3 = self.timer.perf()
        # The pull phase: before forward, inside it (layer by layer) and after it.
        pull_s = t1 - t0 + window.waited_s + t3 - t2
        merged = merge_pulls([pulled[layer] for layer in range(len(self.layers))],
                             one_by_one=True)
        wait_s = min(merged.wait_s, pull_s)
        pushed_at = self.timer.now()
        pushed = self._push_layers(clock, pulled, pushed_at, wait_s)
        t4 = self.timer.perf()
        row = iteration_row(self.worker.rank, clock, epoch, started, t4 - t0,
                            t2 - t1 - window.waited_s, t4 - t3, pull_s - wait_s, wait_s,
                            merge_pushes(list(pushed.values())), merged, loss, len(batch))
        self._layer_rows = self._layers(clock, pulled, pushed)
        return row.model_copy(update={"pushed_at": pushed_at,
                                      "acked_at": max(p.answered_at for p in pushed.values())})

    def step(self, shard: Shard, batch: np.ndarray, epoch: int, clock: int) -> None:
        row = self._iteration(shard, batch, epoch, clock)
        self.worker.record(row, self._layer_rows)

    def _pull_layers(self, clock: int) -> tuple[RequestWindow[int, PullHandle],
                                                 dict[int, PullResult]]:
        """This clock's layer pulls, started in the schedule's order; the results fill in as
        the window finishes them."""
        behind = [known - got for known, got in zip(self.known, self.received, strict=True)]
        order = self.schedule.pulls(behind)
        self._pull_order = {layer: i for i, layer in enumerate(order)}
        results: dict[int, PullResult] = {}

        def start(layer: int) -> PullHandle:
            return self.pull_range(self.layers[layer], clock)

        def finish(layer: int, handle: PullHandle) -> None:
            result = self.client.wait(handle)
            results[layer] = result
            self.received[layer] = max(result.versions.values(), default=0)
            self.known[layer] = max(self.known[layer], self.received[layer])
            self.slowest[layer] = result.slowest_clock

        return RequestWindow(order, start, finish, self.pool_size, self.timer.perf), results

    def _push_layers(self, clock: int, pulled: dict[int, PullResult], pushed_at: float,
                     waited_s: float) -> dict[int, PushResult]:
        order = self.schedule.pushes(clock, self.slowest)
        self._push_order = {layer: i for i, layer in enumerate(order)}
        keys, values = self._gradient()
        results: dict[int, PushResult] = {}

        def start(layer: int) -> PushHandle:
            span = self.layers[layer]
            header: dict[str, Any] = {"clock": clock, "base_versions": pulled[layer].versions,
                      "pushed_at": pushed_at, "waited_s": waited_s,
                      "final": clock == self.last_clock}
            if keys is None:
                return self.client.push(span, values[span.start:span.end], **header)
            lo, hi = np.searchsorted(keys, (span.start, span.end))
            return self.client.push(keys[lo:hi], values[lo:hi], span=span, **header)

        def finish(layer: int, handle: PushHandle) -> None:
            results[layer] = result = self.client.wait(handle)
            # Accepted at version v, the push made it v + 1 (on arrival; a BSP round later).
            accepted = max(result.versions.values(), default=0)
            self.known[layer] = max(self.known[layer], accepted + 1)

        run_pool(order, start, finish, self.pool_size)
        return results

    def _gradient(self) -> tuple[np.ndarray | None, np.ndarray]:
        """(keys, values) through the push filter, or (None, the dense gradient)."""
        if self.filter is None:
            return None, self.model.grads_np
        return self.filter.apply(self.model.grads_np)

    def _layers(self, clock: int, pulled: dict[int, PullResult],
                pushed: dict[int, PushResult]) -> list[LayerRecord]:
        return [LayerRecord(worker=self.worker.rank, iteration=clock, layer=layer,
                            pull_order=self._pull_order[layer],
                            push_order=self._push_order[layer],
                            suspend_s=pulled[layer].wait_s, staleness=pushed[layer].staleness)
                for layer in range(len(self.layers))]

    def push_order(self) -> list[KeyRange]:
        return list(self.layers)

