"""In-process transport for fast tests: the same semantics as websockets, no sockets.

Each endpoint belongs to the event loop that created it; a send hands the message to the peer's
loop thread-safely, so a server and its clients may run on different threads' loops. Payloads are
copied on send, as a real socket would, so no side can see the other's later writes.
"""

from __future__ import annotations

import asyncio
import itertools

from engine.errors import AuthenticationError, ConnectFailed, ConnectionClosed
from engine.transport.admission import Admission, admit
from engine.transport.base import Handler, Message, PeerInfo, Sendable


class _Closed:
    """The close marker, queued behind every message sent before it: a peer that sends its
    last message and closes is read to the end, as over a socket."""

    def __init__(self, reason: str, code: int) -> None:
        self.reason, self.code = reason, code


class MemoryConnection(PeerInfo):
    def __init__(self, remote: str, admission: Admission | None = None) -> None:
        self._remote = remote
        self._admission = admission
        self._loop = asyncio.get_running_loop()
        self._inbox: asyncio.Queue[object] = asyncio.Queue()
        self._peer: MemoryConnection | None = None
        self._closed_reason: str | None = None
        self._close_code: int | None = None
        # Set from the peer's thread when it closes: sends fail at once, while reads go on
        # until the marker, so nothing it sent before closing is lost.
        self._peer_closed: _Closed | None = None

    def _deliver(self, item: object) -> None:
        self._loop.call_soon_threadsafe(self._inbox.put_nowait, item)

    async def send(self, message: Sendable) -> None:
        if self._closed_reason is not None or self._peer is None:
            raise ConnectionClosed(self._closed_reason or f"connection to {self._remote} closed",
                                   self._close_code)
        if self._peer_closed is not None:
            raise ConnectionClosed(self._peer_closed.reason, self._peer_closed.code)
        self._peer._deliver(message if isinstance(message, str) else bytes(message))

    async def recv(self) -> Message:
        if self._closed_reason is not None and self._inbox.empty():
            raise ConnectionClosed(self._closed_reason, self._close_code)
        item = await self._inbox.get()
        if isinstance(item, _Closed):
            if self._closed_reason is None:
                self._closed_reason, self._close_code = item.reason, item.code
            raise ConnectionClosed(self._closed_reason, self._close_code)
        assert isinstance(item, bytes | str)
        return item

    def unsent_bytes(self) -> int:
        return 0  # delivered at once, into the peer's inbox

    async def close(self, code: int = 1000, reason: str = "") -> None:
        if self._closed_reason is None:
            self._closed_reason = f"connection to {self._remote} closed (code {code}: {reason})"
            self._close_code = code
            self._deliver(_Closed(self._closed_reason, code))
            if self._peer is not None:
                marker = _Closed(
                    f"connection to {self._peer.remote} closed (code {code}: {reason})", code)
                self._peer._peer_closed = marker
                self._peer._deliver(marker)


class MemoryListener:
    def __init__(self, transport: MemoryTransport, address: str) -> None:
        self._transport = transport
        self._address = address

    @property
    def address(self) -> str:
        return self._address

    async def close(self) -> None:
        self._transport._listeners.pop(self._address, None)


class MemoryTransport:
    """Share one instance between all parties that should reach each other."""

    def __init__(self) -> None:
        self._listeners: dict[str, tuple[asyncio.AbstractEventLoop, Handler, str]] = {}
        self._ports = itertools.count(1)

    async def listen(self, host: str, port: int, handler: Handler, *, token: str,
                     max_message_bytes: int | None = None) -> MemoryListener:
        # Messages are whole Python objects here: nothing is allocated from a declared size.
        address = f"mem://{host}:{port or next(self._ports)}"
        self._listeners[address] = (asyncio.get_running_loop(), handler, token)
        return MemoryListener(self, address)

    async def connect(self, address: str, *, token: str, timeout: float) -> MemoryConnection:
        try:
            loop, handler, expected = self._listeners[address]
        except KeyError:
            raise ConnectFailed(f"cannot connect to {address}: nothing listens there") from None
        admission = admit(expected, token)
        if admission is None:
            raise AuthenticationError(f"{address} refused our join token")
        client = MemoryConnection(address)
        accepted: asyncio.Future[MemoryConnection] = asyncio.get_running_loop().create_future()
        client_loop = asyncio.get_running_loop()

        async def accept() -> None:
            server_side = MemoryConnection(f"memory-client ({admission})", admission)
            server_side._peer, client._peer = client, server_side
            client_loop.call_soon_threadsafe(accepted.set_result, server_side)
            await handler(server_side)

        asyncio.run_coroutine_threadsafe(accept(), loop)
        try:
            await asyncio.wait_for(accepted, timeout)
        except TimeoutError:
            raise ConnectFailed(f"no answer from {address} within {timeout:.0f} s") from None
        return client
