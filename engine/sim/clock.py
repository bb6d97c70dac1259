"""An asyncio event loop whose clock is virtual: when nothing is ready to run, time jumps to the
next timer instead of waiting for it. Coroutines written against asyncio (sleep, wait_for,
queues, futures) run unchanged, in virtual-time order, and deterministically: one thread, no
sockets, callbacks at equal times in the order they were scheduled."""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Mapping
from typing import Any

from engine.errors import RunFailed


class Deadlock(RunFailed):
    """Every simulated role waits and no timer is left: the run can never go on."""


class _VirtualSelector(selectors.BaseSelector):
    """Never waits: a select with a timeout moves the clock to its end; without one, nothing
    could ever wake the loop, which is a deadlock of the simulated roles."""

    def __init__(self, loop: VirtualTimeLoop) -> None:
        self._loop = loop
        self._keys: dict[int, selectors.SelectorKey] = {}

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        key = selectors.SelectorKey(fileobj, fd, events, data)
        self._keys[fd] = key
        return key

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        return self._keys.pop(fd)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None:
            raise Deadlock("the simulated cluster is deadlocked: every role waits and no timer "
                           "is pending (a consistency model that can never release a pull?)")
        self._loop.advance(max(timeout, 0.0))
        return []

    def get_map(self) -> Mapping[Any, selectors.SelectorKey]:
        return dict(self._keys)

    def close(self) -> None:
        self._keys.clear()


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        self._virtual_now = 0.0
        super().__init__(selector=_VirtualSelector(self))

    def time(self) -> float:
        return self._virtual_now

    def advance(self, seconds: float) -> None:
        self._virtual_now += seconds


def run_virtual(main: Any) -> Any:
    """Run the coroutine ``main`` to completion on a fresh virtual-time loop."""
    loop = VirtualTimeLoop()
    try:
        return loop.run_until_complete(main)
    finally:
        # As asyncio.run does: what a failed run left in flight (a loop's prefetched pull) is
        # cancelled and let finish, so that nothing is destroyed pending.
        left = asyncio.all_tasks(loop)
        for task in left:
            task.cancel()
        if left:
            loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
        loop.close()
