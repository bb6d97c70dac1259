"""The copies of key ranges one shard server process holds, by range index: those it serves
(the primary of) and those it backs up. The coordinator adds copies (``Adopt``, or the welcome)
and drops them as servers come, go and die."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from engine import initial
from engine.config import RunConfig
from engine.consistency.registry import make_controller
from engine.errors import ProtocolError
from engine.keyrows import RowBudget
from engine.keys import KeyLayout, KeyRange
from engine.policies.aggregation import AGGREGATION_RULES
from engine.proctime import usable_cores
from engine.replication.link import ChainLink
from engine.server import checkpoint
from engine.server.aggregation import make_aggregator
from engine.server.learning import make_learning
from engine.server.limits import ServerBudget, ServerLimits, server_memory
from engine.server.optimizers import make_optimizer
from engine.server.pull_filter import make_pull_filter
from engine.server.service import ShardServer
from engine.server.shard import SPARSE_CAPACITY, ShardState, SparseKeys
from engine.server.vectors import ShardVectors
from engine.transport.admission import credential
from engine.transport.base import Transport
from engine.transport.control import ControlChannel
from engine.wire.messages import Event, Fatal, ShardInfo
from engine.wire.records import EventRecord, SyncRecord


@dataclass(frozen=True)
class Endpoint:
    """Where and how this process's copies listen and link: its transport, the run's secret
    and id, the address it binds."""

    transport: Transport
    token: str
    run: bytes
    host: str = "127.0.0.1"
    port: int = 0


class Copies:
    def __init__(self, rank: int, channel: ControlChannel, config: RunConfig,
                 layout: KeyLayout, endpoint: Endpoint,
                 on_syncs: Callable[[list[SyncRecord]], None] | None = None) -> None:
        self.rank, self.channel = rank, channel
        self.config, self.layout, self.endpoint = config, layout, endpoint
        # Every shard decides the same barriers; shard 0's copies report them, in order.
        self._on_syncs = on_syncs
        self.servers: dict[int, ShardServer] = {}
        self.clocks_per_epoch: float | None = None  # the Start's, for copies built later
        self._reports: set[asyncio.Future[None]] = set()
        # Sandblaster L-BFGS's named vectors, per key range served (engine.server.vectors).
        self.vectors: dict[int, ShardVectors] = {}
        self._budget: ServerBudget | None = None
        # What its sparse copies may store in all (cluster.server_memory), backups too.
        self.rows_budget = RowBudget(server_memory(config.cluster))
        self._said_full = False

    async def add(self, info: ShardInfo, *, primary: bool,
                  restore_from: Path | None = None) -> ShardServer:
        """A copy of key range ``info``, listening: its state (from a checkpoint folder, on a
        resume), the run's limits and pull filter, a chain link when the run keeps replicas."""
        if info.index in self.servers:
            raise ProtocolError(f"server {self.rank} holds shard {info.index} already")
        state = self.fresh_state(KeyRange(info.start, info.end))
        if restore_from is not None:  # a resumed run: the shard as it was saved
            path = checkpoint.shard_file(restore_from, info.index)
            await asyncio.to_thread(checkpoint.restore, state, path)
        cluster = self.config.cluster
        limits = ServerLimits.from_cluster(cluster, usable_cores())
        pulls = make_pull_filter(self.config.comm.pull_filter, self.config.comm.refresh_every,
                                 cluster.workers, state.size)
        server = ShardServer(state, run=self.endpoint.run, rank=self.rank,
                             max_frame_bytes=cluster.max_frame_bytes, limits=limits,
                             on_syncs=self._on_syncs if info.index == 0 else None,
                             pull_filter=pulls, budget=self.budget(limits))
        server.primary = primary
        server.on_full = self._full
        if cluster.replicas:
            server.link = self.new_link(info.index)
        await server.start(self.endpoint.transport, self.endpoint.host, self.endpoint.port,
                           token=self.endpoint.token)
        self.servers[info.index] = server
        return server

    def _full(self, why: str) -> None:
        """A push did not fit this process's budget: the run cannot go on (no key is ever
        dropped), and ends saying so, once (the workers' later pushes are refused too)."""
        if not self._said_full:
            self._said_full = True
            self._keep(asyncio.ensure_future(self.channel.send(Fatal(message=why))))

    def budget(self, limits: ServerLimits) -> ServerBudget:
        """The one budget every copy of this process shares (engine.server.limits)."""
        if self._budget is None:
            self._budget = ServerBudget(limits)
        return self._budget

    async def drop(self, index: int) -> None:
        server = self.get(index)
        del self.servers[index]
        await server.close()

    def get(self, index: int) -> ShardServer:
        server = self.servers.get(index)
        if server is None:
            raise ProtocolError(f"server {self.rank} holds no copy of shard {index}")
        return server

    def fresh_state(self, keys: KeyRange) -> ShardState:
        state = build_shard(self.config, keys, self.layout, self.rows_budget)
        if self.clocks_per_epoch is not None:
            state.learning.start(self.clocks_per_epoch)
        return state

    def new_link(self, index: int) -> ChainLink:
        """A copy's link to its successor (linked by a ``Chain`` order)."""
        return ChainLink(self.endpoint.transport,
                         token=credential(self.endpoint.token, "server", self.rank),
                         max_frame_bytes=self.config.cluster.max_frame_bytes,
                         label=f"server {self.rank}, keys of shard {index}")

    def infos(self) -> list[ShardInfo]:
        return [ShardInfo(index=i, address=c.address, start=c.state.keys.start,
                          end=c.state.keys.end) for i, c in self.servers.items()]

    def primaries(self) -> dict[int, ShardServer]:
        return {i: s for i, s in self.servers.items() if s.primary}

    def report_first_pull(self, index: int) -> Callable[[ShardServer], None]:
        def report(server: ShardServer) -> None:
            self.report(EventRecord(at=time.time(), kind="failover_served", detail={
                "rank": self.rank, "index": index, "promoted_at": server.promoted_at,
                "first_pull_at": server.first_pull_at}))
        return report

    def report(self, row: EventRecord) -> None:
        """Send an event from a callback (no await there)."""
        self._keep(asyncio.ensure_future(self.channel.send(Event(row=row))))

    def answer_later(self, answer: Coroutine[Any, Any, EventRecord]) -> None:
        """Send the event ``answer`` returns once it does, while other orders go on."""
        async def send() -> None:
            await self.channel.send(Event(row=await answer))

        self._keep(asyncio.ensure_future(send()))

    def _keep(self, task: asyncio.Future[None]) -> None:
        self._reports.add(task)
        task.add_done_callback(self._reports.discard)

    def stats(self) -> EventRecord:
        """The ``server_stats`` event: this process's counters over the copies it serves (over
        all it holds, if it serves none)."""
        served = self.primaries() or self.servers
        counters: dict[str, int] = {}
        errors: dict[str, int] = {}
        versions: list[int] = []
        for server in served.values():
            stats = server.stats
            for name in ("frames_in", "bytes_in", "bytes_out", "bad_frames",
                         "slow_readers_closed", "internal_errors", "warnings_held_back",
                         "resent_pushes", "resent_pulls"):
                counters[name] = counters.get(name, 0) + int(getattr(stats, name))
            counters["pushes"] = counters.get("pushes", 0) + server.state.pushes
            counters["duplicates"] = counters.get("duplicates", 0) + server.state.duplicates
            for code, count in stats.errors_by_code.items():
                errors[code] = errors.get(code, 0) + count
            versions += server.state.versions.tolist()
        return EventRecord(at=time.time(), kind="server_stats", detail={
            "rank": self.rank, **counters, "errors": errors,
            "version": min((s.state.version for s in served.values()), default=0),
            "range_versions": versions, "serves": sorted(self.primaries()),
            # Keys with a row in this process, over every copy it holds (backups too): what its
            # memory grows with when they are sparse.
            "stored_keys": sum(s.state.stored for s in self.servers.values()),
            "stored_bytes": sum(s.state.stored_bytes for s in self.servers.values()),
            "sparse": any(s.state.sparse is not None for s in self.servers.values()),
        })


def build_shard(config: RunConfig, keys: KeyRange, layout: KeyLayout,
                budget: RowBudget | None = None) -> ShardState:
    """A shard's state with the run's policies: clock ranges from the layout, the consistency
    model, the aggregation rule and the server optimizer, each from its registry; a sparse
    one stores no more than ``budget`` lets its process's sparse shards store."""
    ranges = layout.clock_ranges(keys)
    workers = config.cluster.workers
    divisor = AGGREGATION_RULES.get(config.sync.push_scale)(workers)
    sparse = (sparse_keys(keys, layout, config.train.seed, budget) if layout.sparse_on(keys)
              else None)
    size = len(keys) if sparse is None else sparse.capacity  # rows of the value arrays
    learning = make_learning(config.learning, workers, divisor, size)
    state = ShardState(
        keys,
        make_controller(config.sync, workers=workers, ranges=len(ranges)),
        make_optimizer(config.optimizer, size),
        workers=workers,
        ranges=ranges,
        aggregator=make_aggregator(config.sync.push_scale, keys, ranges, workers,
                                   sparse_capacity=None if sparse is None else size),
        clip_norm=config.optimizer.clip_norm,
        learning=learning,
        sparse=sparse,
    )
    rules = [s.init for s in layout.segments if s.keys.intersect(keys) is not None]
    if sparse is None and None not in rules:  # the servers start these keys, not worker 0
        state.init(keys, _initial(layout, keys, config.train.seed))
    return state


def sparse_keys(keys: KeyRange, layout: KeyLayout, seed: int,
                budget: RowBudget | None = None) -> SparseKeys:
    """A sparse shard of ``keys`` (one segment's piece): rows for as many keys as it has, up to
    the default, each new one at its segment's initial value (zeros without a rule)."""
    rule = next(s.init for s in layout.segments if s.keys.intersect(keys) is not None)
    capacity = min(len(keys), SPARSE_CAPACITY)
    if rule is None:
        return SparseKeys(capacity=capacity, budget=budget)
    return SparseKeys(capacity=capacity, initial=partial(initial.values, rule, seed=seed),
                      budget=budget)


def _initial(layout: KeyLayout, keys: KeyRange, seed: int) -> np.ndarray:
    """Every key of a dense shard at its segment's rule."""
    values = np.empty(len(keys), dtype=np.float32)
    for segment in layout.segments:
        piece = segment.keys.intersect(keys)
        if piece is not None and segment.init is not None:
            ids = np.arange(piece.start, piece.end, dtype=np.int64)
            values[keys.local(piece)] = initial.values(segment.init, ids, seed)
    return values
