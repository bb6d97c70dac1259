"""Real connections shaped to a link (engine.transport.shaping): the same rules as the
simulator's links, in wall time, over both transports on loopback."""

from __future__ import annotations

import asyncio
import time

import pytest

from engine.transport.admission import Admission, credential
from engine.transport.base import Connection, Transport
from engine.transport.shaping import LOOPBACK, LinkShaper, parse_network, shaped
from engine.transport.tcp import TcpTransport
from engine.transport.websocket import WebSocketTransport

SECRET = "run-secret-for-tests"
pytestmark = pytest.mark.timeout(60)


class Clock:
    def __init__(self) -> None:
        self.at = 0.0

    def __call__(self) -> float:
        return self.at


def test_a_sender_waits_out_its_own_side_first_come_first_served(
        monkeypatch: pytest.MonkeyPatch) -> None:
    clock, slept = Clock(), []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock.at += seconds

    monkeypatch.setattr(asyncio, "sleep", sleep)
    shaper = LinkShaper(parse_network("8kbit:1s"), clock)  # 1000 bytes a second
    asyncio.run(shaper.sending(500))
    asyncio.run(shaper.sending(250))
    assert slept == [pytest.approx(0.5), pytest.approx(0.25)]
    # the receiving side: from the first byte's departure (0.5 s before it arrived, at the
    # peer's bandwidth) at its own rate, plus the larger latency
    peer = parse_network("8kbit:2s")
    asyncio.run(shaper.received(500, peer))
    assert slept[-1] == pytest.approx(2.0)
    fast = LinkShaper(parse_network("800kbit:0s"), clock)  # 100,000 bytes a second
    asyncio.run(fast.received(1000, parse_network("8kbit:0s")))
    assert slept[-1] == pytest.approx(2.0)  # nothing more: the sender's side was the slower


def roundtrip_s(transport: Transport, size: int, network: str) -> tuple[float, float]:
    """(one message of ``size`` bytes from a shaped client to a shaped server, the reply of the
    same size back), each in wall seconds."""
    model = parse_network(network)

    async def main() -> tuple[float, float]:
        arrived: asyncio.Queue[float] = asyncio.Queue()

        async def echo(connection: Connection) -> None:
            message = await connection.recv()
            arrived.put_nowait(time.monotonic())
            await connection.send(message)

        def worker_peer(admission: Admission | None) -> object:
            return model if admission is not None and admission.role == "worker" else None

        server = shaped(transport, model, worker_peer)  # type: ignore[arg-type]
        client = shaped(transport, model, lambda admission: model)
        listener = await server.listen("127.0.0.1", 0, echo, token=SECRET)
        try:
            connection = await client.connect(listener.address, token=credential(
                SECRET, "worker", 0), timeout=10)
            began = time.monotonic()
            await connection.send(bytes(size))
            there = await arrived.get()
            await connection.recv()
            back = time.monotonic()
            await connection.close()
            return there - began, back - there
        finally:
            await listener.close()

    return asyncio.run(main())


@pytest.mark.parametrize("transport", [TcpTransport(), WebSocketTransport()],
                         ids=["tcp", "websocket"])
def test_a_shaped_message_takes_its_bytes_over_the_bandwidth_plus_the_latency(
        transport: Transport) -> None:
    there, back = roundtrip_s(transport, 500_000, "40mbit:20ms")  # 0.1 s of bytes
    for took in (there, back):
        assert took >= 0.1 + 0.02 - 0.002  # what shaping must add (timers are ms-grained)
        assert took < 0.1 + 0.02 + 0.25  # and not much more (a busy machine's slack)


def test_connections_whose_peer_is_not_the_data_plane_are_left_alone() -> None:
    assert shaped(TcpTransport(), None, lambda admission: LOOPBACK).__class__ is TcpTransport
