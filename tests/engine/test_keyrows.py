"""engine/keyrows.py: the key -> row map of a sparse shard agrees with a dict through
many batches and merges, assigns rows in arrival order, and refuses what does not fit whole."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import engine.keyrows as sparse_keys
from engine.errors import ShardFull
from engine.keyrows import KeyRows, RowBudget


def test_rows_agree_with_a_dict_through_batches_and_merges(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sparse_keys, "MIN_DELTA", 8)  # merge often
    rows, reference = KeyRows(100_000), {}
    rng = np.random.default_rng(0)
    for _ in range(300):
        keys = np.unique(rng.integers(0, 1 << 62, size=rng.integers(1, 50)))
        if rng.random() < 0.5 and reference:  # some keys seen before
            keys = np.unique(np.concatenate([keys, rng.choice(list(reference), size=5)]))
        got, new = rows.assign(keys)
        for key, row, fresh in zip(keys.tolist(), got.tolist(), new.tolist(), strict=True):
            assert fresh == (key not in reference)
            assert reference.setdefault(key, len(reference) if fresh else -1) == row
        assert rows.used == len(reference)
    probe = np.array([*list(reference)[:100], -5, 1 << 62], dtype=np.int64)
    expected = [reference.get(k, -1) for k in probe.tolist()]
    assert rows.find(probe).tolist() == expected
    by_row = rows.keys()
    assert all(by_row[row] == key for key, row in reference.items())


def test_load_puts_keys_in_the_given_rows_and_forgets_the_rest() -> None:
    rows = KeyRows(10)
    rows.assign(np.array([1, 2, 3]))
    rows.load(np.array([30, 10, 20]))
    assert rows.find(np.array([10, 20, 30, 1])).tolist() == [1, 2, 0, -1]
    assert rows.keys().tolist() == [30, 10, 20]
    with pytest.raises(ValueError, match="distinct"):
        rows.load(np.array([1, 1]))


def test_keys_that_do_not_fit_are_refused_whole() -> None:
    rows = KeyRows(4)
    rows.assign(np.array([5, 6, 7]))
    with pytest.raises(ShardFull, match="stores 3 keys and can hold 4: 2 more do not fit"):
        rows.assign(np.array([6, 8, 9]))
    assert rows.used == 3 and rows.find(np.array([8])).tolist() == [-1]


def test_shards_sharing_a_budget_store_no_more_than_it_allows_in_all() -> None:
    """Issue 57: a server's sparse keys were bounded by 2^28 a shard alone (12.6-19 GB, more
    than the machine). The budget bounds the process's shards together, in bytes."""
    budget = RowBudget(100 * 40)  # 100 keys at 40 bytes
    first, second = KeyRows(1000, row_bytes=40, budget=budget), KeyRows(1000, row_bytes=40,
                                                                        budget=budget)
    first.assign(np.arange(60))
    second.assign(np.arange(40))  # together at the budget: taken
    with pytest.raises(ShardFull) as refused:
        second.assign(np.arange(100, 110))
    assert str(refused.value) == (
        "this server's sparse key ranges store 100 keys in 3.9 KiB and may take 3.9 KiB "
        "(cluster.server_memory): 10 keys more (400 bytes) do not fit; give the run more "
        "servers (--servers) or more cluster.server_memory")
    assert second.used == 40 and second.find(np.arange(100, 110)).tolist() == [-1] * 10
    second.assign(np.arange(40))  # keys it stores already need nothing more
    del first
    gc.collect()  # a copy the process dropped counts no more
    second.assign(np.arange(100, 160))
    assert budget.used == 100 * 40


def test_a_load_counts_the_keys_it_replaces_once() -> None:
    budget = RowBudget(10 * 32)
    rows = KeyRows(100, budget=budget)
    rows.assign(np.arange(8))
    rows.load(np.arange(10))  # 10 keys instead of 8: within 10
    with pytest.raises(ShardFull, match="11 keys more"):
        rows.load(np.arange(11))
    assert rows.used == 10
