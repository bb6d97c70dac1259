"""The transports a run's shard servers may serve on (``cluster.transport``), by name: the
scheme of their addresses and the class that speaks it, imported only when a role connects or
listens (``psctl --help`` and the run's composition list them without it)."""

from __future__ import annotations

from dataclasses import dataclass

from engine.registry import Lazy, Registry


@dataclass(frozen=True)
class TransportKind:
    """``scheme://host:port`` addresses, spoken by ``make(max_frame_bytes=..., source=...)``,
    a ``Transport``."""

    scheme: str
    make: Lazy


TRANSPORTS: Registry[TransportKind] = Registry("transport")
TRANSPORTS.register("tcp", TransportKind("tcp", Lazy("engine.transport.tcp:TcpTransport")),
                    "psctl's own length-prefixed framing, one copy per hop")
TRANSPORTS.register("websocket", TransportKind(
    "ws", Lazy("engine.transport.websocket:WebSocketTransport")),
    "frames in websocket binary messages")


def by_scheme(scheme: str) -> TransportKind | None:
    """The transport whose addresses have ``scheme``, if any."""
    kinds = (TRANSPORTS.get(name) for name in TRANSPORTS.names())
    return next((kind for kind in kinds if kind.scheme == scheme), None)
