"""The simulated machine's processors: the CPU time of the run's processes, shared.

A local run's roles are processes of one machine: on two cores, four workers, a server and an
evaluator take turns, and a worker's batch lasts longer the more of them are busy. Each simulated
process does its CPU work (a gradient, sending or receiving a frame, applying a push, testing the
model) one piece after another, first come first served; the machine shares its ``cores``
between the processes that have work at the moment, each at ``min(1, cores / busy)`` of a core
(processor sharing: Linux's scheduler gives runnable processes equal shares), and more busy
processes than cores make each second of work cost more (``contention``: caches shared, more
switches; measured on this machine, ``engine.sim.calibrate``). ``cores = 0``: every process has a
core of its own (each role on a machine of its own).

Work pieces are given in seconds of one core; everything runs on the simulator's event loop, in
virtual time, deterministically (processes are visited in the order they were made).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

# A piece within this much of done is done (sums of shares never land on zero exactly).
_EPSILON_S = 1e-9


@dataclass
class _Piece:
    left_s: float
    done: Callable[[], None]


class Process:
    """One process's CPU work, in order."""

    def __init__(self, machine: Machine, name: str) -> None:
        self.machine, self.name = machine, name
        self._pieces: deque[_Piece] = deque()
        self.busy_s = 0.0  # CPU seconds of work done

    @property
    def busy(self) -> bool:
        return bool(self._pieces)

    def then(self, seconds: float, done: Callable[[], None]) -> None:
        """Queue ``seconds`` of work; ``done()`` is called, on the loop, when it is finished."""
        self.busy_s += max(seconds, 0.0)
        self.machine._add(self, _Piece(max(seconds, 0.0), done))

    async def work(self, seconds: float) -> None:
        """``seconds`` of work, after the work queued before it."""
        if seconds <= 0 and not self._pieces:
            return
        finished: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def done() -> None:
            if not finished.done():
                finished.set_result(None)
        self.then(seconds, done)
        await finished


class Machine:
    def __init__(self, cores: int, contention: float = 0.0) -> None:
        self.cores, self.contention = cores, contention
        self.loop = asyncio.get_running_loop()
        self._processes: list[Process] = []
        self._at = self.loop.time()  # when the shares were last applied
        self._timer: asyncio.TimerHandle | None = None
        self._due: _Piece | None = None  # the piece the timer is set for

    def process(self, name: str) -> Process:
        process = Process(self, name)
        self._processes.append(process)
        return process

    def _rate(self, busy: int) -> float:
        """The share of a core each busy process gets, in seconds of its work a second."""
        if self.cores <= 0 or busy <= self.cores:
            return 1.0
        crowding = busy / self.cores
        return 1.0 / crowding / (1.0 + self.contention * (crowding - 1.0))

    def _add(self, process: Process, piece: _Piece) -> None:
        self._advance()
        process._pieces.append(piece)
        self._schedule()

    def _advance(self) -> None:
        """Apply the shares since the last change to the pieces being worked on."""
        now = self.loop.time()
        elapsed, self._at = now - self._at, now
        busy = [p for p in self._processes if p._pieces]
        if elapsed <= 0 or not busy:
            return
        rate = self._rate(len(busy))
        for process in busy:
            process._pieces[0].left_s -= elapsed * rate

    def _schedule(self) -> None:
        """Finish the pieces that are done and set a timer for the next one to finish."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        finished: list[_Piece] = []
        for process in self._processes:
            while process._pieces and process._pieces[0].left_s <= _EPSILON_S:
                finished.append(process._pieces.popleft())
        busy = [p for p in self._processes if p._pieces]
        if busy:
            rate = self._rate(len(busy))
            self._due = min((p._pieces[0] for p in busy), key=lambda piece: piece.left_s)
            self._timer = self.loop.call_at(self._at + self._due.left_s / rate, self._tick)
        for piece in finished:
            piece.done()

    def _tick(self) -> None:
        self._timer = None
        self._advance()
        if self._due is not None:  # done now, whatever rounding left of it
            self._due.left_s = 0.0
        self._schedule()
