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

Workers' pulls are filtered, range and key-list pulls alike (issue 44: a sparse shard is pulled by
key, a batch's working set at a time; the rule is kept per key, so a key is sent when it moved or
is due, whatever else the list holds). A sparse shard keeps this state by row, for the rows a
worker pulled; a key it does not store (never pushed: still its initial value) is always sent.
The evaluator and tools get every value they ask for. A worker's state is forgotten when it
connects again (``forget``): a restarted worker holds nothing it was sent.
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

    def select_rows(self, worker: int, rows: np.ndarray, values: np.ndarray) -> np.ndarray | None:
        """Of a key-list pull, the positions in the list to send to ``worker`` (sorted), or None
        for all; ``rows`` are the keys' shard-local rows (-1: a key the shard does not store)
        and ``values`` their current values."""
        ...

    def forget(self, worker: int) -> None:
        """``worker`` holds nothing it was sent (a new connection: a restarted worker)."""
        ...

    def forget_all(self) -> None:
        """The shard's state was replaced (a copy restored from a snapshot): a sparse shard's
        rows may hold other keys now, so every worker is sent everything again."""
        ...


class SendAll:
    def select(self, worker: int, span: slice, values: np.ndarray) -> np.ndarray | None:
        return None

    def select_rows(self, worker: int, rows: np.ndarray, values: np.ndarray) -> np.ndarray | None:
        return None

    def forget(self, worker: int) -> None:
        pass

    def forget_all(self) -> None:
        pass


class _Sent:
    """What a shard sent one worker: per row, the value and its age, 0 for a row never sent
    (due), else 1 + the filtered answers since it was last sent as due. Grown on demand, so a
    sparse shard's state grows with the rows this worker pulled, not the shard's capacity."""

    def __init__(self, rows: int) -> None:
        self.values = np.zeros(rows, dtype=np.float32)
        self.age = np.zeros(rows, dtype=np.int32)

    def reach(self, rows: int, limit: int) -> None:
        if rows <= len(self.values):
            return
        size = min(max(rows, 2 * len(self.values)), limit)
        self.values = np.concatenate([self.values, np.zeros(size - len(self.values), np.float32)])
        self.age = np.concatenate([self.age, np.zeros(size - len(self.age), np.int32)])


class SignificantlyModified:
    """Send the values that changed by more than ``delta`` since this worker last got them."""

    def __init__(self, delta: float, refresh_every: int, workers: int, size: int) -> None:
        self.delta, self.refresh_every = delta, refresh_every
        self.workers, self.size = workers, size
        self._sent: dict[int, _Sent] = {}

    def forget(self, worker: int) -> None:
        self._sent.pop(worker, None)

    def forget_all(self) -> None:
        self._sent.clear()

    def _of(self, worker: int, rows: int) -> _Sent | None:
        if not 0 <= worker < self.workers:
            return None  # not one of the run's workers (a tool): it holds no copy
        sent = self._sent.get(worker)
        if sent is None:
            sent = self._sent[worker] = _Sent(0)
        sent.reach(rows, self.size)
        return sent

    def _due(self, age: np.ndarray) -> np.ndarray:
        due: np.ndarray = (age == 0) | (age >= self.refresh_every)
        return due

    def select(self, worker: int, span: slice, values: np.ndarray) -> np.ndarray | None:
        # Counted per key, not per worker: a worker that pulls layer by layer has each layer
        # refreshed every N of its own pulls (a count per worker refreshed whichever layer came
        # N-th, and with 8 layers 6 were never refreshed).
        start = span.start or 0
        state = self._of(worker, start + len(values))
        if state is None:
            return None
        sent, age = state.values[start:start + len(values)], state.age[start:start + len(values)]
        if self._due(age).any():
            sent[:] = values
            age[:] = 1
            return None
        age += 1
        changed = np.flatnonzero(np.abs(values - sent) > self.delta)
        sent[changed] = values[changed]
        return changed + start

    def select_rows(self, worker: int, rows: np.ndarray, values: np.ndarray) -> np.ndarray | None:
        # Per key, as a range's keys: a key-list pull is a working set, and a set that always
        # held one due key would otherwise always be answered whole.
        stored = rows >= 0
        state = self._of(worker, int(rows.max(initial=-1)) + 1)
        if state is None:
            return None
        at = rows[stored]
        due = self._due(state.age[at])
        changed = np.abs(values[stored] - state.values[at]) > self.delta
        send = due | changed
        state.values[at[send]] = values[stored][send]
        state.age[at] = np.where(due, 1, state.age[at] + 1)
        chosen = ~stored  # a key the shard does not store is always sent: nothing tracks it
        chosen[stored] = send
        return np.flatnonzero(chosen)


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
