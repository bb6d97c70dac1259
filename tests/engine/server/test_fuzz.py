"""Property-based fuzz of a real shard server over real websockets on loopback (issue 12).

Hypothesis builds valid PUSH, PULL and INIT frames (key ranges and uint32/uint64 key lists) and
mutates them: header fields set to extreme or random values, shape dimensions, flipped bytes,
truncation, junk appended, frames past the server's and the transport's size limits, unsorted or
duplicated keys, NaN, infinities, huge finite values and subnormals, another run's id, text
messages and plain garbage. They go to one ``ShardServer`` (ASP, so every valid pull is answered
at once) on the test's own event loop, one by one or pipelined.

The property, for every frame: exactly one reply comes back (VALUES, ACK or ERROR, never an
``InternalError``), in order, whose request id is the frame's when its header could be read; or
the server closes the connection with code 1008 or 1009 and a reason (never 1011, never a silent
drop, never a hang: every wait is bounded). The test then reconnects and goes on. A PUSH the
server accepts leaves the parameters finite and holds no value beyond float32's range. Afterwards
the parameters are all finite, the server counted no internal error and logged no error.

A close counts from the moment its close frame arrives: websockets' ``recv`` raises only once the
TCP connection has ended, which the server may leave for its close timeout (see ``next_message``;
the summary line counts these "lingering" closes).

Size: ``PSCTL_FUZZ_FRAMES`` frames (5,000 by default; ``PSCTL_FUZZ_FRAMES=100000`` for a long
run), derandomized so that a failure reproduces; the failure message names the exact frame.
Directed tests below pin the cases the fuzz found or must never miss: key spans at the end of
the 64-bit key space, and finite values too large for the shard's float32 (refused, parameters
and optimizer state bit-identical, no clock consumed).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import os
import re
import struct
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import pytest
import websockets
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from websockets.asyncio.client import ClientConnection, connect

from engine.consistency.registry import make_controller
from engine.keys import KeyRange
from engine.server.optimizers import SGD
from engine.server.service import ShardServer
from engine.server.shard import ShardState
from engine.transport import WebSocketTransport
from engine.transport.admission import credential
from engine.transport.websocket import TOKEN_HEADER
from engine.wire.codecs import BFLOAT16, Codec
from engine.wire.protocol import (
    ANY_CLOCK,
    FLAG_COMMIT,
    FLAG_FINAL,
    HEADER_BYTES,
    DType,
    Frame,
    MsgType,
    Role,
    decode,
    encode,
)

SECRET = "fuzz-secret"
RUN = bytes(range(16))
OTHER_RUN = bytes(range(1, 17))
SHARD = KeyRange(1000, 1064)  # not at 0: key lists are shifted by the shard's start
CLOCK_RANGES = [KeyRange(1000, 1016), KeyRange(1016, 1040), KeyRange(1040, 1064)]
WORKERS = 2
SERVER_MAX_FRAME = 64 * 1024  # past this: an ERROR (FrameTooLarge)
TRANSPORT_MAX = 128 * 1024  # past this: websockets closes with 1009
REPLY_TIMEOUT_S = 5.0
EXAMPLE_TIMEOUT_S = 120.0
KEY_MAX = 2**63 - 1
F32_MAX = float(np.finfo(np.float32).max)

FRAMES = int(os.environ.get("PSCTL_FUZZ_FRAMES", "5000"))
BATCH = 50  # frames per hypothesis example
EXAMPLES = math.ceil(FRAMES / BATCH)

pytestmark = pytest.mark.timeout(180 + FRAMES // 100)

# -- the header, restated from engine/wire/protocol.py --------------------------------------------

HEADER_FORMAT = "<2sBBBBBBI16sQqQQQQQQBB2xQ"
_FIELD_NAMES = ["magic", "version", "type", "dtype", "ndim", "role", "flags", "rank", "run",
                "request_id", "clock", "server_version", "key_start", "key_end", "wait_ns",
                "stamp_ns", "nbytes", "key_kind", "codec", "key_count"]


def _field_offsets() -> dict[str, tuple[int, str]]:
    """Each header field's (offset, struct code), walked from ``HEADER_FORMAT``."""
    tokens = re.findall(r"\d*[a-zA-Z]", HEADER_FORMAT[1:])
    fields, offset, names = {}, 0, iter(_FIELD_NAMES)
    for token in tokens:
        if not token.endswith("x"):
            fields[next(names)] = (offset, "<" + token)
        offset += struct.calcsize("<" + token)
    assert offset == HEADER_BYTES == 104
    return fields


FIELDS = _field_offsets()
INT_FIELDS = [name for name, (_, code) in FIELDS.items() if not code.endswith("s")]
EXTREMES: dict[str, list[int]] = {
    "<B": [0, 1, 2, 3, 4, 5, 6, 7, 8, 127, 128, 255],
    "<I": [0, 1, 2, 2**31 - 1, 2**31, 2**32 - 1],
    "<Q": [0, 1, 2, 999, 1000, 1001, 1063, 1064, 1065, 2**31, 2**32 - 1, 2**32, 2**32 + 1,
           2**63 - 1, 2**63, 2**63 + 1, 2**63 + 1000, 2**64 - 1000, 2**64 - 1],
    "<q": [-(2**63), -(2**31), -2, -1, 0, 1, 2, 2**31, 2**63 - 1],
}
BOUNDS = {"<B": (0, 255), "<I": (0, 2**32 - 1), "<Q": (0, 2**64 - 1), "<q": (-(2**63), 2**63 - 1)}
DIM_EXTREMES = [0, 1, 2, 3, 63, 64, 65, 2**31, 2**32, 2**63 - 1, 2**63, 2**64 - 1]
NUMPY: dict[DType, np.dtype[Any]] = {
    DType.FLOAT32: np.dtype("<f4"), DType.FLOAT64: np.dtype("<f8"), DType.FLOAT16: np.dtype("<f2"),
    DType.BFLOAT16: BFLOAT16}
SPECIALS = {
    "nan": math.nan, "inf": math.inf, "-inf": -math.inf, "1e300": 1e300, "-1e300": -1e300,
    "3e38": 3e38, "-3e38": -3e38, "f32max": 3.4028235e38, "1e19": 1e19, "2e19": 2e19,
    "65504": 65504.0, "-0.0": -0.0, "5e-324": 5e-324, "1e-310": 1e-310, "1e-45": 1e-45,
    "1e-40": 1e-40, "6e-8": 6e-8,
}

# -- frame specifications: pure data drawn by hypothesis, turned into bytes per example ----------


@dataclass(frozen=True)
class Mutation:
    kind: str  # field|span|dim|flip|truncate|extend|swap_keys|dup_key|value|oversize
    where: int = 0
    value: int = 0
    name: str = ""


@dataclass(frozen=True)
class Spec:
    kind: MsgType
    keying: str  # range | u32 | u64
    span: tuple[str, int, int]  # (how, a, b), see ``_span``
    rank: int
    role: Role
    clock: tuple[str, int]  # ("next", delta) from the server's clocks, or ("raw", clock)
    flags: int
    dtype: DType
    shape: str  # flat | 2d | 3d | scalar | short | long
    seed: int
    scale: float
    specials: tuple[tuple[int, str], ...]
    keys_wanted: int
    other_run: bool
    mutations: tuple[Mutation, ...]
    replace: tuple[str, int]  # ("", 0): a frame; ("text"|"garbage"|"psjunk"|"empty", seed)
    codec: Codec = Codec.NONE  # the body packed (where that shrinks it), mutations after


def _field_mutation() -> st.SearchStrategy[Mutation]:
    def for_field(name: str) -> st.SearchStrategy[Mutation]:
        code = FIELDS[name][1]
        low, high = BOUNDS[code]
        values = st.one_of(st.sampled_from(EXTREMES[code]), st.integers(low, high))
        return values.map(lambda value: Mutation("field", value=value, name=name))

    weighted = INT_FIELDS + ["key_start", "key_end"] * 6 + ["key_count", "nbytes"] * 3
    return st.sampled_from(weighted).flatmap(for_field)


SPAN_EXTREMES = [(0, 2**63), (0, 2**63 - 1), (1000, 2**64 - 1), (0, 2**64 - 1), (2**63, 2**63),
                 (2**63 - 1, 2**63), (2**64 - 1, 2**64 - 1), (1064, 1000), (1000, 2**63 + 1000),
                 (1000, 1000 + 2**32), (2**32, 2**32 + 64)]


def _magic_mutation() -> st.SearchStrategy[Mutation]:
    return st.integers(0, 2**16 - 1).map(lambda v: Mutation("field", value=v, name="magic"))


MUTATIONS: st.SearchStrategy[Mutation] = st.one_of(
    _field_mutation(),
    _field_mutation(),
    _field_mutation(),
    st.builds(Mutation, st.just("span"), st.integers(0, len(SPAN_EXTREMES) - 1)),
    _magic_mutation(),
    st.builds(Mutation, st.just("dim"), st.integers(0, 3), st.sampled_from(DIM_EXTREMES)),
    st.builds(Mutation, st.just("flip"), st.integers(0, 2**16), st.integers(1, 255)),
    st.builds(Mutation, st.just("truncate"), st.integers(0, 2**16)),
    st.builds(Mutation, st.just("extend"), st.integers(1, 96), st.integers(0, 255)),
    st.builds(Mutation, st.just("swap_keys"), st.integers(0, 2**16), st.integers(0, 2**16)),
    st.builds(Mutation, st.just("dup_key"), st.integers(0, 2**16)),
    st.builds(Mutation, st.just("value"), st.integers(0, 2**16),
              st.integers(0, len(SPECIALS) - 1)),
)

SHARD_SPANS = st.one_of(
    st.just(("shard", 0, 0)),
    st.builds(lambda i: ("clock_range", i, 0), st.integers(0, len(CLOCK_RANGES) - 1)),
    st.builds(lambda a, b: ("sub", a, b), st.integers(0, len(SHARD)), st.integers(0, len(SHARD))),
)
SPANS = st.one_of(
    SHARD_SPANS,
    st.builds(lambda i: ("outside", i, 0), st.integers(0, 6)),
    st.builds(lambda i, j: ("wide", i, j), st.integers(0, 1), st.integers(0, 4)),
)


# Built once: a strategy made inside ``specs`` would be validated again on every draw.
CLEAN = st.sampled_from([True] * 7 + [False] * 13)
KINDS = st.sampled_from([MsgType.PUSH] * 4 + [MsgType.PULL] * 4 + [MsgType.INIT] * 2)
ANY_KIND = st.sampled_from([MsgType.PUSH] * 4 + [MsgType.PULL] * 4 + [MsgType.INIT] * 2
                           + [MsgType.ACK, MsgType.VALUES, MsgType.ERROR])
SEEDS = st.integers(0, 2**32 - 1)
SCALES = st.sampled_from([0.0, 1e-3, 1.0, 1e3, 1e9, 1e18])
SPECIAL_LISTS = st.lists(st.tuples(st.integers(0, 2**16), st.sampled_from(sorted(SPECIALS))),
                         max_size=3).map(tuple)
KEYS_WANTED = st.integers(0, 70)
KEYINGS = st.sampled_from(["range", "range", "u32", "u64"])
FLAGS = st.sampled_from([FLAG_COMMIT, FLAG_COMMIT, 0, FLAG_FINAL | FLAG_COMMIT, FLAG_FINAL])
WORKER_RANKS = st.sampled_from([0, 1])
ANY_RANK = st.sampled_from([0, 0, 1, 1, 2, 2**32 - 1])
NEXT_CLOCK = st.sampled_from([0, 0, 0, 0, 1, -1]).map(lambda delta: ("next", delta))
ANY_CLOCK_CHOICE = st.one_of(
    st.sampled_from([0, 0, 0, 1, -1]).map(lambda delta: ("next", delta)),
    st.sampled_from([ANY_CLOCK, 0, 1, 2**62, -(2**63), 2**63 - 1]).map(lambda c: ("raw", c)))
FLOAT_DTYPES = st.sampled_from([DType.FLOAT32] * 3 + [DType.FLOAT64, DType.FLOAT16,
                                                      DType.BFLOAT16])
ANY_DTYPE = st.sampled_from([DType.FLOAT32] * 4 + [DType.FLOAT64] * 2
                            + [DType.FLOAT16, DType.BFLOAT16, DType.BYTES])
ROLES = st.sampled_from([Role.WORKER] * 6 + list(Role))
SHAPES = st.sampled_from(["flat"] * 8 + ["2d", "3d", "scalar", "short", "long"])
OTHER_RUN_CHOICE = st.sampled_from([False] * 15 + [True])
CODEC_CHOICE = st.sampled_from([Codec.NONE] * 4 + [Codec.LZ4, Codec.ZSTD, Codec.SNAPPY])
REPLACE = st.sampled_from([""] * 19 + ["text", "garbage", "psjunk", "empty"])
N_MUTATIONS = st.sampled_from([0, 1, 1, 1, 2, 3])
# rare, and last: a frame just past the server's size limit, or past the transport's
OVERSIZE = st.sampled_from([-1] * 100 + [0, 1])
MUTATION_LISTS = {n: st.lists(MUTATIONS, min_size=n, max_size=n).map(tuple) for n in range(4)}


@st.composite
def specs(draw: st.DrawFn) -> Spec:
    """A third of the frames are *clean*: valid but for their values (NaN, huge, subnormal...)
    and their clocks, so they reach the shard's state; the rest are broken in every way."""
    clean = draw(CLEAN)
    kind = draw(KINDS if clean else ANY_KIND)
    seed, scale, specials = draw(SEEDS), draw(SCALES), draw(SPECIAL_LISTS)
    keys_wanted, keying = draw(KEYS_WANTED), draw(KEYINGS)
    span = draw(SHARD_SPANS if clean else SPANS)
    flags = draw(FLAGS)
    if clean:
        return Spec(kind=kind, keying=keying, span=span, rank=draw(WORKER_RANKS),
                    role=Role.WORKER, clock=draw(NEXT_CLOCK), flags=flags,
                    dtype=draw(FLOAT_DTYPES), shape="flat", seed=seed, scale=scale,
                    specials=specials, keys_wanted=keys_wanted, other_run=False, mutations=(),
                    replace=("", 0), codec=draw(CODEC_CHOICE))
    replace = draw(REPLACE)
    mutations: tuple[Mutation, ...] = draw(MUTATION_LISTS[draw(N_MUTATIONS)])
    oversize = draw(OVERSIZE)
    return Spec(
        kind=kind, keying=keying, span=span, rank=draw(ANY_RANK), role=draw(ROLES),
        clock=draw(ANY_CLOCK_CHOICE), flags=flags, dtype=draw(ANY_DTYPE), shape=draw(SHAPES),
        seed=seed, scale=scale, specials=specials, keys_wanted=keys_wanted,
        other_run=draw(OTHER_RUN_CHOICE),
        mutations=mutations + ((Mutation("oversize", oversize),) if oversize >= 0 else ()),
        replace=(replace, draw(SEEDS) if replace else 0), codec=draw(CODEC_CHOICE),
    )


def _span(how: str, a: int, b: int) -> KeyRange:
    if how == "shard":
        return SHARD
    if how == "clock_range":
        return CLOCK_RANGES[a]
    if how == "sub":
        low, high = sorted((a, b))
        return KeyRange(SHARD.start + low, SHARD.start + high)
    if how == "outside":
        return [KeyRange(0, 1064), KeyRange(1063, 1065), KeyRange(0, 0), KeyRange(2000, 2010),
                KeyRange(999, 1001), KeyRange(1064, 1064), KeyRange(0, 8)][a]
    # a key-list frame's span may reach far past its keys: the uint32 limit, the key space's end
    start = (0, SHARD.start)[a]
    return KeyRange(start, [2**32, 2**32 + 1, KEY_MAX, 2**63, 2**64 - 1][b])


def _values(spec: Spec, count: int) -> np.ndarray:
    rng = np.random.default_rng(spec.seed)
    dtype = NUMPY.get(spec.dtype, np.dtype("<f4"))
    if spec.shape == "short":
        count = max(count - 1, 0)
    elif spec.shape == "long":
        count += 1
    with np.errstate(over="ignore"):
        values = (rng.standard_normal(count) * spec.scale).astype(dtype)
        for position, name in spec.specials:
            if count:
                values[position % count] = np.array(SPECIALS[name]).astype(dtype)
    shaped: np.ndarray = values
    if spec.dtype is DType.BYTES:
        shaped = np.frombuffer(values.tobytes(), dtype=np.uint8)
    elif spec.shape == "2d" and count % 2 == 0:
        shaped = values.reshape(2, count // 2)
    elif spec.shape == "3d":
        shaped = values.reshape(1, 1, count)
    elif spec.shape == "scalar" and count == 1:
        shaped = values.reshape(())
    return shaped


def _index(spec: Spec, span: KeyRange) -> np.ndarray:
    """Sorted unique keys inside ``span``, mostly on the shard."""
    low, high = max(span.start, SHARD.start - 4), min(span.end, SHARD.end + 4)
    if low >= high:
        low, high = span.start, min(span.end, span.start + 70)
    rng = np.random.default_rng(spec.seed + 1)
    count = min(spec.keys_wanted, high - low)
    if not count:
        return np.zeros(0, dtype=np.uint64)
    keys: np.ndarray = np.sort(rng.choice(high - low, size=count, replace=False)) + low
    return keys.astype(np.uint64)


def _widen_keys(buffer: bytearray) -> bytearray:
    """Re-encode a uint32 key-list frame with uint64 keys (``encode`` picks the narrowest)."""
    ndim = buffer[FIELDS["ndim"][0]]
    count = struct.unpack_from("<Q", buffer, FIELDS["key_count"][0])[0]
    start = HEADER_BYTES + 8 * ndim
    keys = np.frombuffer(bytes(buffer[start:start + 4 * count]), dtype="<u4").astype("<u8")
    widened = bytearray(buffer[:start]) + bytearray(keys.tobytes()) + buffer[start + 4 * count:]
    struct.pack_into("<B", widened, FIELDS["key_kind"][0], 2)
    return widened


def _first_keys_offset(buffer: bytearray) -> tuple[int, int, int]:
    """(offset of the key list, its count, bytes per key) of an unmutated frame."""
    ndim, kind = buffer[FIELDS["ndim"][0]], buffer[FIELDS["key_kind"][0]]
    count = struct.unpack_from("<Q", buffer, FIELDS["key_count"][0])[0]
    return HEADER_BYTES + 8 * ndim, count, 8 if kind == 2 else 4


def _mutate(buffer: bytearray, mutation: Mutation, dtype: DType) -> bytearray:
    kind = mutation.kind
    if kind == "field":
        offset, code = FIELDS[mutation.name]
        value: Any = mutation.value.to_bytes(2, "little") if code == "<2s" else mutation.value
        if len(buffer) >= offset + struct.calcsize(code):
            struct.pack_into(code, buffer, offset, value)
    elif kind == "span" and len(buffer) >= HEADER_BYTES:
        struct.pack_into("<QQ", buffer, FIELDS["key_start"][0], *SPAN_EXTREMES[mutation.where])
    elif kind == "dim":
        offset = HEADER_BYTES + 8 * mutation.where
        if len(buffer) >= offset + 8:
            struct.pack_into("<Q", buffer, offset, mutation.value)
    elif kind == "flip" and buffer:
        buffer[mutation.where % len(buffer)] ^= mutation.value
    elif kind == "truncate":
        del buffer[mutation.where % (len(buffer) + 1):]
    elif kind == "extend":
        buffer += bytes([mutation.value]) * mutation.where
    elif kind == "oversize":  # just past the server's frame limit, or the transport's
        target = (SERVER_MAX_FRAME, TRANSPORT_MAX)[mutation.where] + 1
        buffer += b"\xa5" * max(target - len(buffer), 1)
    elif kind in ("swap_keys", "dup_key") and len(buffer) >= HEADER_BYTES:
        start, count, width = _first_keys_offset(buffer)
        if count >= 2 and len(buffer) >= start + count * width:
            i = mutation.where % count
            j = (mutation.value % count) if kind == "swap_keys" else (i + 1) % count
            a = bytes(buffer[start + i * width:start + (i + 1) * width])
            b = bytes(buffer[start + j * width:start + (j + 1) * width])
            if kind == "swap_keys":
                buffer[start + i * width:start + (i + 1) * width] = b
            buffer[start + j * width:start + (j + 1) * width] = a
    elif kind == "value" and len(buffer) >= HEADER_BYTES and dtype in NUMPY:
        nbytes = struct.unpack_from("<Q", buffer, FIELDS["nbytes"][0])[0]
        itemsize = NUMPY[dtype].itemsize
        count = min(nbytes, len(buffer) - HEADER_BYTES) // itemsize
        if count:
            special = SPECIALS[sorted(SPECIALS)[mutation.value]]
            with np.errstate(over="ignore"):
                raw = np.array(special).astype(NUMPY[dtype]).tobytes()
            at = len(buffer) - nbytes + (mutation.where % count) * itemsize
            if at >= HEADER_BYTES:
                buffer[at:at + itemsize] = raw
    return buffer


@dataclass(frozen=True)
class Built:
    message: bytes | str
    description: str
    clean_pull: bool  # a valid PULL this connection may send: it must get its VALUES

    def show(self) -> str:
        if isinstance(self.message, str):
            return f"{self.description}; text message {self.message[:200]!r}"
        data = self.message
        head = data[:160].hex()
        return (f"{self.description}; {len(data)} bytes, first {min(len(data), 160)}: {head}"
                + (f" ... last 32: {data[-32:].hex()}" if len(data) > 160 else ""))


def build(spec: Spec, request_id: int, server: ShardServer, admission: int | None) -> Built:
    """The bytes of one fuzzed frame, with a description to print should it fail."""
    how, seed = spec.replace
    if how:
        rng = np.random.default_rng(seed)
        junk = rng.integers(0, 256, int(rng.integers(0, 300)), dtype=np.uint8).tobytes()
        if how == "text":
            return Built(junk.decode("latin-1"), "text message", False)
        data = {"garbage": junk, "psjunk": b"PS" + junk, "empty": b""}[how]
        return Built(data, how, False)
    span = _span(*spec.span)
    index = None if spec.keying == "range" else _index(spec, span)
    if index is None and span.end - span.start > 4096:  # a range frame: one value per key
        span = SHARD
    count = len(span) if index is None else len(index)
    rank = spec.rank if admission is None or spec.mutations else admission
    rank_clock = 0
    if rank < WORKERS:  # the worker's next clock on the clock ranges the span touches
        ranges = server.state.index.touched(span) if SHARD.contains(span) else range(0)
        ahead = server.state.clocks.next[rank, ranges.start:ranges.stop]
        rank_clock = int(ahead.max() if len(ahead) else server.state.clocks.next[rank].min())
    clock = rank_clock + spec.clock[1] if spec.clock[0] == "next" else spec.clock[1]
    carries = spec.kind in (MsgType.PUSH, MsgType.INIT, MsgType.VALUES, MsgType.ERROR)
    frame = Frame(spec.kind, request_id, span, run=OTHER_RUN if spec.other_run else RUN,
                  role=spec.role, rank=rank, clock=clock, flags=spec.flags,
                  dtype=spec.dtype, payload=_values(spec, count) if carries else None,
                  index=index if index is None or span.end > 2**32 else index.astype(np.uint32),
                  codec=Codec.NONE if spec.keying == "u64" else spec.codec)
    buffer = encode(frame)
    if spec.keying == "u64" and index is not None and span.end <= 2**32:
        buffer = _widen_keys(buffer)
    for mutation in spec.mutations:
        buffer = _mutate(buffer, mutation, spec.dtype)
    description = (f"{spec.kind.name} {spec.keying} span [{span.start}, {span.end}) "
                   f"{count} keys clock {clock} rank {rank} {spec.role.name} "
                   f"{spec.dtype.name} {spec.codec.name} flags {spec.flags} "
                   f"other_run={spec.other_run} "
                   f"mutations={list(spec.mutations)}")
    permitted = admission is None or (spec.role is Role.WORKER and rank == admission)
    # A pull names the type its values come back in: BYTES is no such type.
    clean_pull = (spec.kind is MsgType.PULL and not spec.mutations and not spec.other_run
                  and SHARD.contains(span) and permitted and spec.dtype is not DType.BYTES)
    return Built(bytes(buffer), description, clean_pull)


# -- talking to the server ------------------------------------------------------------------------


def expected_request_id(message: bytes | str) -> int | None:
    """The request id a reply must carry: the header's, or None when the header is unreadable
    (then 0, or the id where the header would hold it, is accepted)."""
    if isinstance(message, bytes) and len(message) >= HEADER_BYTES and message[:2] == b"PS":
        return int(struct.unpack_from("<Q", message, FIELDS["request_id"][0])[0])
    return None


@dataclass
class Tally:
    frames: int = 0
    replies: Counter[str] = field(default_factory=Counter)
    closes: Counter[int] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    messages: Counter[str] = field(default_factory=Counter)
    lingering_closes: int = 0  # close frame in, TCP connection not ended by the server at once
    examples: int = 0


class Closed(Exception):
    """The server closed the connection: its close code and reason (None: no close frame)."""

    def __init__(self, code: int | None, reason: str) -> None:
        super().__init__(f"closed with code {code}: {reason!r}")
        self.code, self.reason = code, reason


def _closed(exc: websockets.ConnectionClosed) -> Closed:
    return Closed(None, str(exc)) if exc.rcvd is None else Closed(exc.rcvd.code, exc.rcvd.reason)


async def next_message(socket: ClientConnection, timeout: float, tally: Tally) -> bytes | str:
    """The server's next message, or ``Closed`` as soon as its close frame is in and no message
    precedes it: websockets' ``recv`` itself raises only once the TCP connection has ended."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    task = asyncio.ensure_future(socket.recv())
    close_seen = False
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=0.005)
            if done:
                return task.result()
            close = socket.protocol.close_rcvd
            if close is not None:
                if close_seen:  # one more round: a message ahead of the close is returned
                    tally.lingering_closes += 1
                    socket.transport.abort()
                    raise Closed(close.code, close.reason)
                close_seen = True
            if loop.time() > deadline:
                raise TimeoutError
    except websockets.ConnectionClosed as exc:
        raise _closed(exc) from None
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, websockets.ConnectionClosed):
                await task


class Peer:
    """One fuzzing connection; reopened whenever the server closes it."""

    def __init__(self, address: str, admission: int | None) -> None:
        self.address = address
        self.token = SECRET if admission is None else credential(SECRET, "worker", admission)
        self.socket: ClientConnection | None = None

    async def open(self) -> ClientConnection:
        if self.socket is None:
            self.socket = await asyncio.wait_for(connect(
                self.address, additional_headers={TOKEN_HEADER: self.token}, compression=None,
                max_size=None, ping_interval=None, open_timeout=None, close_timeout=2), 10)
        return self.socket

    async def send(self, message: bytes | str) -> None:
        socket = await self.open()
        try:
            await socket.send(message)
        except websockets.ConnectionClosed as exc:
            raise _closed(exc) from None

    async def close(self) -> None:
        socket, self.socket = self.socket, None
        if socket is not None:
            try:
                await asyncio.wait_for(socket.close(), 5)
            except TimeoutError:
                socket.transport.abort()


class Fuzzer:
    def __init__(self, server: ShardServer, address: str) -> None:
        self.server, self.address = server, address
        self.tally = Tally()
        self._next_id = 1_000_000

    def request_id(self) -> int:
        self._next_id += 1
        return self._next_id

    def check_reply(self, built: Built, data: bytes | str, *, count: bool = True) -> None:
        """One reply to ``built``: well formed, of a fitting type, with the right request id."""
        def fail(why: str) -> None:
            raise AssertionError(f"{why}\n  frame sent: {built.show()}")

        if not isinstance(data, bytes):
            fail(f"the server replied with a text message {data[:200]!r}")
            return
        reply = decode(data, max_bytes=2**26)
        if reply.type not in (MsgType.VALUES, MsgType.ACK, MsgType.ERROR):
            fail(f"reply of type {reply.type.name}")
        if reply.role is not Role.SERVER:
            fail(f"reply from a {reply.role.name}")
        expected = expected_request_id(built.message)
        accepted = {expected} if expected is not None else {0, _id_if_any(built.message)}
        if reply.request_id not in accepted:
            fail(f"reply carries request id {reply.request_id}, expected one of {accepted} "
                 "(a missing, extra or reordered reply)")
        self.tally.frames += count
        self.tally.replies[reply.type.name] += 1
        sent_type = built.message[3] if isinstance(built.message, bytes) and \
            len(built.message) > 3 else None
        if reply.type is MsgType.ERROR:
            code, message = reply.error()
            self.tally.errors[code] += 1
            self.tally.messages[re.sub(r"[0-9]+", "N", message)[:70]] += 1
            if code == "InternalError":
                fail(f"InternalError reply (an exception escaped the server's handler): "
                     f"{message}")
            if not message:
                fail(f"ERROR reply {code} without a message")
            if built.clean_pull:
                fail(f"a valid PULL was refused: {code}: {message}")
        elif reply.type is MsgType.VALUES:
            if sent_type != MsgType.PULL:
                fail("VALUES reply to a frame that is not a PULL")
            if not np.isfinite(reply.values).all():
                fail(f"VALUES reply holds non-finite values: {reply.values}")
        elif sent_type not in (MsgType.PUSH, MsgType.INIT):
            fail("ACK reply to a frame that is neither a PUSH nor an INIT")
        elif sent_type == MsgType.PUSH:
            pushed = decode(built.message, max_bytes=2**26).values  # type: ignore[arg-type]
            if pushed.size and float(np.abs(pushed.astype(np.float64)).max()) > F32_MAX:
                fail("a PUSH of values past float32's range was accepted")
            if not np.isfinite(self.server.state.params).all():  # same loop: a snapshot
                fail(f"the parameters are not finite after this PUSH was accepted: "
                     f"{self.server.state.params}")
        if built.clean_pull and reply.type is MsgType.VALUES:
            decoded = decode(built.message, max_bytes=2**26)  # type: ignore[arg-type]
            if len(reply.values) != decoded.key_count:
                fail(f"VALUES of {len(reply.values)} keys for {decoded.key_count} keys")

    def check_close(self, built: Built, closed: Closed, *, count: bool = True,
                    pipelined: bool = False) -> None:
        which = "first frame without a reply (pipelined)" if pipelined else "last frame sent"
        if closed.code is None:
            raise AssertionError(f"the connection was dropped without a close frame "
                                 f"({closed.reason})\n  {which}: {built.show()}")
        self.tally.frames += count
        self.tally.closes[closed.code] += 1
        if closed.code not in (1008, 1009) or not closed.reason:
            raise AssertionError(f"closed with code {closed.code} reason {closed.reason!r}; "
                                 f"expected 1008 or 1009 with a reason\n"
                                 f"  {which}: {built.show()}")

    async def reply(self, peer: Peer, built: Built) -> bytes | str:
        assert peer.socket is not None
        try:
            return await next_message(peer.socket, REPLY_TIMEOUT_S, self.tally)
        except TimeoutError:
            raise AssertionError(f"no reply and no close within {REPLY_TIMEOUT_S} s\n"
                                 f"  frame sent: {built.show()}") from None

    async def lockstep(self, peer: Peer, batch: Sequence[Callable[[], Built]]) -> None:
        """Send each frame and wait for its one reply, or the close; reconnect after a close.
        Each frame is built just before it is sent, from the server's clocks at that time."""
        for make in batch:
            built = make()
            try:
                await peer.send(built.message)
                data = await self.reply(peer, built)
            except Closed as closed:
                peer.socket = None
                self.check_close(built, closed)
                continue
            self.check_reply(built, data)

    async def pipelined(self, peer: Peer, makers: Sequence[Callable[[], Built]]) -> None:
        """Send the whole batch, then read: the replies must come in order, one per frame,
        up to the end of the batch or to a close. After a close, the frames left unanswered
        go again, one by one, on a new connection."""
        batch = [make() for make in makers]
        answered = 0
        try:
            for built in batch:
                await peer.send(built.message)
            for built in batch:
                self.check_reply(built, await self.reply(peer, built))
                answered += 1
        except Closed as closed:
            peer.socket = None
            try:  # replies come in order: the first frame without one is what the server was on
                self.check_close(batch[min(answered, len(batch) - 1)], closed, count=False,
                                 pipelined=True)
            except AssertionError:
                # Send the whole batch again one by one: a failure there names its frame.
                await self.lockstep(peer, [functools.partial(_same, built) for built in batch])
                raise
            await self.lockstep(peer, [functools.partial(_same, built)
                                       for built in batch[answered:]])

    async def sentinel(self, peer: Peer, admission: int | None) -> None:
        """A valid full-shard pull after each example: answered, with finite values, and
        nothing else is left unread on the connection."""
        rank = admission or 0
        built = Built(bytes(encode(Frame(MsgType.PULL, self.request_id(), SHARD, run=RUN,
                                         role=Role.WORKER, rank=rank, clock=ANY_CLOCK))),
                      "sentinel full-shard PULL", True)
        for attempt in range(2):  # the batch's last frames may have had the server close
            try:
                await peer.send(built.message)
                self.check_reply(built, await self.reply(peer, built), count=False)
                return
            except Closed as closed:
                peer.socket = None
                self.check_close(built, closed, count=False)
                assert attempt == 0, "a new connection was closed before its first reply"


def _same(built: Built) -> Built:
    return built


def _id_if_any(message: bytes | str) -> int:
    if isinstance(message, bytes) and len(message) >= 36:
        return int(struct.unpack_from("<Q", message, 28)[0])
    return 0


class ErrorRecords(logging.Handler):
    """Every record at ERROR or above from any logger (the server's, websockets', asyncio's)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


T = TypeVar("T")


@dataclass
class LiveServer:
    loop: asyncio.AbstractEventLoop
    server: ShardServer
    address: str

    def run(self, coro: Awaitable[T], timeout: float = EXAMPLE_TIMEOUT_S) -> T:
        return self.loop.run_until_complete(asyncio.wait_for(coro, timeout))


@contextlib.contextmanager
def start_server(model: str = "asp", *, initialized: bool = True,
                 momentum: float = 0.9) -> Iterator[LiveServer]:
    loop = asyncio.new_event_loop()
    state = ShardState(SHARD, make_controller(model, workers=WORKERS, ranges=len(CLOCK_RANGES)),
                       SGD(len(SHARD), lr=0.5, momentum=momentum), workers=WORKERS,
                       ranges=CLOCK_RANGES)
    if initialized:
        state.init(SHARD, np.linspace(-1.0, 1.0, len(SHARD), dtype=np.float32))
    server = ShardServer(state, run=RUN, rank=0, max_frame_bytes=SERVER_MAX_FRAME)
    transport = WebSocketTransport(max_frame_bytes=TRANSPORT_MAX)
    live = LiveServer(loop, server, "")
    try:
        live.address = live.run(server.start(transport, "127.0.0.1", 0, token=SECRET), 10)
        yield live
    finally:
        live.run(server.close(), 30)
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


@pytest.fixture
def errors_logged() -> Iterator[ErrorRecords]:
    handler = ErrorRecords()
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield handler
    finally:
        root.removeHandler(handler)


# -- the fuzz -------------------------------------------------------------------------------------


def test_every_fuzzed_frame_gets_one_reply_or_a_policy_close(
        errors_logged: ErrorRecords) -> None:
    with start_server() as live:
        fuzzer = Fuzzer(live.server, live.address)

        @settings(max_examples=EXAMPLES, derandomize=True, database=None, deadline=None,
                  phases=[Phase.explicit, Phase.generate], print_blob=True,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
        @given(batch=st.lists(specs(), min_size=BATCH, max_size=BATCH),
               pipelined=st.sampled_from([False, False, True]),
               admission=st.sampled_from([None, None, 0, 1]))
        def fuzz(batch: list[Spec], pipelined: bool, admission: int | None) -> None:
            peer = Peer(live.address, admission)
            makers = [functools.partial(build, spec, fuzzer.request_id(), live.server, admission)
                      for spec in batch]
            send = fuzzer.pipelined if pipelined else fuzzer.lockstep

            async def example() -> None:
                try:
                    await send(peer, makers)
                    await fuzzer.sentinel(peer, admission)
                finally:
                    await peer.close()

            live.run(example())
            fuzzer.tally.examples += 1
            assert np.isfinite(live.server.state.params).all(), live.server.state.params

        fuzz()
        tally = fuzzer.tally
        print(f"fuzz: {tally.frames} frames in {tally.examples} examples; replies "
              f"{dict(tally.replies)}; closes {dict(tally.closes)}; errors {dict(tally.errors)}; "
              f"pushes applied {live.server.state.pushes}; lingering closes "
              f"{tally.lingering_closes}; most common refusals:")
        for message, times in tally.messages.most_common(15):
            print(f"  {times:6d}  {message}")
        assert tally.frames >= FRAMES
        params = live.server.state.params
        assert np.isfinite(params).all(), params
        assert live.server.stats.internal_errors == 0
        assert errors_logged.records == [], [r.getMessage() for r in errors_logged.records]
        # The fuzz reached every outcome: answers, acks, refusals and both kinds of close.
        assert tally.replies["VALUES"] and tally.replies["ACK"] and tally.replies["ERROR"]
        assert live.server.state.pushes > 0
        assert tally.closes[1008] and tally.closes[1009]


# -- directed cases -------------------------------------------------------------------------------


async def _one(live: LiveServer, data: bytes | bytearray, *, token: str = SECRET) -> Frame:
    socket = await connect(live.address, additional_headers={TOKEN_HEADER: token},
                           compression=None, max_size=None, close_timeout=2)
    try:
        await socket.send(bytes(data))
        reply = await asyncio.wait_for(socket.recv(), REPLY_TIMEOUT_S)
        assert isinstance(reply, bytes)
        return decode(reply, max_bytes=2**26)
    finally:
        await socket.close()


def _frame(kind: MsgType, request_id: int, keys: KeyRange, *, rank: int = 0, clock: int = 0,
           values: np.ndarray | None = None, dtype: DType = DType.FLOAT32,
           index: np.ndarray | None = None) -> bytearray:
    return encode(Frame(kind, request_id, keys, run=RUN, role=Role.WORKER, rank=rank,
                        clock=clock, flags=FLAG_COMMIT if kind is MsgType.PUSH else 0,
                        dtype=dtype, payload=values, index=index))


@pytest.mark.parametrize("key_end", [2**63 - 1, 2**63, 2**63 + 1, 2**64 - 1])
@pytest.mark.parametrize("key_start", [0, SHARD.start])
@pytest.mark.parametrize("kind", [MsgType.PUSH, MsgType.INIT, MsgType.PULL],
                         ids=lambda kind: kind.name)
def test_a_key_end_at_the_edge_of_the_key_space_gets_an_error_reply(
        kind: MsgType, key_start: int, key_end: int, errors_logged: ErrorRecords) -> None:
    with start_server() as live:
        values = None if kind is MsgType.PULL else np.ones(len(SHARD), dtype=np.float32)
        data = _frame(kind, 77, SHARD, values=values)
        struct.pack_into("<QQ", data, FIELDS["key_start"][0], key_start, key_end)

        async def script() -> tuple[Frame, Frame]:
            refused = await _one(live, data)
            served = await _one(live, _frame(MsgType.PULL, 78, SHARD, clock=ANY_CLOCK))
            return refused, served

        before = live.server.state.params.tobytes()
        refused, served = live.run(script(), 30)
        assert refused.type is MsgType.ERROR and refused.request_id == 77
        assert refused.error()[0] != "InternalError", refused.error()
        assert served.type is MsgType.VALUES and served.request_id == 78
        assert live.server.state.params.tobytes() == before
        assert live.server.stats.internal_errors == 0
        assert errors_logged.records == []


def _huge_pushes() -> list[tuple[DType, np.ndarray]]:
    return [(DType.FLOAT64, np.full(len(SHARD), 1e300, dtype=np.float64))] + [
        (DType.FLOAT32, np.full(len(SHARD), 3e38, dtype=np.float32))] * 3


@pytest.mark.parametrize("model", ["asp", "bsp"])
def test_huge_finite_values_are_refused_and_leave_the_parameters_bit_identical(
        model: str, errors_logged: ErrorRecords) -> None:
    with start_server(model) as live:
        state = live.server.state
        before = state.params.tobytes()
        slots = [slot.tobytes() for slot in state.optimizer.slots()]

        async def script() -> list[Frame]:
            replies = []
            for request, (dtype, values) in enumerate(_huge_pushes(), start=1):
                replies.append(await _one(live, _frame(MsgType.PUSH, request, SHARD,
                                                       rank=request % 2, values=values,
                                                       dtype=dtype)))
            # one value of 3e38 and zeros: finite, but its squared norm overflows float32
            one = np.zeros(len(SHARD), dtype=np.float32)
            one[5] = 3e38
            replies.append(await _one(live, _frame(MsgType.PUSH, 9, SHARD, values=one)))
            sparse = np.array([SHARD.start + 3, SHARD.start + 40], dtype=np.uint32)
            replies.append(await _one(live, _frame(
                MsgType.PUSH, 10, SHARD, values=np.full(2, 1e300), dtype=DType.FLOAT64,
                index=sparse)))
            return replies

        replies = live.run(script(), 30)
        for reply, request in zip(replies, [1, 2, 3, 4, 9, 10], strict=True):
            assert reply.type is MsgType.ERROR, (request, reply)
            assert reply.request_id == request
            assert reply.error()[0] != "InternalError", reply.error()
        assert state.params.tobytes() == before
        assert [slot.tobytes() for slot in state.optimizer.slots()] == slots
        assert state.version == 0
        assert np.isfinite(state.params).all()

        async def honest() -> Frame:  # the refused pushes consumed no clock
            return await _one(live, _frame(MsgType.PUSH, 11, SHARD,
                                           values=np.ones(len(SHARD), dtype=np.float32)))

        assert live.run(honest(), 10).type is MsgType.ACK
        assert errors_logged.records == []


def test_a_huge_init_is_refused_and_a_sane_one_then_wins(errors_logged: ErrorRecords) -> None:
    with start_server(initialized=False) as live:

        async def script() -> list[Frame]:
            return [
                await _one(live, _frame(MsgType.INIT, 1, SHARD, dtype=DType.FLOAT64,
                                        values=np.full(len(SHARD), 1e300))),
                await _one(live, _frame(MsgType.INIT, 2, SHARD,
                                        values=np.full(len(SHARD), 2.0, dtype=np.float32))),
                await _one(live, _frame(MsgType.PULL, 3, SHARD, clock=ANY_CLOCK)),
            ]

        refused, accepted, pulled = live.run(script(), 30)
        assert refused.type is MsgType.ERROR and refused.error()[0] != "InternalError"
        assert accepted.type is MsgType.ACK
        assert pulled.type is MsgType.VALUES
        assert pulled.values.tolist() == [2.0] * len(SHARD)
        assert errors_logged.records == []

