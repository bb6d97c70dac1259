"""The binary wire format for tensor traffic between workers and shard servers.

A frame is a fixed little-endian header, ``ndim`` shape dimensions, then the raw array bytes::

    magic "PS" | version | type | dtype | ndim | sender role | flags | sender rank
    run id (16 bytes) | request id | clock | version | key start | key end | wait ns | stamp ns |
    payload bytes
    shape[0..ndim) | payload

Nothing is pickled. ``decode`` validates everything a peer could get wrong (magic, version, type,
dtype, shape against the key range and the byte count, size limit, finiteness of pushed values)
and raises :class:`ProtocolError` with a reason that is sent back to the peer as-is.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, TypeVar

import numpy as np

from engine.errors import BadPayload, FrameTooLarge, ProtocolError
from engine.keys import KeyRange

MAGIC = b"PS"
PROTOCOL_VERSION = 2
MAX_NDIM = 4
_HEADER = struct.Struct("<2sBBBBBBI16sQqQQQQQQ")
_DIM = struct.Struct("<Q")
HEADER_BYTES = _HEADER.size


class MsgType(IntEnum):
    PUSH = 1  # worker -> server: gradient for a key range
    PULL = 2  # worker -> server: ask for values of a key range
    INIT = 3  # worker -> server: initial values (first one wins)
    ACK = 4  # server -> worker: push or init accepted
    VALUES = 5  # server -> worker: reply to PULL
    ERROR = 6  # either way: JSON {"code", "message"}


class Role(IntEnum):
    COORDINATOR = 0
    SERVER = 1
    WORKER = 2
    EVALUATOR = 3
    CLIENT = 4  # tools and tests


class DType(IntEnum):
    FLOAT32 = 1
    FLOAT64 = 2
    FLOAT16 = 3
    BYTES = 4  # JSON error bodies


_NUMPY: dict[DType, np.dtype[Any]] = {
    DType.FLOAT32: np.dtype("<f4"),
    DType.FLOAT64: np.dtype("<f8"),
    DType.FLOAT16: np.dtype("<f2"),
    DType.BYTES: np.dtype("u1"),
}
_CARRIES_VALUES = {MsgType.PUSH, MsgType.INIT, MsgType.VALUES}
ANY_CLOCK = -1  # a PULL with this clock is served at once, whatever the consistency model says
FLAG_FINAL = 1  # on a PUSH: the worker's last iteration; it pushes nothing after this one
_KNOWN_FLAGS = FLAG_FINAL


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
    buffer = bytearray(HEADER_BYTES + _DIM.size * len(shape) + nbytes)
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
    )
    offset = HEADER_BYTES
    for dim in shape:
        _DIM.pack_into(buffer, offset, dim)
        offset += _DIM.size
    if payload is not None:
        target = np.frombuffer(buffer, dtype=_NUMPY[frame.dtype], offset=offset, count=payload.size)
        np.copyto(target, payload.reshape(-1), casting="no")
    return buffer


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


def decode(data: bytes | bytearray | memoryview, *, max_bytes: int) -> Frame:
    """Parse and validate one frame; the payload is a zero-copy view of ``data``."""
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
    keys = KeyRange(key_start, key_end)
    payload = _payload(data, kind, dt, ndim, nbytes, keys)
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
    )


_E = TypeVar("_E", bound=IntEnum)


def _enum(kind: type[_E], value: int, what: str) -> _E:
    try:
        return kind(value)
    except ValueError:
        raise ProtocolError(f"unknown {what} code {value}") from None


def _payload(
    data: bytes | bytearray | memoryview,
    kind: MsgType,
    dtype: DType,
    ndim: int,
    nbytes: int,
    keys: KeyRange,
) -> np.ndarray | None:
    if ndim > MAX_NDIM:
        raise ProtocolError(f"{ndim} dimensions exceed the maximum of {MAX_NDIM}")
    offset = HEADER_BYTES + _DIM.size * ndim
    if len(data) != offset + nbytes:
        raise ProtocolError(
            f"frame holds {len(data) - offset} payload bytes but its header says {nbytes}"
        )
    shape = tuple(_DIM.unpack_from(data, HEADER_BYTES + _DIM.size * i)[0] for i in range(ndim))
    if kind not in _CARRIES_VALUES and kind is not MsgType.ERROR:
        if nbytes or ndim:
            raise BadPayload(f"{kind.name} frames carry no payload, got {nbytes} bytes")
        return None
    itemsize = _NUMPY[dtype].itemsize
    count = 1
    for dim in shape:
        count *= dim
    if count * itemsize != nbytes:
        raise BadPayload(
            f"shape {shape} of {dtype.name} needs {count * itemsize} bytes, payload has {nbytes}"
        )
    if kind in _CARRIES_VALUES:
        _check_values(kind, dtype, shape, keys)
    array = np.frombuffer(data, dtype=_NUMPY[dtype], count=count, offset=offset)
    if kind in (MsgType.PUSH, MsgType.INIT) and not np.isfinite(array).all():
        raise BadPayload(f"{kind.name} values contain NaN or infinity")
    return array


def _check_values(kind: MsgType, dtype: DType, shape: tuple[int, ...], keys: KeyRange) -> None:
    if dtype is DType.BYTES:
        raise BadPayload(f"{kind.name} values must be floating point, got {dtype.name}")
    if len(shape) != 1 or shape[0] != len(keys):
        raise BadPayload(
            f"{kind.name} shape {shape} does not match the {len(keys)} keys of "
            f"[{keys.start}, {keys.end})"
        )
