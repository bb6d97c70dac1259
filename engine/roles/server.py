"""The shard server role: join the coordinator, serve the key ranges it holds, leave when told.

A server holds copies of key ranges (``engine.roles.copies``): those its welcome lists, and
those the coordinator has it adopt later; it answers the coordinator's orders about them
(``engine.roles.copy_orders``) on the same event loop that serves the frames.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

from engine.config import RunConfig
from engine.errors import ProtocolError, PsctlError, RunFailed
from engine.roles import copy_orders as orders
from engine.roles.beating import BeatSender, beat_target
from engine.roles.copies import Copies, Endpoint, build_shard
from engine.roles.lifecycle import hello
from engine.roles.links import server_transport
from engine.server.vectors import ShardVectors
from engine.transport.base import Transport
from engine.transport.control import ControlChannel
from engine.transport.schemes import listening
from engine.wire.codecs import prepare_casts
from engine.wire.messages import (
    Adopt,
    Chain,
    Checkpoint,
    Demote,
    Drop,
    Event,
    Exit,
    Fatal,
    Handoff,
    Members,
    Message,
    Promote,
    Release,
    Restore,
    Serving,
    Start,
    Stop,
    Syncs,
    VectorOps,
    VectorResults,
    Welcome,
    layout_of,
)
from engine.wire.records import EventRecord, SyncRecord

__all__ = ["build_shard", "run_server"]


async def run_server(transport: Transport, coordinator: str, rank: int, *, token: str,
                     host: str = "127.0.0.1", port: int = 0) -> None:
    channel, welcome = await ControlChannel.open(
        transport, coordinator, hello("server", rank, host), token=token,
        timeout=60.0)
    config = RunConfig.model_validate(welcome.config)
    prepare_casts(config.comm.wire_dtype)  # before serving: a float16 run's casts load torch
    # Every shard decides the same barriers; shard 0's copies report them, in order.
    reports: asyncio.Queue[list[SyncRecord]] = asyncio.Queue()
    copies = Copies(rank, channel, config, layout_of(welcome),
                    Endpoint(server_transport(listening(transport, config.cluster.transport),
                                              config), token,
                             bytes.fromhex(welcome.run_id)[:16], host, port),
                    on_syncs=reports.put_nowait)
    resume = Path(welcome.checkpoint) if welcome.checkpoint is not None else None
    try:
        for info in welcome.held:
            await copies.add(info, primary=info.index in welcome.primaries,
                             restore_from=resume)
    except PsctlError as exc:  # a damaged checkpoint, say: the run's reason, in its words
        with contextlib.suppress(PsctlError):
            await channel.send(Fatal(message=str(exc)))
        raise
    await channel.send(Serving(copies=copies.infos()))
    reporter = asyncio.create_task(_report_syncs(channel, reports))
    beating = _heartbeat(coordinator, welcome, rank, token, config)
    try:
        await _obey(channel, copies, reports)
    finally:
        if beating is not None:
            beating.stop()
        reporter.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reporter
        for server in copies.servers.values():
            await server.close()


def _heartbeat(coordinator: str, welcome: Welcome, rank: int, token: str,
               config: RunConfig) -> BeatSender | None:
    """With replicas, a thread beats to the coordinator from the start: it answers for the
    process even while the loop is busy with a long update."""
    if welcome.heartbeat_port is None:
        return None
    sender = BeatSender(beat_target(coordinator, welcome.heartbeat_port), rank, token,
                        config.cluster.heartbeat_timeout_s / 5, asyncio.get_running_loop(),
                        incarnation=welcome.heartbeat_incarnation)
    sender.start()
    return sender


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
        if isinstance(message, Start):
            if message.clocks_per_epoch is not None:
                copies.clocks_per_epoch = message.clocks_per_epoch
                for server in copies.servers.values():
                    server.state.learning.start(message.clocks_per_epoch)
        elif isinstance(message, Stop):
            for server in copies.servers.values():
                server.drain(message.reason)
        elif isinstance(message, Checkpoint):
            for index, server in copies.primaries().items():
                await channel.send(Event(row=await orders.save(server, index, copies.rank,
                                                               message)))
        elif isinstance(message, VectorOps):
            await channel.send(_vector_ops(copies, message))
        elif isinstance(message, Members):
            await channel.send(Event(row=orders.members(copies, message)))
        elif isinstance(message, Demote):  # waits for the chain: orders go on meanwhile
            copies.answer_later(orders.demote(copies, message,
                                              copies.config.cluster.request_timeout_s))
        elif isinstance(message, Exit):
            with contextlib.suppress(TimeoutError):  # the barriers reach the database first
                await asyncio.wait_for(reports.join(), timeout=5.0)
            await channel.send(Event(row=copies.stats()))
            await channel.close()
            return
        else:
            await channel.send(Event(row=await _copy_order(copies, message)))


def _vector_ops(copies: Copies, message: VectorOps) -> VectorResults:
    """Sandblaster's vector operations on every key range this server serves; the dot
    products' parts are summed over them (the coordinator sums over servers)."""
    try:
        totals = [0.0] * sum(op.op == "dot" for op in message.ops)
        for index, server in copies.primaries().items():
            vectors = copies.vectors.get(index)
            if vectors is None or vectors.state is not server.state:
                vectors = copies.vectors[index] = ShardVectors(server.state)
            totals = [t + v for t, v in zip(totals, vectors.apply(message.ops), strict=True)]
    except PsctlError as exc:
        return VectorResults(seq=message.seq, error=f"server {copies.rank}: {exc}")
    return VectorResults(seq=message.seq, values=totals)


async def _copy_order(copies: Copies, message: Message) -> EventRecord:
    """Carry out an order about one copy; one that cannot be (a range this server does not
    hold, say) is answered ``order_failed``, and the server goes on."""
    try:
        return await _carry_out(copies, message)
    except ProtocolError as exc:
        return EventRecord(at=time.time(), kind="order_failed", detail={
            "rank": copies.rank, "index": getattr(message, "index", None),
            "order": type(message).__name__, "message": str(exc)})


async def _carry_out(copies: Copies, message: Message) -> EventRecord:
    if isinstance(message, Chain | Promote):
        return await orders.rechain(copies, message)
    if isinstance(message, Handoff):
        return await orders.hand_off(copies, message)
    if isinstance(message, Restore):
        return await orders.restore(copies, message)
    if isinstance(message, Adopt):
        return await orders.adopt(copies, message)
    if isinstance(message, Release):
        return await orders.release(copies, message)
    if isinstance(message, Drop):
        return await orders.drop(copies, message)
    raise ProtocolError(f"shard server {copies.rank} does not take {type(message).__name__} "
                        "orders")
