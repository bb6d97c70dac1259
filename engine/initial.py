"""Initial values a server computes itself, key by key (issue 44): ``zeros`` or ``normal:STD``
(a normal draw per key from its global id, engine.hashing, times STD). The same on every server,
in every process and after a restart, with nothing sent: what a sparse embedding table needs (its
rows are made where first pushed) and what lets a model of such segments skip worker 0's INIT."""

from __future__ import annotations

import math

import numpy as np

from engine.errors import ConfigError
from engine.hashing import unit_normal

FORMS = "zeros or normal:STD (STD > 0)"


def check(spec: str) -> str:
    """``spec`` if it is an initial-value rule psctl knows, else a ConfigError."""
    name, _, argument = spec.partition(":")
    if name == "zeros" and not argument:
        return spec
    if name == "normal":
        try:
            std = float(argument)
        except ValueError:
            std = math.nan
        if math.isfinite(std) and std > 0:
            return spec
    raise ConfigError(f"initial values {spec[:40]!r}: write {FORMS}")


def values(spec: str, keys: np.ndarray, seed: int) -> np.ndarray:
    """The initial float32 value of each of ``keys`` (global ids) under ``spec``."""
    name, _, argument = check(spec).partition(":")
    if name == "zeros":
        return np.zeros(len(keys), dtype=np.float32)
    return (unit_normal(keys, seed) * float(argument)).astype(np.float32)
