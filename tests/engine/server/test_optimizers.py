"""The server SGD against torch.optim.SGD, dense and sparse updates, and the optimizer factory."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.config import OptimizerConfig
from engine.errors import ConfigError
from engine.server.optimizers import SGD, make_optimizer
from engine.server.update import Update

SIZE = 257
CONFIGS = [
    (0.0, False, 0.0),
    (0.0, False, 0.01),
    (0.9, False, 0.0),
    (0.9, True, 0.0),
    (0.5, False, 0.05),
    (0.9, True, 1e-3),
]


def run_both(
    *, lr: float, momentum: float, nesterov: bool, weight_decay: float, steps: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    start = rng.standard_normal(SIZE).astype(np.float32)
    grads = [rng.standard_normal(SIZE).astype(np.float32) for _ in range(steps)]

    ours = start.copy()
    sgd = SGD(SIZE, lr=lr, momentum=momentum, nesterov=nesterov, weight_decay=weight_decay)
    for grad in grads:
        sgd.step(ours, grad)

    theirs = torch.nn.Parameter(torch.from_numpy(start.copy()))
    optimizer = torch.optim.SGD(
        [theirs], lr=lr, momentum=momentum, nesterov=nesterov, weight_decay=weight_decay
    )
    for grad in grads:
        theirs.grad = torch.from_numpy(grad.copy())
        optimizer.step()
    return ours, theirs.detach().numpy()


@pytest.mark.parametrize(("momentum", "nesterov", "weight_decay"), CONFIGS)
def test_sgd_matches_torch(momentum: float, nesterov: bool, weight_decay: float) -> None:
    ours, theirs = run_both(
        lr=0.05, momentum=momentum, nesterov=nesterov, weight_decay=weight_decay, steps=7, seed=1
    )
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)


def test_plain_sgd_is_exactly_params_minus_lr_grad() -> None:
    params = np.array([1.0, 2.0, -3.0], dtype=np.float32)
    SGD(3, lr=0.5).step(params, np.array([2.0, -4.0, 1.0], dtype=np.float32))
    assert params.tolist() == [0.0, 4.0, -3.5]


def test_momentum_seeds_the_buffer_with_the_first_gradient() -> None:
    params = np.zeros(2, dtype=np.float32)
    sgd = SGD(2, lr=1.0, momentum=0.5)
    grad = np.array([1.0, 2.0], dtype=np.float32)
    sgd.step(params, grad)
    assert params.tolist() == [-1.0, -2.0]  # buf = g (not (1 - dampening) g or m * 0 + g)
    sgd.step(params, grad)
    assert params.tolist() == [-2.5, -5.0]  # buf = 0.5 * g + g


def test_step_updates_in_place_and_leaves_the_gradient_alone() -> None:
    params = np.ones(4, dtype=np.float32)
    grad = np.full(4, 2.0, dtype=np.float32)
    before = id(params)
    SGD(4, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.1).step(params, grad)
    assert id(params) == before
    assert grad.tolist() == [2.0] * 4


@pytest.mark.parametrize(
    ("momentum", "nesterov", "weight_decay"),
    [(0.0, False, 0.0), (0.9, False, 0.0), (0.9, True, 0.01), (0.0, False, 0.01)],
)
def test_step_accepts_a_read_only_gradient(
    momentum: float, nesterov: bool, weight_decay: float
) -> None:
    # A decoded PUSH payload is a read-only view of the received bytes.
    grad = np.frombuffer(np.arange(4, dtype=np.float32).tobytes(), dtype=np.float32)
    assert not grad.flags.writeable
    params = np.zeros(4, dtype=np.float32)
    sgd = SGD(4, lr=1.0, momentum=momentum, nesterov=nesterov, weight_decay=weight_decay)
    sgd.step(params, grad)
    sgd.step(params, grad)
    assert grad.tolist() == [0.0, 1.0, 2.0, 3.0]
    expected = np.zeros(4, dtype=np.float32)
    twin = SGD(4, lr=1.0, momentum=momentum, nesterov=nesterov, weight_decay=weight_decay)
    twin.step(expected, grad.copy())
    twin.step(expected, grad.copy())
    np.testing.assert_array_equal(params, expected)
    assert params[0] == 0.0 and params[3] < -5.0


def test_nesterov_without_momentum_is_refused() -> None:
    with pytest.raises(ConfigError, match="^nesterov momentum needs momentum > 0$"):
        SGD(3, lr=0.1, nesterov=True)




def f32(*values: float) -> np.ndarray:
    return np.array(values, dtype=np.float32)


def test_a_dense_update_over_a_span_moves_only_that_span_and_its_momentum() -> None:
    params = f32(1.0, 2.0, 3.0, 4.0, 5.0)
    sgd = SGD(5, lr=1.0, momentum=0.5)
    sgd.apply(params, Update(slice(1, 3), f32(2.0, 4.0), None, range(0, 1)))
    assert params.tolist() == [1.0, 0.0, -1.0, 4.0, 5.0]
    sgd.apply(params, Update(slice(1, 3), f32(0.0, 0.0), None, range(0, 1)))
    assert params.tolist() == [1.0, -1.0, -3.0, 4.0, 5.0]  # buf 0.5 * g on the span
    sgd.step(params, np.zeros(5, dtype=np.float32))
    assert params.tolist() == [1.0, -1.5, -4.0, 4.0, 5.0]  # no momentum outside the span


def test_a_sparse_update_moves_only_the_indexed_keys_and_their_momentum() -> None:
    params = f32(1.0, 2.0, 3.0, 4.0, 5.0, 6.0)
    sgd = SGD(6, lr=0.5, momentum=0.5)
    update = Update(slice(0, 6), f32(2.0, 4.0), np.array([1, 4], dtype=np.int64), range(0, 2))
    sgd.apply(params, update)
    assert params.tolist() == [1.0, 1.0, 3.0, 4.0, 3.0, 6.0]
    # a zero gradient everywhere: only keys 1 and 4 carry momentum (buf 0.5 * g)
    sgd.step(params, np.zeros(6, dtype=np.float32))
    assert params.tolist() == [1.0, 0.5, 3.0, 4.0, 2.0, 6.0]
    # a sparse update of other keys leaves the momentum of keys 1 and 4 where it was
    sgd.apply(params, Update(slice(2, 4), f32(2.0), np.array([3], dtype=np.int64), range(1, 2)))
    assert params.tolist() == [1.0, 0.5, 3.0, 3.0, 2.0, 6.0]
    sgd.step(params, np.zeros(6, dtype=np.float32))
    assert params.tolist() == [1.0, 0.25, 3.0, 2.5, 1.5, 6.0]  # bufs 0.5, 1, 1


def test_a_sparse_update_with_weight_decay_decays_only_its_keys() -> None:
    params = f32(2.0, 4.0, 8.0)
    SGD(3, lr=0.5, weight_decay=0.5).apply(
        params, Update(slice(0, 3), f32(1.0), np.array([2], dtype=np.int64), range(0, 1)))
    assert params.tolist() == [2.0, 4.0, 5.5]  # 8 - 0.5 * (1 + 0.5 * 8)


@pytest.mark.parametrize(("momentum", "nesterov", "weight_decay"), CONFIGS)
def test_sparse_apply_equals_a_dense_step_restricted_to_its_keys(
    momentum: float, nesterov: bool, weight_decay: float
) -> None:
    rng = np.random.default_rng(7)
    start = rng.standard_normal(SIZE).astype(np.float32)
    index = np.sort(rng.choice(SIZE, size=40, replace=False)).astype(np.int64)
    others = np.setdiff1d(np.arange(SIZE), index)
    sparse, dense = start.copy(), start.copy()
    sparse_sgd, dense_sgd = (SGD(SIZE, lr=0.05, momentum=momentum, nesterov=nesterov,
                                 weight_decay=weight_decay) for _ in range(2))
    theirs = torch.nn.Parameter(torch.from_numpy(start.copy()))
    optimizer = torch.optim.SGD([theirs], lr=0.05, momentum=momentum, nesterov=nesterov,
                                weight_decay=weight_decay)
    for _ in range(5):
        values = rng.standard_normal(len(index)).astype(np.float32)
        sparse_sgd.apply(sparse, Update(slice(0, SIZE), values, index, range(0, 1)))
        full = np.zeros(SIZE, dtype=np.float32)
        full[index] = values
        dense_sgd.step(dense, full)
        theirs.grad = torch.from_numpy(full.copy())
        optimizer.step()
    np.testing.assert_array_equal(sparse[index], dense[index])
    np.testing.assert_allclose(sparse[index], theirs.detach().numpy()[index], rtol=1e-5,
                               atol=1e-6)
    assert sparse[others].tolist() == start[others].tolist()  # never touched
    assert not np.array_equal(sparse[index], start[index])
    if weight_decay == 0:  # zero gradients and fresh momentum leave the other keys alone too
        np.testing.assert_array_equal(sparse, dense)


@pytest.mark.parametrize(("momentum", "nesterov", "weight_decay"), CONFIGS)
def test_sparse_apply_accepts_a_read_only_gradient(
    momentum: float, nesterov: bool, weight_decay: float
) -> None:
    values = np.frombuffer(f32(1.0, 2.0).tobytes(), dtype=np.float32)
    assert not values.flags.writeable
    params = np.ones(4, dtype=np.float32)
    sgd = SGD(4, lr=1.0, momentum=momentum, nesterov=nesterov, weight_decay=weight_decay)
    update = Update(slice(0, 4), values, np.array([0, 3], dtype=np.int64), range(0, 1))
    sgd.apply(params, update)
    sgd.apply(params, update)
    assert values.tolist() == [1.0, 2.0]
    assert params[1:3].tolist() == [1.0, 1.0] and params[0] < 0.0 and params[3] < -1.0


def test_make_optimizer_builds_sgd_from_the_config() -> None:
    config = OptimizerConfig(lr=0.25, momentum=0.5, nesterov=True, weight_decay=0.125)
    optimizer = make_optimizer(config, 5)
    assert isinstance(optimizer, SGD)
    settings = (float(optimizer.lr), float(optimizer.momentum), optimizer.nesterov,
                float(optimizer.weight_decay))
    assert settings == (0.25, 0.5, True, 0.125)
    params = np.zeros(5, dtype=np.float32)
    optimizer.step(params, np.ones(5, dtype=np.float32))
    expected = -(0.25 * (1.0 + 0.5 * 1.0))  # nesterov: g + m * buf, buf = g
    np.testing.assert_allclose(params, np.full(5, expected), rtol=1e-7)


def test_make_optimizer_refuses_an_unknown_name() -> None:
    config = OptimizerConfig.model_construct(name="adam", lr=0.1)
    with pytest.raises(ConfigError, match=r"^unknown server optimizer 'adam' \(known: sgd\)$"):
        make_optimizer(config, 3)
