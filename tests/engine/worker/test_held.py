"""engine/worker/held.py: what a worker holds of the values it was sent, dense or by key."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from engine.errors import ProtocolError
from engine.worker.held import DENSE_KEYS, DenseHeld, Held, KeyedHeld, held_for

KINDS: list[Callable[[], Held]] = [lambda: DenseHeld(1000), KeyedHeld]


@pytest.mark.parametrize("make", KINDS)
def test_a_filtered_answer_is_filled_from_the_latest_values_sent(make: Callable[[], Held]) -> None:
    held = make()
    held.put_range(10, np.arange(5, dtype=np.float32))
    held.put(np.array([500, 999]), np.array([2.0, 3.0], np.float32))
    out = np.empty(4, np.float32)
    held.fill(np.array([10, 12, 500, 999]), np.array([12]), np.array([-1.0], np.float32), out)
    assert out.tolist() == [0.0, -1.0, 2.0, 3.0]
    held.fill_range(11, np.array([13]), np.array([7.0], np.float32), out[:3])
    assert out[:3].tolist() == [1.0, -1.0, 7.0]
    # A key first sent in the answer itself (a key the shard does not store) is held from then.
    held.fill(np.array([12, 600]), np.array([600]), np.array([4.0], np.float32), out[:2])
    assert out[:2].tolist() == [-1.0, 4.0]


@pytest.mark.parametrize("make", KINDS)
def test_a_key_never_sent_is_an_error_that_names_it(make: Callable[[], Held]) -> None:
    held = make()
    held.put(np.array([1, 2]), np.ones(2, np.float32))
    with pytest.raises(ProtocolError, match="left key 3 out .* never sent it"):
        held.fill(np.array([1, 3]), np.array([], np.int64), np.empty(0, np.float32),
                  np.empty(2, np.float32))
    with pytest.raises(ProtocolError, match="left key 0 out"):
        held.fill_range(0, np.array([], np.int64), np.empty(0, np.float32),
                        np.empty(3, np.float32))


def test_keys_answered_that_were_not_asked_for_are_refused() -> None:
    with pytest.raises(ProtocolError, match="not asked for"):
        KeyedHeld().fill(np.array([1, 3]), np.array([2]), np.ones(1, np.float32),
                         np.empty(2, np.float32))


def test_a_keyed_copy_holds_hashed_keys_of_a_2_to_the_62_space_and_grows() -> None:
    held = KeyedHeld()
    rng = np.random.default_rng(0)
    keys = np.unique(rng.integers(0, 2**62, 5000))
    values = rng.standard_normal(len(keys)).astype(np.float32)
    for part in np.array_split(np.arange(len(keys)), 7):
        held.put(keys[part], values[part])
    out = np.empty(len(keys), np.float32)
    held.fill(keys, keys[:0], values[:0], out)
    np.testing.assert_array_equal(out, values)
    assert held.held == len(keys)


def test_a_key_space_too_big_for_an_array_is_held_by_key() -> None:
    assert isinstance(held_for(DENSE_KEYS), DenseHeld)
    assert isinstance(held_for(2**40), KeyedHeld)
