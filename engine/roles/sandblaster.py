"""The coordinator's side of Sandblaster L-BFGS (``--optimizer lbfgs``, seed 004).

The coordinator runs L-BFGS (engine.sandblaster.lbfgs): its vector operations go to every shard
server as ``vector_ops`` and come back as dot products' sums, so the model never reaches the
coordinator. Each evaluation of the loss is a pass over the training set: the pass's portions go
to idle workers as ``task`` messages (engine.sandblaster.balancer); a worker reports
``task_done``, is told by a ``verdict`` whether its copy counts, pushes the gradient sum of a
committed copy into the shards' ``g`` and reports ``task_pushed``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Coroutine
from dataclasses import asdict
from typing import Any

from engine.config import RunConfig
from engine.errors import RunFailed, ShuttingDown
from engine.roles.peer import Peer
from engine.sandblaster.balancer import Pass, portion_count, portions
from engine.sandblaster.lbfgs import Lbfgs, Step, scale, zero
from engine.wire.messages import (
    Message,
    Task,
    TaskDone,
    TaskPushed,
    VectorOp,
    VectorOps,
    VectorResults,
    Verdict,
)

Send = Callable[[Peer, Message], Coroutine[Any, Any, None]]
STOP_CHECK_S = 0.2  # how soon a pass in progress notices that the run is stopping


class Sandblaster:
    def __init__(self, config: RunConfig, *, samples: int, peers: Callable[[str], list[Peer]],
                 send: Send, event: Callable[..., None], stopping: Callable[[], bool]) -> None:
        options = config.optimizer
        self.timeout_s = config.cluster.request_timeout_s
        self.ranges = portions(samples, portion_count(options.portions,
                                                      config.cluster.workers, samples))
        self.copies = 2 if options.backups else 1
        self.peers, self._send, self._event, self.stopping = peers, send, event, stopping
        self.lbfgs = Lbfgs(self, self._pass, history=options.history, first_step=options.lr,
                           on_step=self._on_step)
        self.idle: set[int] = set(range(config.cluster.workers))
        self.current: Pass | None = None
        self._open: dict[int, Pass] = {}  # task -> its pass, for every copy not yet finished
        # Committed copies not yet pushed: task -> (its pass, worker, loss sum, rows).
        self._sums: dict[int, tuple[Pass, int, float, int]] = {}
        self._seq = 0
        self._abandoned: set[int] = set()  # operations whose answers nobody waits for
        self._task_base = 0
        self._answers: dict[int, dict[int, asyncio.Future[VectorResults]]] = {}
        self._progress = asyncio.Event()
        self._cancelled: set[int] = set()  # copies told to stop before they reported
        self._issued: dict[int, int] = {}  # worker -> its last task's iteration number
        self._redo = False
        self.passes = 0

    # -- the run ---------------------------------------------------------------------------------

    async def minimise(self, max_evaluations: int) -> str:
        """Minimise until the epochs (passes) are spent; returns why it ended."""
        try:
            return await self.lbfgs.minimise(max_evaluations, self.stopping)
        except ShuttingDown:  # the run began to stop during a pass
            return "stopped"

    async def settle(self) -> None:
        """After the workers stopped: the last accepted iterate goes back into ``x``."""
        await self.lbfgs.settle()

    # -- vector operations on the shards ---------------------------------------------------------

    async def run(self, ops: list[VectorOp]) -> list[float]:
        """The shards' vector space (engine.sandblaster.lbfgs.VectorSpace)."""
        servers = [p for p in self.peers("server") if not p.lost]
        seq, self._seq = self._seq, self._seq + 1
        loop = asyncio.get_running_loop()
        waiting = self._answers[seq] = {p.rank: loop.create_future() for p in servers}
        try:
            for server in servers:
                await self._send(server, VectorOps(seq=seq, ops=ops))
            async with asyncio.timeout(self.timeout_s):
                answers = [await future for future in waiting.values()]
        except TimeoutError:
            raise RunFailed(f"shard servers did not answer vector operations within "
                            f"{self.timeout_s:g} s (cluster.request_timeout_s)") from None
        except asyncio.CancelledError:  # the run stopped: the answers may still come
            self._abandoned.add(seq)
            raise
        finally:
            del self._answers[seq]
        errors = [a.error for a in answers if a.error is not None]
        if errors:
            raise RunFailed(f"L-BFGS vector operations failed: {errors[0]}")
        return [sum(values) for values in zip(*(a.values for a in answers), strict=True)]

    # -- passes over the data ----------------------------------------------------------------------

    async def _pass(self) -> float:
        """One evaluation: g <- the mean gradient at x over every training row; the mean loss."""
        while True:
            await self.run([zero("g")])
            started = time.monotonic()
            self.current = Pass(self.passes, self.ranges, first_task=self._task_base,
                                copies=self.copies)
            self._redo = False
            for worker in sorted(self.idle):
                self._assign(worker)
            await self._wait(self.current)
            self._task_base = self.current.next_task  # task ids are never used twice
            if not self._redo:
                break
            await self._wait_for_pushes()  # a spoiled pass's late pushes must not land in g
            self._event("lbfgs_pass_redone", evaluation=self.passes,
                        reason="a worker was lost between its commit and its push")
        done, self.current = self.current, None
        await self.run([scale("g", 1.0 / done.samples)])
        self._event("lbfgs_pass", evaluation=self.passes, seconds=time.monotonic() - started,
                    loss=done.loss_sum / done.samples, portions=len(self.ranges),
                    **asdict(done.stats))
        self.passes += 1
        return done.loss_sum / done.samples

    async def _wait(self, current: Pass) -> None:
        """Until the pass is complete (or must be redone); no word from any worker for the
        request timeout fails the run."""
        deadline = time.monotonic() + self.timeout_s
        while not (current.complete or self._redo):
            if self.stopping():  # the workers are stopping: this pass cannot complete
                raise ShuttingDown(f"the run stopped during L-BFGS pass {current.evaluation}")
            if time.monotonic() > deadline:
                raise RunFailed(f"no worker finished a task of L-BFGS pass {current.evaluation} "
                                f"within {self.timeout_s:g} s (cluster.request_timeout_s)")
            self._progress.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._progress.wait(), STOP_CHECK_S)
            if self._progress.is_set():
                deadline = time.monotonic() + self.timeout_s

    async def _wait_for_pushes(self) -> None:
        while self._sums:
            self._progress.clear()
            try:
                await asyncio.wait_for(self._progress.wait(), self.timeout_s)
            except TimeoutError:
                raise RunFailed("committed L-BFGS tasks were not pushed within "
                                f"{self.timeout_s:g} s (cluster.request_timeout_s)") from None

    def _assign(self, worker: int) -> None:
        current = self.current
        peer = self._peer(worker)
        copy = None
        if current is not None and not current.complete and peer is not None \
                and not self.stopping():
            copy = current.take(worker, time.monotonic())
        if copy is None or peer is None or current is None:
            self.idle.add(worker)
            return
        self.idle.discard(worker)
        self._open[copy.task] = current
        start, end = current.ranges[copy.portion]
        iteration = self._issued[worker] = self._issued.get(worker, -1) + 1
        self._spawn_send(peer, Task(task=copy.task, evaluation=current.evaluation,
                                    iteration=iteration, start=start, end=end))

    # -- messages --------------------------------------------------------------------------------

    def on_message(self, peer: Peer, message: Message) -> None:
        if isinstance(message, VectorResults):
            if message.seq in self._abandoned:
                return
            future = self._answers.get(message.seq, {}).get(peer.rank)
            if future is None or future.done():
                raise RunFailed(f"{peer} answered vector operations {message.seq}, which were "
                                "not asked of it")
            future.set_result(message)
        elif isinstance(message, TaskDone):
            self._on_done(peer, message)
        elif isinstance(message, TaskPushed):
            self._on_pushed(peer, message)

    def _on_done(self, peer: Peer, message: TaskDone) -> None:
        if message.task in self._cancelled:  # told to stop already; it reads that verdict
            self._cancelled.discard(message.task)
            return
        owner = self._open.pop(message.task, None)
        if owner is None:
            raise RunFailed(f"{peer} reported task {message.task}, which it was not given")
        commit = owner.finished(peer.rank, message.task) and owner is self.current
        if commit:
            self._sums[message.task] = (owner, peer.rank, message.loss_sum, message.samples)
        self._spawn_send(peer, Verdict(task=message.task, commit=commit))
        self._progress.set()
        if not commit:
            self._assign(peer.rank)
            return
        for other in owner.others(message.task):  # backup copies of the portion stop now
            self._open.pop(other.task, None)
            self._cancelled.add(other.task)
            worker = self._peer(other.worker)
            if worker is not None:
                self._spawn_send(worker, Verdict(task=other.task, commit=False))
            self._assign(other.worker)

    def _on_pushed(self, peer: Peer, message: TaskPushed) -> None:
        sums = self._sums.pop(message.task, None)
        if sums is None or sums[1] != peer.rank:
            raise RunFailed(f"{peer} pushed task {message.task}, which was not committed")
        owner, _, loss_sum, samples = sums
        if owner is self.current:  # else a spoiled pass's: it only had to land before the redo
            owner.pushed_by(peer.rank, message.task, loss_sum, samples)
        self._progress.set()
        self._assign(peer.rank)

    def lost(self, rank: int) -> None:
        """A worker died: its copies go back out; a commit it had not pushed spoils the pass."""
        self.idle.discard(rank)
        for task in [t for t, owner in self._open.items() if owner.running.get(t) is not None
                     and owner.running[t].worker == rank]:
            del self._open[task]
        for task in [t for t, sums in self._sums.items() if sums[1] == rank]:
            del self._sums[task]  # its push may be on some shards only: it never reports
        if self.current is not None and not self.current.forget(rank):
            self._redo = True
        self._progress.set()
        for worker in sorted(self.idle):
            self._assign(worker)

    def joined(self, rank: int) -> None:
        """A restarted worker is ready for tasks."""
        self._assign(rank)

    def _peer(self, worker: int) -> Peer | None:
        return next((p for p in self.peers("worker") if p.rank == worker and not p.lost), None)

    def _on_step(self, step: Step) -> None:
        self._event("lbfgs_step", **asdict(step))

    def _spawn_send(self, peer: Peer, message: Message) -> None:
        task = asyncio.get_running_loop().create_task(self._send(peer, message))
        task.add_done_callback(_drop_result)


def _drop_result(task: asyncio.Task[None]) -> None:
    with contextlib.suppress(asyncio.CancelledError):
        task.exception()  # _send reports a lost peer itself
