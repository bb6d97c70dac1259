"""The in-process transport keeps a socket's order: what a peer sent before it closed is read
before the close, even when the two sides run on different threads' loops."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from engine.aio import LoopThread
from engine.errors import ConnectionClosed
from engine.transport import MemoryTransport
from engine.transport.base import Connection

TOKEN = "secret"


def test_messages_sent_just_before_a_close_are_read_before_it() -> None:
    """The server's loop is busy while the client sends its last messages and closes: the
    deliveries and the close wait in that loop's queue, and the reader must see them in order
    (a worker's last report once vanished so, and its run waited 30 s for a restart)."""
    transport = MemoryTransport()
    server_loop, client_loop = LoopThread("test-server"), LoopThread("test-client")
    client_done = threading.Event()
    received: list[object] = []

    async def handler(connection: Connection) -> None:
        await asyncio.sleep(0)
        client_done.wait(10)  # the loop is held: nothing queued to it runs meanwhile
        try:
            while True:
                received.append(await connection.recv())
        except ConnectionClosed as closed:
            received.append(closed.code)

    async def client(address: str) -> None:
        connection = await transport.connect(address, token=TOKEN, timeout=5)
        for message in (b"first", "second", b"last"):
            await connection.send(message)
        await connection.close(1000, "done")
        client_done.set()

    try:
        listener = server_loop.call(transport.listen("127.0.0.1", 0, handler, token=TOKEN), 5)
        client_loop.call(client(listener.address), 5)
        deadline = time.monotonic() + 10
        while len(received) < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert received == [b"first", "second", b"last", 1000]
    finally:
        server_loop.stop()
        client_loop.stop()


def test_a_send_to_a_closed_peer_fails_at_once() -> None:
    async def scenario() -> None:
        transport = MemoryTransport()
        accepted: asyncio.Queue[Connection] = asyncio.Queue()

        async def handler(connection: Connection) -> None:
            await accepted.put(connection)
            await asyncio.sleep(1)

        listener = await transport.listen("127.0.0.1", 0, handler, token=TOKEN)
        client = await transport.connect(listener.address, token=TOKEN, timeout=5)
        server_side = await asyncio.wait_for(accepted.get(), 5)
        await server_side.close(4000, "gone")
        with pytest.raises(ConnectionClosed) as closed:
            await client.send(b"late")
        assert closed.value.code == 4000 and "gone" in str(closed.value)
        with pytest.raises(ConnectionClosed):
            await client.recv()

    asyncio.run(scenario())
