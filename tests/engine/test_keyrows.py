"""engine/keyrows.py: the key -> row map of a sparse shard agrees with a dict through
many batches and merges, assigns rows in arrival order, and refuses what does not fit whole."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import engine.keyrows as sparse_keys
from engine.errors import ShardFull
from engine.keyrows import KeyRows, RowBudget


@pytest.fixture
def small_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs and merge slices of a few keys: merges start, and span many calls, often."""
    monkeypatch.setattr(sparse_keys, "SMALL_RUN", 8)
    monkeypatch.setattr(sparse_keys, "MERGE_SLICE", 4)
    monkeypatch.setattr(sparse_keys, "MAX_SLICE", 4)
    monkeypatch.setattr(sparse_keys, "WORK_PER_KEY", 1)


@pytest.mark.parametrize("order", ["random", "ascending", "descending"])
@pytest.mark.usefixtures("small_runs")
def test_rows_agree_with_a_dict_through_batches_and_merges(order: str) -> None:
    rows, reference = KeyRows(100_000), {}
    rng = np.random.default_rng(0)
    merging = 0
    for step in range(300):
        if order == "random":
            keys = np.unique(rng.integers(0, 1 << 62, size=rng.integers(1, 50)))
        else:  # keys that arrive in order crowd one end of every merge
            keys = np.arange(step * 50, step * 50 + rng.integers(1, 50)) * (
                1 if order == "ascending" else -1)
            keys = np.unique(keys)
        if rng.random() < 0.5 and reference:  # some keys seen before
            keys = np.unique(np.concatenate([keys, rng.choice(list(reference), size=5)]))
        got, new = rows.assign(keys)
        for key, row, fresh in zip(keys.tolist(), got.tolist(), new.tolist(), strict=True):
            assert fresh == (key not in reference)
            assert reference.setdefault(key, len(reference) if fresh else -1) == row
        assert rows.used == len(reference)
        merging += bool(rows.merging)
    assert merging > 50  # lookups and adds met merges half done
    probe = np.array([*list(reference)[:100], -5, 1 << 62], dtype=np.int64)
    expected = [reference.get(k, -1) for k in probe.tolist()]
    assert rows.find(probe).tolist() == expected
    by_row = rows.keys()
    assert all(by_row[row] == key for key, row in reference.items())


def test_no_add_copies_more_than_its_share_of_a_merge() -> None:
    """Issue 57: merging the map's two runs copied every key in one call (1.5 s of a server's
    loop at 16.8 million keys). Each add now does a bounded slice of the pending merges."""
    rows = KeyRows(1 << 30)
    rng = np.random.default_rng(1)
    batch, worst, most_runs = 1 << 14, 0, 0
    while rows.used < 3_000_000:
        rows.assign(np.unique(rng.integers(0, 1 << 40, size=batch)))
        worst, most_runs = max(worst, rows.last_work), max(most_runs, rows.runs)
    bound = max(sparse_keys.MERGE_SLICE, sparse_keys.WORK_PER_KEY * most_runs * batch)
    # a slice may end a bit past the budget: at most one more slice of each input
    assert worst <= bound + 2 * sparse_keys.MAX_SLICE
    assert worst < 3_000_000 // 4 and most_runs <= 8  # not the whole map in one call
    probe = rng.integers(0, 1 << 40, size=1000)
    assert ((rows.find(probe) >= 0) == np.isin(probe, rows.keys())).all()


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
