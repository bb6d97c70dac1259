"""Injected slowness: straggler factor, onset and jitter."""

from __future__ import annotations

import time

import numpy as np
import pytest

from engine.config import HeterogeneityConfig, JitterConfig, Straggler
from engine.worker.heterogeneity import Slowdown


def test_only_the_named_rank_is_slowed() -> None:
    config = HeterogeneityConfig(stragglers=(Straggler(rank=2, factor=3.0),))
    assert Slowdown(config, rank=2, seed=0).factor_now() == 3.0
    other = Slowdown(config, rank=1, seed=0)
    assert other.factor_now() == 1.0 and not other.active


def test_onset_delays_the_slowdown() -> None:
    config = HeterogeneityConfig(stragglers=(Straggler(rank=0, factor=4.0, onset_s=0.05),))
    slowdown = Slowdown(config, rank=0, seed=0)
    assert slowdown.factor_now() == 1.0
    time.sleep(0.06)
    assert slowdown.factor_now() == 4.0


def test_lognormal_jitter_has_the_configured_spread_and_is_seeded() -> None:
    config = HeterogeneityConfig(jitter=JitterConfig(distribution="lognormal", sigma=0.5))
    draws = [Slowdown(config, rank=0, seed=1).factor_now() for _ in range(3)]
    assert draws[0] == draws[1] == draws[2]  # same seed, same first draw
    slowdown = Slowdown(config, rank=0, seed=1)
    logs = np.log([slowdown.factor_now() for _ in range(4000)])
    assert abs(logs.mean()) < 0.05 and logs.std() == pytest.approx(0.5, rel=0.1)
