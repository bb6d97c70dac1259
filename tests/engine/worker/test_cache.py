"""SSP's worker-side cache (engine/worker/cache.py) against Ho et al.'s rule: a read at clock c
is answered from the copy while it holds every update of the clocks up to c - s - 1."""

from __future__ import annotations

import numpy as np
import pytest

from engine.plan import build_config
from engine.worker.cache import ReadCache, read_cache
from engine.worker.client import PullResult, PushResult


def fetch(slowest: int, nbytes: int = 400) -> PullResult:
    return PullResult({0: 7}, 0.0, 24, nbytes, 0.0, slowest)


def test_a_copy_answers_the_reads_its_slowest_clock_covers() -> None:
    cache = ReadCache(bound=3, own_step_lr=None)
    assert not cache.serves(0)  # nothing fetched yet
    cache.fetched(fetch(slowest=5))  # holds every push of clocks 0..4
    # a read at c needs clocks up to c - 4: served while 5 >= c - 3
    assert [c for c in range(12) if cache.serves(c)] == list(range(9))
    read = cache.read(123.0)
    assert (read.bytes_sent, read.bytes_received, read.wait_s) == (0, 0, 0.0)
    assert read.versions == {0: 7} and read.slowest_clock == 5
    assert cache.saved_per_read == 424 and cache.hits == 1


def test_read_my_writes_steps_the_copy_as_a_plain_sgd_shard() -> None:
    cache = ReadCache(bound=1, own_step_lr=0.1)
    params = np.ones(4, dtype=np.float32)
    grads = np.array([1, 2, 0, -1], dtype=np.float32)
    cache.write(params, grads, PushResult({0: 1}, 0, 0, 0, lr_scale=0.25))
    np.testing.assert_allclose(params, 1 - 0.1 * 0.25 * grads)
    cache.write(params, grads, PushResult({0: 2}, 0, 0, 0, lr_scale=None))  # nothing applied
    np.testing.assert_allclose(params, 1 - 0.1 * 0.25 * grads)


@pytest.mark.parametrize(("values", "bound", "own_lr"), [
    ({"sync.model": "ssp", "sync.staleness": 2}, 2, 0.1),
    ({"sync.model": "dssp", "sync.staleness": 1}, 1, 0.1),  # DSSP's lower bound
    ({"sync.model": "ssp", "optimizer.name": "adagrad"}, 3, None),  # no plain step to mirror
    ({"sync.model": "ssp", "sync.cache": False}, None, None),
    ({"sync.model": "bsp"}, None, None),
    ({"sync.model": "asp"}, None, None),
    ({"sync.model": "bounded-delay"}, None, None),
])
def test_the_models_with_a_bound_to_read_within_get_a_cache(
        values: dict[str, object], bound: int | None, own_lr: float | None) -> None:
    cache = read_cache(build_config({}, {"data.dataset": "digits", **values}))
    if bound is None:
        assert cache is None
    else:
        assert cache is not None and (cache.bound, cache.own_step_lr) == (bound, own_lr)
