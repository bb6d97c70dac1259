"""A simulated worker's parameter client: the real client's pull and push, as coroutines over the
network model, returning the real client's result types (so rows are built by the same code)."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

from engine.consistency.base import PushTiming
from engine.keys import KeyRange, split_by_shard, split_keys_by_shard
from engine.sim.network import Link
from engine.sim.server import PullRequest, PushRequest, Reply, SimServer, key_bytes
from engine.wire.codecs import narrow
from engine.wire.protocol import HEADER_BYTES
from engine.worker.client import PullResult, PushResult
from engine.worker.held import Held, held_for

_DIM_BYTES = 8


class SimClient:
    def __init__(self, rank: int, servers: list[SimServer], link: Link, *,
                 dtype: np.dtype[Any], epoch: float, keeps_copy: bool = False) -> None:
        self.rank, self.servers, self.dtype = rank, servers, dtype
        # With a pull filter, as the real client: answers land in this copy of every value
        # the worker was sent, and each pull hands the caller the whole of it. Range pulls use
        # a dense array, key-list pulls the real client's ``Held`` (a sparse model's key space
        # may be 2^33 keys, too many for a dense copy); each made when first needed.
        self._keeps_copy = keeps_copy
        self._copy: np.ndarray | None = None
        self._held: Held | None = None
        self.ranges = [server.state.keys for server in servers]
        self.link = link
        self.network = servers[0].network
        self.loop = asyncio.get_running_loop()
        self._epoch = epoch  # unix time of virtual time 0

    def now(self) -> float:
        """Virtual time as a unix timestamp, as every recorded row has it."""
        return self._epoch + self.loop.time()

    async def pull(self, keys: KeyRange, out: np.ndarray, clock: int) -> PullResult:
        replies, frames = [], []
        if self._keeps_copy and self._copy is None:
            self._copy = np.zeros(self.ranges[-1].end, dtype=np.float32)
        for index, span in split_by_shard(keys, self.ranges):
            server, reply = self.servers[index], self.loop.create_future()
            into = (out[keys.local(span)] if self._copy is None
                    else self._copy[span.start:span.end])
            request = PullRequest(self.rank, clock, span, into, self.dtype, self.link, reply)
            frames.append((server.link, HEADER_BYTES, server.deliver, request))
            replies.append((index, reply))
        self.network.send_group(self.link, frames)
        sent = HEADER_BYTES * len(frames)
        answers: list[Reply] = await asyncio.gather(*(reply for _, reply in replies))
        if self._copy is not None:
            out[...] = self._copy[keys.start:keys.end]
        versions = {index: a.version for (index, _), a in zip(replies, answers, strict=True)}
        return PullResult(versions, max(a.wait_s for a in answers), sent,
                          sum(a.nbytes for a in answers), self.now(),
                          min(a.slowest_clock for a in answers))

    async def pull_keys(self, keys: np.ndarray, out: np.ndarray, clock: int) -> PullResult:
        """A pull of the sorted global ``keys`` (a sparse model's working set) into ``out``, as
        the real client's key-list pull: one frame naming its keys to each shard that owns
        some, stamped with the shard's whole range (whose clocks hold the pull back)."""
        held = self._held
        if self._keeps_copy and held is None:
            held = self._held = held_for(self.ranges[-1].end)
        replies, frames, parts = [], [], []
        for index, mine in split_keys_by_shard(keys, self.ranges):
            server, reply = self.servers[index], self.loop.create_future()
            span = self.ranges[index]
            request = PullRequest(self.rank, clock, span, out[mine], self.dtype, self.link,
                                  reply, index=keys[mine], keeps_copy=held is not None)
            frames.append((server.link, HEADER_BYTES + (mine.stop - mine.start) * key_bytes(span),
                           server.deliver, request))
            replies.append((index, reply))
            parts.append(mine)
        self.network.send_group(self.link, frames)
        sent = sum(nbytes for _, nbytes, _, _ in frames)
        answers: list[Reply] = await asyncio.gather(*(reply for _, reply in replies))
        if held is not None:  # each shard's keys are its own: the order of filling is free
            for mine, answer in zip(parts, answers, strict=True):
                assert answer.keys is not None and answer.values is not None
                held.fill(keys[mine], answer.keys, answer.values, out[mine])
        versions = {index: a.version for (index, _), a in zip(replies, answers, strict=True)}
        return PullResult(versions, max((a.wait_s for a in answers), default=0.0), sent,
                          sum(a.nbytes for a in answers), self.now(),
                          min((a.slowest_clock for a in answers), default=0))

    async def push(self, keys: KeyRange, values: np.ndarray, *, clock: int,
                   base_versions: dict[int, int], pushed_at: float, waited_s: float,
                   final: bool, index: np.ndarray | None = None) -> PushResult:
        """A dense push of ``values`` for ``keys``, or a sparse one of the sorted global keys
        ``index`` inside ``keys``; every shard ``keys`` touches gets a frame that commits it."""
        timing = PushTiming(pushed_at, waited_s, final)
        values = narrow(values, self.dtype)
        replies, frames, counts, dense = [], [], [], 0
        for shard, span in split_by_shard(keys, self.ranges):
            if index is None:
                part, keys_of = values[keys.local(span)], None
            else:
                lo, hi = np.searchsorted(index, (span.start, span.end))
                part, keys_of = values[lo:hi], index[lo:hi]
            nbytes = (HEADER_BYTES + _DIM_BYTES + part.nbytes
                      + (0 if keys_of is None else len(keys_of) * key_bytes(span)))
            server, reply = self.servers[shard], self.loop.create_future()
            request = PushRequest(self.rank, clock, span, part.astype(np.float32), keys_of, True,
                                  base_versions.get(shard), timing, self.link, reply)
            frames.append((server.link, nbytes, server.deliver, request))
            dense += HEADER_BYTES + _DIM_BYTES + len(span) * 4
            counts.append(len(part))
            replies.append((shard, reply))
        self.network.send_group(self.link, frames)
        sent = sum(nbytes for _, nbytes, _, _ in frames)
        answers: list[Reply] = await asyncio.gather(*(reply for _, reply in replies))
        versions = {shard: a.version for (shard, _), a in zip(replies, answers, strict=True)}
        staleness = max((v - base_versions.get(s, v) for s, v in versions.items()), default=0)
        scaled = [(a.scale, n) for a, n in zip(answers, counts, strict=True)
                  if a.scale is not None and n]
        weight = sum(n for _, n in scaled)
        scale = sum(s * n for s, n in scaled) / weight if weight else None
        return PushResult(versions, max(staleness, 0), sent, sum(a.nbytes for a in answers),
                          self.now(), scale, weight, dense)
