from __future__ import annotations

import asyncio
import time

import pytest

from engine.sim.clock import Deadlock, run_virtual


def test_time_jumps_to_the_next_timer_in_order() -> None:
    async def main() -> list[tuple[float, str]]:
        loop, seen = asyncio.get_running_loop(), []

        async def tick(name: str, every: float) -> None:
            for _ in range(3):
                await asyncio.sleep(every)
                seen.append((round(loop.time(), 9), name))

        await asyncio.gather(tick("a", 100.0), tick("b", 70.0))
        return seen

    began = time.monotonic()
    seen = run_virtual(main())
    assert time.monotonic() - began < 1.0  # 300 virtual seconds, no real waiting
    assert seen == [(70.0, "b"), (100.0, "a"), (140.0, "b"), (200.0, "a"), (210.0, "b"),
                    (300.0, "a")]


def test_timeouts_are_virtual() -> None:
    async def main() -> float:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(asyncio.Event().wait(), 3600)
        return asyncio.get_running_loop().time()

    assert run_virtual(main()) == pytest.approx(3600)


def test_waiting_forever_is_a_deadlock_not_a_hang() -> None:
    async def main() -> None:
        await asyncio.Event().wait()

    with pytest.raises(Deadlock, match="deadlocked"):
        run_virtual(main())


def test_tasks_left_in_flight_are_cancelled_not_destroyed_pending() -> None:
    cancelled = []

    async def straggler() -> None:
        try:
            await asyncio.sleep(1e6)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    async def main() -> None:
        left = asyncio.ensure_future(straggler())
        await asyncio.sleep(1)
        assert not left.done()
        raise RuntimeError("the run failed")

    with pytest.raises(RuntimeError):
        run_virtual(main())
    assert cancelled == [True]
