"""An asyncio event loop on a background thread, for processes whose main thread computes.

Workers and the evaluator run torch on the main thread; their network I/O (parameter client and
control channel) shares one ``LoopThread`` so that communication proceeds while torch computes.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import sys
import threading
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, Protocol, TypeVar

from engine.errors import RequestTimeout

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)

# While work runs on a thread beside an event loop, the thread is asked to hand the GIL back
# every millisecond rather than every 5 (Python's default): numpy keeps the GIL between its
# calls, so with 5 ms slices the loop would wait up to 5 ms for each (bench/zipline.py).
OFF_LOOP_SWITCH_S = 0.001
_switch_lock = threading.Lock()
_switch_users = 0
_switch_saved = sys.getswitchinterval()


async def off_loop(work: Callable[[], T]) -> T:
    """Run ``work`` on a worker thread; the loop goes on meanwhile."""
    with _short_switches():
        return await asyncio.to_thread(work)


@contextlib.contextmanager
def _short_switches() -> Iterator[None]:
    global _switch_users, _switch_saved
    with _switch_lock:
        if _switch_users == 0:
            _switch_saved = sys.getswitchinterval()
            sys.setswitchinterval(min(_switch_saved, OFF_LOOP_SWITCH_S))
        _switch_users += 1
    try:
        yield
    finally:
        with _switch_lock:
            _switch_users -= 1
            if _switch_users == 0:
                sys.setswitchinterval(_switch_saved)


class Pending(Protocol[T_co]):
    """A coroutine submitted to an ``IO``: a ``concurrent.futures.Future`` or an asyncio task."""

    def done(self) -> bool: ...

    def cancel(self) -> bool: ...


class IO(Protocol):
    """Where a client's network I/O runs, and how its caller waits for it: a ``LoopThread`` in a
    real process (the caller blocks its thread), the simulator's event loop in virtual time
    (``engine.sim.runtime.VirtualIO``: the caller's greenlet yields to the other roles)."""

    def submit(self, coro: Coroutine[Any, Any, T]) -> Pending[T]: ...

    def result(self, pending: Pending[T], timeout: float) -> T:
        """``pending``'s result; cancelled and ``TimeoutError`` after ``timeout`` seconds."""
        ...

    def call(self, coro: Coroutine[Any, Any, T], timeout: float, what: str = "operation") -> T:
        """Run ``coro`` and wait for it; ``RequestTimeout`` naming ``what`` after ``timeout``."""
        ...


class LoopThread:
    def __init__(self, name: str = "psctl-io") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def result(self, pending: Pending[T], timeout: float) -> T:
        assert isinstance(pending, concurrent.futures.Future)
        try:
            result: T = pending.result(timeout)
            return result
        except concurrent.futures.TimeoutError:
            pending.cancel()
            raise TimeoutError from None

    def call(self, coro: Coroutine[Any, Any, T], timeout: float, what: str = "operation") -> T:
        """Run ``coro`` on the loop and wait for it; RequestTimeout after ``timeout`` seconds."""
        try:
            return self.result(self.submit(coro), timeout)
        except TimeoutError:
            raise RequestTimeout(f"{what} did not complete within {timeout:.1f} s") from None

    def stop(self, timeout: float = 5.0) -> None:
        if self._thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout)
