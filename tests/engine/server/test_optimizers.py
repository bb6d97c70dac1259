"""The server optimizers against torch.optim (SGD, Adagrad, Adam, RMSprop): dense and sparse
updates, the learning-rate scale, state kept in slots() (so that a shard can roll an update back),
and the optimizer factory and its default learning rates."""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest
import torch

from engine.config import OptimizerConfig
from engine.consistency.base import ASP
from engine.errors import ConfigError, UnsafeUpdate
from engine.keys import KeyRange
from engine.plan import parse_config
from engine.policies.optimizers import SERVER_OPTIMIZERS, ServerOptimizer, default_lr
from engine.server.optimizers import (
    SGD,
    Adagrad,
    Adam,
    RMSprop,
    make_optimizer,
)
from engine.server.shard import ShardState
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
                                 weight_decay=weight_decay, fused=False) for _ in range(2))
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
    config = OptimizerConfig.model_construct(name="lamb", lr=0.1)
    with pytest.raises(ConfigError, match=r"^unknown server optimizer 'lamb' "
                                          r"\(known: sgd, adagrad, adam, rmsprop, lbfgs\)$"):
        make_optimizer(config, 3)


# Adagrad, Adam and RMSprop (and SGD with momentum again) against torch.optim, through the
# interface the shard uses: apply(params, update, scale) and slots().

Built = SGD | Adagrad | Adam | RMSprop
Ours = Callable[[int, float, float], Built]  # (shard size, lr, weight decay)
Theirs = Callable[[torch.nn.Parameter, float, float], torch.optim.Optimizer]

OPTIMIZERS: dict[str, tuple[Ours, Theirs, float]] = {  # name: (ours, torch's, a test lr)
    "sgd": (lambda size, lr, wd: SGD(size, lr=lr, momentum=0.9, weight_decay=wd),
            lambda p, lr, wd: torch.optim.SGD([p], lr=lr, momentum=0.9, weight_decay=wd),
            0.05),
    "adagrad": (lambda size, lr, wd: Adagrad(size, lr=lr, weight_decay=wd),
                lambda p, lr, wd: torch.optim.Adagrad([p], lr=lr, weight_decay=wd), 0.1),
    "adam": (lambda size, lr, wd: Adam(size, lr=lr, weight_decay=wd),
             lambda p, lr, wd: torch.optim.Adam([p], lr=lr, weight_decay=wd), 0.01),
    "rmsprop": (lambda size, lr, wd: RMSprop(size, lr=lr, weight_decay=wd),
                lambda p, lr, wd: torch.optim.RMSprop([p], lr=lr, weight_decay=wd), 0.01),
}
NAMES = list(OPTIMIZERS)
DECAYS = [0.0, 0.01]
CLOSE = {"rtol": 1e-5, "atol": 1e-6}  # float32 rounding a few steps deep


def build(name: str, size: int = SIZE, weight_decay: float = 0.0) -> Built:
    ours, _, lr = OPTIMIZERS[name]
    return ours(size, lr, weight_decay)


def torch_run(name: str, start: np.ndarray, grads: Sequence[np.ndarray], *,
              weight_decay: float = 0.0, scales: Sequence[float] | None = None) -> np.ndarray:
    """torch.optim's parameters after ``grads``, with the lr times ``scales[i]`` at step i."""
    _, theirs, lr = OPTIMIZERS[name]
    param = torch.nn.Parameter(torch.from_numpy(start.copy()))
    optimizer = theirs(param, lr, weight_decay)
    for step, grad in enumerate(grads):
        optimizer.param_groups[0]["lr"] = lr * (1.0 if scales is None else scales[step])
        param.grad = torch.from_numpy(np.array(grad, dtype=np.float32))
        optimizer.step()
    result: np.ndarray = param.detach().numpy().copy()
    return result


def random_update(rng: np.random.Generator, kind: str, size: int = SIZE,
                  first: int = 0) -> Update:
    """A dense update of the whole shard or of a random span, or a sparse one of random keys,
    touching keys from ``first`` on only."""
    if kind == "dense":
        return Update(slice(0, size), rng.standard_normal(size).astype(np.float32))
    if kind == "span":
        start, stop = sorted(int(k) for k in rng.choice(np.arange(first, size + 1), 2,
                                                        replace=False))
        return Update(slice(start, stop), rng.standard_normal(stop - start).astype(np.float32))
    count = int(rng.integers(1, size - first))
    index = np.sort(rng.choice(np.arange(first, size), count, replace=False)).astype(np.int64)
    return Update(slice(0, size), rng.standard_normal(count).astype(np.float32), index)


def touched(update: Update) -> np.ndarray:
    if update.index is not None:
        return update.index
    return np.arange(update.span.start, update.span.stop)


def state_bytes(params: np.ndarray, optimizer: ServerOptimizer) -> list[bytes]:
    return [params.tobytes(), *(slot.tobytes() for slot in optimizer.slots())]


@pytest.mark.parametrize("weight_decay", DECAYS)
@pytest.mark.parametrize("name", NAMES)
def test_dense_updates_match_torch(name: str, weight_decay: float) -> None:
    rng = np.random.default_rng(11)
    start = rng.standard_normal(SIZE).astype(np.float32)
    grads = [rng.standard_normal(SIZE).astype(np.float32) for _ in range(8)]
    params, optimizer = start.copy(), build(name, weight_decay=weight_decay)
    for grad in grads:
        optimizer.apply(params, Update(slice(0, SIZE), grad))
    expected = torch_run(name, start, grads, weight_decay=weight_decay)
    np.testing.assert_allclose(params, expected, **CLOSE)
    assert not np.array_equal(params, start)


@pytest.mark.parametrize("scales", [[0.3] * 6, [1.0, 0.5, 2.0, 0.1, 1.0, 0.25]],
                         ids=["constant", "per-step"])
@pytest.mark.parametrize("name", NAMES)
def test_scale_multiplies_the_learning_rate_of_its_update(name: str,
                                                          scales: list[float]) -> None:
    rng = np.random.default_rng(3)
    start = rng.standard_normal(SIZE).astype(np.float32)
    grads = [rng.standard_normal(SIZE).astype(np.float32) for _ in scales]
    params, optimizer = start.copy(), build(name, weight_decay=0.01)
    for grad, scale in zip(grads, scales, strict=True):
        optimizer.apply(params, Update(slice(0, SIZE), grad), scale)
    expected = torch_run(name, start, grads, weight_decay=0.01, scales=scales)
    np.testing.assert_allclose(params, expected, **CLOSE)
    unscaled = torch_run(name, start, grads, weight_decay=0.01)
    assert np.abs(params - unscaled).max() > 1e-3  # the scale did change the result


@pytest.mark.parametrize("weight_decay", DECAYS)
@pytest.mark.parametrize("kinds", [("sparse",), ("span",), ("sparse", "span", "dense")],
                         ids=["sparse", "spans", "mixed"])
@pytest.mark.parametrize("name", NAMES)
def test_each_key_follows_torch_on_its_own_gradient_subsequence(
    name: str, kinds: tuple[str, ...], weight_decay: float
) -> None:
    # Per-key state: a key moves only when pushed, by what torch would do with the gradients
    # (and scales) of its own pushes alone. Key 0 is never pushed (except by "dense").
    size, rng = 40, np.random.default_rng(5)
    start = rng.standard_normal(size).astype(np.float32)
    params, optimizer = start.copy(), build(name, size, weight_decay)
    pushes: list[tuple[np.ndarray, np.ndarray, float]] = []
    for step in range(12):
        kind = kinds[step % len(kinds)]
        update = random_update(rng, kind, size, first=0 if kind == "dense" else 1)
        scale = float(rng.uniform(0.25, 2.0))
        optimizer.apply(params, update, scale)
        pushes.append((touched(update), update.values, scale))
    counts = np.zeros(size, dtype=np.int64)
    for key in range(size):
        mine = [(values[np.searchsorted(keys, key)], scale)
                for keys, values, scale in pushes if key in keys]
        counts[key] = len(mine)
        expected = torch_run(name, start[key:key + 1], [f32(grad) for grad, _ in mine],
                             weight_decay=weight_decay, scales=[scale for _, scale in mine])
        np.testing.assert_allclose(params[key:key + 1], expected, **CLOSE, err_msg=f"key {key}")
    assert len(set(counts.tolist())) > 2  # keys did see different numbers of steps
    if "dense" not in kinds:
        assert counts[0] == 0 and params[0] == start[0]
        assert all(slot[0] == 0 for slot in optimizer.slots())


@pytest.mark.parametrize("kind", ["dense", "span", "sparse"])
@pytest.mark.parametrize("name", NAMES)
def test_putting_params_and_slots_back_undoes_an_update(name: str, kind: str) -> None:
    # What the shard's rollback does: if slots() left out some state (Adam's step counts, say),
    # the next update would differ from one made as if the undone update never happened.
    rng = np.random.default_rng(21)
    optimizer, params = build(name, weight_decay=0.01), rng.standard_normal(SIZE)
    params = params.astype(np.float32)
    for history in ("dense", "sparse", "span"):
        optimizer.apply(params, random_update(rng, history, first=1))
    twin, twin_params = copy.deepcopy(optimizer), params.copy()
    optimizer.apply(params, random_update(rng, kind), 2.0)
    before = state_bytes(twin_params, twin)
    assert all(now != then for now, then in zip(state_bytes(params, optimizer), before,
                                                strict=True))  # every array moved
    for array, saved in zip((params, *optimizer.slots()), (twin_params, *twin.slots()),
                            strict=True):
        np.copyto(array, saved)
    assert state_bytes(params, optimizer) == before
    after = random_update(rng, kind)
    optimizer.apply(params, after)
    twin.apply(twin_params, after)
    assert state_bytes(params, optimizer) == state_bytes(twin_params, twin)


@pytest.mark.parametrize("name", NAMES)
def test_arrays_outside_slots_are_scratch(name: str) -> None:
    # Any other array an optimizer holds is written before it is read on every update: filled
    # with NaN it changes nothing, so slots() is all the state a rollback has to restore.
    rng = np.random.default_rng(8)
    optimizer, params = build(name, weight_decay=0.01), rng.standard_normal(SIZE)
    params = params.astype(np.float32)
    optimizer.apply(params, random_update(rng, "dense"))
    twin, twin_params = copy.deepcopy(optimizer), params.copy()
    slots = {id(slot) for slot in optimizer.slots()}
    others = [value for value in vars(optimizer).values()
              if isinstance(value, np.ndarray) and id(value) not in slots]
    for other in others:
        other.fill(np.nan)
    for kind in ("dense", "span", "sparse", "dense"):
        update = random_update(rng, kind)
        optimizer.apply(params, update, 0.5)
        twin.apply(twin_params, update, 0.5)
    assert state_bytes(params, optimizer) == state_bytes(twin_params, twin)
    assert np.isfinite(params).all()


SHARD = KeyRange(10, 14)


def fingerprint(state: ShardState) -> list[bytes]:
    return state_bytes(state.params, state.optimizer)


@pytest.mark.parametrize("name", NAMES)
def test_the_shard_rolls_back_params_and_slots_of_a_non_finite_update(name: str) -> None:
    optimizer, twin = build(name, len(SHARD)), build(name, len(SHARD))
    states = [ShardState(SHARD, ASP(1), opt, workers=1) for opt in (optimizer, twin)]
    for state in states:
        assert state.init(SHARD, f32(-3e38, 1.0, 2.0, 3.0))
        state.push(0, 0, SHARD, f32(1.0, 1.0, -1.0, 0.5))
    state = states[0]
    optimizer.lr = np.float32(1e38)  # the next step moves key 10 by about 1e38: past -3.4e38
    before = fingerprint(state)
    with pytest.raises(UnsafeUpdate, match="non-finite"):
        state.push(0, 1, SHARD, f32(1.0, 1.0, -1.0, 0.5))
    assert fingerprint(state) == before
    with pytest.raises(UnsafeUpdate, match="non-finite"):
        state.push(0, 1, SHARD, f32(1.0, -1.0), index=np.array([10, 12], dtype=np.uint32))
    assert fingerprint(state) == before
    # and it goes on exactly as a shard that never saw the refused pushes
    optimizer.lr = twin.lr
    for each in states:
        each.push(0, 1, SHARD, f32(0.5, -0.25, 1.0, 2.0))
    assert fingerprint(state) == fingerprint(states[1])


def test_the_shard_rolls_back_an_adagrad_sum_that_would_overflow() -> None:
    # The parameters stay finite (the step is g / sqrt(inf) = 0); only the slot overflows.
    state = ShardState(SHARD, ASP(1), Adagrad(len(SHARD), lr=0.01), workers=1)
    assert state.init(SHARD, f32(1.0, 2.0, 3.0, 4.0))
    state.push(0, 0, SHARD, f32(1.5e19, 0.0, 0.0, 0.0))  # sum 2.25e38: still a float32
    before = fingerprint(state)
    with pytest.raises(UnsafeUpdate, match="non-finite"):
        state.push(0, 1, SHARD, f32(1.5e19, 0.0, 0.0, 0.0))  # 4.5e38 is not
    assert fingerprint(state) == before


@pytest.mark.parametrize("weight_decay", DECAYS)
@pytest.mark.parametrize("name", NAMES)
def test_apply_leaves_a_read_only_gradient_alone(name: str, weight_decay: float) -> None:
    values = np.frombuffer(f32(1.0, -2.0, 3.0, 4.0).tobytes(), dtype=np.float32)
    assert not values.flags.writeable
    params, optimizer = np.ones(6, dtype=np.float32), build(name, 6, weight_decay)
    optimizer.apply(params, Update(slice(1, 5), values))
    optimizer.apply(params, Update(slice(0, 6), values, np.array([0, 2, 3, 5])))
    assert values.tolist() == [1.0, -2.0, 3.0, 4.0]
    assert params[1] < 1.0 < params[2]


@pytest.mark.parametrize(("name", "settings"), [
    ("adagrad", {}),
    ("adagrad", {"eps": 1e-3}),
    ("adam", {}),
    ("adam", {"betas": (0.8, 0.95), "eps": 1e-3}),
    ("rmsprop", {}),
    ("rmsprop", {"alpha": 0.9, "eps": 1e-3}),
])
def test_make_optimizer_passes_the_settings_on(name: str, settings: dict[str, Any]) -> None:
    # momentum is SGD's: RMSprop ignores it (torch.optim.RMSprop here runs with momentum 0)
    config = OptimizerConfig(name=name, lr=0.05, weight_decay=0.01, momentum=0.5, **settings)
    optimizer = make_optimizer(config, SIZE)
    assert type(optimizer).__name__.lower() == name
    rng = np.random.default_rng(2)
    start = rng.standard_normal(SIZE).astype(np.float32)
    grads = [rng.standard_normal(SIZE).astype(np.float32) * 1e-3 for _ in range(5)]
    params = start.copy()
    for grad in grads:
        optimizer.apply(params, Update(slice(0, SIZE), grad))
    param = torch.nn.Parameter(torch.from_numpy(start.copy()))
    optimizer_class = {"adagrad": torch.optim.Adagrad, "adam": torch.optim.Adam,
                       "rmsprop": torch.optim.RMSprop}[name]
    theirs = optimizer_class([param], lr=0.05, weight_decay=0.01, **settings)
    for grad in grads:
        param.grad = torch.from_numpy(grad.copy())
        theirs.step()
    np.testing.assert_allclose(params, param.detach().numpy(), **CLOSE)


@pytest.mark.parametrize(("name", "eps"), [("adagrad", 1e-10), ("adam", 1e-8), ("rmsprop", 1e-8)])
def test_eps_defaults_to_torchs(name: str, eps: float) -> None:
    optimizer = make_optimizer(OptimizerConfig(name=name), 3)
    assert isinstance(optimizer, Adagrad | Adam | RMSprop)
    assert optimizer.eps == np.float32(eps)
    given = make_optimizer(OptimizerConfig(name=name, eps=1e-4), 3)
    assert isinstance(given, Adagrad | Adam | RMSprop)
    assert given.eps == np.float32(1e-4)


def test_each_optimizer_has_its_own_default_learning_rate() -> None:
    defaults = {name: default_lr(name) for name in SERVER_OPTIMIZERS.names()}
    assert defaults == {"sgd": 0.1, "adagrad": 0.005, "adam": 0.001, "rmsprop": 0.0005,
                        "lbfgs": 1.0}
    adam = parse_config({"optimizer": {"name": "adam"}}).optimizer
    assert adam.lr == default_lr("adam") == 0.001
    # the schema alone knows no optimizer: engine.plan, which composes every run, fills it in
    assert OptimizerConfig(name="adam").lr == 0.1


@pytest.mark.parametrize("name", NAMES)
def test_an_explicit_lr_wins_over_the_default(name: str) -> None:
    assert parse_config({"optimizer": {"name": name}}).optimizer.lr == default_lr(name)
    assert parse_config({"optimizer": {"name": name, "lr": 0.0625}}).optimizer.lr == 0.0625
    assert parse_config({"optimizer": {"name": name, "lr": None}}).optimizer.lr == \
        default_lr(name)


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_fused_sgd_matches_the_numpy_reference(momentum: float) -> None:
    rng = np.random.default_rng(5)
    start = rng.standard_normal(SIZE).astype(np.float32)
    fused, plain = (SGD(SIZE, lr=0.05, momentum=momentum, fused=f) for f in (True, False))
    assert fused.fused and not plain.fused
    ours, reference = start.copy(), start.copy()
    for step in range(20):
        grad = rng.standard_normal(SIZE).astype(np.float32)
        span = slice(0, SIZE) if step % 2 else slice(10, 200)  # whole shard and a layer
        for sgd, params in ((fused, ours), (plain, reference)):
            sgd.apply(params, Update(span, grad[span]), scale=0.5 + step / 20)
    np.testing.assert_allclose(ours, reference, rtol=1e-5, atol=1e-6)
    assert not np.array_equal(ours[:10], start[:10]) and np.array_equal(ours[200:], ours[200:])


@pytest.mark.parametrize(("momentum", "nesterov", "weight_decay"), CONFIGS)
def test_sgd_step_bound_bounds_every_value_it_changes(
    momentum: float, nesterov: bool, weight_decay: float
) -> None:
    rng = np.random.default_rng(9)
    sgd = SGD(SIZE, lr=3.0, momentum=momentum, nesterov=nesterov, weight_decay=weight_decay)
    params = (rng.standard_normal(SIZE) * 50).astype(np.float32)
    for _ in range(15):
        grad = (rng.standard_normal(SIZE) * rng.uniform(0.1, 100)).astype(np.float32)
        update = Update(slice(0, SIZE), grad)
        bound = sgd.step_bound(params, update, scale=2.0)
        sgd.apply(params, update, scale=2.0)
        largest = max(float(np.abs(array).max()) for array in (params, *sgd.slots()))
        assert largest <= bound
        assert largest > bound / (10 * SIZE)  # a bound, but not a vacuous one


def test_sgd_step_bound_is_not_finite_when_a_value_is_not() -> None:
    sgd = SGD(4, lr=0.1, momentum=0.9)
    update = Update(slice(0, 4), np.ones(4, dtype=np.float32))
    for bad in (np.nan, np.inf):
        params = np.array([1, bad, 0, 0], dtype=np.float32)
        assert not np.isfinite(sgd.step_bound(params, update, 1.0))
    sgd.slots()[0][2] = np.nan
    assert np.isnan(sgd.step_bound(np.zeros(4, dtype=np.float32), update, 1.0))


def test_a_bounded_dense_sgd_step_runs_without_the_rollback_copies(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    state = ShardState(KeyRange(0, SIZE), ASP(1), SGD(SIZE, lr=0.1, momentum=0.9))
    state.init(KeyRange(0, SIZE), np.ones(SIZE, dtype=np.float32))

    def copied(*args: Any) -> None:
        raise AssertionError("a bounded step took the checked path")

    monkeypatch.setattr(state, "_apply_checked", copied)
    state.push(0, 0, KeyRange(0, SIZE), np.full(SIZE, 2.0, dtype=np.float32))
    np.testing.assert_allclose(state.params, 1 - 0.1 * 2.0)
    assert state.version == 1
    near = ShardState(KeyRange(0, SIZE), ASP(1), SGD(SIZE, lr=1e20, momentum=0.9))
    near.init(KeyRange(0, SIZE), np.ones(SIZE, dtype=np.float32))
    monkeypatch.setattr(near, "_apply_checked", copied)
    with pytest.raises(AssertionError, match="checked path"):  # 1e20 * 1.6e19: no bound
        near.push(0, 0, KeyRange(0, SIZE), np.full(SIZE, 1e18, dtype=np.float32))
