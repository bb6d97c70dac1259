"""The simulator's transport (engine.sim.transport): a message costs its sender's CPU, crosses
the links, costs its receiver's CPU, and only then is received; in order, to the end."""

from __future__ import annotations

import asyncio

import pytest

from engine.errors import AuthenticationError, ConnectionClosed
from engine.sim.clock import run_virtual
from engine.sim.cpu import Machine
from engine.sim.network import link_of
from engine.sim.transport import Endpoint, VirtualNetwork
from engine.transport.admission import credential
from engine.transport.base import Connection, Message

SECRET = "secret"


def per_byte(sending: bool, message: Message) -> float:
    return (0.001 if sending else 0.002) * len(message)  # 1 ms a byte out, 2 ms in


async def pair(network: VirtualNetwork, machine: Machine, spec: str | None,
               inbox: asyncio.Queue[tuple[float, bytes | str]],
               token: str = SECRET) -> Connection:
    loop = asyncio.get_running_loop()
    server = Endpoint("server", machine.process("server"), link_of(spec), per_byte)
    client = Endpoint("client", machine.process("client"), link_of(spec), per_byte)

    async def handler(connection: Connection) -> None:
        while True:
            try:
                message = await connection.recv()
                inbox.put_nowait((loop.time(), message))
            except ConnectionClosed as exc:
                inbox.put_nowait((loop.time(), f"closed: {exc}"))
                return

    listener = await network.transport(server).listen("server", 0, handler, token=SECRET)
    return await network.transport(client).connect(listener.address, token=token, timeout=1)


def test_a_message_costs_both_ends_and_the_link() -> None:
    async def main() -> list[tuple[float, bytes | str]]:
        inbox: asyncio.Queue[tuple[float, bytes | str]] = asyncio.Queue()
        # 8 kbit/s: 1000 bytes per second each side; 10 ms latency
        connection = await pair(VirtualNetwork(), Machine(0), "8kbit:10ms", inbox)
        await connection.send(b"x" * 100)  # 0.1 s of CPU, then 0.1 s on the link
        await connection.send(b"y" * 10)
        await connection.close()
        return [await inbox.get() for _ in range(3)]

    (first_at, first), (second_at, second), (_, closed) = run_virtual(main())
    # sent at 0.1 (CPU), on the link until 0.2, +10 ms, then 0.2 s of the receiver's CPU
    assert first == b"x" * 100 and first_at == pytest.approx(0.1 + 0.1 + 0.01 + 0.2)
    # the second: 0.01 s more of the sender's CPU (from 0.1), 0.01 s link, then behind the
    # first in the receiver's CPU
    assert second == b"y" * 10 and second_at == pytest.approx(first_at + 0.02)
    assert isinstance(closed, str) and closed.startswith("closed")


def test_the_listener_admits_as_a_real_one_does() -> None:
    async def main() -> str | None:
        inbox: asyncio.Queue[tuple[float, bytes | str]] = asyncio.Queue()
        connection = await pair(VirtualNetwork(), Machine(0), None, inbox,
                                token=credential(SECRET, "worker", 3))
        await connection.send(b"hello")
        await inbox.get()
        return None

    run_virtual(main())

    async def refused() -> None:
        inbox: asyncio.Queue[tuple[float, bytes | str]] = asyncio.Queue()
        await pair(VirtualNetwork(), Machine(0), None, inbox, token="wrong")

    with pytest.raises(AuthenticationError):
        run_virtual(refused())
