"""Links of a given bandwidth and latency: their spec (``BANDWIDTH:LATENCY``), and real
connections shaped to them in user space.

The simulator models a run's links (``engine.sim.network``); a real run on one machine talks over
loopback, which is neither. ``--network`` and ``--server-network`` make real processes take the
regime the simulator models, so that a verdict can be checked on both: every data-plane
connection of a worker or a shard server goes through its process's ``LinkShaper``.
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass

from engine.errors import ConfigError
from engine.transport.admission import Admission
from engine.transport.base import (
    Connection,
    Handler,
    Listener,
    Message,
    PeerInfo,
    Sendable,
    Transport,
)

_BANDWIDTH_UNITS = {"gbit": 1e9 / 8, "mbit": 1e6 / 8, "kbit": 1e3 / 8,
                    "gbyte": 1e9, "mbyte": 1e6, "kbyte": 1e3}
_LATENCY_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
_SPEC = re.compile(r"^\s*(?P<bw>[0-9.]+(?:e[+-]?\d+)?)(?P<bwu>[a-z]+)\s*:\s*"
                   r"(?P<lat>[0-9.]+(?:e[+-]?\d+)?)(?P<latu>[a-z]+)\s*$")


@dataclass(frozen=True, slots=True)
class NetworkModel:
    bytes_per_s: float
    latency_s: float
    spec: str

    def transfer_s(self, nbytes: int) -> float:
        """Time a message of ``nbytes`` occupies a link (without the latency)."""
        return nbytes / self.bytes_per_s


def parse_network(text: str) -> NetworkModel:
    """``BANDWIDTH:LATENCY``, e.g. ``10gbit:50us``; bandwidth in gbit, mbit, kbit, gbyte, mbyte or
    kbyte per second, latency in s, ms, us or ns."""
    match = _SPEC.match(text.lower())
    if match is None:
        raise ConfigError(f"network {text!r} is not BANDWIDTH:LATENCY, e.g. 10gbit:50us or "
                          "1gbit:0.2ms")
    bw_unit, lat_unit = match["bwu"], match["latu"]
    if bw_unit not in _BANDWIDTH_UNITS:
        raise ConfigError(f"network {text!r}: bandwidth unit {bw_unit!r} is not one of "
                          f"{', '.join(_BANDWIDTH_UNITS)}")
    if lat_unit not in _LATENCY_UNITS:
        raise ConfigError(f"network {text!r}: latency unit {lat_unit!r} is not one of "
                          f"{', '.join(_LATENCY_UNITS)}")
    try:
        bandwidth, latency = float(match["bw"]), float(match["lat"])
    except ValueError:
        raise ConfigError(f"network {text!r}: not a number") from None
    rate = bandwidth * _BANDWIDTH_UNITS[bw_unit]
    if not (math.isfinite(rate) and 1e3 <= rate <= 1e15):
        raise ConfigError(f"network {text!r}: bandwidth must be between 8kbit and 8000000gbit")
    delay = latency * _LATENCY_UNITS[lat_unit]
    if not (math.isfinite(delay) and delay <= 10.0):
        raise ConfigError(f"network {text!r}: latency must be at most 10 s")
    spec = f"{bandwidth:g}{bw_unit}:{latency:g}{lat_unit}"
    return NetworkModel(rate, delay, spec)


# Loopback: bytes take no time on the link itself (the CPU copies them).
LOOPBACK = NetworkModel(1e18, 0.0, "loopback")


# A token bucket's depth, in seconds of the link's bandwidth: the event loop's timers have
# millisecond steps (epoll), so a sender woken a little late may send what it was owed at once,
# and the link keeps its average bandwidth.
BURST_S = 0.002


class LinkShaper:
    """One process's link, shared by all its shaped connections: each direction a token bucket
    filled at the link's bandwidth, ``BURST_S`` of it deep (a message leaves once the bytes
    before it and its own have been paid for), and the one-way latency.

    The same rules as the simulator's links (``engine.sim.network.transmit``): a sender's side
    is busy ``bytes / bandwidth`` per message, first come first served; the receiver's side
    takes the bytes from the moment the first of them left (or once it is free, whichever is
    later) at its own bandwidth; a message is delivered once both are done, plus the larger of
    the two ends' latencies. Loopback's own time is negligible beside them."""

    def __init__(self, own: NetworkModel, clock: Callable[[], float] = time.monotonic) -> None:
        self.own, self._clock = own, clock
        self._out_free = 0.0
        self._in_free = 0.0

    async def sending(self, nbytes: int) -> None:
        """Wait until a message of ``nbytes`` has passed this end's outgoing side."""
        start = max(self._clock() - BURST_S, self._out_free)
        self._out_free = start + self.own.transfer_s(nbytes)
        await _until(self._out_free, self._clock)

    async def received(self, nbytes: int, peer: NetworkModel) -> None:
        """A message of ``nbytes`` from ``peer``'s end just arrived (its sender sent it at
        ``peer``'s bandwidth): wait until this end's incoming side has taken it in, plus the
        latency."""
        arrived = self._clock()
        first_left = arrived - peer.transfer_s(nbytes)
        self._in_free = max(first_left, self._in_free) + self.own.transfer_s(nbytes)
        latency = max(self.own.latency_s, peer.latency_s)
        await _until(max(arrived, self._in_free) + latency, self._clock)


async def _until(when: float, clock: Callable[[], float]) -> None:
    wait = when - clock()
    if wait > 0:
        await asyncio.sleep(wait)


class ShapedConnection(PeerInfo):
    """A connection whose messages take ``shaper``'s link, from and to ``peer``'s."""

    def __init__(self, inner: Connection, shaper: LinkShaper, peer: NetworkModel) -> None:
        self._inner, self._shaper, self._peer = inner, shaper, peer
        self._remote, self._admission = inner.remote, inner.admission

    async def send(self, message: Sendable) -> None:
        await self._shaper.sending(_size(message))
        await self._inner.send(message)

    async def recv(self) -> Message:
        message = await self._inner.recv()
        await self._shaper.received(_size(message), self._peer)
        return message

    async def close(self, code: int = 1000, reason: str = "") -> None:
        await self._inner.close(code, reason)

    def unsent_bytes(self) -> int:
        return self._inner.unsent_bytes()


def _size(message: Sendable | Message) -> int:
    if isinstance(message, str):
        return len(message.encode("utf-8"))
    return memoryview(message).nbytes


PeerOf = Callable[[Admission | None], NetworkModel | None]


@dataclass(frozen=True)
class ShapedTransport:
    """``inner``'s connections through one ``LinkShaper``: the ones it opens, to ``peer_of(None)``;
    the ones it accepts, to ``peer_of(their admission)``, where that is not None (a peer whose
    traffic is not the run's data plane, as the evaluator's, is left alone)."""

    inner: Transport
    shaper: LinkShaper
    peer_of: PeerOf

    async def connect(self, address: str, *, token: str, timeout: float) -> Connection:
        connection = await self.inner.connect(address, token=token, timeout=timeout)
        peer = self.peer_of(None)
        return connection if peer is None else ShapedConnection(connection, self.shaper, peer)

    async def listen(self, host: str, port: int, handler: Handler, *, token: str,
                     max_message_bytes: int | None = None) -> Listener:
        async def shaped(connection: Connection) -> None:
            peer = self.peer_of(connection.admission)
            await handler(connection if peer is None
                          else ShapedConnection(connection, self.shaper, peer))

        return await self.inner.listen(host, port, shaped, token=token,
                                       max_message_bytes=max_message_bytes)


def shaped(transport: Transport, own: NetworkModel | None,
           peer_of: PeerOf) -> Transport:
    """``transport`` shaped to ``own``'s link (``ShapedTransport``); as it is for no link."""
    if own is None:
        return transport
    return ShapedTransport(transport, LinkShaper(own), peer_of)
