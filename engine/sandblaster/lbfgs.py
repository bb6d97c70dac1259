"""L-BFGS over vectors the coordinator never holds.

Every vector (the parameters ``x``, the mean gradient ``g``, the direction ``d``, the last
iterate ``x0`` and its gradient ``g0``, the correction pairs ``s<i>`` and ``y<i>``) lives cut
across the shards; this module only sends operations (engine.server.vectors) and gets back the
dot products' sums. Nocedal & Wright, Numerical Optimization (2006), algorithms 7.4 and 7.5,
with a backtracking line search on the Armijo condition.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from engine.wire.messages import VectorOp

ARMIJO_C1 = 1e-4
SHRINK = 0.5
MAX_TRIALS = 12
# Pairs whose curvature s.y is not clearly positive would make the inverse Hessian indefinite.
CURVATURE_EPS = 1e-10


class VectorSpace(Protocol):
    async def run(self, ops: list[VectorOp]) -> list[float]:
        """Apply ``ops`` on every shard, in order; each ``dot``'s value summed over shards."""
        ...


Evaluate = Callable[[], Awaitable[float]]  # f(x) into the return value, its gradient into g


@dataclass(frozen=True)
class Step:
    """One accepted L-BFGS iteration."""

    iteration: int
    loss: float
    grad_norm: float
    step: float
    trials: int
    evaluations: int
    pairs: int
    restarted: bool


def zero(a: str) -> VectorOp:
    return VectorOp(op="zero", a=a)


def copy(a: str, b: str) -> VectorOp:
    return VectorOp(op="copy", a=a, b=b)


def scale(a: str, c: float) -> VectorOp:
    return VectorOp(op="scale", a=a, c=c)


def axpy(a: str, c: float, b: str) -> VectorOp:
    return VectorOp(op="axpy", a=a, b=b, c=c)


def dot(a: str, b: str) -> VectorOp:
    return VectorOp(op="dot", a=a, b=b)


class Lbfgs:
    """Minimise the function ``evaluate`` computes at ``x``, one pass per evaluation."""

    def __init__(self, space: VectorSpace, evaluate: Evaluate, *, history: int = 10,
                 first_step: float = 1.0, on_step: Callable[[Step], None] = lambda step: None,
                 tolerance: float = 1e-7) -> None:
        self.space, self.evaluate, self.history = space, evaluate, history
        self.first_step, self.on_step, self.tolerance = first_step, on_step, tolerance
        self.pairs: deque[tuple[int, float]] = deque()  # (slot, 1 / s.y), oldest first
        self.evaluations = 0
        self.iterations = 0
        self.searching = False  # x is a line search's trial point; x0 is the last iterate
        self.loss = math.inf
        self._gamma = 1.0

    async def minimise(self, max_evaluations: int, stopping: Callable[[], bool]) -> str:
        """Iterate until ``max_evaluations`` passes are spent or ``stopping()``; returns why it
        ended."""
        self.loss = await self._evaluate()
        (squared,) = await self.space.run([dot("g", "g")])
        while True:
            if stopping():
                return "stopped"
            if math.sqrt(squared) <= self.tolerance:
                return f"converged: gradient norm {math.sqrt(squared):.3g}"
            if self.evaluations >= max_evaluations:
                return "all epochs done"
            restarted, slope = await self._direction(squared)
            outcome = await self._search(slope, squared, restarted, max_evaluations, stopping)
            if isinstance(outcome, str):
                return outcome
            squared = outcome

    async def settle(self) -> None:
        """Put back the last iterate if a line search was cut off at a trial point."""
        if self.searching:
            await self.space.run([copy("x", "x0"), copy("g", "g0")])
            self.searching = False

    async def _evaluate(self) -> float:
        self.evaluations += 1
        return await self.evaluate()

    async def _direction(self, squared: float) -> tuple[bool, float]:
        """d = -H g by the two-loop recursion; (restarted, g.d). A d that is not a descent
        direction drops the pairs and falls back to -g."""
        if self.pairs:
            pending: list[VectorOp] = [copy("d", "g")]
            alphas: list[float] = []
            for slot, rho in reversed(self.pairs):
                alpha = rho * await self._dot(pending, f"s{slot}", "d")
                alphas.append(alpha)
                pending.append(axpy("d", -alpha, f"y{slot}"))
            pending.append(scale("d", self._gamma))
            for (slot, rho), alpha in zip(self.pairs, reversed(alphas), strict=True):
                beta = rho * await self._dot(pending, f"y{slot}", "d")
                pending.append(axpy("d", alpha - beta, f"s{slot}"))
            pending.append(scale("d", -1.0))
            slope = await self._dot(pending, "g", "d")
            if slope < 0:
                return False, slope
            self.pairs.clear()
        await self.space.run([copy("d", "g"), scale("d", -1.0)])
        return True, -squared

    async def _search(self, slope: float, squared: float, restarted: bool,
                      max_evaluations: int, stopping: Callable[[], bool]) -> float | str:
        """Backtrack from the first step until the loss falls enough; the new |g|^2, or why
        the run ends."""
        step = self.first_step if not restarted else min(1.0, 1.0 / math.sqrt(squared))
        f0 = self.loss
        await self.space.run([copy("x0", "x"), copy("g0", "g")])
        self.searching = True
        for trial in range(1, MAX_TRIALS + 1):
            await self.space.run([copy("x", "x0"), axpy("x", step, "d")])
            loss = await self._evaluate()
            if loss <= f0 + ARMIJO_C1 * step * slope:
                self.searching = False
                self.loss = loss
                return await self._accept(step, trial, restarted)
            if self.evaluations >= max_evaluations or stopping():
                await self.settle()
                return "all epochs done" if not stopping() else "stopped"
            step *= SHRINK
        await self.settle()
        if restarted:
            return f"line search failed along the steepest descent ({MAX_TRIALS} trials)"
        self.pairs.clear()
        (squared,) = await self.space.run([dot("g", "g")])
        return squared

    async def _accept(self, step: float, trials: int, restarted: bool) -> float:
        """Store the pair s = x - x0, y = g - g0; returns |g|^2 at the new iterate."""
        slot = self._free_slot()
        s, y = f"s{slot}", f"y{slot}"
        sy, yy, squared = await self.space.run([
            copy(s, "d"), scale(s, step), copy(y, "g"), axpy(y, -1.0, "g0"),
            dot(s, y), dot(y, y), dot("g", "g")])
        if sy > CURVATURE_EPS * yy and yy > 0:
            self.pairs.append((slot, 1.0 / sy))
            self._gamma = sy / yy
        self.iterations += 1
        self.on_step(Step(self.iterations, self.loss, math.sqrt(squared), step, trials,
                          self.evaluations, len(self.pairs), restarted))
        return squared

    def _free_slot(self) -> int:
        if len(self.pairs) >= self.history:
            return self.pairs.popleft()[0]
        used = {slot for slot, _ in self.pairs}
        return min(set(range(self.history)) - used)

    async def _dot(self, pending: list[VectorOp], a: str, b: str) -> float:
        """Send the ops waiting and one dot product in a single round trip."""
        values = await self.space.run([*pending, dot(a, b)])
        pending.clear()
        return values[-1]
