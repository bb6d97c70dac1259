"""The simulator's transport: the real roles' connections, in virtual time.

Real clients and shard servers (``engine.worker.client``, ``engine.server.service``) run on the
simulator's event loop and talk through this ``Transport`` as they would through TCP: the same
frames, the same handshakes and admissions. What a message costs is modelled: sending it takes
CPU of the sender's process, then it crosses the links (``engine.sim.network``), then receiving
it takes CPU of the receiver's process (``engine.sim.cpu``); only then does ``recv`` return it.
A process's CPU work is done in order, so a shard server handles its requests one after the
other, as its real event loop does. Each endpoint says what a message costs it
(``Endpoint.costs``): the cluster charges frames by side and size and a server's push its
update (``engine.sim.cluster``).
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from engine.errors import AuthenticationError, ConnectFailed, ConnectionClosed, TransportError
from engine.sim.cpu import Process
from engine.sim.network import Link, transmit
from engine.transport.admission import Admission, admit
from engine.transport.base import Handler, Message, PeerInfo, Sendable

# (sending?, the message) -> CPU seconds it costs its process on that side
Costs = Callable[[bool, Message], float]


@dataclass(frozen=True)
class Endpoint:
    """A simulated process on the network: its CPU, its link, what a message costs it."""

    name: str
    process: Process
    link: Link
    costs: Costs


class _Closed:
    """Queued behind every message sent before the close, so a peer reads them all first."""

    def __init__(self, reason: str, code: int) -> None:
        self.reason, self.code = reason, code


class VirtualConnection(PeerInfo):
    def __init__(self, endpoint: Endpoint, remote: str, admission: Admission | None) -> None:
        self._endpoint, self._remote, self._admission = endpoint, remote, admission
        self._loop = asyncio.get_running_loop()
        self._peer: VirtualConnection | None = None
        self._inbox: deque[Message | _Closed] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._closed: ConnectionClosed | None = None  # our side is closed
        self._peer_closed = False

    async def send(self, message: Sendable) -> None:
        if isinstance(message, memoryview):
            message = bytes(message)
        if self._closed is not None:
            raise self._closed
        peer = self._peer
        if peer is None or self._peer_closed:
            raise ConnectionClosed(f"connection to {self._remote} closed", None)
        await self._endpoint.process.work(self._endpoint.costs(True, message))
        self._travel(message)

    def _travel(self, item: Message | _Closed) -> None:
        """Across the links to the peer, then through its CPU into its inbox."""
        peer = self._peer
        assert peer is not None
        size = len(item) if not isinstance(item, _Closed) else 0
        arrival = transmit(self._loop.time(), self._endpoint.link, peer._endpoint.link, size)
        self._loop.call_at(arrival, peer._arrived, item)

    def _arrived(self, item: Message | _Closed) -> None:
        cost = 0.0 if isinstance(item, _Closed) else self._endpoint.costs(False, item)
        self._endpoint.process.then(cost, lambda: self._deliver(item))

    def _deliver(self, item: Message | _Closed) -> None:
        if isinstance(item, _Closed):
            self._peer_closed = True
        self._inbox.append(item)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def recv(self) -> Message:
        if self._waiter is not None:
            raise TransportError("another task is already receiving on this connection")
        while not self._inbox:
            if self._closed is not None:
                raise self._closed
            self._waiter = self._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        item = self._inbox.popleft()
        if isinstance(item, _Closed):
            self._closed = self._closed or ConnectionClosed(item.reason, item.code)
            raise self._closed
        return item

    def unsent_bytes(self) -> int:
        return 0  # on its way at once: the links hold it, not this process's memory

    async def close(self, code: int = 1000, reason: str = "") -> None:
        if self._closed is not None:
            return
        text = f"connection to {self._remote} closed (code {code}{': ' + reason if reason else ''})"
        self._closed = ConnectionClosed(text, code)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)
        if self._peer is not None and not self._peer_closed:
            self._travel(_Closed(text, code))


class VirtualListener:
    def __init__(self, network: VirtualNetwork, address: str) -> None:
        self._network, self._address = network, address

    @property
    def address(self) -> str:
        return self._address

    async def close(self) -> None:
        self._network.listeners.pop(self._address, None)


class VirtualNetwork:
    """Every simulated process's way onto the network; share one per simulated cluster."""

    def __init__(self) -> None:
        self.listeners: dict[str, tuple[Endpoint, Handler, str]] = {}
        self._ports = itertools.count(1)
        self.tasks: set[asyncio.Task[None]] = set()  # the listeners' handlers, running

    def transport(self, endpoint: Endpoint) -> VirtualTransport:
        return VirtualTransport(self, endpoint)


class VirtualTransport:
    """One simulated process's transport (``engine.transport.base.Transport``)."""

    def __init__(self, network: VirtualNetwork, endpoint: Endpoint) -> None:
        self._network, self.endpoint = network, endpoint

    async def listen(self, host: str, port: int, handler: Handler, *, token: str,
                     max_message_bytes: int | None = None) -> VirtualListener:
        address = f"sim://{self.endpoint.name}:{port or next(self._network._ports)}"
        if address in self._network.listeners:
            raise TransportError(f"cannot listen on {address}: in use")
        self._network.listeners[address] = (self.endpoint, handler, token)
        return VirtualListener(self._network, address)

    async def connect(self, address: str, *, token: str, timeout: float) -> VirtualConnection:
        try:
            server, handler, secret = self._network.listeners[address]
        except KeyError:
            raise ConnectFailed(f"cannot connect to {address}: nothing listens there") from None
        admission = admit(secret, token)
        if admission is None:
            raise AuthenticationError(f"{address} refused our join token")
        mine = VirtualConnection(self.endpoint, address, None)
        theirs = VirtualConnection(server, f"{self.endpoint.name} ({admission})", admission)
        mine._peer, theirs._peer = theirs, mine
        task: asyncio.Task[None] = asyncio.ensure_future(handler(theirs))
        self._network.tasks.add(task)
        task.add_done_callback(self._network.tasks.discard)
        return mine
