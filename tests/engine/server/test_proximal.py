"""The L1 proximal step: lazy shrinking of keys nobody pushed equals shrinking every key at every
step, for SGD and Adagrad, under a schedule's factors and the mean rule's share."""

from __future__ import annotations

import numpy as np
import pytest

from engine.config import OptimizerConfig
from engine.errors import ConfigError
from engine.plan import parse_config
from engine.server.optimizers import Proximal, make_optimizer
from engine.server.update import Update

SIZE = 40


def eager(name: str, steps: list[tuple[np.ndarray, np.ndarray, float]], lr: float, l1: float,
          share: float) -> np.ndarray:
    """Every key shrunk at every step (a key not pushed has gradient 0)."""
    params = np.linspace(-1, 1, SIZE).astype(np.float32)
    acc = np.zeros(SIZE, dtype=np.float32)
    for index, grad, scale in steps:
        full = np.zeros(SIZE, dtype=np.float32)
        full[index] = grad
        if name == "adagrad":
            acc += full * full
        rate = np.float32(lr * scale)
        if name == "adagrad":
            rate = rate / (np.sqrt(acc) + np.float32(1e-10))
        moved = params - rate * full
        params = np.sign(moved) * np.maximum(np.abs(moved) - rate * np.float32(l1 * share), 0)
    return params


@pytest.mark.parametrize("name", ["sgd", "adagrad"])
@pytest.mark.parametrize("share", [1.0, 0.25])
def test_lazy_shrinking_equals_shrinking_every_key_every_step(name: str, share: float) -> None:
    rng = np.random.default_rng(5)
    steps = []
    for step in range(60):
        index = np.sort(rng.choice(SIZE, size=rng.integers(1, 6), replace=False))
        steps.append((index, rng.normal(0, 0.5, len(index)).astype(np.float32),
                      0.5 * (1 + np.cos(np.pi * step / 60))))
    optimizer = make_optimizer(OptimizerConfig(name=name, lr=0.2, momentum=0, l1=0.05), SIZE)
    assert isinstance(optimizer, Proximal)
    optimizer.share = share
    params = np.linspace(-1, 1, SIZE).astype(np.float32)
    for index, grad, scale in steps:
        optimizer.apply(params, Update(slice(0, SIZE), grad * np.float32(share), index), scale)
    optimizer.bring_current(params, slice(0, SIZE), None)
    expected = eager(name, [(i, g * np.float32(share), s) for i, g, s in steps], 0.2, 0.05,
                     share)
    np.testing.assert_allclose(params, expected, rtol=1e-4, atol=1e-6)
    assert np.count_nonzero(params) < SIZE  # the penalty made weights exactly zero


def test_a_dense_update_shrinks_every_key_once() -> None:
    optimizer = make_optimizer(OptimizerConfig(name="sgd", lr=0.5, momentum=0, l1=0.1), 4)
    params = np.array([1.0, -1.0, 0.02, 0.0], dtype=np.float32)
    optimizer.apply(params, Update(slice(0, 4), np.zeros(4, np.float32)))
    np.testing.assert_allclose(params, [0.95, -0.95, 0.0, 0.0])
    assert len(optimizer.slots()) == 1  # the settled sums (sgd without momentum has none)


@pytest.mark.parametrize(("settings", "says"), [
    ({"name": "sgd", "l1": 0.1}, "with momentum 0.9 \\(add --momentum 0\\)"),
    ({"name": "adam", "l1": 0.1}, "not for adam"),
])
def test_l1_is_refused_where_it_is_no_proximal_step(settings: dict[str, object],
                                                     says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        parse_config({"optimizer": settings})


def test_a_shard_settles_the_penalty_on_reads_and_a_mean_push_carries_its_share() -> None:
    from engine.consistency.base import ASP
    from engine.keys import KeyRange
    from engine.server.shard import ShardState

    keys = KeyRange(10, 14)
    optimizer = make_optimizer(OptimizerConfig(name="sgd", lr=1.0, momentum=0, l1=0.1), 4)
    state = ShardState(keys, ASP(2), optimizer, workers=2)
    assert state.init(keys, np.array([1.0, -1.0, 1.0, 0.5], dtype=np.float32))
    # Two workers under the mean rule: each push is half a step, of gradient and of penalty.
    for worker in (0, 1):
        state.push(worker, 0, keys, np.array([0.2], dtype=np.float32),
                   index=np.array([10], dtype=np.uint32))
    # Key 10 took two half steps: 1 - 2 * (0.1 + 0.05) = 0.7. Keys 11-13 owe two half steps of
    # penalty, 0.1 in all, settled by the read itself.
    np.testing.assert_allclose(state.read(keys), [0.7, -0.9, 0.9, 0.4], rtol=1e-6)
    np.testing.assert_allclose(state.params, [0.7, -0.9, 0.9, 0.4], rtol=1e-6)
    np.testing.assert_allclose(state.read(keys), [0.7, -0.9, 0.9, 0.4], rtol=1e-6)  # paid once
