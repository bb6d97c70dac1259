"""The simulated machine's cores (engine.sim.cpu): processor sharing between busy processes,
first come first served within one."""

from __future__ import annotations

import asyncio

import pytest

from engine.sim.clock import run_virtual
from engine.sim.cpu import Machine


def ends(cores: int, work: dict[str, list[float]]) -> dict[str, float]:
    """When each process finishes its pieces, all queued at time 0."""
    async def main() -> dict[str, float]:
        machine = Machine(cores)
        loop = asyncio.get_running_loop()
        done: dict[str, float] = {}

        async def run(name: str, pieces: list[float]) -> None:
            process = machine.process(name)
            await asyncio.gather(*(process.work(s) for s in pieces))
            done[name] = loop.time()

        await asyncio.gather(*(run(name, pieces) for name, pieces in work.items()))
        return done

    result: dict[str, float] = run_virtual(main())
    return result


def test_processes_share_the_cores_equally_while_more_are_busy() -> None:
    # 4 busy on 2 cores: half a core each; d finishes its 0.5 at 1.0, then 3 share 2 cores.
    done = ends(2, {"a": [1.0], "b": [1.0], "c": [1.0], "d": [0.5]})
    assert done["d"] == pytest.approx(1.0)
    assert done["a"] == done["b"] == done["c"] == pytest.approx(1.0 + 0.5 / (2 / 3))


def test_no_more_busy_processes_than_cores_each_runs_at_full_speed() -> None:
    assert ends(2, {"a": [1.0], "b": [0.25]}) == pytest.approx({"a": 1.0, "b": 0.25})


def test_a_process_does_its_pieces_one_after_another() -> None:
    assert ends(4, {"a": [0.5, 0.5, 1.0]})["a"] == pytest.approx(2.0)


def test_no_cores_given_every_process_has_one_of_its_own() -> None:
    assert ends(0, {name: [1.0] for name in "abcdef"}) == pytest.approx(
        {name: 1.0 for name in "abcdef"})


def test_busy_time_is_counted() -> None:
    async def main() -> float:
        process = Machine(1).process("p")
        await process.work(0.25)
        await process.work(0.5)
        return process.busy_s

    assert run_virtual(main()) == pytest.approx(0.75)
