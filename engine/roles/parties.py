"""The coordinator's part for the parties attached to a run that are none of its processes: the
launcher, told each join, the ranks to start and how the run ended, and telling which roles
ended for good; and ``psctl scale``, asking for workers or servers and answered. This one
channel replaces the files they used to poll and the launcher's reading of the database (which
stays the run's record)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from engine.errors import ConnectionClosed, ProtocolError, PsctlError
from engine.roles.peer import Hub
from engine.transport.base import Connection
from engine.wire.messages import (
    Attach,
    Attached,
    Joined,
    Message,
    RoleEnded,
    RunEnded,
    Scale,
    ScaleAnswer,
    StartRoles,
    StartUp,
    dump_control,
    parse_control,
)

# How long the run's end may take to reach the launcher (it reads the database if it does not).
TELL_END_S = 5.0
log = logging.getLogger(__name__)


class Parties:
    def __init__(self, hub: Hub, run_id: str, *,
                 ended_for_good: Callable[[str, int, str], None],
                 scale: Callable[[str, int], tuple[str, dict[str, object]]]) -> None:
        """``ended_for_good(role, rank, why)`` takes the launcher's word that a role will not
        come back; ``scale(role, count)`` does a psctl scale request and returns the event
        that says what happened (its kind and detail)."""
        self.hub, self.run_id = hub, run_id
        self._ended_for_good, self._scale = ended_for_good, scale
        self._launcher: Connection | None = None
        self.joined = 0  # the run's processes admitted so far (restarts not counted)

    async def serve(self, connection: Connection, attach: Attach) -> None:
        """A party's connection from its ``attach`` on, until it closes."""
        if attach.client == "launcher":
            if self._launcher is not None:
                raise ProtocolError("a launcher is attached to this run already")
            self._launcher = connection
        try:
            await connection.send(dump_control(Attached(run_id=self.run_id,
                                                        joined=self.joined)))
            while True:
                await self._on_message(connection, attach, parse_control(
                    await connection.recv()))
        except ConnectionClosed:
            return
        finally:
            if self._launcher is connection:
                self._launcher = None

    async def _on_message(self, connection: Connection, attach: Attach,
                          message: object) -> None:
        if isinstance(message, RoleEnded) and attach.client == "launcher":
            self._ended_for_good(message.role, message.rank, message.why)
        elif isinstance(message, StartUp) and attach.client == "launcher":
            self.hub.event("start_up", **message.model_dump(exclude={"type"}))
        elif isinstance(message, Scale) and attach.client == "scale":
            kind, detail = self._scale(message.role, message.count)
            await connection.send(dump_control(ScaleAnswer.model_validate(
                {"kind": kind, "detail": detail})))
        else:
            kind = getattr(message, "type", type(message).__name__)
            raise ProtocolError(f"the {attach.client} may not send {kind}")

    def one_joined(self) -> None:
        self.joined += 1
        self._tell(Joined(count=self.joined))

    def start_roles(self, workers: list[int], servers: list[int]) -> None:
        """Tell the launcher every worker and server rank the job has now."""
        if self._launcher is None:
            self.hub.event("start_roles_untold", workers=workers, servers=servers,
                           message="no launcher is attached to start the newcomers; start "
                                   "them with psctl role")
            return
        self._tell(StartRoles(workers=workers, servers=servers))

    async def tell_end(self, ended: RunEnded) -> bool:
        """Tell the launcher how the run ended; whether it was told."""
        launcher = self._launcher
        if launcher is None:
            return False
        try:
            await asyncio.wait_for(launcher.send(dump_control(ended)), TELL_END_S)
        except (PsctlError, TimeoutError) as exc:
            log.warning("could not tell the launcher how the run ended: %s", exc)
            return False
        with contextlib.suppress(PsctlError, TimeoutError):
            await asyncio.wait_for(launcher.close(), TELL_END_S)
        return True

    def _tell(self, message: Message) -> None:
        launcher = self._launcher
        if launcher is not None:
            self.hub.spawn(self._send(launcher, message))

    async def _send(self, launcher: Connection, message: Message) -> None:
        with contextlib.suppress(ConnectionClosed):  # it is gone: it reads the database
            await launcher.send(dump_control(message))
