"""When the KKT filter changes nothing (docs/models.md): OSDI'14 (seed 003) skips a key whose
weight is 0 and whose gradient satisfies |g| <= l1, because the proximal step would leave the
weight at 0. That holds for a push applied alone by the proximal SGD step; it does not under
BSP, where a round's mean mixes the keys one worker left out with the others' values, nor with
Adagrad, whose running sum of squares misses the left-out gradients."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from engine.keys import KeyLayout, KeyRange
from engine.models.logreg import kkt_mask
from engine.plan import build_config
from engine.roles.copies import build_shard
from engine.server.shard import ShardState

L1 = 1.0
KEYS = KeyRange(0, 4)
# Two workers, two rounds; every weight starts at 0.
ROUNDS = [
    [np.array([0.5, 3.0, -0.2, 0.0], np.float32), np.array([2.0, 0.1, 0.0, -4.0], np.float32)],
    [np.array([0.9, -0.5, 0.3, 1.5], np.float32), np.array([-0.4, 0.2, 2.5, 0.7], np.float32)],
]


def shard(**settings: Any) -> ShardState:
    config = build_config({}, {"data.dataset": "digits", "cluster.workers": 2,
                               "optimizer.momentum": 0.0, "optimizer.lr": 0.1,
                               "optimizer.l1": L1, **settings})
    state = build_shard(config, KEYS, KeyLayout.single(len(KEYS)))
    state.init(KEYS, np.zeros(len(KEYS), dtype=np.float32))
    return state


def train(state: ShardState, *, kkt: bool) -> np.ndarray:
    for clock, grads in enumerate(ROUNDS):
        weights = state.params.copy()  # what both workers pulled
        for worker, grad in enumerate(grads):
            keep = kkt_mask(weights, grad, L1) if kkt else np.ones(len(grad), bool)
            index = np.flatnonzero(keep).astype(np.uint32)
            state.push(worker, clock, KEYS, grad[keep], index=index)
    return state.params.copy()


@pytest.mark.parametrize("aggregation", ["sum", "mean"])
def test_exact_for_pushes_applied_alone_by_proximal_sgd(aggregation: str) -> None:
    settings = {"sync.model": "asp", "sync.push_scale": aggregation}
    filtered = train(shard(**settings), kkt=True)
    np.testing.assert_array_equal(filtered, train(shard(**settings), kkt=False))
    assert (filtered != 0).any()  # the runs did move some weights


@pytest.mark.parametrize("settings", [
    {"sync.model": "bsp"},  # a round's mean mixes what one worker left out with the others
    {"sync.model": "asp", "optimizer.name": "adagrad"},  # its sum of squares misses them
], ids=["bsp-mean", "asp-adagrad"])
def test_not_exact_under_bsp_or_adagrad(settings: dict[str, Any]) -> None:
    assert not np.array_equal(train(shard(**settings), kkt=True),
                              train(shard(**settings), kkt=False))
