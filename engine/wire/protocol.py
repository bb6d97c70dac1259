"""The binary wire format for tensor traffic between workers and shard servers (version 3).

A frame is a fixed little-endian header, ``ndim`` shape dimensions, an optional key list, then the
raw array bytes::

    magic "PS" | version | type | dtype | ndim | sender role | flags | sender rank
    run id (16 bytes) | request id | clock | version | key start | key end | wait ns | stamp ns |
    payload bytes | key kind | codec | 2 pad bytes | key count
    shape[0..ndim) | keys[0..key count) (uint32 or uint64) | payload

A VALUES frame's clock is the slowest worker's committed clock count on the clock ranges it
covers (the servers' minimum layer clock; request scheduling reads it). An ACK of a push may
carry one FLOAT64 value: the scale the shard applied the pushed gradient
with (aggregator weight times learning-rate factors; see ``engine.server.shard``).

``key start``/``key end`` is the frame's *span*. A ``RANGE`` frame addresses every key of the span
and carries one value per key. A key-list frame (``U32`` or ``U64``) addresses a sorted, unique
list of keys inside the span, one value per listed key; its span is what the frame speaks for
(a PUSH with ``FLAG_COMMIT`` commits its clock for the clock ranges the span covers), so an
empty list is a legal push that only advances the clock. The header is 104 bytes, so the
keys and values that follow it stay 8-byte aligned.

A nonzero *codec* byte says the body after the header is compressed (``engine.wire.codecs``);
the header's sizes are the uncompressed ones, so the reader knows the inflated size, bounded by its
frame limit, before inflating. Values travel as FLOAT32, FLOAT16 or BFLOAT16 (or FLOAT64).

Nothing is pickled. ``decode`` validates everything a peer could get wrong (magic, version, type,
dtype, shape against the keys and the byte count, key order and bounds, size limit, finiteness of
pushed values) and raises :class:`ProtocolError` with a reason that is sent back to the peer as-is.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, TypeVar

import numpy as np

from engine.errors import BadPayload, FrameTooLarge, NonFinitePush, ProtocolError
from engine.keys import KeyRange
from engine.wire.codecs import BFLOAT16, Codec, pack, unpack

MAGIC = b"PS"
PROTOCOL_VERSION = 3
MAX_NDIM = 4
_HEADER = struct.Struct("<2sBBBBBBI16sQqQQQQQQBB2xQ")
_CODEC_OFFSET = _HEADER.size - 11  # the codec byte follows the key kind
_DIM = struct.Struct("<Q")
HEADER_BYTES = _HEADER.size


class MsgType(IntEnum):
    PUSH = 1  # worker -> server: gradient for a key range
    PULL = 2  # worker -> server: ask for values of a key range
    INIT = 3  # worker -> server: initial values (first one wins)
    ACK = 4  # server -> worker: push or init accepted
    VALUES = 5  # server -> worker: reply to PULL
    ERROR = 6  # either way: JSON {"code", "message"}
    CLOCKS = 7  # worker -> server: which clock do you hold for me on this span? (an ACK answers)


class Role(IntEnum):
    COORDINATOR = 0
    SERVER = 1
    WORKER = 2
    EVALUATOR = 3
    CLIENT = 4  # tools and tests


class KeyKind(IntEnum):
    RANGE = 0  # every key of the span, in order
    U32 = 1  # a sorted, unique uint32 key list follows the shape
    U64 = 2  # the same with uint64 keys, for key spaces past 2**32


_KEY_DTYPES: dict[KeyKind, np.dtype[Any]] = {
    KeyKind.U32: np.dtype("<u4"), KeyKind.U64: np.dtype("<u8")}


class DType(IntEnum):
    FLOAT32 = 1
    FLOAT64 = 2
    FLOAT16 = 3
    BYTES = 4  # JSON error bodies
    BFLOAT16 = 5  # the upper half of a float32 (ml_dtypes.bfloat16)


_NUMPY: dict[DType, np.dtype[Any]] = {
    DType.FLOAT32: np.dtype("<f4"),
    DType.FLOAT64: np.dtype("<f8"),
    DType.FLOAT16: np.dtype("<f2"),
    DType.BYTES: np.dtype("u1"),
    DType.BFLOAT16: BFLOAT16,
}
FLOAT_DTYPES = (DType.FLOAT32, DType.FLOAT64, DType.FLOAT16, DType.BFLOAT16)


def wire_dtype(name: str) -> DType:
    """``float32``, ``float16`` or ``bfloat16`` (the ``comm.wire_dtype`` setting) as a DType."""
    return DType[name.upper()]


def numpy_dtype(dtype: DType) -> np.dtype[Any]:
    return _NUMPY[dtype]
_CARRIES_VALUES = {MsgType.PUSH, MsgType.INIT, MsgType.VALUES}
_TAKES_KEY_LIST = {MsgType.PUSH, MsgType.PULL, MsgType.VALUES}
# Keys index a flat array, so the key space ends where a signed 64-bit length does.
MAX_KEY = 2**63 - 1
# The most keys one key-list PUSH or PULL may name: a server refuses more (2 million keys of one
# push held its event loop 2-7 s; 16,384 new keys held it at most 52 ms, key map merges
# included, up to 16.8 million keys stored: bench/keyrows.py), and a client sends a longer list as
# frames of at most this many, which a push commits only with its last.
MAX_LIST_KEYS = 1 << 14
ANY_CLOCK = -1  # a PULL with this clock is served at once, whatever the consistency model says
FLAG_FINAL = 1  # on a PUSH: the worker's last iteration; it pushes nothing after this one
FLAG_COMMIT = 2  # on a PUSH: the worker is done with this clock on every clock range of the span
_KNOWN_FLAGS = FLAG_FINAL | FLAG_COMMIT
# The websocket close code of a copy that no longer serves a key range (it moved to another
# server, which the coordinator names to every client): the client goes there.
CLOSE_MOVED = 4001


def to_ns(seconds: float) -> int:
    """Seconds as the integer nanoseconds a frame carries. ``from_ns`` is its inverse; offline
    replays apply the same pair to recorded seconds, so they see exactly what the servers saw."""
    return max(round(seconds * 1e9), 0)


def from_ns(ns: int) -> float:
    return ns / 1e9


@dataclass(frozen=True, slots=True)
class Frame:
    type: MsgType
    request_id: int
    keys: KeyRange
    run: bytes = bytes(16)
    role: Role = Role.CLIENT
    rank: int = 0
    clock: int = 0
    version: int = 0
    wait_ns: int = 0
    # A PUSH carries the worker's wall-clock send time (ns since the epoch) and, in wait_ns, how
    # long its pull was held back: every shard then sees the same timings, so timing-driven
    # controllers (ElasticBSP, DSSP) reach the same decisions on every shard without talking.
    stamp_ns: int = 0
    flags: int = 0
    dtype: DType = DType.FLOAT32
    payload: np.ndarray | None = None
    index: np.ndarray | None = None  # sorted unique keys inside ``keys``; None: all of ``keys``
    # How the body travels (encode falls back to NONE where packing does not shrink it); a
    # decoded frame says how it arrived, so a server can answer in kind.
    codec: Codec = Codec.NONE

    @property
    def key_count(self) -> int:
        return len(self.keys) if self.index is None else len(self.index)

    @property
    def values(self) -> np.ndarray:
        if self.payload is None:
            raise BadPayload(f"{self.type.name} frame carries no values")
        return self.payload

    def error(self) -> tuple[str, str]:
        """The (code, message) of an ERROR frame."""
        body = json.loads(bytes(self.values).decode("utf-8"))
        return str(body.get("code", "error")), str(body.get("message", ""))


def encode(frame: Frame) -> bytearray:
    """One contiguous buffer holding the frame; the payload is copied exactly once."""
    payload = frame.payload
    shape: tuple[int, ...] = () if payload is None else payload.shape
    nbytes = 0 if payload is None else payload.nbytes
    kind, index = key_kind(frame), frame.index
    index_bytes = 0 if index is None else len(index) * _KEY_DTYPES[kind].itemsize
    buffer = bytearray(HEADER_BYTES + _DIM.size * len(shape) + index_bytes + nbytes)
    _HEADER.pack_into(
        buffer,
        0,
        MAGIC,
        PROTOCOL_VERSION,
        frame.type,
        frame.dtype,
        len(shape),
        frame.role,
        frame.flags,
        frame.rank,
        frame.run,
        frame.request_id,
        frame.clock,
        frame.version,
        frame.keys.start,
        frame.keys.end,
        frame.wait_ns,
        frame.stamp_ns,
        nbytes,
        kind,
        Codec.NONE,
        0 if index is None else len(index),
    )
    offset = HEADER_BYTES
    for dim in shape:
        _DIM.pack_into(buffer, offset, dim)
        offset += _DIM.size
    if index is not None:
        target = np.frombuffer(buffer, dtype=_KEY_DTYPES[kind], offset=offset, count=len(index))
        target[:] = index
        offset += index_bytes
    if payload is not None:
        target = np.frombuffer(buffer, dtype=_NUMPY[frame.dtype], offset=offset, count=payload.size)
        np.copyto(target, payload.reshape(-1), casting="no")
    if frame.codec is Codec.NONE:
        return buffer
    return _packed(buffer, frame.codec)


def _packed(buffer: bytearray, codec: Codec) -> bytearray:
    """``buffer`` with its body compressed by ``codec``; as it was when that does not shrink it."""
    body = pack(codec, memoryview(buffer)[HEADER_BYTES:])
    if len(body) >= len(buffer) - HEADER_BYTES:
        return buffer
    packed = bytearray(HEADER_BYTES + len(body))
    packed[:HEADER_BYTES] = buffer[:HEADER_BYTES]
    packed[_CODEC_OFFSET] = codec
    packed[HEADER_BYTES:] = body
    return packed


def key_kind(frame: Frame) -> KeyKind:
    """How a frame's keys travel: a range, or a list in the narrowest type that holds them."""
    if frame.index is None:
        return KeyKind.RANGE
    return KeyKind.U32 if frame.keys.end <= 2**32 else KeyKind.U64


def error_frame(request_id: int, code: str, message: str, *, role: Role, rank: int) -> Frame:
    body = json.dumps({"code": code, "message": message}).encode("utf-8")
    return Frame(
        MsgType.ERROR,
        request_id,
        KeyRange(0, 0),
        role=role,
        rank=rank,
        dtype=DType.BYTES,
        payload=np.frombuffer(body, dtype=np.uint8),
    )


def peek_request_id(data: bytes | bytearray | memoryview) -> int:
    """Best-effort request id of a frame that failed validation, so the error can be matched."""
    if len(data) >= HEADER_BYTES and bytes(data[:2]) == MAGIC:
        return int(_HEADER.unpack_from(data, 0)[9])
    return 0


def peek_kind(data: bytes | bytearray | memoryview | str) -> tuple[MsgType | None, int]:
    """A frame's type and the number of keys it carries, from its header alone (the simulator
    charges a server's push by its keys); (None, 0) for what is no frame."""
    if isinstance(data, str) or len(data) < HEADER_BYTES or bytes(data[:2]) != MAGIC:
        return None, 0
    fields = _HEADER.unpack_from(data, 0)
    try:
        kind = MsgType(fields[2])
    except ValueError:
        return None, 0
    listed = fields[-1]
    return kind, int(listed) if fields[-3] != KeyKind.RANGE else max(int(fields[13] - fields[12]),
                                                                     0)


# frame_limit's floor: small enough to allocate for any peer, large enough that a small garbage
# message is answered with an ERROR rather than a closed connection
MIN_FRAME_LIMIT = 2**16


def frame_limit(keys: int) -> int:
    """The largest frame that can address at most ``keys`` keys (a full header, a key list and
    float64 values for every key), or ``MIN_FRAME_LIMIT``."""
    return max(HEADER_BYTES + _DIM.size * MAX_NDIM + 16 * keys, MIN_FRAME_LIMIT)


def decode(data: bytes | bytearray | memoryview, *, max_bytes: int,
           max_keys: int | None = None) -> Frame:
    """Parse and validate one frame; the payload is a zero-copy view of ``data``.

    ``max_keys``: the most keys a frame may address here (a server's shard); what the header
    declares beyond it is refused before anything it declares is allocated."""
    if len(data) > max_bytes:
        raise FrameTooLarge(f"frame of {len(data)} bytes exceeds the limit of {max_bytes}")
    if len(data) < HEADER_BYTES:
        raise ProtocolError(
            f"frame of {len(data)} bytes is shorter than the {HEADER_BYTES}-byte "
            "header; not a psctl frame"
        )
    fields = _HEADER.unpack_from(data, 0)
    (
        magic,
        version,
        msg_type,
        dtype,
        ndim,
        role,
        flags,
        rank,
        run,
        request_id,
        clock,
        server_version,
        key_start,
        key_end,
        wait_ns,
        stamp_ns,
        nbytes,
        raw_key_kind,
        raw_codec,
        key_count,
    ) = fields
    if magic != MAGIC:
        raise ProtocolError(f"bad magic {magic!r}: not a psctl frame")
    if version != PROTOCOL_VERSION:
        raise ProtocolError(
            f"protocol version {version} is not supported (expected {PROTOCOL_VERSION})"
        )
    kind, dt, sender = (
        _enum(MsgType, msg_type, "type"),
        _enum(DType, dtype, "dtype"),
        _enum(Role, role, "role"),
    )
    if flags & ~_KNOWN_FLAGS:
        raise ProtocolError(f"unknown flag bits {flags & ~_KNOWN_FLAGS:#04x}")
    if key_end < key_start:
        raise ProtocolError(f"key range [{key_start}, {key_end}) is reversed")
    if key_end > MAX_KEY:
        raise ProtocolError(f"key end {key_end} is past the largest key space ({MAX_KEY} keys)")
    keys = KeyRange(key_start, key_end)
    keying = _enum(KeyKind, raw_key_kind, "key kind")
    codec = _enum(Codec, raw_codec, "codec")
    if max_keys is not None:
        _check_declared(keys, key_count, nbytes, max_keys)
    if codec is not Codec.NONE:
        data = _inflate(data, codec, ndim, keying, key_count, nbytes, max_bytes)
    index = _index(data, kind, keying, ndim, key_count, keys)
    payload = _payload(data, kind, dt, ndim, nbytes, keys, index)
    return Frame(
        kind,
        request_id,
        keys,
        run=run,
        role=sender,
        rank=rank,
        clock=clock,
        version=server_version,
        wait_ns=wait_ns,
        stamp_ns=stamp_ns,
        flags=flags,
        dtype=dt,
        payload=payload,
        index=index,
        codec=codec,
    )


def _check_declared(keys: KeyRange, key_count: int, nbytes: int, max_keys: int) -> None:
    if len(keys) > max_keys or key_count > max_keys:
        raise FrameTooLarge(f"the frame addresses {max(len(keys), key_count)} keys; this server "
                            f"holds {max_keys}")
    if nbytes > 8 * max_keys:
        raise FrameTooLarge(f"the frame declares {nbytes} payload bytes; values for this "
                            f"server's {max_keys} keys take at most {8 * max_keys}")


def _inflate(data: bytes | bytearray | memoryview, codec: Codec, ndim: int, keying: KeyKind,
             key_count: int, nbytes: int, max_bytes: int) -> bytearray:
    """The frame with its body inflated to exactly the size its header declares, which must
    stay within ``max_bytes``: a peer cannot make a small frame inflate without bound."""
    if ndim > MAX_NDIM:
        raise ProtocolError(f"{ndim} dimensions exceed the maximum of {MAX_NDIM}")
    key_bytes = key_count * _KEY_DTYPES[keying].itemsize if keying is not KeyKind.RANGE else 0
    size = HEADER_BYTES + _DIM.size * ndim + key_bytes + nbytes
    if size > max_bytes:
        raise FrameTooLarge(f"the frame would inflate to {size} bytes, past the limit of "
                            f"{max_bytes}")
    inflated = bytearray(size)
    inflated[:HEADER_BYTES] = data[:HEADER_BYTES]
    unpack(codec, memoryview(data)[HEADER_BYTES:], memoryview(inflated)[HEADER_BYTES:])
    return inflated


_E = TypeVar("_E", bound=IntEnum)


def _enum(kind: type[_E], value: int, what: str) -> _E:
    try:
        return kind(value)
    except ValueError:
        raise ProtocolError(f"unknown {what} code {value}") from None


def _index(
    data: bytes | bytearray | memoryview,
    kind: MsgType,
    keying: KeyKind,
    ndim: int,
    count: int,
    span: KeyRange,
) -> np.ndarray | None:
    """The frame's key list (a zero-copy view), checked: sorted, unique, inside the span."""
    if keying is KeyKind.RANGE:
        if count:
            raise ProtocolError(f"a key-range frame declares a key count of {count}")
        return None
    if kind not in _TAKES_KEY_LIST:
        raise ProtocolError(f"{kind.name} frames address a key range, not a key list")
    if ndim > MAX_NDIM:
        raise ProtocolError(f"{ndim} dimensions exceed the maximum of {MAX_NDIM}")
    if keying is KeyKind.U32 and span.end > 2**32:
        raise ProtocolError(f"span end {span.end} does not fit the frame's uint32 keys")
    offset, dtype = HEADER_BYTES + _DIM.size * ndim, _KEY_DTYPES[keying]
    if count > (len(data) - offset) // dtype.itemsize:
        raise BadPayload(f"the frame declares {count} keys but holds room for at most "
                         f"{max(len(data) - offset, 0) // dtype.itemsize}")
    index = np.frombuffer(data, dtype=dtype, count=count, offset=offset)
    if count and (int(index[0]) < span.start or int(index[-1]) >= span.end):
        raise BadPayload(f"keys {int(index[0])}..{int(index[-1])} are not all inside the span "
                         f"[{span.start}, {span.end})")
    if count > 1:
        # Compared in the keys' own unsigned type: as int64 a key of 2**63 or more would wrap
        # negative and pass for sorted in front of small keys (the fuzz found one).
        increasing = index[1:] > index[:-1]
        if not increasing.all():
            at = int(np.argmin(increasing))
            what = "duplicated" if index[at + 1] == index[at] else "not sorted"
            raise BadPayload(f"key list is {what}: key {int(index[at + 1])} at position "
                             f"{at + 1} follows {int(index[at])}; keys must be strictly increasing")
    return index


def _payload(
    data: bytes | bytearray | memoryview,
    kind: MsgType,
    dtype: DType,
    ndim: int,
    nbytes: int,
    keys: KeyRange,
    index: np.ndarray | None,
) -> np.ndarray | None:
    if ndim > MAX_NDIM:
        raise ProtocolError(f"{ndim} dimensions exceed the maximum of {MAX_NDIM}")
    offset = HEADER_BYTES + _DIM.size * ndim
    if index is not None:
        offset += index.nbytes
    if len(data) != offset + nbytes:
        raise ProtocolError(
            f"frame holds {len(data) - offset} payload bytes but its header says {nbytes}"
        )
    shape = tuple(_DIM.unpack_from(data, HEADER_BYTES + _DIM.size * i)[0] for i in range(ndim))
    if kind not in _CARRIES_VALUES and kind is not MsgType.ERROR:
        if not (nbytes or ndim):
            return None
        if kind is not MsgType.ACK:
            raise BadPayload(f"{kind.name} frames carry no payload, got {nbytes} bytes")
        if dtype is not DType.FLOAT64 or shape != (1,):
            raise BadPayload(f"an ACK carries at most one FLOAT64 value (the applied scale), "
                             f"got {dtype.name} of shape {shape}")
    itemsize = _NUMPY[dtype].itemsize
    count = 1
    for dim in shape:
        count *= dim
    if count * itemsize != nbytes:
        raise BadPayload(
            f"shape {shape} of {dtype.name} needs {count * itemsize} bytes, payload has {nbytes}"
        )
    if kind in _CARRIES_VALUES:
        _check_values(kind, dtype, shape, keys, index)
    array = np.frombuffer(data, dtype=_NUMPY[dtype], count=count, offset=offset)
    if kind in (MsgType.PUSH, MsgType.INIT) and not np.isfinite(array).all():
        error = NonFinitePush if kind is MsgType.PUSH else BadPayload
        raise error(f"{kind.name} values contain NaN or infinity")
    return array


def _check_values(kind: MsgType, dtype: DType, shape: tuple[int, ...], keys: KeyRange,
                  index: np.ndarray | None) -> None:
    if dtype is DType.BYTES:
        raise BadPayload(f"{kind.name} values must be floating point, got {dtype.name}")
    count = len(keys) if index is None else len(index)
    if len(shape) != 1 or shape[0] != count:
        where = (f"[{keys.start}, {keys.end})" if index is None
                 else f"the key list in [{keys.start}, {keys.end})")
        raise BadPayload(f"{kind.name} shape {shape} does not match the {count} keys of {where}")


_REQUEST_ID_OFFSET = 28  # after magic, six one-byte fields, the rank and the run id


def with_request_id(data: bytes | bytearray, request_id: int) -> bytearray:
    """A copy of an encoded frame under another request id (a chain link's own numbering)."""
    copy = bytearray(data)
    struct.pack_into("<Q", copy, _REQUEST_ID_OFFSET, request_id)
    return copy
