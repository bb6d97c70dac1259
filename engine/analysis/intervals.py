"""Confidence intervals over seeds, and ratios paired by seed, for the comparisons a reviewer
believes (issue 41).

A metric's interval is Student's t over the seeds' values: mean ± t(0.975, n - 1) · s / √n.
A ratio of two set-ups is paired by seed (the same seed's data order and initial model on both
sides): the per-seed log ratios' mean ± t · s / √n, exponentiated, so that the interval of a
ratio is symmetric on the log scale and the pairing removes what the seed alone explains. The
verdict says "no difference at 95 %" whenever the interval holds 1."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

LEVEL = 0.95


@dataclass(frozen=True)
class Interval:
    mean: float
    low: float | None  # None with one value: no spread to measure
    high: float | None
    n: int


@dataclass(frozen=True)
class Ratio:
    """``ratio`` of a set-up's metric to the baseline's, better > 1 (for a time, the baseline's
    over the set-up's: a speedup), with its interval and verdict."""

    ratio: float
    low: float | None
    high: float | None
    n: int  # seeds paired
    verdict: str


def t_quantile(n: int) -> float:
    """t(0.975, n - 1), from scipy's Student t (exact for small n, where it matters most)."""
    from scipy.stats import t  # imported here: only comparisons of repeated seeds need it

    return float(t.ppf(0.5 + LEVEL / 2, n - 1))


def interval(values: Sequence[float | None],
             bounds: tuple[float, float] = (-math.inf, math.inf)) -> Interval | None:
    """The mean and its 95 % interval over seeds; None if any seed has no value (a run that
    never reached the target leaves the set-up's time to target undefined, not shorter).
    ``bounds``: what the quantity can be (an accuracy is in [0, 1]); the interval is cut to
    them, as a t interval of few, spread seeds can reach past them."""
    if not values or any(v is None for v in values):
        return None
    floats = [float(v) for v in values if v is not None]
    mean = statistics.fmean(floats)
    if len(floats) < 2:
        return Interval(mean, None, None, 1)
    half = t_quantile(len(floats)) * statistics.stdev(floats) / math.sqrt(len(floats))
    low, high = bounds
    return Interval(mean, max(low, mean - half), min(high, mean + half), len(floats))


def paired_ratio(baseline: Mapping[int, float | None], other: Mapping[int, float | None], *,
                 lower_is_better: bool, better: str = "better",
                 worse: str = "worse") -> Ratio | None:
    """The ratio of ``other`` to ``baseline`` over the seeds both have a positive value for
    (times inverted, so that > 1 is better), its 95 % interval and the verdict."""
    seeds = sorted(s for s in baseline.keys() & other.keys()
                   if (baseline[s] or 0) > 0 and (other[s] or 0) > 0)
    if not seeds:
        return None
    logs = [math.log(float(other[s]) / float(baseline[s])) for s in seeds]  # type: ignore[arg-type]
    if lower_is_better:
        logs = [-x for x in logs]
    mean = statistics.fmean(logs)
    if len(logs) < 2:
        return Ratio(math.exp(mean), None, None, 1, "one seed: no interval")
    half = t_quantile(len(logs)) * statistics.stdev(logs) / math.sqrt(len(logs))
    low, high = math.exp(mean - half), math.exp(mean + half)
    verdict = better if low > 1 else worse if high < 1 else "no difference at 95 %"
    return Ratio(math.exp(mean), low, high, len(logs), verdict)
