"""A shard server's answers to the coordinator's orders about its copies: chains (``Chain``,
``Promote``), handoffs to a joining copy (``Handoff``, ``Restore``), copies coming and going
(``Adopt``, ``Drop``), moving a range's primary (``Demote``, ``Release``), checkpoints and
membership. Each returns the event that answers the order."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

from engine.errors import PsctlError, StoreError
from engine.roles.copies import Copies
from engine.server import checkpoint
from engine.server.service import ShardServer
from engine.wire.messages import (
    Adopt,
    Chain,
    Checkpoint,
    Demote,
    Drop,
    Handoff,
    Members,
    Promote,
    Release,
    Restore,
    ShardInfo,
)
from engine.wire.records import EventRecord

DRAIN_POLL_S = 0.002


def event(kind: str, copies: Copies, index: int, **detail: object) -> EventRecord:
    return EventRecord(at=time.time(), kind=kind,
                       detail={"rank": copies.rank, "index": index, **detail})


async def rechain(copies: Copies, order: Chain | Promote) -> EventRecord:
    """Link a copy to its (new) successor, or promote it; the event says it is done."""
    server = copies.get(order.index)
    if isinstance(order, Promote):
        server.on_first_pull = copies.report_first_pull(order.index)
        server.promote()
        return event("promoted", copies, order.index, at=server.promoted_at)
    if server.link is None:  # a run without replicas whose range moves between servers
        server.link = copies.new_link(order.index)
    held_since = server.link.held_since
    try:
        await server.link.relink(order.successor)
    except PsctlError as exc:  # the successor died meanwhile: its loss brings another Chain
        return event("chain_link_failed", copies, order.index, successor=order.successor,
                     message=str(exc))
    detail: dict[str, object] = {"successor": order.successor, "resent": server.link.pending}
    if held_since is not None:  # what a handoff cost: its updates waited this long
        detail["held_s"] = round(time.monotonic() - held_since, 4)
    return event("chain_linked", copies, order.index, **detail)


async def hand_off(copies: Copies, order: Handoff) -> EventRecord:
    """As this chain's tail, snapshot the copy and hold every later update for the joining
    server (in one step on the loop: no update falls between), then write the snapshot."""
    started = time.perf_counter()
    server = copies.get(order.index)
    if server.link is None:  # no replicas: this copy is the chain, and its tail
        server.link = copies.new_link(order.index)
    try:
        snapshot = checkpoint.Snapshot.of(server.state, 0, live=True)
        server.link.hold()
    except PsctlError as exc:
        return event("handoff_failed", copies, order.index, message=str(exc))
    try:
        size = await asyncio.to_thread(snapshot.write, Path(order.path))
    except StoreError as exc:
        await server.link.relink(None)  # the tail again: what it held is acknowledged
        return event("handoff_failed", copies, order.index, message=str(exc))
    return event("handoff_saved", copies, order.index, path=order.path, bytes=size,
                 seconds=round(time.perf_counter() - started, 4))


async def restore(copies: Copies, order: Restore) -> EventRecord:
    """Replace the copy of a range by the tail's snapshot (a fresh state, so that nothing of
    an earlier, abandoned handoff stays), make it the tail, then delete the file."""
    started = time.perf_counter()
    server = copies.get(order.index)
    state = copies.fresh_state(server.state.keys)
    path = Path(order.path)
    try:
        await asyncio.to_thread(checkpoint.restore, state, path, live=True)
    except StoreError as exc:
        return event("handoff_failed", copies, order.index, message=str(exc))
    server.state = state
    if server.link is None:
        server.link = copies.new_link(order.index)
    await server.link.relink(None)  # it joins as the tail: it acknowledges what it gets
    with contextlib.suppress(OSError):
        path.unlink()
    return event("handoff_restored", copies, order.index,
                 seconds=round(time.perf_counter() - started, 4))


async def adopt(copies: Copies, order: Adopt) -> EventRecord:
    """An empty copy of a range, as a backup, listening; a handoff fills it."""
    info = ShardInfo(index=order.index, address="", start=order.start, end=order.end)
    server = await copies.add(info, primary=False)
    return event("copy_listening", copies, order.index, address=server.address)


async def drop(copies: Copies, order: Drop) -> EventRecord:
    await copies.drop(order.index)
    return event("copy_dropped", copies, order.index)


async def demote(copies: Copies, order: Demote, timeout_s: float) -> EventRecord:
    """Stop serving workers, then wait until every update this copy applied reached the
    chain's tail (so the next primary holds all of them)."""
    started = time.monotonic()
    server = copies.get(order.index)
    server.demote()
    while server.link is not None and server.link.pending:
        if time.monotonic() - started > timeout_s:
            return event("demote_failed", copies, order.index, pending=server.link.pending,
                         message=f"updates did not reach the chain's tail in {timeout_s:g} s")
        await asyncio.sleep(DRAIN_POLL_S)
    return event("demoted", copies, order.index,
                 seconds=round(time.monotonic() - started, 4))


async def release(copies: Copies, order: Release) -> EventRecord:
    closed = await copies.get(order.index).release_clients("this copy no longer serves workers")
    return event("released", copies, order.index, closed=closed)


async def save(server: ShardServer, index: int, rank: int, order: Checkpoint) -> EventRecord:
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


def members(copies: Copies, order: Members) -> EventRecord:
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
