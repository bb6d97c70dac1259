"""Vector operations on a shard's own keys: how Sandblaster L-BFGS (seed 004) moves a model it
never holds.

The coordinator's L-BFGS works on named vectors that are cut like the parameters: each shard
keeps its part of every one, and does ``zero``, ``copy``, ``scale``, ``axpy`` and ``dot`` on it
when told. Only the dot products' partial sums travel back. ``x`` is the shard's parameters and
``g`` the sum of the gradients pushed since it was last zeroed (engine.server.optimizers'
``GradientSum``); any other name is a vector the shard makes on first use, zero-filled.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from engine.errors import BadPayload
from engine.server.optimizers import GradientSum
from engine.server.shard import ShardState
from engine.wire.messages import VectorOp

# x, g, the direction, the last iterate and gradient, and 2 x 16 correction pairs, with room.
MAX_VECTORS = 48


class ShardVectors:
    """The named vectors of one shard."""

    def __init__(self, state: ShardState) -> None:
        if not isinstance(state.optimizer, GradientSum):
            raise BadPayload("vector operations need the lbfgs optimizer on the servers")
        self.state = state
        self._named: dict[str, np.ndarray] = {"x": state.params, "g": state.optimizer.total}
        self._scratch = np.empty(len(state.params), dtype=np.float32)

    def apply(self, ops: Sequence[VectorOp]) -> list[float]:
        """Apply ``ops`` in order; the partial sum of each ``dot``, in float64. An op that would
        leave a vector non-finite is refused with the vector unchanged, and so is every op after
        it (those before it stay done)."""
        with np.errstate(over="ignore", invalid="ignore"):  # results are checked instead
            return [value for op in ops if (value := self._one(op)) is not None]

    def _one(self, op: VectorOp) -> float | None:
        a = self._vector(op.a)
        if op.op == "zero":
            a.fill(0)
            return None
        if op.op == "scale":
            self._checked(op, np.multiply(a, np.float32(op.c), out=self._scratch), a)
            return None
        if op.b is None:
            raise BadPayload(f"vector op {op.op} needs a second vector (b)")
        b = self._vector(op.b)
        if op.op == "dot":
            return float(np.dot(a.astype(np.float64), b.astype(np.float64)))
        if op.op == "copy":
            np.copyto(a, b)
            return None
        result = np.multiply(b, np.float32(op.c), out=self._scratch)  # axpy
        result += a
        self._checked(op, result, a)
        return None

    def _vector(self, name: str) -> np.ndarray:
        vector = self._named.get(name)
        if vector is None:
            if len(self._named) >= MAX_VECTORS:
                raise BadPayload(f"a shard keeps at most {MAX_VECTORS} vectors; {name!r} would "
                                 "be one more")
            vector = self._named[name] = np.zeros(len(self.state.params), dtype=np.float32)
        return vector

    @staticmethod
    def _checked(op: VectorOp, result: np.ndarray, target: np.ndarray) -> None:
        if not np.isfinite(result).all():
            raise BadPayload(f"vector op {op.op} on {op.a} would make it non-finite; "
                             "refused, the vector is unchanged")
        np.copyto(target, result)
