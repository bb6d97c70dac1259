"""The coordinator's part for testing the model: it asks the evaluator at each epoch's end (by
the run's first workers, still there) and every ``eval.interval_s``, records the answers, stops
the run at its target accuracy or at a diverged loss, and waits for the final evaluation."""

from __future__ import annotations

import asyncio
import contextlib

from engine.errors import ProtocolError
from engine.roles.peer import Hub, RunState
from engine.roles.recording import Records
from engine.wire.messages import Evaluate, Evaluation
from engine.wire.records import EvaluationRecord, divergence


class Evaluations:
    def __init__(self, state: RunState, hub: Hub, records: Records) -> None:
        self.state, self.hub, self.records = state, hub, records
        self.best_accuracy = 0.0
        self._pending = False  # asked, not answered: the timer does not ask again meanwhile
        self._final: asyncio.Future[EvaluationRecord] | None = None
        self.final_asked = 0  # times the final evaluation was asked for

    def on_evaluation(self, message: Evaluation) -> None:
        diverged = divergence(message.row)
        if diverged is not None:  # a NaN loss cannot be stored, and training on is pointless
            self.hub.event("diverged", accuracy=message.row.accuracy, step=message.row.step)
            self.hub.fail(diverged)
            return
        self.records.evaluation(message.row)
        if message.metrics:
            if any(m.role != "evaluator" or m.rank != 0 for m in message.metrics):
                raise ProtocolError("an evaluation reported metrics of another process")
            self.records.user_metrics(message.metrics)
        self._pending = False
        self.best_accuracy = max(self.best_accuracy, message.row.accuracy)
        target = self.state.config.stop.target_accuracy
        if target is not None and message.row.accuracy >= target:
            self.hub.stop(f"target accuracy {target:.4f} reached")
        if message.final and self._final is not None and not self._final.done():
            self._final.set_result(message.row)

    def on_epoch_done(self, rank: int, epoch: int) -> None:
        """Worker ``rank`` finished ``epoch``: the run's epoch is its first workers' (still
        there; newcomers count their own), tested once all of them finished it."""
        state = self.state
        workers = [w for w in range(state.config.cluster.workers)
                   if w in state.membership.active]
        if rank not in workers:
            return
        before = min((state.progress.epochs_done.get(w, -1) for w in workers), default=-1)
        state.progress.epochs_done[rank] = epoch
        after = min((state.progress.epochs_done.get(w, -1) for w in workers), default=-1)
        if after > before:
            self.hub.event("epoch_done", epoch=after)
            # under a budget the epochs are each worker's own passes: the marks test instead
            if after + 1 < state.config.train.epochs and state.config.stop.budget is None:
                self.request(float(after + 1), final=False)

    async def timer(self) -> None:
        state = self.state
        while True:
            await asyncio.sleep(state.config.eval.interval_s)
            stopping = state.stop_reason is not None
            if state.training.is_set() and state.progress.iterations and not stopping:
                self.request(self._epoch(), final=False)

    async def final(self) -> bool:
        """Ask for the final evaluation; whether it arrived within cluster.request_timeout_s
        of its last asking: an evaluator restarted meanwhile is asked again when it rejoins
        (its rejoin has a bound of its own), at most once for each restart it may have."""
        final = self._final = asyncio.get_running_loop().create_future()
        self.request(self._epoch(), final=True)
        limit = self.state.config.cluster.request_timeout_s
        for _ in range(self.state.config.fault.max_restarts + 1):
            asked = self.final_asked
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(final), limit)
                return True
            if self.final_asked == asked:
                return False
        return False

    def at_mark(self) -> None:
        """A mark of the run's budget: tested even while a periodic evaluation is out."""
        self._pending = False
        self.request(self._epoch(), final=False)

    def request(self, epoch: float, *, final: bool) -> None:
        evaluator = self.state.peers.get(("evaluator", 0))
        if evaluator is None or evaluator.lost or (self._pending and not final):
            return  # a lost evaluator is asked again when its restart rejoins
        self._pending = True
        if final:
            self.final_asked += 1
        # A resumed run repeats the epochs after its checkpoint: its evaluations' epochs wait
        # at the highest one recorded before, rather than going back.
        epoch = max(epoch, self.state.progress.epoch_floor)
        self.hub.spawn(self.hub.send(evaluator, Evaluate(epoch=epoch, final=final)))

    def evaluator_back(self) -> None:
        """The evaluator joined (again, after a restart): what its lost predecessor was asked
        and never answered is forgotten, except the final evaluation, which is asked again."""
        self._pending = False
        if self._final is not None and not self._final.done():
            self.request(self._epoch(), final=True)

    def _epoch(self) -> float:
        return self.state.progress.epoch(self.state.config.cluster.workers)
