"""Websocket transport (the ``websockets`` library), with websockets' exceptions translated.

Per-message deflate is off: measured on this machine it made 1 MiB tensor frames about 100x
slower, and float gradients do not compress anyway. The join token travels in a request header
and a connection without it is refused with HTTP 401 before any frame is read.
"""

from __future__ import annotations

import asyncio
import http
from typing import Any

import websockets
from websockets.asyncio.client import ClientConnection, connect
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.http11 import Request, Response

from engine.errors import AuthenticationError, ConnectFailed, ConnectionClosed, TransportError
from engine.transport.admission import Admission, admit
from engine.transport.base import Handler, Message, PeerInfo, Sendable

TOKEN_HEADER = "X-Psctl-Token"
PING_INTERVAL_S = 30.0
# Peers can be busy in a long numpy or torch call; only a peer silent this long counts as gone.
PING_TIMEOUT_S = 120.0
CLOSE_TIMEOUT_S = 5.0


class WebSocketConnection(PeerInfo):
    def __init__(self, socket: ClientConnection | ServerConnection, remote: str,
                 admission: Admission | None = None) -> None:
        self._socket = socket
        self._remote = remote
        self._admission = admission

    async def send(self, message: Sendable) -> None:
        if isinstance(message, memoryview):
            # websockets 17 takes a typed memoryview's element count as its byte length.
            message = message.cast("B")
        try:
            await self._socket.send(message)
        except websockets.ConnectionClosed as exc:
            raise ConnectionClosed(_closed_reason(self._remote, exc), _close_code(exc)) from None

    async def recv(self) -> Message:
        try:
            return await self._socket.recv()
        except websockets.ConnectionClosed as exc:
            raise ConnectionClosed(_closed_reason(self._remote, exc), _close_code(exc)) from None

    def unsent_bytes(self) -> int:
        return self._socket.transport.get_write_buffer_size()

    async def close(self, code: int = 1000, reason: str = "") -> None:
        # websockets waits for the close frame to be written, which never happens while a peer
        # that stopped reading keeps the socket's buffers full: past the timeout, drop the TCP
        # connection instead.
        try:
            await asyncio.wait_for(self._socket.close(code, reason[:120]), CLOSE_TIMEOUT_S)
        except TimeoutError:
            self._socket.transport.abort()


class WebSocketListener:
    def __init__(self, server: Server, address: str) -> None:
        self._server = server
        self._address = address

    @property
    def address(self) -> str:
        return self._address

    async def close(self) -> None:
        self._server.close()
        await self._server.wait_closed()


class WebSocketTransport:
    def __init__(self, *, max_frame_bytes: int = 64 * 2**20, source: str | None = None) -> None:
        self.max_frame_bytes = max_frame_bytes
        # The local address outgoing connections leave from (a role bound to its node's
        # address); None: whatever the kernel picks.
        self.source = source

    async def listen(
        self, host: str, port: int, handler: Handler, *, token: str,
        max_message_bytes: int | None = None,
    ) -> WebSocketListener:
        admitted: dict[ServerConnection, Admission] = {}

        async def on_connect(socket: ServerConnection) -> None:
            peer = "{}:{}".format(*socket.remote_address[:2])
            admission = admitted.pop(socket)
            await handler(WebSocketConnection(socket, f"{peer} ({admission})", admission))

        def check_token(socket: ServerConnection, request: Request) -> Response | None:
            admission = admit(token, request.headers.get(TOKEN_HEADER, "")[:256])
            if admission is None:
                return socket.respond(http.HTTPStatus.UNAUTHORIZED, "missing or wrong credential\n")
            admitted[socket] = admission
            return None

        try:
            server = await serve(on_connect, host, port, process_request=check_token,
                                 **self._options(max_message_bytes))
        except OSError as exc:
            raise TransportError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
        bound = server.sockets[0].getsockname()
        return WebSocketListener(server, f"ws://{host}:{bound[1]}")

    async def connect(self, address: str, *, token: str, timeout: float) -> WebSocketConnection:
        try:
            socket = await asyncio.wait_for(
                connect(
                    address,
                    additional_headers={TOKEN_HEADER: token},
                    open_timeout=None,
                    **self._options(),
                    **self._source(),
                ),
                timeout,
            )
        except websockets.InvalidStatus as exc:
            if exc.response.status_code == http.HTTPStatus.UNAUTHORIZED:
                raise AuthenticationError(f"{address} refused our join token") from None
            raise ConnectFailed(f"{address} answered HTTP {exc.response.status_code}") from None
        except TimeoutError:
            raise ConnectFailed(f"no answer from {address} within {timeout:.0f} s") from None
        except (OSError, websockets.InvalidHandshake, websockets.InvalidURI) as exc:
            raise ConnectFailed(f"cannot connect to {address}: {exc}") from None
        return WebSocketConnection(socket, address)

    def _source(self) -> dict[str, Any]:
        return {} if self.source is None else {"local_addr": (self.source, 0)}

    def _options(self, max_message_bytes: int | None = None) -> dict[str, Any]:
        return {
            "compression": None,
            # websockets checks a frame's declared length against this before reading it
            "max_size": min(self.max_frame_bytes, max_message_bytes or self.max_frame_bytes),
            "ping_interval": PING_INTERVAL_S,
            "ping_timeout": PING_TIMEOUT_S,
        }


def _closed_reason(remote: str, exc: websockets.ConnectionClosed) -> str:
    close = exc.rcvd or exc.sent
    if close is None:
        return f"connection to {remote} was lost"
    reason = f": {close.reason}" if close.reason else ""
    return f"connection to {remote} closed (code {close.code}{reason})"


def _close_code(exc: websockets.ConnectionClosed) -> int | None:
    close = exc.rcvd or exc.sent
    return None if close is None else int(close.code)
