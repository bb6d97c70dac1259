"""The shard server role: join the coordinator, serve one key range, leave when told."""

from __future__ import annotations

import os

from engine.config import RunConfig
from engine.consistency import make_controller
from engine.errors import ProtocolError, PsctlError, RunFailed
from engine.keys import KeyRange
from engine.messages import Event, Exit, Hello, Serving, Stop
from engine.optimizers import make_optimizer
from engine.records import EventRecord
from engine.roles.control import ControlChannel
from engine.server import ShardServer
from engine.shard import ShardState
from engine.transport.base import Transport


async def run_server(transport: Transport, coordinator: str, rank: int, *, token: str,
                     host: str = "127.0.0.1", port: int = 0) -> None:
    channel, welcome = await ControlChannel.open(
        transport, coordinator, Hello(role="server", rank=rank, pid=os.getpid()), token=token,
        timeout=60.0)
    if welcome.own_range is None:
        raise ProtocolError("the coordinator sent a server no key range")
    config = RunConfig.model_validate(welcome.config)
    keys = KeyRange(welcome.own_range.start, welcome.own_range.end)
    state = ShardState(
        keys,
        make_controller(config.sync.model, workers=config.cluster.workers, keys=len(keys)),
        make_optimizer(config.optimizer, len(keys)),
    )
    server = ShardServer(state, run=bytes.fromhex(welcome.run_id)[:16], rank=rank,
                         max_frame_bytes=config.cluster.max_frame_bytes)
    address = await server.start(transport, host, port, token=token)
    await channel.send(Serving(address=address))
    try:
        await _obey(channel, server)
    finally:
        await server.close()


async def _obey(channel: ControlChannel, server: ShardServer) -> None:
    while True:
        try:
            message = await channel.recv()
        except PsctlError as exc:
            raise RunFailed(f"shard server {server.rank} lost the coordinator: {exc}") from None
        if isinstance(message, Stop):
            server.drain(message.reason)
        elif isinstance(message, Exit):
            await channel.send(Event(row=_stats_event(server)))
            await channel.close()
            return


def _stats_event(server: ShardServer) -> EventRecord:
    import time

    stats = server.stats
    return EventRecord(at=time.time(), kind="server_stats", detail={
        "rank": server.rank, "version": server.state.version, "pushes": server.state.pushes,
        "frames_in": stats.frames_in, "bytes_in": stats.bytes_in, "bytes_out": stats.bytes_out,
        "bad_frames": stats.bad_frames, "errors": stats.errors_by_code,
    })
