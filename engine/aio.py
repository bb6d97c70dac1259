"""An asyncio event loop on a background thread, for processes whose main thread computes.

Workers and the evaluator run torch on the main thread; their network I/O (parameter client and
control channel) shares one ``LoopThread`` so that communication proceeds while torch computes.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from engine.errors import RequestTimeout

T = TypeVar("T")


class LoopThread:
    def __init__(self, name: str = "psctl-io") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def call(self, coro: Coroutine[Any, Any, T], timeout: float, what: str = "operation") -> T:
        """Run ``coro`` on the loop and wait for it; RequestTimeout after ``timeout`` seconds."""
        future = self.submit(coro)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise RequestTimeout(f"{what} did not complete within {timeout:.1f} s") from None

    def stop(self, timeout: float = 5.0) -> None:
        if self._thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout)
