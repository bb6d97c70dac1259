"""Blocking code on the virtual-time loop (engine.sim.green): waits yield to the other tasks, in
virtual time, and failures and cancellations cross in both directions."""

from __future__ import annotations

import asyncio

import pytest

from engine.sim.clock import run_virtual
from engine.sim.green import blocking, run_blocking, wait_for


def test_blocking_code_waits_in_virtual_time_beside_other_tasks() -> None:
    seen: list[tuple[str, float]] = []

    def sleeper(name: str, every: float) -> str:
        loop = asyncio.get_running_loop()
        for _ in range(3):
            wait_for(asyncio.sleep(every))
            seen.append((name, loop.time()))
        return name

    async def main() -> list[str]:
        return list(await asyncio.gather(run_blocking(lambda: sleeper("a", 1.0)),
                                         run_blocking(lambda: sleeper("b", 1.5))))

    assert run_virtual(main()) == ["a", "b"]
    assert seen == [("a", 1.0), ("b", 1.5), ("a", 2.0), ("b", 3.0), ("a", 3.0), ("b", 4.5)]


def test_an_awaited_failure_is_raised_in_the_blocking_code_and_its_own_comes_out() -> None:
    async def fails() -> None:
        await asyncio.sleep(1)
        raise KeyError("inner")

    def code() -> None:
        try:
            wait_for(fails())
        except KeyError:
            raise ValueError("outer") from None

    async def main() -> None:
        await run_blocking(code)

    with pytest.raises(ValueError, match="outer"):
        run_virtual(main())


def test_a_cancelled_task_unwinds_its_blocking_code() -> None:
    cleaned: list[float] = []

    def code() -> None:
        try:
            wait_for(asyncio.sleep(100))
        finally:  # a loop's end() may wait again while it unwinds
            wait_for(asyncio.sleep(1))
            cleaned.append(asyncio.get_running_loop().time())

    async def main() -> None:
        task = asyncio.ensure_future(run_blocking(code))
        await asyncio.sleep(5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    run_virtual(main())
    assert cleaned == [6.0]


def test_waiting_outside_blocking_code_is_refused() -> None:
    assert not blocking()
    with pytest.raises(RuntimeError, match="outside run_blocking"):
        wait_for(asyncio.sleep(0))
