"""What a real role's code is given in the simulator, so that it runs unchanged: a virtual clock,
an I/O runner on the virtual-time loop, and a worker's host.

A worker loop (``engine.worker``) blocks on its parameter client and reads the time from its
host (``engine.worker.loops.Host``); run by ``engine.sim.green.run_blocking``, each of its
blocking waits lets the other simulated roles run (``wait_for``), and its clock is the loop's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from engine.aio import Pending
from engine.errors import Diverged, RequestTimeout, RunFailed
from engine.sim.green import wait_for
from engine.wire.messages import ControlMessage
from engine.wire.records import IterationRecord, LayerRecord

if TYPE_CHECKING:
    from engine.config import RunConfig
    from engine.keys import KeyLayout, KeyRange
    from engine.worker.client import ParameterClient
    from engine.worker.timing import Pace

T = TypeVar("T")


class VirtualClock:
    """``engine.worker.timing.Clock`` in virtual time: ``epoch`` is the unix time of virtual 0."""

    def __init__(self, loop: asyncio.AbstractEventLoop, epoch: float) -> None:
        self._loop, self.epoch = loop, epoch

    def now(self) -> float:
        return self.epoch + self._loop.time()

    def perf(self) -> float:
        return self._loop.time()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            wait_for(asyncio.sleep(seconds))


class VirtualIO:
    """``engine.aio.IO`` on the simulator's loop: coroutines run as its tasks; a wait for one
    yields to the other roles (the caller is blocking code run by ``run_blocking``)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def submit(self, coro: Coroutine[Any, Any, T]) -> Pending[T]:
        task = self._loop.create_task(coro)
        # A request nobody waits for (the run failed with it in flight) fails quietly, as a
        # real client's future does: whoever waits still gets its exception.
        task.add_done_callback(_retrieved)
        return task

    def result(self, pending: Pending[T], timeout: float) -> T:
        assert isinstance(pending, asyncio.Future)
        if not pending.done():
            if timeout <= 0:
                pending.cancel()
                raise TimeoutError
            try:
                wait_for(asyncio.wait_for(asyncio.shield(pending), timeout))
            except TimeoutError:
                pending.cancel()
                raise
        result: T = pending.result()
        return result

    def call(self, coro: Coroutine[Any, Any, T], timeout: float, what: str = "operation") -> T:
        try:
            return self.result(self.submit(coro), timeout)
        except TimeoutError:
            raise RequestTimeout(f"{what} did not complete within {timeout:.1f} s") from None


def _retrieved(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()


class SimulatedWorker:
    """A worker loop's host (``engine.worker.loops.Host``) in the simulated cluster: it reports
    to the cluster (which records as the coordinator does) instead of over a control channel."""

    def __init__(self, config: RunConfig, rank: int, keys: KeyRange, layout: KeyLayout,
                 client: ParameterClient, clock: VirtualClock, pace: Pace, *,
                 should_stop: Callable[[], bool],
                 record: Callable[[IterationRecord, list[LayerRecord]], None],
                 epoch_done: Callable[[int, int], None]) -> None:
        self.config, self.rank, self.keys, self.layout = config, rank, keys, layout
        self.client, self.clock, self.pace = client, clock, pace
        self._should_stop, self._record, self._epoch_done = should_stop, record, epoch_done
        self.stopped: str | None = None  # why the loop ended early, if it did
        self._last_iteration = -1

    def train(self, loop: Any, shard: Any) -> int:
        """``loop.train(shard)``; a divergence ends the run saying where, as a real worker's."""
        from engine.worker.loops import diverged

        try:
            done: int = loop.train(shard)
        except Diverged as exc:
            raise Diverged(diverged(self.rank, self._last_iteration + 1,
                                    self.config.optimizer.lr, exc)) from exc
        return done

    def should_stop(self) -> bool:
        return self._should_stop()

    def stop_with(self, reason: str) -> None:
        self.stopped = self.stopped or reason

    def record(self, row: IterationRecord, layers: list[LayerRecord] | None = None) -> None:
        self._last_iteration = row.iteration
        self._record(row, layers or [])

    def epoch_done(self, epoch: int) -> None:
        self._epoch_done(self.rank, epoch)

    def inbox(self) -> list[ControlMessage]:
        return []  # nothing but the cluster speaks to a simulated worker

    def send(self, message: ControlMessage) -> None:
        raise RunFailed(f"a simulated worker has no coordinator to send {message.type!r} to")
