"""The TCP transport over real loopback sockets: whole messages both ways, the handshake, the
limits, closing, and what a peer that breaks the rules gets."""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import pytest

from engine.errors import AuthenticationError, ConnectFailed, ConnectionClosed
from engine.transport import tcp
from engine.transport.admission import credential
from engine.transport.base import Connection, Message
from engine.transport.schemes import SchemeTransport
from engine.transport.tcp import TcpConnection, TcpTransport

SECRET = "run-secret-for-tests"
pytestmark = pytest.mark.timeout(30)


def serve(handler: Callable[[Connection], Awaitable[None]],
          script: Callable[[str], Awaitable[Any]], *, limit: int = 2**20) -> Any:
    """Run ``script(address)`` against a listener that hands connections to ``handler``."""
    async def main() -> Any:
        listener = await TcpTransport(limit).listen("127.0.0.1", 0, handler, token=SECRET)
        try:
            return await asyncio.wait_for(script(listener.address), 20)
        finally:
            await listener.close()
    return asyncio.run(main())


async def echo(connection: Connection) -> None:
    while True:
        try:
            message = await connection.recv()
        except ConnectionClosed:
            return
        await connection.send(message)


def test_binary_and_text_messages_arrive_whole_and_in_order() -> None:
    values = np.arange(700_000, dtype=np.float32)  # 2.8 MB: many socket reads and writes

    async def script(address: str) -> list[Message]:
        connection = await TcpTransport(2**23).connect(address, token=SECRET, timeout=5)
        sent: list[Any] = [memoryview(values), "héllo", b"", bytearray(b"\x01\x02"), b"x" * 70]
        for message in sent:
            await connection.send(message)
        got = [await connection.recv() for _ in sent]
        await connection.close()
        return got

    got = serve(echo, script, limit=2**23)
    np.testing.assert_array_equal(np.frombuffer(got[0], dtype=np.float32), values)
    assert got[1:] == ["héllo", b"", b"\x01\x02", b"x" * 70]


def test_the_handshake_admits_a_credential_as_its_role_and_refuses_a_wrong_one() -> None:
    admitted: list[str] = []

    async def handler(connection: Connection) -> None:
        admitted.append(str(connection.admission))
        await echo(connection)

    async def script(address: str) -> None:
        worker = await TcpTransport().connect(address, token=credential(SECRET, "worker", 3),
                                              timeout=5)
        await worker.send(b"ping")
        assert await worker.recv() == b"ping"
        await worker.close()
        with pytest.raises(AuthenticationError, match="refused our join token"):
            await TcpTransport().connect(address, token="not-it", timeout=5)

    serve(handler, script)
    assert admitted == ["worker 3"]


def test_a_message_over_the_limit_closes_the_connection_with_1009() -> None:
    seen: list[str] = []

    async def handler(connection: Connection) -> None:
        try:
            await connection.recv()
        except ConnectionClosed as exc:
            seen.append(str(exc))

    async def script(address: str) -> ConnectionClosed:
        connection = await TcpTransport(2**22).connect(address, token=SECRET, timeout=5)
        await connection.send(bytes(2**20 + 1))
        with pytest.raises(ConnectionClosed) as caught:
            await connection.recv()
        return caught.value

    closed = serve(handler, script, limit=2**20)
    assert closed.code == tcp.CLOSE_TOO_BIG
    assert f"a message of {2**20 + 1} bytes is over the limit of {2**20}" in str(closed)
    assert seen and "code 1009" in seen[0]


def test_close_tells_the_peer_the_code_and_reason() -> None:
    async def handler(connection: Connection) -> None:
        await connection.recv()
        await connection.close(4000, "done here")

    async def script(address: str) -> tuple[ConnectionClosed, ConnectionClosed]:
        connection = await TcpTransport().connect(address, token=SECRET, timeout=5)
        await connection.send(b"bye")
        with pytest.raises(ConnectionClosed) as first:
            await connection.recv()
        with pytest.raises(ConnectionClosed) as sending:
            await connection.send(b"more")
        return first.value, sending.value

    received, sending = serve(handler, script)
    assert received.code == 4000 and "(code 4000: done here)" in str(received)
    assert sending.code == 4000


def test_a_reader_that_stops_reading_holds_back_the_sender_and_loses_nothing() -> None:
    held: list[int] = []

    async def handler(connection: Connection) -> None:
        await gate.wait()
        assert isinstance(connection, TcpConnection)
        held.append(len(connection._messages))  # bounded while the sender was held back
        count = 0
        while True:
            try:
                message = await connection.recv()
            except ConnectionClosed:
                break
            assert message == bytes([count % 256]) * 65536
            count += 1
        held.append(count)

    async def script(address: str) -> bool:
        connection = await TcpTransport().connect(address, token=SECRET, timeout=5)

        async def flood() -> None:
            for index in range(300):  # 19.7 MB: more than the socket buffers hold
                await connection.send(bytes([index % 256]) * 65536)

        sender = asyncio.ensure_future(flood())
        await asyncio.sleep(1.0)
        blocked = not sender.done()
        gate.set()
        await asyncio.wait_for(sender, 10)
        await connection.close()
        return blocked

    gate = asyncio.Event()
    assert serve(handler, script) is True
    assert held[0] <= tcp.MAX_QUEUED_MESSAGES + 1
    assert held[1] == 300


def test_a_peer_that_never_says_who_it_is_is_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tcp, "HANDSHAKE_TIMEOUT_S", 0.3)

    async def handler(connection: Connection) -> None:  # never reached
        raise AssertionError("admitted without a credential")

    async def script(address: str) -> bytes:
        host, port = tcp.parse_address(address)
        reader, writer = await asyncio.open_connection(host, port)
        data = await asyncio.wait_for(reader.read(), 5)  # until the listener closes
        writer.close()
        return data

    said = serve(handler, script)
    kind, length = struct.unpack_from("<B3xQ", said)
    assert kind == tcp.CLOSE
    assert struct.unpack_from("<H", said, 12)[0] == tcp.CLOSE_REFUSED
    assert b"no credential within 0.3 s" in said[14:14 + length]


def test_a_huge_hello_is_refused_before_anything_is_allocated() -> None:
    async def handler(connection: Connection) -> None:
        raise AssertionError("admitted")

    async def script(address: str) -> int:
        host, port = tcp.parse_address(address)
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(struct.pack("<B3xQ", tcp.HELLO, 2**40))
        data = await asyncio.wait_for(reader.read(), 5)
        writer.close()
        return int(struct.unpack_from("<H", data, 12)[0])

    assert serve(handler, script) == tcp.CLOSE_TOO_BIG


def test_connect_failures_name_the_address() -> None:
    with socket.socket() as probe:  # a port that was free a moment ago and is closed now
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]

    async def attempt(address: str) -> str:
        with pytest.raises(ConnectFailed) as caught:
            await SchemeTransport().connect(address, token=SECRET, timeout=5)
        return str(caught.value)

    assert asyncio.run(attempt(f"tcp://127.0.0.1:{port}")).startswith(
        f"cannot connect to tcp://127.0.0.1:{port}: ")
    assert "no transport for scheme 'udp'" in asyncio.run(attempt("udp://127.0.0.1:1"))
    assert "is not a tcp://host:port address" in asyncio.run(attempt("tcp://127.0.0.1"))


def test_the_scheme_transport_listens_as_configured_and_connects_by_address() -> None:
    async def main() -> tuple[str, Message]:
        transport = SchemeTransport().listening("tcp")
        listener = await transport.listen("127.0.0.1", 0, echo, token=SECRET)
        try:
            connection = await transport.connect(listener.address, token=SECRET, timeout=5)
            await connection.send(b"over tcp")
            reply = await connection.recv()
            await connection.close()
        finally:
            await listener.close()
        return listener.address, reply

    address, reply = asyncio.run(main())
    assert address.startswith("tcp://127.0.0.1:") and reply == b"over tcp"


def test_closing_the_listener_closes_its_connections_with_1001() -> None:
    async def main() -> ConnectionClosed:
        listener = await TcpTransport().listen("127.0.0.1", 0, echo, token=SECRET)
        connection = await TcpTransport().connect(listener.address, token=SECRET, timeout=5)
        await listener.close()
        with pytest.raises(ConnectionClosed) as caught:
            await asyncio.wait_for(connection.recv(), 5)
        return caught.value

    closed = asyncio.run(main())
    assert closed.code == tcp.CLOSE_GOING_AWAY and "server shutting down" in str(closed)


def test_a_peer_that_does_not_read_leaves_at_most_one_piece_in_our_memory() -> None:
    # What the kernel will not take stays in the event loop's write buffer, in this process:
    # a shard server counts it in its reply budget, and it must stay small however much is sent.
    seen: list[int] = []
    message = bytes(8 * 2**20)

    async def handler(connection: Connection) -> None:
        assert isinstance(connection, TcpConnection)
        sending = asyncio.ensure_future(connection.send(message))
        for _ in range(100):  # 1 s: the sockets' buffers fill in a few ms
            seen.append(connection.unsent_bytes())
            await asyncio.sleep(0.01)
        assert not sending.done()  # still blocked: the peer reads nothing
        sending.cancel()
        await connection.close()

    async def script(address: str) -> None:
        host, port = tcp.parse_address(address)
        raw = socket.socket()
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        raw.setblocking(False)
        loop = asyncio.get_running_loop()
        await loop.sock_connect(raw, (host, port))
        hello = tcp.PREFACE + SECRET.encode()
        await loop.sock_sendall(raw, struct.pack("<B3xQ", tcp.HELLO, len(hello)) + hello)
        await asyncio.sleep(1.5)  # never read
        raw.close()

    serve(handler, script)
    assert max(seen) > 0  # it did back up
    assert max(seen) <= tcp.PIECE_BYTES
