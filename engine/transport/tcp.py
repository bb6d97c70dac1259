"""A plain TCP transport for the data plane: length-prefixed messages, no copy to spare.

Websockets costs the data plane copies that its protocol makes necessary: a client masks every
frame (a copy), the frame is serialised into a fresh buffer (a copy), the receiver appends what
the socket gives it to a stream buffer and slices each frame out of it (two copies), and the
3.11 event loop's send buffer shifts its remainder after every partial write. Here a message is
a 12-byte header (kind, length) and its body: the body is received straight into the buffer that
``recv`` returns (``asyncio.BufferedProtocol``) and sent from the caller's own buffer, in pieces
that the socket takes as they are, so a payload is copied once per hop, by the kernel.

The handshake is a HELLO carrying the credential (``engine.transport.admission``), answered by
WELCOME or by a CLOSE with code 4401. Messages are bounded (``max_frame_bytes``; 1 KiB before
admission), so is the queue of unread messages (reading pauses beyond it) and the bytes waiting
to be sent: ``send`` hands the socket one piece at a time and waits until the event loop's buffer
is empty before the next, so what a connection keeps in user space beyond the caller's message is
at most one piece (``unsent_bytes`` says how much). Liveness: TCP keepalive, about two minutes
for a silent peer, as the websocket transport's pings.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from engine.errors import AuthenticationError, ConnectFailed, ConnectionClosed, TransportError
from engine.transport.admission import Admission, admit
from engine.transport.base import Handler, Message, PeerInfo, Sendable

log = logging.getLogger(__name__)

SCHEME = "tcp"
PREFACE = b"psctl-tcp/1 "
_HEAD = struct.Struct("<B3xQ")  # kind, body length
BINARY, TEXT, CLOSE, HELLO, WELCOME = range(5)
_CLOSE_HEAD = struct.Struct("<H")
CLOSE_REFUSED = 4401
CLOSE_PROTOCOL = 1002
CLOSE_TOO_BIG = 1009
CLOSE_GOING_AWAY = 1001
HANDSHAKE_BYTES = 1024
HANDSHAKE_TIMEOUT_S = 10.0
CLOSE_TIMEOUT_S = 5.0
MAX_QUEUED_MESSAGES = 16
# A piece is written only once the event loop's write buffer is empty (pause above 0 bytes,
# resume at 0): the kernel takes what fits in the socket and the 3.11 loop copies the rest into
# its buffer, so a connection holds at most one piece in user space beyond its caller's message.
# With the old limits (pause above 1 MiB, 1 MiB pieces) 15 connections that did not read held
# 22.9 MB there, outside every count, and kept it for 5 s after the server gave them up.
PIECE_BYTES = 1 << 18
WRITE_HIGH_BYTES = WRITE_LOW_BYTES = 0
# Probes after 30 s of silence, nine of them 10 s apart (Linux names; skipped where absent).
KEEPALIVE = ((getattr(socket, "TCP_KEEPIDLE", None), 30),
             (getattr(socket, "TCP_KEEPINTVL", None), 10),
             (getattr(socket, "TCP_KEEPCNT", None), 9))


class _Stream(asyncio.BufferedProtocol):
    """One connection's bytes: reads each message's body into its own buffer, queues whole
    messages (bounded: reading pauses beyond ``MAX_QUEUED_MESSAGES``) and tracks write
    backpressure."""

    def __init__(self, limit: int, on_message: Callable[[_Stream, int, bytearray], None]) -> None:
        self.limit = HANDSHAKE_BYTES  # until admitted
        self._after_handshake = limit
        self._on_message = on_message
        self.transport: asyncio.Transport | None = None
        self._head = bytearray(_HEAD.size)
        self._body: bytearray | None = None
        self._kind = BINARY
        self._got = 0
        self._skip = 0  # bytes of a message being dropped
        self._scratch: bytearray | None = None  # made when a message is dropped: rare
        self.closing = False  # our CLOSE is sent
        self.failed: ConnectionClosed | None = None  # why we closed, if the stream did
        self.on_fail: Callable[[ConnectionClosed], None] | None = None
        self.is_admitted = False
        self.lost = asyncio.get_running_loop().create_future()
        self._writable: asyncio.Future[None] | None = None

    def admitted(self) -> None:
        self.limit = self._after_handshake
        self.is_admitted = True

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.set_write_buffer_limits(high=WRITE_HIGH_BYTES, low=WRITE_LOW_BYTES)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            for option, value in KEEPALIVE:
                if option is not None:
                    sock.setsockopt(socket.IPPROTO_TCP, option, value)

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._skip:
            if self._scratch is None:
                self._scratch = bytearray(1 << 16)
            return memoryview(self._scratch)[:min(self._skip, len(self._scratch))]
        # Never past the current message: its body lands in its own buffer, whole.
        target = self._head if self._body is None else self._body
        return memoryview(target)[self._got:]

    def buffer_updated(self, nbytes: int) -> None:
        if self._skip:
            self._skip -= nbytes
            return
        self._got += nbytes
        if self._body is None:
            if self._got < _HEAD.size:
                return
            self._kind, length = _HEAD.unpack(self._head)
            self._got = 0
            if self.closing and self._kind != CLOSE:  # after our close only the peer's counts
                self._skip = length
                return
            if length > self.limit:
                self.fail(CLOSE_TOO_BIG, f"a message of {length} bytes is over the limit of "
                                         f"{self.limit}")
                self._skip = length
                return
            self._body = bytearray(length)
            if length:
                return
        elif self._got < len(self._body):
            return
        body, self._body, self._got = self._body, None, 0
        self._on_message(self, self._kind, body)

    def fail(self, code: int, reason: str) -> None:
        """Tell the peer why and close: at once if we had said so already (this is the peer's
        answer, or it went on regardless), else once it answers or ``CLOSE_TIMEOUT_S`` is up."""
        if self.transport is None or self.transport.is_closing():
            return
        if self.closing:
            self.transport.close()
            return
        self.failed = ConnectionClosed(f"closed (code {code}: {reason})", code)
        if not self.is_admitted:  # a stranger gets our reason, not our patience
            self.transport.write(close_message(code, reason))
            self.transport.close()
            return
        self.begin_close(close_message(code, reason))
        if self.on_fail is not None:
            self.on_fail(self.failed)

    def begin_close(self, message: bytes) -> None:
        """Send our CLOSE and read on (dropping all but the peer's CLOSE) until the peer closes:
        closing the socket with its bytes unread would reset the connection, and the peer
        would lose our CLOSE."""
        assert self.transport is not None
        self.closing = True
        self.transport.write(message)
        loop = asyncio.get_running_loop()
        loop.call_later(CLOSE_TIMEOUT_S, self._give_up, self.transport)

    @staticmethod
    def _give_up(transport: asyncio.Transport) -> None:
        if not transport.is_closing():
            transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        # The connection and this stream refer to each other: a part-read body must not wait
        # for the garbage collector.
        self.on_fail, self._body = None, None
        if not self.lost.done():
            self.lost.set_result(None)
        self._wake_writer()

    def pause_writing(self) -> None:
        if self._writable is None:
            self._writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        self._wake_writer()

    def _wake_writer(self) -> None:
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)
        self._writable = None

    async def writable(self) -> None:
        if self._writable is not None:
            await self._writable


def close_message(code: int, reason: str) -> bytes:
    body = _CLOSE_HEAD.pack(code) + reason.encode("utf-8", "replace")[:240]
    return _HEAD.pack(CLOSE, len(body)) + body


class TcpConnection(PeerInfo):
    def __init__(self, stream: _Stream, remote: str, admission: Admission | None) -> None:
        self._stream, self._remote, self._admission = stream, remote, admission
        self._messages: collections.deque[Message] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None
        self._closed: ConnectionClosed | None = None
        self._paused = False
        self._send_lock = asyncio.Lock()
        stream.lost.add_done_callback(lambda _: self._lost())
        stream.on_fail = lambda failed: self._end(failed.code,
                                                  f"connection to {remote} {failed}")

    def deliver(self, kind: int, body: bytearray) -> None:
        """A whole message from the stream (called by the event loop)."""
        if kind == BINARY:
            self._messages.append(body)
        elif kind == TEXT:
            try:
                self._messages.append(body.decode("utf-8"))
            except UnicodeDecodeError:
                self._stream.fail(1007, "a text message is not UTF-8")
                return
        elif kind == CLOSE and len(body) >= _CLOSE_HEAD.size:
            (code,) = _CLOSE_HEAD.unpack_from(body)
            reason = body[_CLOSE_HEAD.size:].decode("utf-8", "replace")
            self._end(code, f"connection to {self._remote} closed (code {code}"
                            f"{': ' + reason if reason else ''})")
            self._answer_close(code)
            return
        else:
            self._stream.fail(CLOSE_PROTOCOL, f"unexpected message kind {kind}")
            return
        if len(self._messages) >= MAX_QUEUED_MESSAGES and not self._paused:
            self._paused = True
            assert self._stream.transport is not None
            self._stream.transport.pause_reading()
        self._wake()

    def _answer_close(self, code: int) -> None:
        transport = self._stream.transport
        if transport is None or transport.is_closing():
            return
        if not self._stream.closing:
            transport.write(close_message(code, ""))
        transport.close()

    def _lost(self) -> None:
        failed = self._stream.failed
        if failed is not None:
            self._end(failed.code, f"connection to {self._remote} {failed}")
        self._end(None, f"connection to {self._remote} was lost")

    def _end(self, code: int | None, reason: str) -> None:
        if self._closed is None:
            self._closed = ConnectionClosed(reason, code)
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def recv(self) -> Message:
        if self._waiter is not None:
            raise TransportError("another task is already receiving on this connection")
        while not self._messages:
            if self._closed is not None:
                raise ConnectionClosed(str(self._closed), self._closed.code)
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        message = self._messages.popleft()
        if self._paused and len(self._messages) <= MAX_QUEUED_MESSAGES // 2:
            self._paused = False
            transport = self._stream.transport
            if transport is not None and not transport.is_closing():
                transport.resume_reading()
        return message

    async def send(self, message: Sendable) -> None:
        if isinstance(message, str):
            kind, data = TEXT, memoryview(message.encode("utf-8"))
        else:
            kind, data = BINARY, memoryview(message).cast("B")
        async with self._send_lock:  # a message's pieces must not interleave with another's
            transport = self._writable_transport()
            transport.write(_HEAD.pack(kind, len(data)))
            for start in range(0, len(data), PIECE_BYTES):
                await self._stream.writable()
                self._writable_transport().write(data[start:start + PIECE_BYTES])
            await self._stream.writable()
        self._writable_transport()  # lost while the last piece waited

    def unsent_bytes(self) -> int:
        transport = self._stream.transport
        return 0 if transport is None else transport.get_write_buffer_size()

    def _writable_transport(self) -> asyncio.Transport:
        transport = self._stream.transport
        if self._closed is not None or transport is None or transport.is_closing():
            closed = self._closed or ConnectionClosed(f"connection to {self._remote} is closing",
                                                      None)
            raise ConnectionClosed(str(closed), closed.code)
        return transport

    async def close(self, code: int = 1000, reason: str = "") -> None:
        transport = self._stream.transport
        if transport is not None and not transport.is_closing() and not self._stream.closing:
            self._stream.begin_close(close_message(code, reason[:120]))
        self._end(code, f"connection to {self._remote} closed (code {code}"
                        f"{': ' + reason[:120] if reason else ''})")
        try:
            await asyncio.wait_for(asyncio.shield(self._stream.lost), CLOSE_TIMEOUT_S)
        except TimeoutError:  # a peer that stopped reading keeps the buffers full
            if transport is not None:
                transport.abort()


class TcpListener:
    def __init__(self, server: asyncio.Server, address: str) -> None:
        self._server, self._address = server, address
        self.connections: set[TcpConnection] = set()
        self.handlers: set[asyncio.Task[None]] = set()

    @property
    def address(self) -> str:
        return self._address

    async def close(self) -> None:
        self._server.close()
        for connection in list(self.connections):
            await connection.close(CLOSE_GOING_AWAY, "server shutting down")
        if self.handlers:
            await asyncio.wait(self.handlers, timeout=CLOSE_TIMEOUT_S)
        for task in self.handlers:
            task.cancel()
        await self._server.wait_closed()


@dataclass
class TcpTransport:
    """Connects to ``tcp://host:port`` addresses and listens on them (see the module's doc)."""

    max_frame_bytes: int = 64 * 2**20
    # The local address outgoing connections leave from; None: whatever the kernel picks.
    source: str | None = None

    async def listen(self, host: str, port: int, handler: Handler, *,
                     token: str, max_message_bytes: int | None = None) -> TcpListener:
        loop = asyncio.get_running_loop()
        holder: list[TcpListener] = []
        # A body is allocated whole when its header arrives: the header's length is checked
        # against this first.
        limit = min(self.max_frame_bytes, max_message_bytes or self.max_frame_bytes)

        def accepted() -> _Stream:
            admitting = _Admitting(token, handler, holder[0])
            stream = _Stream(limit, admitting.on_message)
            # A peer that never says who it is must not hold a connection open. Cancelled on
            # admission: the timer held each stream for 10 s (16 flooding connections, with
            # their reconnections, kept 241 streams and 22 MB alive).
            admitting.expiry = loop.call_later(HANDSHAKE_TIMEOUT_S, admitting.expire, stream)
            return stream

        try:
            server = await loop.create_server(accepted, host, port, reuse_address=True)
        except OSError as exc:
            raise TransportError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
        bound = server.sockets[0].getsockname()
        holder.append(TcpListener(server, f"{SCHEME}://{host}:{bound[1]}"))
        return holder[0]

    async def connect(self, address: str, *, token: str, timeout: float) -> TcpConnection:
        host, port = parse_address(address)
        loop = asyncio.get_running_loop()
        greeting: asyncio.Future[int] = loop.create_future()
        connection: list[TcpConnection] = []

        def on_message(stream: _Stream, kind: int, body: bytearray) -> None:
            if connection:
                connection[0].deliver(kind, body)
            elif kind == WELCOME:
                stream.admitted()
                connection.append(TcpConnection(stream, address, None))
                greeting.set_result(0)
            elif not greeting.done():
                code = _CLOSE_HEAD.unpack_from(body)[0] if kind == CLOSE and len(body) >= 2 \
                    else CLOSE_PROTOCOL
                greeting.set_result(code)

        try:
            async with asyncio.timeout(timeout):
                transport, stream = await loop.create_connection(
                    lambda: _Stream(self.max_frame_bytes, on_message), host, port,
                    local_addr=None if self.source is None else (self.source, 0))
                hello = PREFACE + token.encode("utf-8")[:HANDSHAKE_BYTES - len(PREFACE)]
                transport.write(_HEAD.pack(HELLO, len(hello)) + hello)
                lost = asyncio.ensure_future(asyncio.shield(stream.lost))
                await asyncio.wait([greeting, lost], return_when=asyncio.FIRST_COMPLETED)
                lost.cancel()
        except TimeoutError:
            raise ConnectFailed(f"no answer from {address} within {timeout:.0f} s") from None
        except OSError as exc:
            raise ConnectFailed(f"cannot connect to {address}: {exc}") from None
        if not greeting.done():
            raise ConnectFailed(f"{address} closed the connection during the handshake")
        code = greeting.result()
        if code == CLOSE_REFUSED:
            transport.close()
            raise AuthenticationError(f"{address} refused our join token")
        if code:
            transport.close()
            raise ConnectFailed(f"{address} refused the handshake (code {code})")
        return connection[0]


class _Admitting:
    """The listening side of one connection: the handshake, then its handler's messages."""

    def __init__(self, token: str, handler: Handler, listener: TcpListener) -> None:
        self._token, self._handler, self._listener = token, handler, listener
        self._connection: TcpConnection | None = None
        self.expiry: asyncio.TimerHandle | None = None

    def expire(self, stream: _Stream) -> None:
        if self._connection is None:
            stream.fail(CLOSE_REFUSED, f"no credential within {HANDSHAKE_TIMEOUT_S:g} s")

    def on_message(self, stream: _Stream, kind: int, body: bytearray) -> None:
        if self._connection is not None:
            self._connection.deliver(kind, body)
            return
        admission = None
        if kind == HELLO and body.startswith(PREFACE):
            offered = bytes(body[len(PREFACE):]).decode("utf-8", "replace")[:256]
            admission = admit(self._token, offered)
        if admission is None:
            stream.fail(CLOSE_REFUSED, "missing or wrong credential")
            return
        assert stream.transport is not None
        if self.expiry is not None:
            self.expiry.cancel()
        stream.admitted()
        stream.transport.write(_HEAD.pack(WELCOME, 0))
        peer = stream.transport.get_extra_info("peername") or ("?", 0)
        connection = TcpConnection(stream, f"{peer[0]}:{peer[1]} ({admission})", admission)
        self._connection = connection
        self._listener.connections.add(connection)
        task = asyncio.create_task(self._serve(connection))
        self._listener.handlers.add(task)
        task.add_done_callback(self._listener.handlers.discard)

    async def _serve(self, connection: TcpConnection) -> None:
        try:
            await self._handler(connection)
        except Exception:  # as websockets does: the handler's failure closes its connection
            log.exception("connection handler failed for %s", connection.remote)
            await connection.close(1011, "internal error")
        finally:
            self._listener.connections.discard(connection)
            with contextlib.suppress(Exception):
                await connection.close()


def parse_address(address: str) -> tuple[str, int]:
    parts = urlsplit(address)
    if parts.scheme != SCHEME or parts.hostname is None or parts.port is None:
        raise ConnectFailed(f"{address!r} is not a {SCHEME}://host:port address")
    return parts.hostname, parts.port
