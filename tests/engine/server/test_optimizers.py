"""The server SGD against torch.optim.SGD, and the optimizer factory."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.config import OptimizerConfig
from engine.errors import ConfigError
from engine.server.optimizers import SGD, make_optimizer

SIZE = 257


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


@pytest.mark.parametrize(
    ("momentum", "nesterov", "weight_decay"),
    [
        (0.0, False, 0.0),
        (0.0, False, 0.01),
        (0.9, False, 0.0),
        (0.9, True, 0.0),
        (0.5, False, 0.05),
        (0.9, True, 1e-3),
    ],
)
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


def test_make_optimizer_builds_sgd_from_the_config() -> None:
    config = OptimizerConfig(lr=0.25, momentum=0.5, nesterov=True, weight_decay=0.125)
    optimizer = make_optimizer(config, 5)
    assert isinstance(optimizer, SGD)
    assert (optimizer.lr, optimizer.momentum, optimizer.nesterov, optimizer.weight_decay) == (
        0.25,
        0.5,
        True,
        0.125,
    )
    params = np.zeros(5, dtype=np.float32)
    optimizer.step(params, np.ones(5, dtype=np.float32))
    expected = -(0.25 * (1.0 + 0.5 * 1.0))  # nesterov: g + m * buf, buf = g
    np.testing.assert_allclose(params, np.full(5, expected), rtol=1e-7)


def test_make_optimizer_refuses_an_unknown_name() -> None:
    config = OptimizerConfig.model_construct(name="adam", lr=0.1)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="^unknown server optimizer 'adam'$"):
        make_optimizer(config, 3)
