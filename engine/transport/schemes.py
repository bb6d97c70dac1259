"""One transport per address scheme, as ``engine.transport.kinds`` registers them: ``ws://``
(websockets) and ``tcp://`` (engine.transport.tcp).

A role connects to whatever address it is given, so a run can keep its control plane on
websockets while its shard servers serve the data plane on TCP (``cluster.transport``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from engine.errors import ConnectFailed
from engine.transport.base import Connection, Handler, Listener, Transport
from engine.transport.kinds import TRANSPORTS, TransportKind, by_scheme


@dataclass(frozen=True)
class SchemeTransport:
    """Connects by the address's scheme; listens with ``listens`` (a ``SCHEMES`` key)."""

    max_frame_bytes: int = 64 * 2**20
    source: str | None = None
    listens: str = "websocket"

    def __post_init__(self) -> None:
        TRANSPORTS.entry(self.listens)  # a ConfigError naming the known ones

    def listening(self, name: str) -> SchemeTransport:
        """This transport, listening with ``name`` instead."""
        return replace(self, listens=name)

    def _made(self, kind: TransportKind) -> Transport:
        made: Transport = kind.make.load()(max_frame_bytes=self.max_frame_bytes,
                                           source=self.source)
        return made

    async def listen(self, host: str, port: int, handler: Handler, *, token: str,
                     max_message_bytes: int | None = None) -> Listener:
        return await self._made(TRANSPORTS.get(self.listens)).listen(
            host, port, handler, token=token, max_message_bytes=max_message_bytes)

    async def connect(self, address: str, *, token: str, timeout: float) -> Connection:
        scheme = address.partition("://")[0]
        kind = by_scheme(scheme)
        if kind is None:
            known = " or ".join(TRANSPORTS.get(name).scheme for name in TRANSPORTS.names())
            raise ConnectFailed(f"{address!r}: no transport for scheme {scheme!r} ({known})")
        return await self._made(kind).connect(address, token=token, timeout=timeout)


def listening(transport: Transport, name: str) -> Transport:
    """``transport`` listening with ``name`` where it can choose (a ``SchemeTransport``);
    any other transport (the in-memory one of tests) as it is."""
    return transport.listening(name) if isinstance(transport, SchemeTransport) else transport
