"""Transports: how frames travel between the processes of a run."""

from engine.transport.base import Connection, Handler, Listener, Message, Sendable, Transport
from engine.transport.memory import MemoryTransport
from engine.transport.websocket import WebSocketTransport

__all__ = [
    "Connection",
    "Handler",
    "Listener",
    "MemoryTransport",
    "Message",
    "Sendable",
    "Transport",
    "WebSocketTransport",
]
