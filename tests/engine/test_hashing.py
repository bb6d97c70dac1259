"""engine/hashing.py: SplitMix64's finaliser as numpy computes it equals the reference algorithm
(Steele, Lea and Flood; Vigna's splitmix64.c), written here in plain Python integers, and its
first output from state 0 is the published 0xE220A8397B1DCDAF; the unit draws are in range and
about uniform / normal."""

from __future__ import annotations

import numpy as np

from engine.hashing import mix64, unit_normal, unit_uniform

MASK = (1 << 64) - 1
GAMMA = 0x9E3779B97F4A7C15


def reference(state: int) -> int:
    """One step of splitmix64.c: advance the state by the gamma, then mix it."""
    z = (state + GAMMA) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def test_mix64_is_splitmix64() -> None:
    assert reference(0) == 0xE220A8397B1DCDAF
    values = [0, 1, 2, 12345, (1 << 40) + 7, (1 << 63) - 1]
    for seed in (0, 3, 2**40):
        got = mix64(np.array(values, dtype=np.int64), seed).tolist()
        assert got == [reference((v + seed * GAMMA) & MASK) for v in values]


def test_unit_draws_are_in_range_and_distributed_as_named() -> None:
    keys = np.arange(200_000, dtype=np.int64)
    uniform = unit_uniform(keys, 1)
    assert uniform.min() > 0 and uniform.max() < 1
    assert abs(uniform.mean() - 0.5) < 0.005
    normal = unit_normal(keys, 2)
    assert abs(normal.mean()) < 0.01 and abs(normal.std() - 1) < 0.01
    assert not np.array_equal(unit_uniform(keys[:10], 1), unit_uniform(keys[:10], 2))
