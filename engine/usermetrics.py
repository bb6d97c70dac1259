"""``psctl.log(name, value)``: the metrics a user's model or data file logs itself, collected in
the process that runs that code.

Every call is checked where it is made, so that a bad one fails in the user's code with a clear
:class:`~engine.errors.MetricError`: the name a short identifier (``NAME_PATTERN``), the value
one finite number (``float(value)``: an int, a float, a numpy scalar, a one-element tensor), at
most ``MAX_NAMES`` names in a process. The roles that run user code (a worker, the evaluator,
the simulator) turn collecting on with :func:`collect`; until then a checked value is dropped,
so a model file imported by a plain script or a test runs unchanged.

Values of one name logged several times before they are taken are averaged: a metric logged once
per iteration (from ``forward`` or a gradient hook) keeps its value, one logged per batch of an
evaluation becomes its mean over the test set.

A worker's loop *seals* what was logged when it builds an iteration's row, which every loop does
right after that iteration's gradient (``engine.worker.loops.iteration_row``), and *takes* it
when the row is recorded: several loops record an iteration only after the next gradient
(overlapped, bounded delay, Downpour), whose values must not land on the earlier row. Keys are
(worker rank, iteration), as the simulator runs every worker in one process; a simulated worker
*holds* its values right after its gradient, before any other worker computes.
"""

from __future__ import annotations

import math
import re
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any

from engine.errors import MetricError

# A short identifier-like name: safe in a CSV header, a URL segment and a chart title.
NAME_PATTERN = r"[A-Za-z_][A-Za-z0-9_./-]{0,63}"
NAME_MAX_CHARS = 64
MAX_NAMES = 32  # distinct names one process (so one run's code) may log
# Iterations sealed and not yet taken. A loop holds back a few (bounded delay: its delay + 1);
# rows that are never recorded (a stop) leave theirs behind, dropped oldest first past this.
MAX_SEALED = 1024

_NAME = re.compile(NAME_PATTERN)
_THIS_FILE = Path(__file__).resolve()
_Sums = dict[str, tuple[float, int]]  # name -> (sum, count) of the values logged


def is_name(text: object) -> bool:
    """Whether ``text`` can name a metric."""
    return isinstance(text, str) and _NAME.fullmatch(text) is not None


def check_name(name: object) -> str:
    """``name`` if it is a metric name, else a :class:`MetricError` saying what one is."""
    if not is_name(name):
        raise MetricError(f"psctl.log({_short(name)}, ...){_where()}: a metric name is a letter "
                          f"or _ then up to {NAME_MAX_CHARS - 1} letters, digits or _ . / -, "
                          f"such as 'grad_norm' or 'layer1/act_mean'")
    return str(name)


def check_value(name: str, value: object) -> float:
    """``value`` as a finite float, else a :class:`MetricError`."""
    number = None
    detach = getattr(value, "detach", None)
    if callable(detach):  # a tensor in the graph (the loss, say): its value, without a warning
        value = detach()
    if not isinstance(value, str | bytes | bytearray):  # float("1.5") would take text
        # float() takes numbers and numpy scalars; .item() a one-element array or tensor.
        for read in (value, getattr(value, "item", None)):
            try:
                number = float(read() if callable(read) else read)  # type: ignore[arg-type]
                break
            except (TypeError, ValueError, RuntimeError, OverflowError):
                continue
    if number is None:
        raise MetricError(f"psctl.log({name!r}, {_short(value)}){_where()}: the value must be one "
                          f"number (an int, a float, a numpy scalar or a one-element tensor), "
                          f"not {type(value).__name__}")
    if not math.isfinite(number):
        raise MetricError(f"psctl.log({name!r}, {number}){_where()}: the value must be finite; "
                          "log only where the metric is defined (math.isfinite)")
    return number


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _where() -> str:
    """`` at FILE line N``: the first frame outside psctl.log and this module (the user's)."""
    frame = sys._getframe(1)
    while frame is not None:
        path = Path(frame.f_code.co_filename)
        if path.resolve() != _THIS_FILE and path.parts[-2:] != ("psctl", "__init__.py"):
            return f" at {path.name} line {frame.f_lineno}"
        frame = frame.f_back  # type: ignore[assignment]
    return ""


def cut_to_caller(tb: TracebackType | None) -> TracebackType | None:
    """``tb`` without its innermost frames in this module: a refused call's traceback ends at
    the user's line that made it, as its report then says."""
    last_outside = None
    node = tb
    while node is not None:
        if Path(node.tb_frame.f_code.co_filename).resolve() != _THIS_FILE:
            last_outside = node
        node = node.tb_next
    if last_outside is None:
        return tb
    last_outside.tb_next = None
    return tb


class Collector:
    """One process's logged values. Locked: a gradient hook may run on autograd's own thread."""

    def __init__(self, max_names: int = MAX_NAMES, max_sealed: int = MAX_SEALED) -> None:
        self._lock = threading.Lock()
        self._max_names, self._max_sealed = max_names, max_sealed
        self._names: dict[str, None] = {}  # in first-logged order
        self._open: _Sums = {}
        self._held: dict[int, _Sums] = {}
        self._sealed: dict[tuple[int, int], _Sums] = {}  # insertion order: oldest first

    @property
    def names(self) -> list[str]:
        with self._lock:
            return list(self._names)

    def add(self, name: str, value: float) -> None:
        with self._lock:
            if name not in self._names:
                if len(self._names) >= self._max_names:
                    shown = ", ".join(self._names)
                    raise MetricError(f"psctl.log({name!r}, ...){_where()}: at most "
                                      f"{self._max_names} metric names per run, and these are "
                                      f"logged already: {shown}")
                self._names[name] = None
            total, count = self._open.get(name, (0.0, 0))
            self._open[name] = (total + value, count + 1)

    def take_open(self) -> dict[str, float]:
        """The means of what was logged since the last take, which starts afresh."""
        with self._lock:
            opened, self._open = self._open, {}
        return _means(opened)

    def hold(self, rank: int) -> None:
        """Simulated worker ``rank`` has computed: what was logged since is its."""
        with self._lock:
            opened, self._open = self._open, {}
            self._held[rank] = _merge(self._held.get(rank, {}), opened)

    def seal(self, rank: int, iteration: int) -> None:
        """Worker ``rank`` built iteration ``iteration``'s row: what it logged since is that
        iteration's, kept (even when nothing was logged) until the row is recorded."""
        with self._lock:
            held = self._held.pop(rank, None)
            if held is None:
                held, self._open = self._open, {}
            self._sealed.pop((rank, iteration), None)  # a repeated clock: the newest wins
            self._sealed[(rank, iteration)] = held
            while len(self._sealed) > self._max_sealed:
                del self._sealed[next(iter(self._sealed))]

    def take(self, rank: int, iteration: int) -> dict[str, float]:
        """The means of worker ``rank``'s values for ``iteration``: as sealed, or, for a row
        that was not (a loop that builds its own), all that was logged since the last take."""
        with self._lock:
            sealed = self._sealed.pop((rank, iteration), None)
            if sealed is None:
                sealed, self._open = self._open, {}
        return _means(sealed)


def _means(sums: _Sums) -> dict[str, float]:
    return {name: total / count for name, (total, count) in sums.items()}


def _merge(a: _Sums, b: _Sums) -> _Sums:
    out = dict(a)
    for name, (total, count) in b.items():
        was_total, was_count = out.get(name, (0.0, 0))
        out[name] = (was_total + total, was_count + count)
    return out


_collector: Collector | None = None
_users = 0  # the collecting() blocks open: in-process test clusters run roles as threads
_users_lock = threading.Lock()


def log(name: str, value: Any) -> None:
    """Check ``name`` and ``value`` and, in a process that collects, keep the value."""
    number = check_value(check_name(name), value)
    collector = _collector
    if collector is not None:
        collector.add(name, number)


def collector() -> Collector | None:
    """This process's collector, or None while nothing collects."""
    return _collector


@contextmanager
def collecting() -> Iterator[Collector]:
    """Collect what ``psctl.log`` is given in this process while inside. Blocks open at once
    (roles run as threads of one process, in tests) share one collector, which ends with the
    last of them; their keys keep workers apart, by rank."""
    global _collector, _users
    with _users_lock:
        if _collector is None:
            _collector = Collector()
        _users += 1
        collector = _collector
    try:
        yield collector
    finally:
        with _users_lock:
            _users -= 1
            if _users == 0:
                _collector = None


# Where this process collects, each does what the Collector's method of its name does; else
# nothing (and nothing was logged).


def seal(rank: int, iteration: int) -> None:
    if _collector is not None:
        _collector.seal(rank, iteration)


def hold(rank: int) -> None:
    if _collector is not None:
        _collector.hold(rank)


def take(rank: int, iteration: int) -> dict[str, float]:
    return {} if _collector is None else _collector.take(rank, iteration)


def take_open() -> dict[str, float]:
    return {} if _collector is None else _collector.take_open()
