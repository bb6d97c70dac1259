"""Deterministic per-key numbers from a 64-bit hash: the same on every process, every server and
after a restart, with nothing stored (issue 44).

``mix64`` is SplitMix64's finaliser (Steele, Lea and Flood, "Fast splittable pseudorandom number
generators", OOPSLA 2014: the 64-bit mixing function of ``java.util.SplittableRandom``), applied
to ``value + seed * golden gamma``. It is a bijection of the 64-bit integers whose output bits
each depend on every input bit, which is what a feature hasher and a per-key initial value need;
it is not a cryptographic hash. numpy's uint64 arithmetic wraps modulo 2^64, as the algorithm
assumes.
"""

from __future__ import annotations

import numpy as np

_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)
# 2^-53: a hash's top 53 bits as a double in [0, 1).
_UNIT = 1.0 / float(1 << 53)


def mix64(values: np.ndarray, seed: int = 0) -> np.ndarray:
    """SplitMix64's output for each of ``values`` (any integer dtype) under ``seed``, as uint64."""
    with np.errstate(over="ignore"):
        z = np.asarray(values).astype(np.uint64, copy=True)
        z += np.uint64(seed % (1 << 64)) * _GAMMA + _GAMMA
        z ^= z >> _S30
        z *= _M1
        z ^= z >> _S27
        z *= _M2
        z ^= z >> _S31
    return z


def unit_uniform(values: np.ndarray, seed: int = 0) -> np.ndarray:
    """A float64 in (0, 1) per value: the hash's top 53 bits, moved half a step off zero."""
    bits = mix64(values, seed) >> np.uint64(11)
    return (bits.astype(np.float64) + 0.5) * _UNIT


def unit_normal(values: np.ndarray, seed: int = 0) -> np.ndarray:
    """A standard normal float64 per value (Box-Muller over two independent hashes)."""
    radius = np.sqrt(-2.0 * np.log(unit_uniform(values, seed)))
    normal: np.ndarray = radius * np.cos(2.0 * np.pi * unit_uniform(values, seed + 0x5DEECE66D))
    return normal
