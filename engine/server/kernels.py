"""In-place BLAS level-1 kernels for the servers' dense steps.

numpy's ``buf *= m; buf += g; p -= lr * buf`` makes four passes over the shard and needs a
scratch array for ``lr * buf``; BLAS's ``scal`` and ``axpy`` make three, write in place and run
on OpenBLAS's threads (about 0.23 ms against numpy's 0.65 ms for the MNIST MLP's 932k keys here:
docs/benchmarks.md, "Server update"). scipy ships the BLAS psctl already depends on.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np


@functools.cache
def _blas() -> Any:  # scipy has no type hints
    # Imported on first use: scipy.linalg takes about 0.13 s to import, and every psctl command
    # (`psctl runs`, shell completion) imports this module through the registries.
    from scipy.linalg import blas

    return blas


def axpy(x: np.ndarray, y: np.ndarray, a: float) -> None:
    """y += a * x, in place (float32, one-dimensional; ``x`` may be read-only)."""
    if not len(y):
        return
    out = _blas().saxpy(x, y, a=a)
    if out is not y:  # f2py copies an array it cannot write through: put the result back
        np.copyto(y, out)


def scal(a: float, x: np.ndarray) -> None:
    """x *= a, in place (float32, one-dimensional)."""
    if not len(x):
        return
    out = _blas().sscal(a, x)
    if out is not x:
        np.copyto(x, out)


def norm(x: np.ndarray) -> float:
    """The L2 norm, inf when it overflows float32 or a value is not finite (NaN stays NaN)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return float(np.dot(x, x)) ** 0.5 if len(x) else 0.0
