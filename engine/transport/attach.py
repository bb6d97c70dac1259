"""The launcher's and ``psctl scale``'s connection to a run's coordinator: they attach (they
are no process of the run), ask, and are told, from a thread that is not asyncio's.

What the coordinator tells waits in a bounded inbox for ``next``; a connection that ends puts a
``Lost`` there, so a reader never waits past its own timeout for a coordinator that is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue

from engine.aio import LoopThread
from engine.errors import ConnectFailed, ConnectionClosed, LaunchError, ProtocolError, PsctlError
from engine.transport.base import Connection
from engine.transport.control import Lost
from engine.transport.websocket import WebSocketTransport
from engine.wire.messages import (
    Attach,
    Attached,
    ClientName,
    ControlMessage,
    Message,
    dump_control,
    parse_control,
)

# More than any run's processes and scale requests tell between two looks of the launcher; a
# reader that falls this far behind loses the connection rather than the coordinator's memory.
INBOX_BOUND = 4096
SEND_TIMEOUT_S = 10.0


class Attachment:
    def __init__(self, io: LoopThread, connection: Connection, attached: Attached) -> None:
        self._io, self._connection = io, connection
        self.attached = attached
        self._inbox: queue.Queue[ControlMessage | Lost] = queue.Queue(INBOX_BOUND)
        self._reader = io.submit(self._read())

    @classmethod
    def open(cls, address: str, client: ClientName, *, token: str,
             timeout: float) -> Attachment:
        """Attach to the coordinator at ``address`` with ``token`` (the run's secret, or the
        credential the run gives ``client``); a LaunchError says why it could not."""
        io = LoopThread(f"psctl-{client}")
        try:
            connection, attached = io.call(_attach(address, client, token, timeout),
                                           timeout + 5, "attaching to the coordinator")
        except PsctlError as exc:
            io.stop()
            raise LaunchError(f"cannot attach to the run's coordinator at {address}: "
                              f"{exc}") from None
        return cls(io, connection, attached)

    def send(self, message: Message) -> None:
        """Send ``message``; a ConnectionClosed (a PsctlError) if the coordinator is gone."""
        self._io.call(self._connection.send(dump_control(message)), SEND_TIMEOUT_S,
                      f"sending {type(message).__name__} to the coordinator")

    def next(self, timeout: float) -> ControlMessage | Lost | None:
        """What the coordinator told next, waiting at most ``timeout`` seconds (None: nothing
        in that time)."""
        try:
            return self._inbox.get(timeout=max(timeout, 0.0))
        except queue.Empty:
            return None

    def close(self) -> None:
        with contextlib.suppress(PsctlError):
            self._io.call(self._connection.close(), 5, "closing the connection")
        self._reader.cancel()
        self._io.stop()

    async def _read(self) -> None:
        try:
            while True:
                message = parse_control(await self._connection.recv())
                try:
                    self._inbox.put_nowait(message)
                except queue.Full:
                    raise ProtocolError(f"{INBOX_BOUND} messages from the coordinator were "
                                        "not read") from None
        except PsctlError as exc:
            with contextlib.suppress(queue.Full):
                self._inbox.put_nowait(Lost(f"lost the coordinator: {exc}"))


async def _attach(address: str, client: ClientName, token: str,
                  timeout: float) -> tuple[Connection, Attached]:
    try:
        connection = await WebSocketTransport().connect(address, token=token, timeout=timeout)
    except ConnectFailed as exc:
        raise ConnectionClosed(str(exc)) from None
    try:
        await connection.send(dump_control(Attach(client=client, pid=os.getpid())))
        reply = parse_control(await asyncio.wait_for(connection.recv(), timeout))
    except TimeoutError:
        await connection.close()
        raise ProtocolError(f"no answer within {timeout:g} s") from None
    if not isinstance(reply, Attached):
        await connection.close()
        raise ProtocolError(f"expected attached, got {reply.type}")
    return connection, reply
