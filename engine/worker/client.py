"""The worker-side parameter client: non-blocking push and pull of key ranges or sparse key
lists over all shards.

``push``, ``pull`` and ``init`` return a typed handle at once; ``wait(handle, timeout)`` blocks
until every shard involved has answered and returns the matching result type. Keys are a
``KeyRange`` (a layer, the whole model) or a sorted array of unique keys (a sparse gradient);
either is cut per shard here. Network I/O runs on an event loop in a background
thread (a ``LoopThread`` shared with the control channel; in the simulator, its virtual-time
loop), so a worker's computation overlaps its communication. Values passed to ``push`` are
copied before the call returns: the caller may reuse its buffer at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Generic, TypeVar

import numpy as np

from engine.aio import IO, Pending
from engine.errors import (
    ProtocolError,
    PsctlError,
    RequestTimeout,
)
from engine.keys import KeyRange, split_by_shard, split_keys_by_shard
from engine.transport.base import Transport
from engine.wire.codecs import CODECS, Codec, narrow, widen_into
from engine.wire.protocol import (
    ANY_CLOCK,
    FLAG_COMMIT,
    FLAG_FINAL,
    HEADER_BYTES,
    MAX_LIST_KEYS,
    DType,
    Frame,
    MsgType,
    Role,
    encode,
    numpy_dtype,
    to_ns,
    wire_dtype,
)
from engine.worker.connection import Link, ShardConnection
from engine.worker.connection import LinkFaults as LinkFaults  # re-exported for the roles
from engine.worker.connection import ShardAddress as ShardAddress
from engine.worker.held import held_for


@dataclass(frozen=True, slots=True)
class WireFormat:
    """How a client's values travel: their type on the wire (pushes are narrowed before they
    are framed, pulls are answered in it) and the codec of its key-list frames."""

    dtype: DType = DType.FLOAT32
    codec: Codec = Codec.NONE
    # The servers filter this client's pulls (only changed values come back), so the client
    # keeps its own copy of every value it was sent and fills each pull from it.
    keeps_copy: bool = False
    # Pushes and pulls go out as frames of at most this many keys (0: one frame per shard).
    range_size: int = 0

    @classmethod
    def of(cls, dtype: str, codec: str, *, keeps_copy: bool = False,
           range_size: int | None = None) -> WireFormat:
        """From the ``comm.wire_dtype``, ``comm.compress``, ``comm.pull_filter`` and
        ``comm.range_size`` settings."""
        return cls(wire_dtype(dtype), CODECS.get(codec).code, keeps_copy, range_size or 0)


PLAIN_WIRE = WireFormat()


@dataclass(frozen=True, slots=True)
class PullResult:
    versions: dict[int, int]  # shard index -> version the values were read at
    wait_s: float  # longest time a shard held the pull back for consistency
    bytes_sent: int
    bytes_received: int
    answered_at: float = field(default=0.0, compare=False)  # when the last reply arrived (unix s)
    # The slowest worker's committed clocks on the pulled keys' clock ranges (all shards).
    slowest_clock: int = field(default=0, compare=False)


@dataclass(frozen=True, slots=True)
class PushResult:
    versions: dict[int, int]  # shard index -> version the push was accepted at
    staleness: int  # updates applied between the pull and this push, worst shard
    bytes_sent: int
    bytes_received: int
    answered_at: float = field(default=0.0, compare=False)  # when the last ack arrived (unix s)
    # The scale the shards applied the gradient with (aggregator weight x learning-rate
    # factors), averaged over the keys that carried values; None when no key did.
    lr_scale: float | None = None
    scaled_keys: int = 0  # the keys lr_scale averages over
    # What the same push would have cost as dense float32 frames of its spans (before any
    # filter): bytes_sent / dense_bytes is what filtering saved.
    dense_bytes: int = 0


Result = PullResult | PushResult
R = TypeVar("R", PullResult, PushResult)
Keys = KeyRange | np.ndarray  # a contiguous range, or sorted unique keys (any integer dtype)


@dataclass(frozen=True, slots=True)
class Handle(Generic[R]):
    """A request in flight; ``ParameterClient.wait`` turns it into its result."""

    request_id: int
    kind: type[R]


PullHandle = Handle[PullResult]
PushHandle = Handle[PushResult]


@dataclass(frozen=True, slots=True)
class _Part:
    """One shard's frame of a request (its request id is set when it is submitted)."""

    shard: int
    frame: Frame
    out: np.ndarray | None  # where a pull's values go


def _checked_keys(keys: np.ndarray, num_keys: int) -> np.ndarray:
    """Sorted, unique, in-range integer keys, or a ProtocolError saying which rule failed."""
    if keys.ndim != 1 or keys.dtype.kind not in "iu":
        raise ProtocolError(f"keys must be a 1-d integer array, got {keys.dtype} {keys.shape}")
    if len(keys) and (int(keys[0]) < 0 or int(keys[-1]) >= num_keys):
        raise ProtocolError(f"keys must lie in [0, {num_keys})")
    if len(keys) > 1 and (np.diff(keys.astype(np.int64, copy=False)) <= 0).any():
        raise ProtocolError("keys must be sorted and unique")
    return keys.astype(np.uint64 if num_keys > 2**32 else np.uint32, copy=False)


class ParameterClient:
    def __init__(
        self,
        transport: Transport,
        shards: list[ShardAddress],
        *,
        token: str,
        run: bytes,
        role: Role,
        rank: int,
        connect_timeout_s: float,
        request_timeout_s: float,
        max_frame_bytes: int,
        io: IO,
        wire: WireFormat = PLAIN_WIRE,
        faults: LinkFaults | None = None,
        duplicates_ok: bool = False,
        now: Callable[[], float] = time.time,
    ) -> None:
        self._transport, self._shards, self._token = transport, shards, token
        self._wire = wire
        # A push refused as a duplicate of a committed clock counts as acknowledged: a
        # restarted worker repeats the clock some shard already has.
        self._faults, self._duplicates_ok = faults, duplicates_ok
        self._copy = held_for(shards[-1].keys.end) if wire.keeps_copy and shards else None
        self._run, self._role, self._rank = run, role, rank
        self._connect_timeout_s, self.request_timeout_s = connect_timeout_s, request_timeout_s
        self._max_frame_bytes = max_frame_bytes
        self._ids = itertools.count(1)
        self._requests: dict[int, Pending[Result]] = {}
        self._io, self._now = io, now
        self._connections: list[ShardConnection] = []

    @property
    def shard_keys(self) -> list[KeyRange]:
        return [shard.keys for shard in self._shards]

    def connect(self) -> None:
        self._io.call(self._connect_all(), self._connect_timeout_s + 5, "connecting to shards")

    def close(self) -> None:
        with contextlib.suppress(PsctlError):
            self._io.call(self._close_all(), 5, "closing shard connections")

    @property
    def num_keys(self) -> int:
        return self._shards[-1].keys.end

    def clock(self) -> int:
        """The next clock the servers expect from this worker on every key (the smallest over
        shards and clock ranges): where a restarted worker picks up."""
        return min(self.shard_clocks().values(), default=0)

    def shard_clocks(self) -> dict[KeyRange, int]:
        """Per shard (its keys), the next clock it expects from this worker on every key."""
        frames = [(shard.index, encode(Frame(
            MsgType.CLOCKS, rid, shard.keys, run=self._run, role=self._role, rank=self._rank,
            clock=0)), rid) for shard, rid in zip(self._shards, self._ids, strict=False)]
        replies = self._io.call(self._ask_all(frames), self.request_timeout_s,
                                "asking the shards for this worker's clock")
        return {shard.keys: reply.clock for shard, (reply, _) in
                zip(self._shards, replies, strict=True)}

    async def _ask_all(self, frames: list[tuple[int, bytearray, int]]) -> list[tuple[Frame, int]]:
        return list(await asyncio.gather(*(self._connections[index].request(rid, data)
                                           for index, data, rid in frames)))

    @property
    def link_stats(self) -> dict[str, int]:
        """Frames the injected faults dropped, and requests sent again, on every connection."""
        links = [c.link for c in self._connections if c.link is not None]
        return {"dropped": sum(link.dropped for link in links),
                "resent": sum(link.resent for link in links)}

    def init(self, values: np.ndarray) -> PushHandle:
        request_id = self._submit(MsgType.INIT, self._range_parts(
            MsgType.INIT, KeyRange(0, values.size), values, clock=0, base={}), {})
        return Handle(request_id, PushResult)

    def push(
        self, keys: Keys, values: np.ndarray, *, clock: int, base_versions: dict[int, int],
        pushed_at: float = 0.0, waited_s: float = 0.0, final: bool = False,
        commit: bool = True, span: KeyRange | None = None,
    ) -> PushHandle:
        """Send a gradient for ``keys`` (one value per key). With ``commit`` (the default) this
        worker is done with ``clock`` on every clock range of ``span`` (default: ``keys`` if it
        is a range, else the whole key space): a shard in the span that gets no key still gets
        an empty push, which advances the clock. ``pushed_at`` (unix s) and ``waited_s`` (how
        long this iteration's pull was held back) travel with it for the timing-driven
        consistency models."""
        flags = (FLAG_FINAL if final else 0) | (FLAG_COMMIT if commit else 0)
        header = {"clock": clock, "base": base_versions, "stamp_ns": to_ns(pushed_at),
                  "wait_ns": to_ns(waited_s), "flags": flags}
        if isinstance(keys, KeyRange):
            parts = self._range_parts(MsgType.PUSH, span or keys, values, **header,
                                      request=keys)
        else:
            parts = self._list_parts(MsgType.PUSH, keys, values, span, empty_ok=commit,
                                     **header)
        return Handle(self._submit(MsgType.PUSH, parts, base_versions), PushResult)

    def pull(self, keys: Keys, out: np.ndarray, *, clock: int,
             span: KeyRange | None = None) -> PullHandle:
        """Fill ``out`` (float32, one value per key) with the servers' values; see ``wait``.

        A key list pulled for a clock (not ``ANY_CLOCK``) asks every shard of ``span`` (default:
        the whole key space), with an empty frame where it has no key: the pull is also the
        wait for its clock, and the push it gates commits on every shard of that span, each of
        which refuses a clock past its own window."""
        count = len(keys)
        if out.shape != (count,) or out.dtype != np.float32:
            raise ProtocolError(f"pull buffer must be float32 of shape ({count},)")
        if isinstance(keys, KeyRange):
            parts = self._range_parts(MsgType.PULL, keys, out, clock=clock, base={})
        else:
            parts = self._list_parts(MsgType.PULL, keys, out, span,
                                     empty_ok=not count or clock != ANY_CLOCK,
                                     clock=clock, base={})
        return Handle(self._submit(MsgType.PULL, parts, {}), PullResult)

    def done(self, handle: Handle[Any]) -> bool:
        """Has the request been answered (so that ``wait`` returns at once)?"""
        future = self._requests.get(handle.request_id)
        if future is None:
            raise ProtocolError(f"unknown or already awaited request id {handle.request_id}")
        return future.done()

    def wait(self, handle: Handle[R], timeout: float | None = None) -> R:
        future = self._requests.pop(handle.request_id, None)
        if future is None:
            raise ProtocolError(f"unknown or already awaited request id {handle.request_id}")
        limit = self.request_timeout_s if timeout is None else timeout
        try:
            result = self._io.result(future, limit)
        except TimeoutError:
            raise RequestTimeout(
                f"request {handle.request_id} got no answer within {limit:.1f} s"
            ) from None
        if not isinstance(result, handle.kind):  # the request's own kind decided the result's
            raise ProtocolError(f"request {handle.request_id} answered with the wrong kind")
        return result

    def _part(self, kind: MsgType, shard: int, span: KeyRange, values: np.ndarray, *,
              clock: int, base: dict[int, int], index: np.ndarray | None = None,
              stamp_ns: int = 0, wait_ns: int = 0, flags: int = 0) -> _Part:
        pull = kind is MsgType.PULL
        # INIT stays float32: the servers start from exactly the model worker 0 built.
        dtype = DType.FLOAT32 if kind is MsgType.INIT else self._wire.dtype
        payload = None if pull else narrow(values, numpy_dtype(dtype))
        frame = Frame(kind, 0, span, run=self._run, role=self._role, rank=self._rank,
                      clock=clock, version=base.get(shard, 0), stamp_ns=stamp_ns,
                      wait_ns=wait_ns, flags=flags, dtype=dtype, payload=payload, index=index,
                      codec=self._wire.codec if index is not None else Codec.NONE)
        return _Part(shard, frame, values if pull else None)

    def _range_parts(self, kind: MsgType, span: KeyRange, values: np.ndarray, *,
                     request: KeyRange | None = None, **header: Any) -> list[_Part]:
        """One frame per shard that ``span`` reaches; the values are those of ``request``
        (default: the span), which must lie inside it."""
        request = request or span
        if not span.contains(request):
            raise ProtocolError(f"keys [{request.start}, {request.end}) are outside the span "
                                f"[{span.start}, {span.end})")
        if request != span and kind is MsgType.PUSH:
            return self._list_parts(kind, np.arange(request.start, request.end), values, span,
                                    empty_ok=True, **header)
        return [self._part(kind, shard, piece, values[request.local(piece)], **header)
                for shard, piece in split_by_shard(span, self.shard_keys)]

    def _list_parts(self, kind: MsgType, keys: np.ndarray, values: np.ndarray,
                    span: KeyRange | None, *, empty_ok: bool, **header: Any) -> list[_Part]:
        keys = _checked_keys(keys, self.num_keys)
        span = span or KeyRange(0, self.num_keys)
        if len(keys) and (keys[0] < span.start or keys[-1] >= span.end):
            raise ProtocolError(f"keys {int(keys[0])}..{int(keys[-1])} are outside the span "
                                f"[{span.start}, {span.end})")
        owned = dict(split_keys_by_shard(keys, self.shard_keys)) if len(keys) else {}
        return [self._part(kind, shard, piece, values[mine], index=keys[mine], **header)
                for shard, piece in split_by_shard(span, self.shard_keys)
                if (mine := owned.get(shard, slice(0, 0) if empty_ok else None)) is not None]

    def _submit(self, kind: MsgType, parts: list[_Part], base: dict[int, int]) -> int:
        dense = sum(_dense_size(part.frame) for part in parts) if kind is MsgType.PUSH else 0
        if kind is not MsgType.INIT:
            parts = [piece for part in parts for piece in _chunks(part, self._piece(part))]
        # Every frame has its own request id (a shard matches replies by it); the request's
        # handle is the first.
        ids = [next(self._ids) for _ in parts]
        frames = [(part.shard, encode(replace(part.frame, request_id=rid)), rid,
                   (part.out, part.frame) if kind is MsgType.PULL else part.frame.key_count)
                  for part, rid in zip(parts, ids, strict=True)]
        self._requests[ids[0]] = self._io.submit(self._request(kind, ids[0], frames, base, dense))
        return ids[0]

    def _piece(self, part: _Part) -> int:
        """The most keys a frame of ``part`` may carry: ``comm.range_size`` (if set), and for a
        key list at most MAX_LIST_KEYS, which a server takes (0: no bound)."""
        size = self._wire.range_size
        if part.frame.index is None:
            return size
        return min(size, MAX_LIST_KEYS) if size else MAX_LIST_KEYS

    async def _request(
        self,
        kind: MsgType,
        request_id: int,
        frames: list[tuple[int, bytearray, int, Any]],
        base: dict[int, int],
        dense: int = 0,
    ) -> Result:
        sent = sum(len(data) for _, data, _, _ in frames)
        extras = [extra for _, _, _, extra in frames]  # a pull's (out, asked) per frame
        replies = await asyncio.gather(*(
            self._reply(kind, request_id, (index, data, rid), extra)
            for (index, data, rid, _), extra in zip(frames, extras, strict=True)))
        answered_at = self._now()
        received = sum(nbytes for _, nbytes in replies)
        parts = [(index, data, extra) for index, data, _, extra in frames]
        versions = _versions(kind, [index for index, _, _ in parts],
                             [reply for reply, _ in replies])
        if kind is MsgType.PULL:
            wait_s = max((reply.wait_ns for reply, _ in replies), default=0) / 1e9
            slowest = min((reply.clock for reply, _ in replies), default=0)
            return PullResult(versions, wait_s, sent, received, answered_at, slowest)
        staleness = max((versions[i] - base.get(i, versions[i]) for i in versions), default=0)
        scale, keys = _mean_scale([(reply, count) for (_, _, count), (reply, _)
                                   in zip(parts, replies, strict=True)])
        return PushResult(versions, max(staleness, 0), sent, received, answered_at, scale, keys,
                          dense)

    async def _reply(self, kind: MsgType, request_id: int, frame: tuple[int, bytearray, int],
                     extra: Any) -> tuple[Frame, int]:
        # A pull's answer is filled in as it arrives, not when the request's last shard has
        # answered: a shard's filtered answers are relative to what it sent before, so the
        # copy takes them in the order the shard sent them.
        index, data, rid = frame
        reply = await self._connections[index].request(rid, data)
        if kind is MsgType.PULL:
            out, asked = extra
            self._fill(out, asked, reply[0], request_id)
        return reply

    def _fill(self, out: np.ndarray, asked: Frame, reply: Frame, request_id: int) -> None:
        """Put a pull's answer in ``out``: all of it, or (a filtered answer) the values that
        changed, over the copy this client keeps of what it was sent."""
        values, sent = reply.values, reply.key_count
        if sent == asked.key_count:
            if values.shape != out.shape:
                raise ProtocolError(f"request {request_id}: a shard answered "
                                    f"{values.shape[0]} values for {len(out)} keys")
            widen_into(out, values)
            if self._copy is not None:
                self._keep(asked, out)
            return
        if self._copy is None or reply.index is None or reply.keys != asked.keys \
                or sent > asked.key_count or values.shape != (sent,):
            raise ProtocolError(f"request {request_id}: a shard answered a pull with {sent} "
                                f"of its {asked.key_count} keys, but this client keeps no copy "
                                "to fill the rest from (comm.pull_filter)")
        if asked.index is None:
            self._copy.fill_range(asked.keys.start, reply.index, values, out)
        else:
            self._copy.fill(asked.index, reply.index, values, out)

    def _keep(self, asked: Frame, values: np.ndarray) -> None:
        assert self._copy is not None
        if asked.index is None:
            self._copy.put_range(asked.keys.start, values)
        else:
            self._copy.put(asked.index, values)

    async def _connect_all(self) -> None:
        self._connections = list(
            await asyncio.gather(
                *(
                    ShardConnection.open(
                        self._transport,
                        shard,
                        token=self._token,
                        timeout=self._connect_timeout_s,
                        max_frame_bytes=self._max_frame_bytes,
                        link=None if self._faults is None else Link(
                            self._faults, self._rank * 1009 + shard.index),
                        duplicates_ok=self._duplicates_ok,
                    )
                    for shard in self._shards
                )
            )
        )

    def set_copies(self, copies: dict[int, list[str]]) -> None:
        """Per shard, where its copies listen now (``Replicas``); on the client's loop."""
        for index, addresses in copies.items():
            if 0 <= index < len(self._connections):
                self._connections[index].set_copies(addresses)

    async def _close_all(self) -> None:
        await asyncio.gather(*(connection.close() for connection in self._connections))


def _versions(kind: MsgType, shards: list[int], replies: list[Frame]) -> dict[int, int]:
    """Per shard, the version a request was served at. Split into several frames (a range
    size), a push takes its first frame's (the later ones count its own earlier pieces) and a
    pull its oldest (the values are at least that new)."""
    versions: dict[int, int] = {}
    for shard, reply in zip(shards, replies, strict=True):
        if shard not in versions:
            versions[shard] = reply.version
        elif kind is MsgType.PULL:
            versions[shard] = min(versions[shard], reply.version)
    return versions


def _chunks(part: _Part, size: int) -> list[_Part]:
    """``part`` as frames of at most ``size`` keys, sent back to back. A push's pieces do not
    commit; one more, empty frame over the whole span commits the clock (with the final flag)
    after them, so the shard sees the clock end exactly once."""
    frame = part.frame
    if not size or frame.key_count <= size:
        return [part]
    pieces = []
    for lo in range(0, frame.key_count, size):
        hi = min(lo + size, frame.key_count)
        if frame.index is None:
            keys, index = KeyRange(frame.keys.start + lo, frame.keys.start + hi), None
        else:
            keys, index = frame.keys, frame.index[lo:hi]
        payload = None if frame.payload is None else frame.payload[lo:hi]
        flags = frame.flags & ~(FLAG_COMMIT | FLAG_FINAL) if frame.type is MsgType.PUSH \
            else frame.flags
        pieces.append(_Part(part.shard, replace(frame, keys=keys, index=index, payload=payload,
                                                flags=flags),
                            None if part.out is None else part.out[lo:hi]))
    if frame.type is MsgType.PUSH and frame.flags & (FLAG_COMMIT | FLAG_FINAL):
        empty = np.zeros(0, dtype=np.uint32 if frame.keys.end <= 2**32 else np.uint64)
        pieces.append(_Part(part.shard, replace(frame, index=empty,
                                                payload=frame.values[:0]), None))
    return pieces


def _dense_size(frame: Frame) -> int:
    """The bytes of ``frame`` as a dense float32 frame of its whole span."""
    return HEADER_BYTES + 8 + 4 * len(frame.keys)


def _mean_scale(acks: list[tuple[Frame, int]]) -> tuple[float | None, int]:
    """The key-weighted mean of the scales the ACKs carry (a shard that got no keys, or an
    older server, carries none), and the keys behind it."""
    total, keys = 0.0, 0
    for ack, count in acks:
        if ack.payload is None or not count:
            continue
        scale = float(ack.payload[0])
        if math.isfinite(scale) and scale >= 0:
            total, keys = total + scale * count, keys + count
    return (total / keys, keys) if keys else (None, 0)
