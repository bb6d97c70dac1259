"""The shard server role: join the coordinator, serve one key range, leave when told."""

from __future__ import annotations

import asyncio
import contextlib
import os

from engine.config import RunConfig
from engine.consistency.registry import make_controller
from engine.errors import ProtocolError, PsctlError, RunFailed
from engine.keys import KeyLayout, KeyRange
from engine.roles.control import ControlChannel
from engine.server.aggregation import AGGREGATION_RULES, make_aggregator
from engine.server.learning import make_learning
from engine.server.optimizers import make_optimizer
from engine.server.pull_filter import make_pull_filter
from engine.server.service import ServerLimits, ShardServer
from engine.server.shard import ShardState
from engine.transport.base import Transport
from engine.wire.messages import Event, Exit, Hello, Serving, Start, Stop, Syncs, layout_of
from engine.wire.records import EventRecord, SyncRecord


async def run_server(transport: Transport, coordinator: str, rank: int, *, token: str,
                     host: str = "127.0.0.1", port: int = 0) -> None:
    channel, welcome = await ControlChannel.open(
        transport, coordinator, Hello(role="server", rank=rank, pid=os.getpid()), token=token,
        timeout=60.0)
    if welcome.own_range is None:
        raise ProtocolError("the coordinator sent a server no key range")
    config = RunConfig.model_validate(welcome.config)
    keys = KeyRange(welcome.own_range.start, welcome.own_range.end)
    state = build_shard(config, keys, layout_of(welcome))
    # Every shard decides the same barriers; shard 0 alone reports them, in order.
    reports: asyncio.Queue[list[SyncRecord]] = asyncio.Queue()
    cluster = config.cluster
    limits = ServerLimits(max_queued_bytes=cluster.max_queued_bytes,
                          max_pending_pulls=cluster.max_pending_pulls)
    pulls = make_pull_filter(config.comm.pull_filter, config.comm.refresh_every,
                             cluster.workers, len(keys))
    server = ShardServer(state, run=bytes.fromhex(welcome.run_id)[:16], rank=rank,
                         max_frame_bytes=cluster.max_frame_bytes, limits=limits,
                         on_syncs=reports.put_nowait if rank == 0 else None, pull_filter=pulls)
    address = await server.start(transport, host, port, token=token)
    await channel.send(Serving(address=address))
    reporter = asyncio.create_task(_report_syncs(channel, reports))
    try:
        await _obey(channel, server, reports)
    finally:
        reporter.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reporter
        await server.close()


def build_shard(config: RunConfig, keys: KeyRange, layout: KeyLayout) -> ShardState:
    """A shard's state with the run's policies: clock ranges from the layout, the consistency
    model, the aggregation rule and the server optimizer, each from its registry."""
    ranges = layout.clock_ranges(keys)
    workers = config.cluster.workers
    divisor = AGGREGATION_RULES.get(config.sync.push_scale)(workers)
    learning = make_learning(config.learning, workers, divisor, len(keys))
    return ShardState(
        keys,
        make_controller(config.sync, workers=workers, ranges=len(ranges)),
        make_optimizer(config.optimizer, len(keys)),
        workers=workers,
        ranges=ranges,
        aggregator=make_aggregator(config.sync.push_scale, keys, ranges, workers),
        clip_norm=config.optimizer.clip_norm,
        learning=learning,
    )


async def _report_syncs(channel: ControlChannel, reports: asyncio.Queue[list[SyncRecord]]) -> None:
    while True:
        rows = await reports.get()
        await channel.send(Syncs(rows=rows))
        reports.task_done()


async def _obey(channel: ControlChannel, server: ShardServer,
                reports: asyncio.Queue[list[SyncRecord]]) -> None:
    while True:
        try:
            message = await channel.recv()
        except PsctlError as exc:
            raise RunFailed(f"shard server {server.rank} lost the coordinator: {exc}") from None
        if isinstance(message, Start) and message.clocks_per_epoch is not None:
            server.state.learning.start(message.clocks_per_epoch)
        elif isinstance(message, Stop):
            server.drain(message.reason)
        elif isinstance(message, Exit):
            with contextlib.suppress(TimeoutError):  # the barriers reach the database first
                await asyncio.wait_for(reports.join(), timeout=5.0)
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
        "slow_readers_closed": stats.slow_readers_closed,
        "internal_errors": stats.internal_errors,
        "warnings_held_back": stats.warnings_held_back,
        "duplicates": server.state.duplicates,
        "range_versions": server.state.versions.tolist(),
    })
