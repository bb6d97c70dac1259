"""A live snapshot (engine.server.checkpoint, ``live=True``): what a chain's tail hands a server
joining the chain. Unlike a checkpoint it keeps a BSP round that is open (its sums, and who has
pushed to it), and whether the shard was initialised: the copy restored from it equals the tail
bit for bit, and the same updates then move both the same way."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine.errors import DuplicatePush, ProtocolError, StoreError
from engine.server.checkpoint import Snapshot, restore
from engine.server.shard import ShardState
from tests.engine.server.test_checkpoint import (
    KEYS,
    LAYER_B,
    LAYER_W,
    fingerprint,
    fresh,
    grad,
    mixed_pushes,
    run_config,
    started,
)

pytestmark = pytest.mark.timeout(30)


def live_copy(state: ShardState, config: object, folder: Path) -> ShardState:
    path = folder / "handoff.npz"
    Snapshot.of(state, 0, live=True).write(path)
    again = fresh(config)  # type: ignore[arg-type]
    restore(again, path, live=True)
    return again


def round_sums(state: ShardState) -> list[bytes]:
    return [part.tobytes() for part in state.aggregator.round_state()]


@pytest.mark.parametrize("optimizer", ["sgd-momentum", "adam"])
def test_an_open_bsp_round_travels_with_its_sums_and_completes_on_the_copy(
        tmp_path: Path, optimizer: str) -> None:
    config = run_config("bsp", optimizer=optimizer)
    tail = started(config)
    mixed_pushes(tail, 2)
    tail.push(0, 2, KEYS, grad(0, 2))  # round 2: worker 0 in, on both layers
    tail.push(1, 2, LAYER_W, grad(1, 2, 5))  # worker 1 on one layer only
    assert any(np.any(part) for part in tail.aggregator.round_state())
    copy = live_copy(tail, config, tmp_path)
    assert fingerprint(copy) == fingerprint(tail)
    assert round_sums(copy) == round_sums(tail)
    assert copy.clocks.next.tolist() == [[3, 3], [3, 2], [2, 2]]  # nothing pushed again
    # The round completes on both the same way.
    for state in (tail, copy):
        state.push(1, 2, LAYER_B, grad(1, 2, 3))
        state.push(2, 2, KEYS, grad(2, 2))
    assert fingerprint(copy) == fingerprint(tail)
    assert copy.version == tail.version == 3


def test_a_checkpoint_drops_that_round_where_a_live_snapshot_keeps_it(tmp_path: Path) -> None:
    config = run_config("bsp")
    tail = started(config)
    tail.push(0, 0, KEYS, grad(0, 0))
    Snapshot.of(tail, 1).write(tmp_path / "checkpoint.npz")
    resumed = fresh(config)
    restore(resumed, tmp_path / "checkpoint.npz")
    assert resumed.clocks.next.tolist() == [[0, 0], [0, 0], [0, 0]]
    assert live_copy(tail, config, tmp_path).clocks.next.tolist() == [[1, 1], [0, 0], [0, 0]]


def test_a_shard_not_initialised_yet_is_handed_over_uninitialised(tmp_path: Path) -> None:
    config = run_config("asp")
    copy = live_copy(fresh(config), config, tmp_path)
    assert not copy.initialized
    assert copy.init(KEYS, np.ones(8, dtype=np.float32))  # the INIT down the chain still lands


@pytest.mark.parametrize("model", ["asp", "ssp", "dssp"])
def test_the_copy_of_an_immediate_model_equals_the_tail_and_steps_identically(
        tmp_path: Path, model: str) -> None:
    config = run_config(model)
    tail = started(config)
    mixed_pushes(tail, 3)
    copy = live_copy(tail, config, tmp_path)
    assert fingerprint(copy) == fingerprint(tail)
    for state in (tail, copy):
        state.push(0, 3, KEYS, grad(0, 7), trusted=True)
    assert fingerprint(copy) == fingerprint(tail)


def test_a_checkpoint_file_is_not_a_live_snapshot(tmp_path: Path) -> None:
    config = run_config("bsp")
    Snapshot.of(started(config), 1).write(tmp_path / "checkpoint.npz")
    with pytest.raises(StoreError, match="not a live copy of this shard: initialized"):
        restore(fresh(config), tmp_path / "checkpoint.npz", live=True)


def test_non_finite_round_sums_are_refused(tmp_path: Path) -> None:
    config = run_config("bsp")
    tail = started(config)
    tail.push(0, 0, KEYS, grad(0, 0))
    arrays = dict(Snapshot.of(tail, 0, live=True).arrays)
    arrays["round0"] = arrays["round0"].copy()
    arrays["round0"][2] = np.inf
    Snapshot(arrays).write(tmp_path / "bad.npz")
    with pytest.raises(StoreError, match="round sums that are not finite"):
        restore(fresh(config), tmp_path / "bad.npz", live=True)


def test_a_trusted_push_skips_the_consistency_check_not_the_clocks() -> None:
    """A copy that joined a chain applies what its predecessor accepted, even where its own
    controller (rebuilt without timing history) would refuse it; a duplicate is still one."""
    state = started(run_config("bsp", workers=2))
    state.push(0, 0, KEYS, grad(0, 0))
    with pytest.raises(ProtocolError, match="during BSP round 0"):
        state.push(0, 1, KEYS, grad(0, 1))
    state.push(0, 1, KEYS, grad(0, 1), trusted=True)
    assert state.clocks.next[0].tolist() == [2, 2]
    with pytest.raises(DuplicatePush):
        state.push(0, 1, KEYS, grad(0, 1), trusted=True)
