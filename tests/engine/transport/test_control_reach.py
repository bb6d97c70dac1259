"""A role started before its coordinator listens keeps trying to reach it, within its timeout."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest

from engine.errors import LaunchError
from engine.transport.base import Connection
from engine.transport.control import _reach
from engine.transport.websocket import WebSocketTransport
from engine.wire.messages import Hello

TOKEN = "t" * 43
HELLO = Hello(role="worker", rank=3, pid=1)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_coordinator_that_starts_late_is_reached() -> None:
    port, transport = _free_port(), WebSocketTransport()

    async def scenario() -> None:
        async def handler(connection: Connection) -> None:
            await connection.close()

        async def listen_late() -> None:
            await asyncio.sleep(0.8)
            listener = await transport.listen("127.0.0.1", port, handler, token=TOKEN)
            await asyncio.sleep(2)
            await listener.close()

        late = asyncio.create_task(listen_late())
        connection = await _reach(transport, f"ws://127.0.0.1:{port}", HELLO, token=TOKEN,
                                  timeout=10)
        await connection.close()
        await late

    asyncio.run(scenario())


def test_nobody_listening_within_the_timeout_names_the_role_and_the_address() -> None:
    port = _free_port()
    started = time.monotonic()
    with pytest.raises(LaunchError, match=rf"worker 3 cannot reach the coordinator at "
                                          rf"ws://127.0.0.1:{port} within 2 s"):
        asyncio.run(_reach(WebSocketTransport(), f"ws://127.0.0.1:{port}", HELLO, token=TOKEN,
                           timeout=2))
    assert 1.5 < time.monotonic() - started < 5
