"""engine/analysis/intervals.py against references computed here: Student t intervals over
seeds and ratios paired by seed, with their verdicts."""

from __future__ import annotations

import math
import statistics

import pytest
from scipy import stats

from engine.analysis.intervals import interval, paired_ratio, t_quantile


def test_t_quantiles_are_students() -> None:
    assert t_quantile(2) == pytest.approx(12.706, abs=1e-3)
    assert t_quantile(3) == pytest.approx(4.303, abs=1e-3)
    assert t_quantile(30) == pytest.approx(2.045, abs=1e-3)


def test_an_interval_is_the_mean_plus_minus_t_times_the_standard_error() -> None:
    values = [10.0, 12.0, 11.0, 15.0]
    found = interval(values)
    assert found is not None
    mean, sem = statistics.fmean(values), statistics.stdev(values) / 2
    low, high = stats.t.interval(0.95, 3, loc=mean, scale=sem)
    assert (found.mean, found.low, found.high, found.n) == pytest.approx((mean, low, high, 4))


def test_one_seed_has_no_interval_and_a_missing_value_no_mean() -> None:
    single = interval([3.0])
    assert single is not None and (single.mean, single.low, single.high) == (3.0, None, None)
    assert interval([3.0, None]) is None and interval([]) is None


def test_a_paired_ratio_follows_the_seeds_not_the_means() -> None:
    # Seed by seed the set-up is 2x faster though its times vary as much as the baseline's.
    base = {0: 10.0, 1: 20.0, 2: 40.0}
    fast = {0: 5.0, 1: 10.2, 2: 19.6}
    found = paired_ratio(base, fast, lower_is_better=True, better="faster", worse="slower")
    assert found is not None and found.verdict == "faster" and found.n == 3
    logs = [math.log(base[s] / fast[s]) for s in base]
    half = stats.t.ppf(0.975, 2) * statistics.stdev(logs) / math.sqrt(3)
    assert (found.ratio, found.low, found.high) == pytest.approx(
        (math.exp(statistics.fmean(logs)), math.exp(statistics.fmean(logs) - half),
         math.exp(statistics.fmean(logs) + half)))


def test_verdicts() -> None:
    base = {0: 1.0, 1: 1.0, 2: 1.0}
    assert paired_ratio(base, {0: 0.5, 1: 0.52, 2: 0.49}, lower_is_better=False).verdict \
        == "worse"  # type: ignore[union-attr]
    noisy = paired_ratio(base, {0: 0.5, 1: 1.6, 2: 1.1}, lower_is_better=False)
    assert noisy is not None and noisy.verdict == "no difference at 95 %"
    assert paired_ratio(base, {5: 1.0}, lower_is_better=False) is None  # no seed in common


def test_an_interval_is_cut_to_what_the_quantity_can_be() -> None:
    found = interval([0.9, 0.99, 0.999], (0.0, 1.0))
    assert found is not None and found.high == 1.0 and 0.0 < found.low < found.mean
    loose = interval([0.9, 0.99, 0.999])
    assert loose is not None and loose.high is not None and loose.high > 1.0
