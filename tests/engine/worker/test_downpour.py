"""Downpour's worker loop against DistBelief's Algorithm 1.1 (Dean et al., NIPS 2012), computed
here: fetch every n_fetch steps, step the replica's own copy after every gradient
(parameters <- parameters - alpha * gradient), push the accrued gradients every n_push steps."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from engine.keys import KeyLayout, KeyRange
from engine.plan import build_config
from engine.wire.records import IterationRecord
from engine.worker.client import Handle, PullResult, PushResult
from engine.worker.downpour import DownpourLoop
from engine.worker.loops import Shard
from tests.engine.worker.hosts import timing

KEYS, ETA, ALPHA = 3, 0.1, 0.05
TARGET = np.array([1.0, -2.0, 0.5], dtype=np.float32)
START = np.array([0.3, 0.7, -1.1], dtype=np.float32)


class SGDServer:
    """A parameter server answering at once: a push is applied as w <- w - eta * sum, a pull
    copies w out. Handles complete when made, as an idle loopback shard's nearly do."""

    def __init__(self) -> None:
        self.params = START.copy()
        self.pushes: list[np.ndarray] = []
        self._ids = iter(range(1, 10**6))
        self._results: dict[int, Any] = {}

    def pull(self, keys: KeyRange, out: np.ndarray, *, clock: int) -> Handle[PullResult]:
        np.copyto(out, self.params)
        return self._done(PullResult({0: len(self.pushes)}, 0.0, 8, 4 * KEYS), PullResult)

    def push(self, keys: KeyRange, values: np.ndarray, **header: Any) -> Handle[PushResult]:
        self.pushes.append(values.copy())
        self.params -= np.float32(ETA) * values
        return self._done(PushResult({0: len(self.pushes)}, 0, 4 * KEYS, 8), PushResult)

    def _done(self, result: Any, kind: type[Any]) -> Handle[Any]:
        handle = Handle(next(self._ids), kind)
        self._results[handle.request_id] = result
        return handle

    def done(self, handle: Handle[Any]) -> bool:
        return handle.request_id in self._results

    def wait(self, handle: Handle[Any], timeout: float | None = None) -> Any:
        return self._results.pop(handle.request_id)


def algorithm_1_1(steps: int, n_fetch: int, n_push: int, alpha: float) -> tuple[list[float],
                                                                                 np.ndarray]:
    """The paper's client, line by line, on the quadratic loss 0.5 |p - target|^2 against a
    server applying w <- w - eta * pushed; returns each step's loss and the server's model."""
    server, params = START.copy(), START.copy()
    accrued = np.zeros(KEYS, dtype=np.float32)
    losses = []
    for step in range(steps):
        if step % n_fetch == 0:
            params = server.copy()
        gradient = params - TARGET
        losses.append(float(0.5 * gradient @ gradient))
        accrued += gradient
        params = params - np.float32(alpha) * gradient
        if (step + 1) % n_push == 0 or step == steps - 1:
            server -= np.float32(ETA) * accrued
            accrued = np.zeros(KEYS, dtype=np.float32)
    return losses, server


class Quadratic(DownpourLoop):
    def compute(self, shard: Shard, batch: np.ndarray) -> float:
        np.subtract(self.model.params_np, TARGET, out=self.model.grads_np)
        return float(0.5 * self.model.grads_np @ self.model.grads_np)


def run_loop(n_fetch: int, n_push: int, alpha: float, steps: int = 12) -> tuple[
        list[IterationRecord], SGDServer]:
    config = build_config({}, {"data.dataset": "digits", "train.epochs": 1, "sync.model": "asp",
                               "train.fetch_every": n_fetch, "train.push_every": n_push,
                               "train.local_lr": alpha})
    rows: list[IterationRecord] = []
    server = SGDServer()
    worker = SimpleNamespace(
        client=server, config=config, layout=KeyLayout.single(KEYS), keys=KeyRange(0, KEYS),
        rank=0, **timing(),
        record=lambda row, layers=None: rows.append(row), should_stop=lambda: False,
        epoch_done=lambda epoch: None)
    model = SimpleNamespace(params_np=np.zeros(KEYS, dtype=np.float32),
                            grads_np=np.zeros(KEYS, dtype=np.float32))
    loop = Quadratic(worker, model)  # type: ignore[arg-type]
    shard = Shard(np.zeros((steps, 2), dtype=np.float32), np.zeros(steps, dtype=np.int64), 1)
    assert loop.train(shard) == steps
    return sorted(rows, key=lambda r: r.iteration), server


@pytest.mark.parametrize(("n_fetch", "n_push", "alpha"),
                         [(4, 4, ALPHA), (3, 2, ALPHA), (1, 1, ALPHA), (4, 4, 0.0)])
def test_the_loop_computes_what_algorithm_1_1_computes(n_fetch: int, n_push: int,
                                                       alpha: float) -> None:
    rows, server = run_loop(n_fetch, n_push, alpha)
    losses, model = algorithm_1_1(12, n_fetch, n_push, alpha)
    assert [r.loss for r in rows] == pytest.approx(losses, rel=1e-5)
    np.testing.assert_allclose(server.params, model, rtol=1e-5)
    assert len(server.pushes) == -(-12 // n_push)


def test_the_local_step_changes_the_result() -> None:
    stepped, _ = run_loop(4, 4, ALPHA)
    frozen, _ = run_loop(4, 4, 0.0)
    assert [r.loss for r in stepped] != pytest.approx([r.loss for r in frozen], rel=1e-5)


def test_only_fetching_and_pushing_iterations_move_bytes() -> None:
    rows, _ = run_loop(4, 4, ALPHA)
    assert [r.iteration for r in rows if r.bytes_received] == [0, 3, 4, 7, 8, 11]
    assert [r.iteration for r in rows if r.push_bytes] == [3, 7, 11]
