"""A role's connection to the coordinator: hello, welcome, then JSON messages both ways.

``SyncControl`` is the thread-side face for workers and the evaluator: their main thread computes
with torch, so incoming messages are queued for it to poll, and sends never block it.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from engine.aio import LoopThread
from engine.errors import (
    ConnectFailed,
    ConnectionClosed,
    LaunchError,
    MetricError,
    ProtocolError,
    PsctlError,
)
from engine.transport.base import Connection, Transport
from engine.usermetrics import cut_to_caller
from engine.wire.messages import (
    ControlMessage,
    Fatal,
    Hello,
    Message,
    Welcome,
    dump_control,
    parse_control,
)

# A role started before its coordinator listens tries again after these pauses (doubling).
RETRY_FIRST_S = 0.1
RETRY_MAX_S = 1.0
# How long a failing role tries to tell the coordinator why, and how much it tells.
REPORT_TIMEOUT_S = 5.0
_MESSAGE_CHARS = 500
_TRACEBACK_CHARS = 4000


def fatal(exc: BaseException) -> Fatal:
    """What a role that crashed tells the coordinator: the exception, where it was raised
    (the innermost frame: in the user's model file, say) and the end of its traceback."""
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    frames = traceback.extract_tb(exc.__traceback__)
    if frames:
        where = frames[-1]
        text += f" (in {where.name}, {Path(where.filename).name} line {where.lineno})"
    return Fatal(message=text[:_MESSAGE_CHARS],
                 traceback="".join(traceback.format_exception(exc))[-_TRACEBACK_CHARS:])


class ControlChannel:
    def __init__(self, connection: Connection) -> None:
        self.connection = connection

    @classmethod
    async def open(
        cls, transport: Transport, address: str, hello: Hello, *, token: str, timeout: float
    ) -> tuple[ControlChannel, Welcome]:
        connection = await _reach(transport, address, hello, token=token, timeout=timeout)
        channel = cls(connection)
        await channel.send(hello)
        try:
            reply = await asyncio.wait_for(channel.recv(), timeout)
        except TimeoutError:
            raise LaunchError(
                f"the coordinator at {address} did not welcome {hello.role} "
                f"{hello.rank} within {timeout:.0f} s"
            ) from None
        if not isinstance(reply, Welcome):
            raise ProtocolError(f"expected a welcome from the coordinator, got {reply.type}")
        return channel, reply

    async def send(self, message: Message) -> None:
        await self.connection.send(dump_control(message))

    async def recv(self) -> ControlMessage:
        return parse_control(await self.connection.recv())

    async def close(self) -> None:
        await self.connection.close()


class Lost:
    """Put in the inbox when the coordinator connection ends; the role must stop."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


class SyncControl:
    def __init__(self, io: LoopThread, channel: ControlChannel) -> None:
        self._io, self._channel = io, channel
        self.inbox: queue.Queue[ControlMessage | Lost] = queue.Queue()
        self._handlers: dict[type[Message], Callable[[Any], None]] = {}
        self._reader = io.submit(self._read())

    @classmethod
    def open(
        cls,
        io: LoopThread,
        transport: Transport,
        address: str,
        hello: Hello,
        *,
        token: str,
        timeout: float,
    ) -> tuple[SyncControl, Welcome]:
        channel, welcome = io.call(
            ControlChannel.open(transport, address, hello, token=token, timeout=timeout),
            timeout + 5,
            "joining the coordinator",
        )
        return cls(io, channel), welcome

    def send(self, message: Message) -> None:
        """Queue ``message`` for sending; a broken channel shows up as a ``Lost`` in the inbox."""
        self._io.submit(self._send(message))

    def send_and_wait(self, message: Message, timeout: float = 10.0) -> None:
        self._io.call(self._channel.send(message), timeout, f"sending {message.type}")  # type: ignore[attr-defined]

    @contextlib.contextmanager
    def reporting(self, *, own_errors: bool = True) -> Iterator[None]:
        """An error inside says its message to the coordinator before it propagates, so that
        the run fails at once with the reason rather than with a lost connection: any
        exception that is not psctl's own (a crash in the user's model, a bug) with its
        traceback, and, with ``own_errors``, psctl's own (a bad data or model file)."""
        try:
            yield
        except MetricError as exc:  # psctl.log refused a call in the user's own code: its crash
            self._report(fatal(exc.with_traceback(cut_to_caller(exc.__traceback__))))
            raise
        except PsctlError as exc:
            if own_errors:
                self._report(Fatal(message=str(exc)))
            raise
        except Exception as exc:
            self._report(fatal(exc))
            raise

    def _report(self, message: Fatal) -> None:
        with contextlib.suppress(PsctlError):
            self.send_and_wait(message, timeout=REPORT_TIMEOUT_S)

    def poll(self, wait_s: float = 0.0) -> list[ControlMessage | Lost]:
        """What has arrived; with ``wait_s``, waiting at most that long for the first of it
        (a hundred idle workers polling every few milliseconds keep two cores busy)."""
        messages = []
        with contextlib.suppress(queue.Empty):
            if wait_s > 0:
                messages.append(self.inbox.get(timeout=wait_s))
            while True:
                messages.append(self.inbox.get_nowait())
        return messages

    def close(self) -> None:
        with contextlib.suppress(PsctlError):
            self._io.call(self._channel.close(), 5, "closing the control channel")

    async def _send(self, message: Message) -> None:
        try:
            await self._channel.send(message)
        except ConnectionClosed as exc:
            self.inbox.put(Lost(str(exc)))

    def on(self, kind: type[Message], handler: Callable[[Any], None]) -> None:
        """Messages of ``kind`` go to ``handler``, called on the I/O loop as they arrive,
        instead of the inbox: for what must act while the role's thread waits on a request
        (where a lost shard's copies are)."""
        self._handlers[kind] = handler

    async def _read(self) -> None:
        try:
            while True:
                message = await self._channel.recv()
                handler = self._handlers.get(type(message))
                if handler is None:
                    self.inbox.put(message)
                else:
                    handler(message)
        except PsctlError as exc:
            self.inbox.put(Lost(f"lost the coordinator: {exc}"))


async def _reach(transport: Transport, address: str, hello: Hello, *, token: str,
                 timeout: float) -> Connection:
    """Connect to the coordinator, trying again while nothing listens there yet: a scheduler
    (psctl role, Slurm) may start a role before its coordinator (``timeout`` in all)."""
    deadline = time.monotonic() + timeout
    pause = RETRY_FIRST_S
    while True:
        left = deadline - time.monotonic()
        try:
            return await transport.connect(address, token=token, timeout=max(left, 0.1))
        except ConnectFailed as exc:
            if time.monotonic() + pause >= deadline:
                raise LaunchError(f"{hello.role} {hello.rank} cannot reach the coordinator at "
                                  f"{address} within {timeout:.0f} s: {exc}") from None
        except PsctlError as exc:  # refused credentials, say: trying again would not help
            raise LaunchError(f"{hello.role} {hello.rank} cannot reach the coordinator at "
                              f"{address}: {exc}") from None
        await asyncio.sleep(pause)
        pause = min(pause * 2, RETRY_MAX_S)
