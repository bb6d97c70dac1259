"""The coordinator's part that spends the run's budget (``--budget``, engine.budget): from the
workers' start it asks for the model to be tested at each mark of the budget, and stops the
run for every worker at once when the budget is spent. Seconds are the coordinator's clock from
the moment it started the workers; samples and updates are counted from the iterations the
workers report (every 0.05 s under such a budget: the run overshoots it by a few iterations)."""

from __future__ import annotations

import asyncio

from engine.budget import Budget, budget_of
from engine.roles.evaluations import Evaluations
from engine.roles.peer import Hub, RunState
from engine.wire.records import IterationRecord


class Spending:
    def __init__(self, state: RunState, hub: Hub, evaluations: Evaluations) -> None:
        self.hub, self.evaluations = hub, evaluations
        self.budget: Budget | None = budget_of(state.config.stop.budget)
        self._marks = list(self.budget.marks()) if self.budget else []
        self._spent = 0

    def start(self) -> None:
        """The workers were told to start: seconds count from here."""
        if self.budget is not None and self.budget.unit == "s":
            self.hub.spawn(self._clock(self.budget))

    async def _clock(self, budget: Budget) -> None:
        loop = asyncio.get_running_loop()
        started = loop.time()
        for mark in self._marks:
            await asyncio.sleep(max(0.0, started + mark - loop.time()))
            self.evaluations.at_mark()
        await asyncio.sleep(max(0.0, started + budget.amount - loop.time()))
        self.hub.stop(f"budget of {budget.text} spent")

    def on_rows(self, rows: list[IterationRecord]) -> None:
        budget = self.budget
        if budget is None or budget.unit == "s" or not rows:
            return
        self._spent += sum(row.samples for row in rows) if budget.unit == "samples" else len(rows)
        while self._marks and self._spent >= self._marks[0]:
            self._marks.pop(0)
            self.evaluations.at_mark()
        if self._spent >= budget.amount:
            self.hub.stop(f"budget of {budget.text} spent")
