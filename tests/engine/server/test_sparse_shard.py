"""Sparse shards (issue 44): a shard whose keys are stored only where pushed holds exactly what a
dense shard of the same keys holds, under every server optimizer, the L1 proximal step and BSP's
round sums; its checkpoints (and live copies) carry exactly the touched keys and their optimizer
state; a key space of 2^40 costs memory only for the keys pushed; what it cannot do is refused
with a clear error and changes nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest

from engine.config import RunConfig
from engine.consistency.registry import make_controller
from engine.errors import BadPayload, ShardFull, StoreError
from engine.keyrows import RowBudget
from engine.keys import KeyLayout, KeyRange, Segment
from engine.roles.copies import build_shard
from engine.server.checkpoint import Snapshot, restore, save
from engine.server.optimizers import make_optimizer
from engine.server.shard import ShardState, SparseKeys
from tests.engine.server.test_checkpoint import OPTIMIZERS as CHECKPOINTED

pytestmark = pytest.mark.timeout(60)

KEYS = KeyRange(1000, 1600)  # a shard that does not start at key 0
# The checkpoint tests' optimizers, and the L1 proximal step over the two that take it.
OPTIMIZERS: dict[str, dict[str, Any]] = {
    **CHECKPOINTED,
    "sgd-l1": {"name": "sgd", "lr": 0.1, "momentum": 0.0, "l1": 0.01},
    "adagrad-l1": {"name": "adagrad", "lr": 0.1, "l1": 0.01},
}


def config(optimizer: str, model: str = "asp", workers: int = 2) -> RunConfig:
    return RunConfig.model_validate({
        "cluster": {"workers": workers, "servers": 1},
        "sync": {"model": model},
        "optimizer": OPTIMIZERS[optimizer],
    })


def layout(sparse: bool) -> KeyLayout:
    return KeyLayout((Segment("w", (2000,), KeyRange(0, 2000), sparse=sparse),))


def pushes(seed: int, count: int, workers: int) -> list[tuple[int, int, np.ndarray, np.ndarray]]:
    """(worker, clock, sorted keys, gradient): each worker's clocks in order, a few keys each."""
    rng = np.random.default_rng(seed)
    out = []
    for clock in range(count):
        for worker in range(workers):
            keys = np.unique(rng.integers(KEYS.start, KEYS.end, size=rng.integers(1, 40)))
            out.append((worker, clock, keys, rng.standard_normal(len(keys)).astype(np.float32)))
    return out


def apply(state: ShardState, plan: list[tuple[int, int, np.ndarray, np.ndarray]]) -> None:
    for worker, clock, keys, grad in plan:
        state.push(worker, clock, KEYS, grad, index=keys)


def everything(state: ShardState) -> np.ndarray:
    return state.read(KEYS, np.arange(KEYS.start, KEYS.end, dtype=np.int64))


def dense_started(cfg: RunConfig) -> ShardState:
    state = build_shard(cfg, KEYS, layout(False))
    state.init(KEYS, np.zeros(len(KEYS), dtype=np.float32))
    return state


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
@pytest.mark.parametrize("model", ["asp", "bsp"])
def test_a_sparse_shard_holds_what_a_dense_one_does(optimizer: str, model: str) -> None:
    cfg = config(optimizer, model)
    dense, sparse = dense_started(cfg), build_shard(cfg, KEYS, layout(True))
    assert sparse.sparse is not None and sparse.initialized
    plan = pushes(1, 30, 2)
    apply(dense, plan)
    apply(sparse, plan)
    np.testing.assert_array_equal(everything(sparse), everything(dense))
    touched = np.unique(np.concatenate([keys for _, _, keys, _ in plan]))
    assert sparse.stored == len(touched) < len(KEYS)
    assert np.array_equal(np.sort(sparse.rows.keys()) + KEYS.start, touched)  # type: ignore[union-attr]
    assert sparse.version == dense.version


@pytest.mark.parametrize("optimizer", ["sgd-l1", "adagrad-l1"])
def test_keys_never_pushed_shrink_from_their_initial_values_as_a_dense_shards_do(
        optimizer: str) -> None:
    # Nonzero starting values (a rule, as an embedding's) under the L1 proximal step: a key
    # nobody pushed has been shrunk by every step so far, stored or not.
    def ruled(sparse: bool) -> KeyLayout:
        return KeyLayout((Segment("w", (2000,), KeyRange(0, 2000), sparse=sparse,
                                  init="normal:0.5"),))

    cfg = config(optimizer)
    dense, sparse = build_shard(cfg, KEYS, ruled(False)), build_shard(cfg, KEYS, ruled(True))
    start = everything(sparse)
    apply(dense, pushes(2, 10, 2)[:5])
    apply(sparse, pushes(2, 10, 2)[:5])
    after = everything(sparse)
    np.testing.assert_array_equal(after, everything(dense))
    unpushed = np.setdiff1d(np.arange(len(KEYS)), np.concatenate(
        [keys - KEYS.start for _, _, keys, _ in pushes(2, 10, 2)[:5]]))
    assert (np.abs(after[unpushed]) <= np.abs(start[unpushed])).all()
    assert (after[unpushed] != start[unpushed]).any()
    # The rest, and read again: the dense shard settled its keys at the first read and again
    # now, the sparse one shrinks an unstored key once by the whole sum (the same in reals,
    # within float32's rounding of the two subtractions).
    apply(dense, pushes(2, 10, 2)[5:])
    apply(sparse, pushes(2, 10, 2)[5:])
    np.testing.assert_allclose(everything(sparse), everything(dense), rtol=1e-6, atol=1e-7)


def test_a_key_never_pushed_reads_its_initial_value_and_is_not_stored() -> None:
    def initial(keys: np.ndarray) -> np.ndarray:
        return (keys % 7).astype(np.float32)

    state = ShardState(KEYS, make_controller("asp", workers=1),
                       make_optimizer(config("sgd-momentum").optimizer, 64), ranges=[KEYS],
                       sparse=SparseKeys(capacity=64, initial=initial))
    keys = np.array([1001, 1500], dtype=np.int64)
    np.testing.assert_array_equal(state.read(KEYS, keys), [1001 % 7, 1500 % 7])
    assert state.stored == 0
    state.push(0, 0, KEYS, np.array([1.0], dtype=np.float32), index=keys[:1])
    # its first step starts from its initial value: 1001 % 7 - lr * 1
    np.testing.assert_allclose(state.read(KEYS, keys), [1001 % 7 - 0.1, 1500 % 7], rtol=1e-6)
    assert state.stored == 1


def test_what_a_sparse_shard_cannot_do_is_refused_and_changes_nothing() -> None:
    state = ShardState(KEYS, make_controller("asp", workers=1),
                       make_optimizer(config("adagrad").optimizer, 4), ranges=[KEYS],
                       sparse=SparseKeys(capacity=4))
    with pytest.raises(BadPayload, match="pulled and pushed by key"):
        state.read(KEYS)
    with pytest.raises(BadPayload, match="pulled and pushed by key"):
        state.push(0, 0, KEYS, np.zeros(len(KEYS), dtype=np.float32))
    with pytest.raises(BadPayload, match="no INIT"):
        state.init(KEYS, np.zeros(len(KEYS), dtype=np.float32))
    state.push(0, 0, KEYS, np.ones(3, dtype=np.float32), index=np.array([1001, 1002, 1003]),
               commit=False)
    before = everything(state)
    with pytest.raises(ShardFull, match="stores 3 keys and can hold 4: 2 more do not fit"):
        state.push(0, 0, KEYS, np.ones(2, dtype=np.float32), index=np.array([1004, 1005]))
    np.testing.assert_array_equal(everything(state), before)
    assert state.stored == 3


@pytest.mark.parametrize(("optimizer", "row_bytes"), [
    ("sgd-momentum", 4 + 4 + 32),  # value, momentum, key map (and its copy while merged)
    ("sgd-l1", 4 + 4 + 32),  # no momentum; the L1 step's lazy catch-up keeps one
    ("adagrad", 4 + 4 + 32),
    ("adam", 4 + 12 + 32),  # two moments and the step count
])
def test_the_process_budget_refuses_a_push_past_it_and_changes_nothing(
        optimizer: str, row_bytes: int) -> None:
    """Issue 57: a sparse shard stored up to 2^28 keys whatever its process's memory. Its
    copies share the process's budget (cluster.server_memory), counted at each shard's bytes
    per stored key."""
    budget = RowBudget(10 * row_bytes)
    cfg = config(optimizer)
    first = build_shard(cfg, KEYS, layout(True), budget)
    other = build_shard(cfg, KEYS, layout(True), budget)  # another copy in the process
    assert first.rows is not None and first.rows.row_bytes == row_bytes
    first.push(0, 0, KEYS, np.ones(6, dtype=np.float32), index=np.arange(1001, 1007))
    before = everything(other)
    with pytest.raises(ShardFull, match="store 6 keys in .* 5 keys more .* do not fit"):
        other.push(0, 0, KEYS, np.ones(5, dtype=np.float32), index=np.arange(1001, 1006))
    np.testing.assert_array_equal(everything(other), before)
    assert other.stored == 0 and other.clocks.next[0].tolist() == [0]
    other.push(0, 0, KEYS, np.ones(4, dtype=np.float32), index=np.arange(1001, 1005))
    assert budget.used == 10 * row_bytes


@pytest.mark.parametrize("optimizer", ["adagrad", "adam", "adagrad-l1"])
def test_a_checkpoint_restores_exactly_the_touched_keys_and_their_optimizer_state(
        tmp_path: Path, optimizer: str) -> None:
    cfg = config(optimizer)
    state = build_shard(cfg, KEYS, layout(True))
    apply(state, pushes(2, 20, 2))
    path, _, _ = save(state, tmp_path, 0, seq=7)
    copy = build_shard(cfg, KEYS, layout(True))
    assert restore(copy, path) == 7
    assert copy.stored == state.stored
    np.testing.assert_array_equal(copy.rows.keys(), state.rows.keys())  # type: ignore[union-attr]
    used = state.stored
    np.testing.assert_array_equal(copy.params[:used], state.params[:used])
    for mine, theirs in zip(copy.optimizer.slots(), state.optimizer.slots(), strict=True):
        np.testing.assert_array_equal(mine[:used], theirs[:used])
        np.testing.assert_array_equal(mine[copy.size:], theirs[state.size:])
    # nothing else is stored, and both go on alike
    assert not copy.params[used:].any()
    later = pushes(3, 5, 2)
    apply(state, [(w, c + 20, k, g) for w, c, k, g in later])
    apply(copy, [(w, c + 20, k, g) for w, c, k, g in later])
    np.testing.assert_array_equal(everything(copy), everything(state))
    assert path.stat().st_size < 60_000  # rows of 600 keys at most, not the 2,000-key space


def test_a_live_copy_of_a_sparse_bsp_shard_keeps_its_open_round(tmp_path: Path) -> None:
    cfg = config("sgd-momentum", "bsp")
    state = build_shard(cfg, KEYS, layout(True))
    apply(state, pushes(4, 3, 2))
    keys = np.array([1001, 1003, 1100], dtype=np.int64)
    state.push(0, 3, KEYS, np.ones(3, dtype=np.float32), index=keys)  # half of round 3
    path = tmp_path / "live.npz"
    Snapshot.of(state, 0, live=True).write(path)
    copy = build_shard(cfg, KEYS, layout(True))
    restore(copy, path, live=True)
    for shard in (state, copy):
        shard.push(1, 3, KEYS, np.ones(2, dtype=np.float32), index=keys[:2])
    np.testing.assert_array_equal(everything(copy), everything(state))
    assert copy.version == state.version == 4


def test_a_checkpoint_that_does_not_fit_a_sparse_shard_is_refused(tmp_path: Path) -> None:
    cfg = config("adagrad")
    dense = dense_started(cfg)
    apply(dense, pushes(5, 2, 2))
    path, _, _ = save(dense, tmp_path, 0, seq=1)
    with pytest.raises(StoreError, match="no int64 stored_keys"):
        restore(build_shard(cfg, KEYS, layout(True)), path)
    sparse = build_shard(cfg, KEYS, layout(True))
    apply(sparse, pushes(5, 2, 2))
    path, _, _ = save(sparse, tmp_path, 1, seq=1)
    small = ShardState(KEYS, make_controller("asp", workers=2),
                       make_optimizer(cfg.optimizer, 8), workers=2, ranges=[KEYS],
                       sparse=SparseKeys(capacity=8))
    with pytest.raises(StoreError, match="this shard holds at most 8"):
        restore(small, path)


def test_a_2_to_the_40_key_space_costs_memory_only_for_the_keys_pushed() -> None:
    keys = KeyRange(0, 1 << 40)
    wide = KeyLayout((Segment("w", (1 << 40,), keys, sparse=True),))
    process = psutil.Process()
    before = process.memory_info().rss
    state = build_shard(config("adam"), keys, wide)
    rng = np.random.default_rng(0)
    for clock in range(20):
        index = np.unique(rng.integers(0, 1 << 40, size=5000))
        state.push(0, clock, keys, np.ones(len(index), dtype=np.float32), index=index)
    grown = process.memory_info().rss - before
    assert state.stored > 99_000
    # its own account: a value, Adam's mean, square and step count, and the key map
    assert state.stored_bytes == state.stored * (4 * 4 + 16)
    # params, Adam's three slots and the key map: about 36 bytes a stored key, in pages
    assert grown < 64 * 2**20, f"{grown / 2**20:.0f} MiB for {state.stored:,} keys"


def test_the_servers_start_keys_with_a_rule_themselves() -> None:
    from engine import initial

    rules = KeyLayout((Segment("emb", (20,), KeyRange(0, 20), sparse=True, init="normal:0.5"),
                       Segment("w", (6,), KeyRange(20, 26), init="normal:2.0"),
                       Segment("b", (4,), KeyRange(26, 30), init="zeros")))
    cfg = config("sgd-momentum")
    seed = cfg.train.seed
    dense = build_shard(cfg, KeyRange(20, 30), rules)
    assert dense.initialized  # nobody sends an INIT
    np.testing.assert_array_equal(
        dense.read(KeyRange(20, 30)),
        np.concatenate([initial.values("normal:2.0", np.arange(20, 26), seed), np.zeros(4)]))
    table = build_shard(cfg, KeyRange(0, 20), rules)
    wanted = np.array([3, 17], dtype=np.int64)
    np.testing.assert_array_equal(table.read(KeyRange(0, 20), wanted),
                                  initial.values("normal:0.5", wanted, seed))
    assert table.stored == 0 and 0.1 < np.abs(table.read(KeyRange(0, 20), wanted)).max() < 3
