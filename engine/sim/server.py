"""A simulated shard server: the real ``ShardState`` behind an inbox served first come, first
served, one request at a time. A push takes the compute model's update time for its keys; a pull
is answered at once when the consistency model allows, else it waits, as on a real server, until
a push releases it. Replies travel back through the network model."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from engine.consistency.base import PushTiming
from engine.errors import RunFailed
from engine.keys import KeyRange
from engine.server.pull_filter import PullFilter, SendAll
from engine.server.shard import ShardState
from engine.sim.compute import Costs
from engine.sim.network import Link, transmit, transmit_group
from engine.wire.codecs import narrow
from engine.wire.protocol import HEADER_BYTES
from engine.wire.records import SyncRecord

# An ACK carries its version in the header and one float64 scale as payload.
ACK_BYTES = HEADER_BYTES + 8 + 8


def key_bytes(span: KeyRange) -> int:
    """The bytes of one key of a frame's key list over ``span``: as the wire's ``key_kind``,
    uint32 while the span ends within 2^32, else uint64 (a hashed feature space)."""
    return 4 if span.end <= 2**32 else 8


@dataclass(frozen=True, slots=True)
class Reply:
    version: int
    nbytes: int
    wait_s: float = 0.0
    slowest_clock: int = 0
    scale: float | None = None
    # A key-list pull answered to a client that keeps a copy: the keys sent and their values
    # (a pull filter may leave some out), for the client to fill its copy from.
    keys: np.ndarray | None = None
    values: np.ndarray | None = None


@dataclass(slots=True)
class PullRequest:
    worker: int
    clock: int
    span: KeyRange
    out: np.ndarray  # the part of the worker's buffer this shard fills
    dtype: np.dtype  # what the values travel as
    link: Link
    reply: asyncio.Future[Reply]
    since: float = 0.0
    index: np.ndarray | None = None  # a key-list pull: the sorted global keys asked for
    keeps_copy: bool = False  # the client fills ``out`` itself, from the reply's keys


@dataclass(slots=True)
class PushRequest:
    worker: int
    clock: int
    span: KeyRange
    values: np.ndarray
    index: np.ndarray | None  # global keys of a sparse push
    commit: bool
    base_version: int | None
    timing: PushTiming
    link: Link
    reply: asyncio.Future[Reply]


class Network:
    """The network model on the simulation's loop: ``send`` schedules a delivery."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()

    def send(self, source: Link, target: Link, nbytes: int,
             deliver: Callable[..., object], *args: object) -> None:
        arrival = transmit(self.loop.time(), source, target, nbytes)
        self.loop.call_at(arrival, deliver, *args)

    def send_group(self, source: Link,
                   frames: Sequence[tuple[Link, int, Callable[..., object], object]]) -> None:
        """Frames of one request: they leave together and arrive together."""
        arrival = transmit_group(self.loop.time(), source,
                                 [(target, nbytes) for target, nbytes, _, _ in frames])
        for _, _, deliver, request in frames:
            self.loop.call_at(arrival, deliver, request)


def _resolve(future: asyncio.Future[Reply], reply: Reply) -> None:
    if not future.done():
        future.set_result(reply)


class SimServer:
    def __init__(self, index: int, state: ShardState, network: Network, link: Link,
                 costs: Costs, *, max_queued: int,
                 on_syncs: Callable[[list[SyncRecord]], None] | None,
                 pull_filter: PullFilter | None = None) -> None:
        self.index, self.state, self.network, self.costs = index, state, network, costs
        self.pull_filter = pull_filter or SendAll()
        self.link = link
        self.inbox: asyncio.Queue[PullRequest | PushRequest] = asyncio.Queue(max_queued)
        self.pending: list[PullRequest] = []
        self.draining = False  # the run is stopping: every pull is answered as it comes
        self.busy_s = 0.0
        self._on_syncs = on_syncs

    def deliver(self, request: PullRequest | PushRequest) -> None:
        try:
            self.inbox.put_nowait(request)
        except asyncio.QueueFull:
            raise RunFailed(f"simulated server {self.index}: more than {self.inbox.maxsize} "
                            "requests queued (a worker loop sent without waiting?)") from None

    async def serve(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            request = await self.inbox.get()
            if isinstance(request, PushRequest):
                cost = self.costs.update_s(len(request.values))
                self.busy_s += cost
                await asyncio.sleep(cost)
                self._push(request)
            else:
                request.since = loop.time()
                self._pull(request)

    def drain(self) -> None:
        """The run stops (its budget is spent, Ctrl-C): the workers stop at their next step,
        so a pull held for a worker that will never push again would never be answered. Every
        waiting pull is answered now, and every later one at once, as a real shard's pulls are
        let go at the end of a run. A push that follows (the step a released pull let a
        worker finish) is acknowledged, not applied: the budget is spent, and a consistency
        model would refuse it (ElasticBSP: a push past the worker's barrier)."""
        self.draining = True
        now, waiting, self.pending = asyncio.get_running_loop().time(), self.pending, []
        for request in waiting:
            self._answer(request, now - request.since)

    def _pull(self, request: PullRequest) -> None:
        if self.draining or self.state.pull_ready(request.worker, request.clock, request.span):
            self._answer(request, 0.0)
        else:
            self.pending.append(request)

    def _answer(self, request: PullRequest, waited_s: float) -> None:
        if request.index is not None:
            self._answer_keys(request, request.index, waited_s)
            return
        # As the real shard: the pull filter picks the values to send (the worker's client
        # keeps its copy, into which ``out`` looks), and a filtered answer names its keys.
        current = self.state.read(request.span)
        local = self.state.keys.local(request.span)
        chosen = self.pull_filter.select(request.worker, local, current)
        if chosen is None:
            values = narrow(current, request.dtype)
            request.out[...] = values
            nbytes = HEADER_BYTES + 8 + values.nbytes
        else:
            at = chosen - local.start
            values = narrow(current[at], request.dtype)
            request.out[at] = values
            nbytes = HEADER_BYTES + 8 + values.nbytes + len(at) * key_bytes(request.span)
        reply = Reply(self.state.version_of(request.span), nbytes, waited_s,
                      self.state.slowest_clock(request.span))
        self.network.send(self.link, request.link, nbytes, _resolve, request.reply, reply)

    def _answer_keys(self, request: PullRequest, index: np.ndarray, waited_s: float) -> None:
        """A key-list pull (a sparse model's working set), as the real shard answers it: the
        values of the keys asked for, or those the pull filter lets through, key by key; the
        answer names its keys either way."""
        rows, current = self.state.read_keyed(request.span, index)
        kept = self.pull_filter.select_rows(request.worker, rows, current)
        keys, values = (index, current) if kept is None else (index[kept], current[kept])
        values = narrow(values, request.dtype)
        if not request.keeps_copy:  # no filter: every key asked for is answered
            request.out[...] = values
        nbytes = HEADER_BYTES + 8 + values.nbytes + len(keys) * key_bytes(request.span)
        reply = Reply(self.state.version_of(request.span), nbytes, waited_s,
                      self.state.slowest_clock(request.span),
                      keys=keys if request.keeps_copy else None,
                      values=values if request.keeps_copy else None)
        self.network.send(self.link, request.link, nbytes, _resolve, request.reply, reply)

    def _push(self, request: PushRequest) -> None:
        if self.draining:
            version = self.state.version_of(request.span)
            self.network.send(self.link, request.link, ACK_BYTES, _resolve, request.reply,
                              Reply(version, ACK_BYTES))
            return
        accepted = self.state.push(request.worker, request.clock, request.span, request.values,
                                   request.timing, index=request.index, commit=request.commit,
                                   base_version=request.base_version)
        reply = Reply(accepted, ACK_BYTES, scale=self.state.last_scale)
        self.network.send(self.link, request.link, ACK_BYTES, _resolve, request.reply, reply)
        syncs = self.state.controller.take_syncs()
        if syncs and self._on_syncs is not None:
            self._on_syncs(syncs)
        self._release()

    def _release(self) -> None:
        now, waiting = asyncio.get_running_loop().time(), []
        for request in self.pending:
            if self.state.pull_ready(request.worker, request.clock, request.span):
                self._answer(request, now - request.since)
            else:
                waiting.append(request)
        self.pending = waiting
