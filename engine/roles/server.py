"""The shard server role: join the coordinator, serve one key range, leave when told."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable
from pathlib import Path

from engine.config import RunConfig
from engine.consistency.registry import make_controller
from engine.errors import ProtocolError, PsctlError, RunFailed, StoreError
from engine.keys import KeyLayout, KeyRange
from engine.replication.link import ChainLink
from engine.roles.control import ControlChannel
from engine.server import checkpoint
from engine.server.aggregation import AGGREGATION_RULES, make_aggregator
from engine.server.learning import make_learning
from engine.server.optimizers import make_optimizer
from engine.server.pull_filter import make_pull_filter
from engine.server.service import ServerLimits, ShardServer
from engine.server.shard import ShardState
from engine.transport.admission import credential
from engine.transport.base import Transport
from engine.wire.messages import (
    Chain,
    Checkpoint,
    Event,
    Exit,
    Heartbeat,
    Hello,
    Members,
    Promote,
    Serving,
    ShardInfo,
    Start,
    Stop,
    Syncs,
    Welcome,
    layout_of,
)
from engine.wire.records import EventRecord, SyncRecord


async def run_server(transport: Transport, coordinator: str, rank: int, *, token: str,
                     host: str = "127.0.0.1", port: int = 0) -> None:
    channel, welcome = await ControlChannel.open(
        transport, coordinator, Hello(role="server", rank=rank, pid=os.getpid()), token=token,
        timeout=60.0)
    if welcome.own_range is None:
        raise ProtocolError("the coordinator sent a server no key range")
    config = RunConfig.model_validate(welcome.config)
    # Every shard decides the same barriers; shard 0's primary alone reports them, in order.
    reports: asyncio.Queue[list[SyncRecord]] = asyncio.Queue()
    copies = Copies(rank, channel)
    for info in (welcome.own_range, *welcome.held):
        server = await _copy(config, welcome, info, rank, token, transport,
                             reports.put_nowait if info.index == 0 else None)
        server.primary = info.index == rank
        await server.start(transport, host, port, token=token)
        copies.servers[info.index] = server
    await channel.send(Serving(address=copies.own.address, backups=[
        ShardInfo(index=i, address=c.address, start=c.state.keys.start, end=c.state.keys.end)
        for i, c in copies.servers.items() if i != rank]))
    reporter = asyncio.create_task(_report_syncs(channel, reports))
    try:
        await _obey(channel, copies, reports)
    finally:
        reporter.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reporter
        for server in copies.servers.values():
            await server.close()


async def _copy(config: RunConfig, welcome: Welcome, info: ShardInfo, rank: int, token: str,
                transport: Transport,
                on_syncs: Callable[[list[SyncRecord]], None] | None) -> ShardServer:
    """One copy of key range ``info``: its state (from the checkpoint, on a resume), the run's
    limits and pull filter, and a chain link when the run keeps replicas."""
    keys = KeyRange(info.start, info.end)
    state = build_shard(config, keys, layout_of(welcome))
    if welcome.checkpoint is not None:  # a resumed run: the shard as it was saved
        path = checkpoint.shard_file(Path(welcome.checkpoint), info.index)
        await asyncio.to_thread(checkpoint.restore, state, path)
    cluster = config.cluster
    limits = ServerLimits(max_queued_bytes=cluster.max_queued_bytes,
                          max_pending_pulls=cluster.max_pending_pulls)
    pulls = make_pull_filter(config.comm.pull_filter, config.comm.refresh_every,
                             cluster.workers, len(keys))
    server = ShardServer(state, run=bytes.fromhex(welcome.run_id)[:16], rank=rank,
                         max_frame_bytes=cluster.max_frame_bytes, limits=limits,
                         on_syncs=on_syncs, pull_filter=pulls)
    if cluster.replicas:
        server.link = ChainLink(transport, token=credential(token, "server", rank),
                                max_frame_bytes=cluster.max_frame_bytes,
                                label=f"server {rank}, keys of shard {info.index}")
    return server


class Copies:
    """The copies of key ranges one server process holds, by range index (its own, the one
    it is primary of from the start, and the ranges it backs up)."""

    def __init__(self, rank: int, channel: ControlChannel) -> None:
        self.rank, self.channel = rank, channel
        self.servers: dict[int, ShardServer] = {}
        self._reports: set[asyncio.Task[None]] = set()

    @property
    def own(self) -> ShardServer:
        return self.servers[self.rank]

    def primaries(self) -> dict[int, ShardServer]:
        return {i: s for i, s in self.servers.items() if s.primary}

    def report_first_pull(self, index: int) -> Callable[[ShardServer], None]:
        def report(server: ShardServer) -> None:
            task = asyncio.ensure_future(self.channel.send(Event(row=EventRecord(
                at=time.time(), kind="failover_served", detail={
                    "rank": self.rank, "index": index, "promoted_at": server.promoted_at,
                    "first_pull_at": server.first_pull_at}))))
            self._reports.add(task)
            task.add_done_callback(self._reports.discard)
        return report


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


async def _obey(channel: ControlChannel, copies: Copies,
                reports: asyncio.Queue[list[SyncRecord]]) -> None:
    while True:
        try:
            message = await channel.recv()
        except PsctlError as exc:
            raise RunFailed(f"shard server {copies.rank} lost the coordinator: {exc}") from None
        if isinstance(message, Start) and message.clocks_per_epoch is not None:
            for server in copies.servers.values():
                server.state.learning.start(message.clocks_per_epoch)
        elif isinstance(message, Stop):
            for server in copies.servers.values():
                server.drain(message.reason)
        elif isinstance(message, Checkpoint):
            for index, server in copies.primaries().items():
                await channel.send(Event(row=await _save(server, index, copies.rank, message)))
        elif isinstance(message, Chain | Promote):
            await channel.send(Event(row=await _rechain(copies, message)))
        elif isinstance(message, Heartbeat):
            await channel.send(message)  # answered from the loop that serves the frames
        elif isinstance(message, Members):
            await channel.send(Event(row=_members(copies, message)))
        elif isinstance(message, Exit):
            with contextlib.suppress(TimeoutError):  # the barriers reach the database first
                await asyncio.wait_for(reports.join(), timeout=5.0)
            await channel.send(Event(row=_stats_event(copies.own)))
            await channel.close()
            return


def _members(copies: Copies, order: Members) -> EventRecord:
    """Workers join and leave every copy this server holds (a backup too, so that it agrees
    with its primary should it take over)."""
    wanted, starts = set(order.workers), dict[int, int]()
    for server in copies.servers.values():
        state = server.state
        for worker in sorted(state.members - wanted):
            state.leave(worker)
        for worker in sorted(wanted - state.members):
            clock = state.join(worker)
            starts[worker] = min(clock, starts.get(worker, clock))
        server.release_ready_pulls()  # a leaver may have held the others back
    return EventRecord(at=time.time(), kind="members_updated", detail={
        "rank": copies.rank, "workers": sorted(wanted), "starts": starts})


async def _rechain(copies: Copies, order: Chain | Promote) -> EventRecord:
    """Link a copy to its (new) successor, or promote it; the event says it is done."""
    server = copies.servers.get(order.index)
    if server is None:
        raise ProtocolError(f"server {copies.rank} holds no copy of shard {order.index}")
    if isinstance(order, Promote):
        server.on_first_pull = copies.report_first_pull(order.index)
        server.promote()
        return EventRecord(at=time.time(), kind="promoted", detail={
            "rank": copies.rank, "index": order.index, "at": server.promoted_at})
    assert server.link is not None  # the run keeps replicas, or no chain would be sent
    await server.link.relink(order.successor)
    return EventRecord(at=time.time(), kind="chain_linked", detail={
        "rank": copies.rank, "index": order.index, "successor": order.successor,
        "resent": server.link.pending})


async def _save(server: ShardServer, index: int, rank: int, order: Checkpoint) -> EventRecord:
    """Snapshot one copy now (on the loop, between frames) and write it off the loop."""
    started = time.perf_counter()
    snapshot = checkpoint.Snapshot.of(server.state, order.seq)
    clocks = server.state.clocks.shard_clocks()
    path = checkpoint.shard_file(Path(order.folder), index)
    try:
        size = await asyncio.to_thread(snapshot.write, path)
    except StoreError as exc:
        return EventRecord(at=time.time(), kind="checkpoint_failed", detail={
            "rank": rank, "index": index, "seq": order.seq, "message": str(exc)})
    return EventRecord(at=time.time(), kind="checkpoint_saved", detail={
        "rank": rank, "index": index, "seq": order.seq, "path": str(path), "bytes": size,
        "seconds": round(time.perf_counter() - started, 4), "clocks": clocks})


def _stats_event(server: ShardServer) -> EventRecord:
    stats = server.stats
    return EventRecord(at=time.time(), kind="server_stats", detail={
        "rank": server.rank, "version": server.state.version, "pushes": server.state.pushes,
        "frames_in": stats.frames_in, "bytes_in": stats.bytes_in, "bytes_out": stats.bytes_out,
        "bad_frames": stats.bad_frames, "errors": stats.errors_by_code,
        "slow_readers_closed": stats.slow_readers_closed,
        "internal_errors": stats.internal_errors,
        "warnings_held_back": stats.warnings_held_back,
        "resent_pushes": stats.resent_pushes, "resent_pulls": stats.resent_pulls,
        "duplicates": server.state.duplicates,
        "range_versions": server.state.versions.tolist(),
    })
