"""Blocking code on the simulator's event loop: a worker loop, written once for real processes,
runs here unchanged.

A real worker loop blocks: it waits for a pull's answer, sleeps out a slow batch. In the
simulator every role shares one thread and one virtual-time event loop, so a blocking call must
let the others run instead of stopping the thread. ``run_blocking(fn)`` runs ``fn`` in a
greenlet (the ``greenlet`` package: the same switch SQLAlchemy's asyncio layer uses to run its
synchronous core on an event loop); inside it, ``wait_for(awaitable)`` switches back to the
event loop's task, which awaits on its behalf and switches back with the result. No thread is
involved: what runs, and in which order, is decided by the event loop alone, so simulated runs
stay deterministic.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

import greenlet

T = TypeVar("T")


class _Blocking(greenlet.greenlet):  # type: ignore[misc]  # greenlet ships no typed base
    """A greenlet running blocking code for a task of the event loop."""


async def run_blocking(fn: Callable[[], T]) -> T:
    """Run ``fn`` to its end; each ``wait_for`` inside it is awaited here, on the loop."""
    child = _Blocking(fn, greenlet.getcurrent())
    request = child.switch()
    while not child.dead:
        try:
            value = await request
        except BaseException as exc:  # the awaited failed (or the task was cancelled): raise there
            request = child.throw(exc)
        else:
            request = child.switch(value)
    return cast(T, request)


def wait_for(awaitable: Awaitable[T]) -> T:
    """Block the calling blocking code until ``awaitable`` is done: the event loop runs the
    other roles meanwhile. Only inside ``run_blocking``."""
    current = greenlet.getcurrent()
    if not isinstance(current, _Blocking):
        raise RuntimeError("wait_for outside run_blocking: nothing would run the event loop")
    return cast(T, current.parent.switch(awaitable))


def blocking() -> bool:
    """Is the caller blocking code run by ``run_blocking``?"""
    return isinstance(greenlet.getcurrent(), _Blocking)


def pending(value: Any) -> bool:
    """Is ``value`` something ``wait_for`` can take?"""
    return hasattr(value, "__await__")
