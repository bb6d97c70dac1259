"""ZipLine barrier search: every variant equals brute force, ties included; bad input is refused."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.consistency.zipline import DEFAULT_VARIANT, MAX_BRUTE_COMBINATIONS, VARIANTS, search

FAST_VARIANTS = [v for v in VARIANTS if v != "brute"]

# Few distinct values, so that equal times and tied windows are common. The last set mixes huge
# and small times: there float64 rounding makes different windows' spreads equal (tie rule 3).
VALUE_SETS = [
    (0.0, 1.0, 2.0, 3.0, 5.0),
    (-1.0, 0.0, 0.1, 0.2, 0.3, 0.5, 0.7, 1.5),
    (0.0, 0.5, 1.0, 1e16, 1e16 + 2, 1e16 + 4),
]


WORKERS = st.integers(1, 5)
WIDTHS = st.integers(1, 6)  # R, the iterations ahead


@st.composite
def time_matrices(
    draw: st.DrawFn,
    workers: st.SearchStrategy[int] = WORKERS,
    width: st.SearchStrategy[int] = WIDTHS,
) -> np.ndarray:
    n, r = draw(workers), draw(width)
    values = draw(st.sampled_from(VALUE_SETS))
    flat = draw(st.lists(st.sampled_from(values), min_size=n * r, max_size=n * r))
    return np.sort(np.array(flat, dtype=np.float64).reshape(n, r), axis=1)


def assert_same(times: np.ndarray, variant: str, reference: str = "brute") -> None:
    r, d = search(times, variant)
    expected_r, expected_d = search(times, reference)
    assert r.tolist() == expected_r.tolist(), (variant, times.tolist())
    assert d == expected_d, (variant, times.tolist())


@pytest.mark.parametrize("variant", FAST_VARIANTS)
@settings(max_examples=300, deadline=None)
@given(times=time_matrices())
def test_every_variant_equals_brute_force(variant: str, times: np.ndarray) -> None:
    assert_same(times, variant)


@pytest.mark.parametrize("variant", FAST_VARIANTS)
@settings(max_examples=25, deadline=None)
@given(times=time_matrices(workers=st.just(1)))
def test_one_worker(variant: str, times: np.ndarray) -> None:
    assert_same(times, variant)
    r, d = search(times, variant)
    assert (r.tolist(), d) == ([0], 0.0)


@pytest.mark.parametrize("variant", FAST_VARIANTS)
@settings(max_examples=25, deadline=None)
@given(times=time_matrices(width=st.just(1)))
def test_one_iteration_ahead(variant: str, times: np.ndarray) -> None:
    assert_same(times, variant)
    r, d = search(times, variant)
    assert r.tolist() == [0] * times.shape[0]
    assert d == times.max() - times.min()


def straggler_times(seed: int, workers: int = 50, width: int = 30) -> np.ndarray:
    """Lognormal worker speeds and noisy intervals, rounded so that equal times occur (odd seeds
    round to whole units: many equal times and tied windows)."""
    rng = np.random.default_rng(seed)
    base = rng.lognormal(0.0, 0.5, size=(workers, 1))
    intervals = base * rng.lognormal(0.0, 0.2, size=(workers, width))
    return np.round(np.cumsum(intervals, axis=1), 1 - seed % 2)


@pytest.mark.parametrize("variant", FAST_VARIANTS)
@pytest.mark.parametrize("seed", range(4))
def test_variants_agree_on_larger_inputs(variant: str, seed: int) -> None:
    assert_same(straggler_times(seed), variant, reference=DEFAULT_VARIANT)


# -- hand-worked examples -----------------------------------------------------------------------

# worker 2's first time 3.2 is best matched by worker 0's 3.0 and worker 1's 3.5: spread 0.5.
# No tighter window exists: [3.0, 3.2] has no time of worker 1, [3.2, 3.5] none of worker 0,
# and any later time of worker 2 (6.4, ...) is at least 2.4 after worker 0's last time (4.0).
THREE_WORKERS = [[1.0, 2.0, 3.0, 4.0], [1.5, 3.5, 5.5, 7.5], [3.2, 6.4, 9.6, 12.8]]

HAND_EXAMPLES = [
    pytest.param(THREE_WORKERS, [2, 1, 0], 0.5, id="three-workers"),
    # five windows of spread 1 ([0,1], [1,2], ... [4,5]): the earliest barrier, at 1, wins
    pytest.param([[0.0, 2.0, 4.0], [1.0, 3.0, 5.0]], [0, 0], 1.0, id="tie-earliest-barrier"),
    # spread 0 at time 1 and again at time 2: time 1 wins, worker 0 takes its first 1
    pytest.param([[1.0, 1.0, 2.0], [1.0, 2.0, 2.0]], [0, 0], 0.0, id="equal-times"),
    # window [2, 2]: worker 0 has three iterations ending at 2 and takes the earliest
    pytest.param(
        [[1.0, 2.0, 2.0, 2.0, 3.0], [2.0, 9.0, 9.0, 9.0, 9.0]], [1, 0], 0.0, id="earliest-inside"
    ),
    # 1e16 - 0.0 and 1e16 - 0.5 round to the same float64: the tighter window [0.5, 1e16] wins
    pytest.param([[0.0, 0.5], [1e16, 2e16]], [1, 0], 1e16, id="rounding-tie-tightest"),
    pytest.param([[7.0]], [0], 0.0, id="one-worker-one-iteration"),
    pytest.param([[3.0, 4.0, 9.0]], [0], 0.0, id="one-worker"),
    pytest.param([[3.0], [1.0], [2.5]], [0, 0, 0], 2.0, id="one-iteration"),
]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize(("times", "expected_r", "expected_d"), HAND_EXAMPLES)
def test_hand_examples(
    variant: str, times: list[list[float]], expected_r: list[int], expected_d: float
) -> None:
    r, d = search(np.array(times), variant)
    assert r.tolist() == expected_r
    assert d == expected_d


def test_result_types_and_default() -> None:
    r, d = search(np.array(THREE_WORKERS))
    assert r.dtype.kind == "i" and r.shape == (3,)
    assert type(d) is float
    assert DEFAULT_VARIANT in VARIANTS and "brute" in VARIANTS
    r, d = search(np.array([[1, 2], [2, 3]]))  # integer times are accepted
    assert (r.tolist(), d) == ([1, 0], 0.0)


# -- refused input ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("times", "reason"),
    [
        pytest.param(np.array([1.0, 2.0]), r"must be 2-D .* got 1-D", id="1-D"),
        pytest.param(np.ones((2, 2, 2)), r"must be 2-D .* got 3-D", id="3-D"),
        pytest.param(np.ones((0, 3)), r"times is empty \(shape \(0, 3\)\)", id="no-workers"),
        pytest.param(np.ones((3, 0)), r"times is empty \(shape \(3, 0\)\)", id="no-iterations"),
        pytest.param(np.array([[1.0, np.nan]]), "NaN or inf", id="nan"),
        pytest.param(np.array([[1.0], [np.inf]]), "NaN or inf", id="inf"),
        pytest.param(
            np.array([[1.0, 2.0], [3.0, 2.5]]),
            r"row 1 decreases \(times\[1, 0\] = 3.0 > times\[1, 1\] = 2.5\)",
            id="decreasing",
        ),
        pytest.param(np.array([[-1e308], [1e308]]), "max - min overflows", id="overflow"),
    ],
)
@pytest.mark.parametrize("variant", VARIANTS)
def test_invalid_times_are_refused(variant: str, times: np.ndarray, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        search(times, variant)


def test_unknown_variant_lists_the_known_ones() -> None:
    known = ", ".join(VARIANTS)
    with pytest.raises(ValueError, match=f"unknown variant 'fast'; known variants: {known}$"):
        search(np.array(THREE_WORKERS), "fast")


def test_brute_force_refuses_too_many_choices() -> None:
    assert MAX_BRUTE_COMBINATIONS == 10**6
    with pytest.raises(ValueError, match=r"R\*\*n = 10\*\*7 choices, more than 1,000,000"):
        search(np.zeros((7, 10)), "brute")
