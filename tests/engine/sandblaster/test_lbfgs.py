"""The coordinator's L-BFGS, run on real shard vectors in one process: it must find what
scipy's L-BFGS finds, never hold the model, and put the last iterate back when cut off."""

from __future__ import annotations

import asyncio
import itertools

import numpy as np
import pytest
from scipy.optimize import minimize

from engine.consistency.base import ASP
from engine.keys import KeyRange
from engine.sandblaster.lbfgs import Lbfgs, Step
from engine.server.optimizers import GradientSum
from engine.server.shard import ShardState
from engine.server.update import Update
from engine.server.vectors import ShardVectors
from engine.wire.messages import VectorOp

FEATURES, ROWS = 20, 400
CUTS = [KeyRange(0, 8), KeyRange(8, FEATURES)]


def problem() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(4)
    inputs = rng.normal(size=(ROWS, FEATURES))
    truth = rng.normal(size=FEATURES)
    labels = (inputs @ truth + rng.normal(scale=2.0, size=ROWS) > 0).astype(float)
    return inputs, labels


def loss_and_grad(w: np.ndarray, inputs: np.ndarray, labels: np.ndarray,
                  ) -> tuple[float, np.ndarray]:
    """Mean logistic loss with a small L2 term (strictly convex: one optimum)."""
    z = inputs @ w
    loss = np.mean(np.logaddexp(0.0, z) - labels * z) + 0.005 * w @ w
    grad = inputs.T @ (1 / (1 + np.exp(-z)) - labels) / len(labels) + 0.01 * w
    return float(loss), grad


class Shards:
    """The vector space of two shard states, as the servers hold it; it counts round trips
    and every op it saw, to check that only scalars came back."""

    def __init__(self) -> None:
        self.parts = []
        for keys in CUTS:
            state = ShardState(keys, ASP(1), GradientSum(len(keys)))
            state.init(keys, np.zeros(len(keys), dtype=np.float32))
            self.parts.append(ShardVectors(state))
        self.trips = 0

    async def run(self, ops: list[VectorOp]) -> list[float]:
        self.trips += 1
        values = [part.apply(ops) for part in self.parts]
        return [sum(column) for column in zip(*values, strict=True)]

    def x(self) -> np.ndarray:
        return np.concatenate([part.state.params for part in self.parts]).astype(np.float64)


def objective(shards: Shards, inputs: np.ndarray, labels: np.ndarray) -> tuple[
        list[float], object]:
    """An ``evaluate`` that computes at the shards' x and adds the gradient into their g, as
    workers' pushes would."""
    seen: list[float] = []

    async def evaluate() -> float:
        loss, grad = loss_and_grad(shards.x(), inputs, labels)
        for part, keys in zip(shards.parts, CUTS, strict=True):
            state = part.state
            state.optimizer.total.fill(0)  # type: ignore[attr-defined]
            state.optimizer.apply(state.params, Update(  # a push of the whole pass's mean
                slice(0, len(keys)), grad[keys.start:keys.end].astype(np.float32)))
        seen.append(loss)
        return loss

    return seen, evaluate


def test_it_reaches_scipys_optimum_through_vector_operations_alone() -> None:
    inputs, labels = problem()
    shards = Shards()
    seen, evaluate = objective(shards, inputs, labels)
    steps: list[Step] = []
    lbfgs = Lbfgs(shards, evaluate, history=10, on_step=steps.append)  # type: ignore[arg-type]
    reason = asyncio.run(lbfgs.minimise(60, lambda: False))
    reference = minimize(loss_and_grad, np.zeros(FEATURES), args=(inputs, labels), jac=True,
                         method="L-BFGS-B", options={"maxcor": 10, "gtol": 1e-9})
    final = loss_and_grad(shards.x(), inputs, labels)[0]
    assert final == pytest.approx(reference.fun, rel=1e-5), (reason, final, reference.fun)
    # Armijo: every accepted step lowered the loss, and most took the first trial.
    losses = [step.loss for step in steps]
    assert all(b < a for a, b in itertools.pairwise(losses))
    assert sum(step.trials == 1 for step in steps) >= len(steps) * 0.8
    assert steps[-1].pairs == 10 and lbfgs.evaluations == len(seen) <= 60


def test_a_run_cut_off_during_a_line_search_puts_the_last_iterate_back() -> None:
    inputs, labels = problem()
    shards = Shards()
    seen, evaluate = objective(shards, inputs, labels)
    accepted: list[np.ndarray] = []

    def on_step(step: Step) -> None:
        accepted.append(shards.x())

    async def cut_off() -> None:
        lbfgs = Lbfgs(shards, evaluate, on_step=on_step)  # type: ignore[arg-type]

        async def slow() -> float:
            if len(seen) == 4:  # the fourth pass never ends: the run stops during it
                await asyncio.sleep(3600)
            return await evaluate()  # type: ignore[operator,no-any-return]

        lbfgs.evaluate = slow
        task = asyncio.create_task(lbfgs.minimise(100, lambda: False))
        while len(seen) < 4:
            await asyncio.sleep(0)
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert lbfgs.searching
        assert not np.allclose(shards.x(), accepted[-1])  # x is the trial point
        await lbfgs.settle()

    asyncio.run(cut_off())
    assert np.allclose(shards.x(), accepted[-1])


def test_a_gradient_of_zero_ends_the_run_at_once() -> None:
    shards = Shards()

    async def flat() -> float:
        return 1.0

    lbfgs = Lbfgs(shards, flat)  # type: ignore[arg-type]
    assert asyncio.run(lbfgs.minimise(10, lambda: False)).startswith("converged")
    assert lbfgs.evaluations == 1
