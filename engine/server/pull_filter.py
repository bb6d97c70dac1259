"""Pull filters: which values a shard sends back to a worker's pull.

Seed 003's *significantly-modified filter*: a worker keeps its copy of the parameters, and a pull
returns only the values that moved by more than DELTA since the values this shard last sent to
that worker; every ``refresh_every``-th pull of a key range by a worker (and its first) is
answered whole, which bounds how far the worker's copy can drift from the shard (counted per
key, so a worker that pulls layer by layer has every layer refreshed). The shard remembers, per
worker, the values it sent (one float32 copy of the shard per worker), so the drift of a key that
keeps moving by less than DELTA is measured from what the worker really holds, never
accumulated unseen. The whole answers are psctl's bound, not the source's: OSDI'14's filter
sends the entries changed by more than a threshold since they were last synchronised.

Only range pulls by workers are filtered: the evaluator and key-list pulls get every value they
ask for.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from engine.errors import ConfigError
from engine.registry import Registry


class PullFilter(Protocol):
    def select(self, worker: int, span: slice, values: np.ndarray) -> np.ndarray | None:
        """The shard-local positions inside ``span`` to send to ``worker`` (sorted), or None
        for all of them; ``values`` are the shard's current values of ``span``."""
        ...


class SendAll:
    def select(self, worker: int, span: slice, values: np.ndarray) -> np.ndarray | None:
        return None


class SignificantlyModified:
    """Send the values that changed by more than ``delta`` since this worker last got them."""

    def __init__(self, delta: float, refresh_every: int, workers: int, size: int) -> None:
        self.delta, self.refresh_every = delta, refresh_every
        self._sent = np.zeros((workers, size), dtype=np.float32)
        # Per worker and key: filtered answers since the key was last sent whole. Counted per
        # key, not per worker: a worker that pulls layer by layer has each layer refreshed every
        # N of its own pulls (a count per worker refreshed whichever layer came N-th, and with
        # 8 layers 6 were never refreshed). A key never sent starts due.
        self._since = np.full((workers, size), refresh_every - 1, dtype=np.int32)

    def select(self, worker: int, span: slice, values: np.ndarray) -> np.ndarray | None:
        if not 0 <= worker < len(self._sent):
            return None  # not one of the run's workers (a tool): it holds no copy
        sent, since = self._sent[worker, span], self._since[worker, span]
        if (since >= self.refresh_every - 1).any():
            sent[:] = values
            since[:] = 0
            return None
        since += 1
        changed = np.flatnonzero(np.abs(values - sent) > self.delta)
        sent[changed] = values[changed]
        return changed + (span.start or 0)


@dataclass(frozen=True)
class PullFilterSpec:
    """A parsed ``--pull-filter``: the rule's name and its threshold."""

    name: str
    delta: float = 0.0


FORMS = "none or significant:DELTA (e.g. significant:0.001)"


def parse_pull_filter(text: str) -> PullFilterSpec:
    """``none`` or ``significant:DELTA`` with DELTA a finite number >= 0."""
    name, _, argument = text.strip().partition(":")
    if name == "none" and not argument:
        return PullFilterSpec("none")
    if name == "significant" and argument:
        try:
            delta = float(argument)
        except ValueError:
            delta = math.nan
        if math.isfinite(delta) and delta >= 0:
            return PullFilterSpec("significant", delta)
    raise ConfigError(f"pull filter {text.strip()[:40]!r}: write {FORMS}")


@dataclass(frozen=True)
class FilterContext:
    spec: PullFilterSpec
    refresh_every: int
    workers: int
    size: int


PULL_FILTERS: Registry[Callable[[FilterContext], PullFilter]] = Registry("pull filter")
PULL_FILTERS.register("none", lambda c: SendAll(), "every pull gets every value it asks for")
PULL_FILTERS.register(
    "significant",
    lambda c: SignificantlyModified(c.spec.delta, c.refresh_every, c.workers, c.size),
    "only values that moved by more than DELTA since this worker got them; whole every N pulls")


def make_pull_filter(text: str, refresh_every: int, workers: int, size: int) -> PullFilter:
    spec = parse_pull_filter(text)
    return PULL_FILTERS.get(spec.name)(FilterContext(spec, refresh_every, workers, size))
