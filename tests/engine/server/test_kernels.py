"""The BLAS kernels of the servers' dense steps: in place on views, read-only inputs, empty
arrays, and a norm that reports overflow and NaN rather than hiding them."""

from __future__ import annotations

import subprocess
import sys

import numpy as np

from engine.server import kernels


def test_axpy_and_scal_write_through_a_view_of_a_larger_array() -> None:
    whole = np.arange(10, dtype=np.float32)
    view = whole[2:7]
    grad = np.frombuffer(np.ones(5, dtype=np.float32).tobytes(), dtype=np.float32)
    assert not grad.flags.writeable  # a pushed gradient is a read-only view of the frame
    kernels.axpy(grad, view, -2.0)
    kernels.scal(0.5, view)
    expected = np.arange(10, dtype=np.float32)
    expected[2:7] = (expected[2:7] - 2) * 0.5
    np.testing.assert_array_equal(whole, expected)


def test_empty_arrays_are_left_alone() -> None:
    empty = np.zeros(0, dtype=np.float32)
    kernels.axpy(empty, empty, 1.0)
    kernels.scal(2.0, empty)
    assert kernels.norm(empty) == 0.0


def test_norm_is_inf_on_overflow_and_nan_on_nan() -> None:
    assert kernels.norm(np.array([3, 4], dtype=np.float32)) == 5.0
    assert kernels.norm(np.array([1e20, 0], dtype=np.float32)) == np.inf  # squares overflow
    assert np.isnan(kernels.norm(np.array([1, np.nan], dtype=np.float32)))
    assert kernels.norm(np.array([1, -np.inf], dtype=np.float32)) == np.inf


def test_the_cli_does_not_import_scipy_linalg_until_a_server_steps() -> None:
    """Every psctl command imports the kernels through the registries; scipy.linalg waits for
    the first step (it took a fifth of `psctl --help`'s start-up)."""
    probe = ("import sys, numpy as np, psctl.cli\n"
             "from engine.server import kernels\n"
             "before = 'scipy.linalg' in sys.modules\n"
             "kernels.scal(2.0, np.ones(3, dtype=np.float32))\n"
             "print(before, 'scipy.linalg' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=60, check=True)
    assert done.stdout.split() == ["False", "True"]
