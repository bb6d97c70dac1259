"""The transport interface: message-oriented, authenticated connections between processes.

Implementations: ``WebSocketTransport`` and ``TcpTransport`` (real processes, loopback or network;
``SchemeTransport`` picks one by address) and
``MemoryTransport`` (everything in one process, for fast tests). Messages are whole: a ``bytes``
message is a protocol frame, a ``str`` message is a JSON control message.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

from engine.transport.admission import Admission

Message = bytes | bytearray | str  # a binary message may arrive in its own, writable buffer
Sendable = bytes | bytearray | memoryview | str


class Connection(Protocol):
    """One open, authenticated connection. ``recv`` raises ``ConnectionClosed`` at the end."""

    @property
    def remote(self) -> str:
        """A printable name of the peer, for error messages."""
        ...

    @property
    def admission(self) -> Admission | None:
        """Whom the peer was admitted as (on the listening side; None on the connecting side)."""
        ...

    async def send(self, message: Sendable) -> None: ...

    async def recv(self) -> Message: ...

    async def close(self, code: int = 1000, reason: str = "") -> None: ...

    def unsent_bytes(self) -> int:
        """Bytes ``send`` took that still wait in this process's memory for the socket (the
        event loop's write buffer; what the kernel holds is not counted): a shard server counts
        them in its reply budget."""
        ...


class PeerInfo:
    """``remote`` and ``admission`` as a connection class keeps them (set both in __init__)."""

    _remote: str
    _admission: Admission | None

    @property
    def remote(self) -> str:
        return self._remote

    @property
    def admission(self) -> Admission | None:
        return self._admission


Handler = Callable[[Connection], Awaitable[None]]


class Listener(Protocol):
    @property
    def address(self) -> str:
        """What a peer passes to ``Transport.connect`` to reach this listener."""
        ...

    async def close(self) -> None: ...


class Transport(Protocol):
    async def listen(self, host: str, port: int, handler: Handler, *, token: str,
                     max_message_bytes: int | None = None) -> Listener:
        """Serve ``handler`` for every connection whose credential the run's secret ``token``
        admits (``engine.transport.admission``), bound to that admission; refuse the rest.
        ``max_message_bytes``: a lower limit than the transport's for the messages this listener
        accepts (a shard server's, from its key count); a message declaring more is refused
        before its body is allocated."""
        ...

    async def connect(self, address: str, *, token: str, timeout: float) -> Connection:
        """Open a connection presenting ``token`` (a credential, or the run's secret), or raise
        ``ConnectFailed`` / ``AuthenticationError`` within ``timeout``."""
        ...
