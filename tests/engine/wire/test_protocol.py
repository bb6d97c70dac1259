"""The binary wire format: round trips for every frame type and a refusal for every bad frame.

The header layout is restated here from the module docstring (not imported), so that a change to
the wire format breaks these tests instead of silently following along.
"""

from __future__ import annotations

import json
import pickle
import struct
import tracemalloc
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.errors import BadPayload, FrameTooLarge, ProtocolError
from engine.keys import KeyRange
from engine.wire.codecs import Codec
from engine.wire.protocol import (
    ANY_CLOCK,
    FLAG_COMMIT,
    FLAG_FINAL,
    HEADER_BYTES,
    MAGIC,
    MAX_NDIM,
    PROTOCOL_VERSION,
    DType,
    Frame,
    KeyKind,
    MsgType,
    Role,
    decode,
    encode,
    error_frame,
    from_ns,
    peek_request_id,
    to_ns,
    with_request_id,
)

# magic | version | type | dtype | ndim | role | flags | rank | run | request id | clock |
# version | key start | key end | wait ns | stamp ns | payload bytes | key kind | pad | key count
LAYOUT = struct.Struct("<2sBBBBBBI16sQqQQQQQQB3xQ")
MAX = 1 << 20
RUN = bytes(range(16))
NUMPY = {DType.FLOAT32: "<f4", DType.FLOAT64: "<f8", DType.FLOAT16: "<f2", DType.BYTES: "u1"}


def raw_frame(
    *,
    magic: bytes = MAGIC,
    version: int = PROTOCOL_VERSION,
    msg_type: int = MsgType.PUSH,
    dtype: int = DType.FLOAT32,
    role: int = Role.WORKER,
    rank: int = 0,
    request_id: int = 42,
    clock: int = 0,
    server_version: int = 0,
    start: int = 0,
    end: int = 4,
    shape: tuple[int, ...] | None = None,
    payload: bytes | None = None,
    nbytes: int | None = None,
    key_kind: int = 0,
    keys: bytes = b"",
    key_count: int | None = None,
    flags: int = 0,
) -> bytes:
    """A frame assembled byte by byte, so that any field can be made wrong."""
    itemsize = {0: 1, 1: 4, 2: 8}[key_kind]
    count = len(keys) // itemsize if key_count is None else key_count
    listed = len(keys) // itemsize
    if payload is None:
        payload = np.arange(end - start if key_kind == 0 else listed, dtype="<f4").tobytes()
    if shape is None:
        shape = (end - start if key_kind == 0 else listed,)
    header = LAYOUT.pack(
        magic,
        version,
        msg_type,
        dtype,
        len(shape),
        role,
        flags,
        rank,
        RUN,
        request_id,
        clock,
        server_version,
        start,
        end,
        0,
        0,
        len(payload) if nbytes is None else nbytes,
        key_kind,
        count,
    )
    return header + b"".join(struct.pack("<Q", d) for d in shape) + keys + payload


def refusal(data: bytes | bytearray, max_bytes: int = MAX) -> ProtocolError:
    with pytest.raises(ProtocolError) as caught:
        decode(data, max_bytes=max_bytes)
    return caught.value


# -- layout -------------------------------------------------------------------------------------


def test_header_is_104_bytes_and_matches_the_documented_layout() -> None:
    assert HEADER_BYTES == LAYOUT.size == 104
    frame = Frame(
        MsgType.PUSH,
        request_id=7,
        keys=KeyRange(3, 5),
        run=RUN,
        role=Role.WORKER,
        rank=9,
        clock=11,
        version=13,
        wait_ns=17,
        stamp_ns=19,
        payload=np.array([1.5, -2.5], dtype=np.float32),
    )
    data = encode(frame)
    assert isinstance(data, bytearray)
    fields = LAYOUT.unpack_from(data, 0)
    assert fields == (b"PS", 3, 1, 1, 1, 2, 0, 9, RUN, 7, 11, 13, 3, 5, 17, 19, 8, 0, 0)
    assert struct.unpack_from("<Q", data, 104) == (2,)
    assert data[112:] == np.array([1.5, -2.5], dtype="<f4").tobytes()
    assert len(data) == 104 + 8 + 8
    assert decode(data, max_bytes=MAX).stamp_ns == 19


def test_a_hand_built_frame_decodes() -> None:
    frame = decode(raw_frame(request_id=5, clock=3, start=10, end=13), max_bytes=MAX)
    assert frame.type is MsgType.PUSH
    assert frame.request_id == 5
    assert frame.clock == 3
    assert frame.keys == KeyRange(10, 13)
    assert frame.values.tolist() == [0.0, 1.0, 2.0]


# -- round trips --------------------------------------------------------------------------------

u64 = st.integers(0, 2**64 - 1)
clocks = st.one_of(st.just(ANY_CLOCK), st.integers(0, 2**63 - 1))
runs = st.binary(min_size=16, max_size=16)
roles = st.sampled_from(list(Role))
float_dtypes = st.sampled_from([DType.FLOAT32, DType.FLOAT64, DType.FLOAT16])


@st.composite
def key_ranges(draw: Any, max_len: int = 40) -> KeyRange:
    start = draw(st.integers(0, 2**62))
    return KeyRange(start, start + draw(st.integers(0, max_len)))


def assert_same_header(got: Frame, sent: Frame) -> None:
    assert got.type is sent.type
    assert got.request_id == sent.request_id
    assert got.keys == sent.keys
    assert got.run == sent.run
    assert got.role is sent.role
    assert got.rank == sent.rank
    assert got.clock == sent.clock
    assert got.version == sent.version
    assert got.wait_ns == sent.wait_ns
    assert got.dtype is sent.dtype


@settings(max_examples=150, deadline=None)
@given(
    kind=st.sampled_from([MsgType.PUSH, MsgType.INIT, MsgType.VALUES]),
    keys=key_ranges(),
    dtype=float_dtypes,
    request_id=u64,
    clock=clocks,
    version=u64,
    wait_ns=u64,
    run=runs,
    role=roles,
    rank=st.integers(0, 2**32 - 1),
    seed=st.integers(0, 2**32 - 1),
)
def test_value_frames_round_trip(
    kind: MsgType,
    keys: KeyRange,
    dtype: DType,
    request_id: int,
    clock: int,
    version: int,
    wait_ns: int,
    run: bytes,
    role: Role,
    rank: int,
    seed: int,
) -> None:
    values = np.random.default_rng(seed).standard_normal(len(keys)).astype(NUMPY[dtype])
    sent = Frame(
        kind,
        request_id,
        keys,
        run=run,
        role=role,
        rank=rank,
        clock=clock,
        version=version,
        wait_ns=wait_ns,
        dtype=dtype,
        payload=values,
    )
    data = encode(sent)
    assert len(data) == HEADER_BYTES + 8 + values.nbytes
    got = decode(bytes(data), max_bytes=len(data))
    assert_same_header(got, sent)
    assert got.values.dtype == np.dtype(NUMPY[dtype])
    assert got.values.shape == (len(keys),)
    np.testing.assert_array_equal(got.values, values)


@settings(max_examples=100, deadline=None)
@given(
    kind=st.sampled_from([MsgType.PULL, MsgType.ACK, MsgType.CLOCKS]),
    keys=key_ranges(max_len=2**40),
    request_id=u64,
    clock=clocks,
    version=u64,
    wait_ns=u64,
    run=runs,
    role=roles,
    rank=st.integers(0, 2**32 - 1),
)
def test_frames_without_payload_round_trip(
    kind: MsgType,
    keys: KeyRange,
    request_id: int,
    clock: int,
    version: int,
    wait_ns: int,
    run: bytes,
    role: Role,
    rank: int,
) -> None:
    sent = Frame(
        kind,
        request_id,
        keys,
        run=run,
        role=role,
        rank=rank,
        clock=clock,
        version=version,
        wait_ns=wait_ns,
    )
    data = encode(sent)
    assert len(data) == HEADER_BYTES
    got = decode(data, max_bytes=HEADER_BYTES)
    assert_same_header(got, sent)
    assert got.payload is None
    with pytest.raises(BadPayload, match=f"{kind.name} frame carries no values"):
        _ = got.values


@settings(max_examples=100, deadline=None)
@given(
    request_id=u64,
    code=st.text(min_size=1, max_size=20),
    message=st.text(max_size=200),
    role=roles,
    rank=st.integers(0, 2**32 - 1),
)
def test_error_frames_round_trip(
    request_id: int, code: str, message: str, role: Role, rank: int
) -> None:
    sent = error_frame(request_id, code, message, role=role, rank=rank)
    assert sent.type is MsgType.ERROR
    assert sent.dtype is DType.BYTES
    assert sent.error() == (code, message)
    got = decode(encode(sent), max_bytes=MAX)
    assert_same_header(got, sent)
    assert got.keys == KeyRange(0, 0)
    assert got.error() == (code, message)
    assert peek_request_id(encode(sent)) == request_id


def test_every_message_type_is_covered_by_a_round_trip() -> None:
    covered = {MsgType.PUSH, MsgType.INIT, MsgType.VALUES, MsgType.PULL, MsgType.ACK}
    covered |= {MsgType.ERROR, MsgType.CLOCKS}
    assert covered == set(MsgType)


def test_empty_value_frame_round_trips() -> None:
    sent = Frame(MsgType.PUSH, 1, KeyRange(5, 5), payload=np.zeros(0, dtype=np.float32))
    data = encode(sent)
    assert len(data) == HEADER_BYTES + 8
    got = decode(data, max_bytes=MAX)
    assert got.keys == KeyRange(5, 5)
    assert got.values.shape == (0,)


def test_error_body_is_json_with_code_and_message() -> None:
    frame = error_frame(3, "BadPayload", 'näh: "quoted"', role=Role.SERVER, rank=2)
    assert json.loads(bytes(frame.values)) == {"code": "BadPayload", "message": 'näh: "quoted"'}
    assert frame.role is Role.SERVER and frame.rank == 2 and frame.request_id == 3


def test_error_of_a_body_without_fields_has_defaults() -> None:
    body = np.frombuffer(b"{}", dtype=np.uint8)
    frame = Frame(MsgType.ERROR, 1, KeyRange(0, 0), dtype=DType.BYTES, payload=body)
    assert frame.error() == ("error", "")


# -- zero copy ----------------------------------------------------------------------------------


def test_decoded_payload_is_a_view_of_the_buffer() -> None:
    values = np.array([1.0, 2.0, 3.0], dtype=np.float32)
    data = encode(Frame(MsgType.VALUES, 1, KeyRange(0, 3), payload=values))
    frame = decode(data, max_bytes=MAX)
    assert np.shares_memory(frame.values, np.frombuffer(data, dtype=np.uint8))
    data[-4:] = np.array([9.0], dtype="<f4").tobytes()  # write the buffer: the view follows
    assert frame.values.tolist() == [1.0, 2.0, 9.0]


def test_payload_decoded_from_bytes_is_read_only() -> None:
    data = bytes(encode(Frame(MsgType.VALUES, 1, KeyRange(0, 2), payload=np.ones(2, "f4"))))
    frame = decode(data, max_bytes=MAX)
    assert not frame.values.flags.writeable
    with pytest.raises(ValueError):
        frame.values[0] = 5.0


def test_decode_accepts_a_memoryview() -> None:
    data = encode(Frame(MsgType.PUSH, 4, KeyRange(1, 3), payload=np.ones(2, "f4")))
    frame = decode(memoryview(data), max_bytes=MAX)
    assert frame.values.tolist() == [1.0, 1.0]


def test_encode_copies_the_payload() -> None:
    values = np.array([1.0, 2.0], dtype=np.float32)
    data = encode(Frame(MsgType.PUSH, 1, KeyRange(0, 2), payload=values))
    values[:] = 0.0
    assert decode(data, max_bytes=MAX).values.tolist() == [1.0, 2.0]


# -- refusals -----------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [0, 1, 2, HEADER_BYTES - 1])
def test_shorter_than_header(size: int) -> None:
    error = refusal(raw_frame()[:size])
    assert type(error) is ProtocolError
    assert str(error) == (
        f"frame of {size} bytes is shorter than the 104-byte header; not a psctl frame"
    )


def test_pickle_payload_is_refused_by_its_magic_and_never_unpickled() -> None:
    # A pickled object the size of a real frame; decode must not look past its first bytes.
    data = pickle.dumps({"params": list(range(64))}, protocol=4)
    assert len(data) > HEADER_BYTES
    error = refusal(data)
    assert type(error) is ProtocolError
    assert str(error) == f"bad magic {data[:2]!r}: not a psctl frame"
    assert peek_request_id(data) == 0


def test_bad_magic() -> None:
    error = refusal(raw_frame(magic=b"PK"))
    assert type(error) is ProtocolError
    assert str(error) == "bad magic b'PK': not a psctl frame"


@pytest.mark.parametrize("version", [0, 1, 2, 4, 255])
def test_unsupported_version(version: int) -> None:
    error = refusal(raw_frame(version=version))
    assert type(error) is ProtocolError
    assert str(error) == f"protocol version {version} is not supported (expected 3)"


@pytest.mark.parametrize(
    ("field", "value", "what"),
    [
        ("msg_type", 0, "type"),
        ("msg_type", 8, "type"),
        ("dtype", 0, "dtype"),
        ("dtype", 6, "dtype"),
        ("role", 5, "role"),
        ("role", 255, "role"),
    ],
)
def test_unknown_codes(field: str, value: int, what: str) -> None:
    fields: dict[str, Any] = {field: value}
    error = refusal(raw_frame(**fields))
    assert type(error) is ProtocolError
    assert str(error) == f"unknown {what} code {value}"


def test_reversed_key_range() -> None:
    error = refusal(raw_frame(start=10, end=6, shape=(4,), payload=bytes(16)))
    assert type(error) is ProtocolError
    assert str(error) == "key range [10, 6) is reversed"


@pytest.mark.parametrize("end", [2**63, 2**63 + 4, 2**64 - 1])
def test_a_key_end_past_the_signed_64_bit_key_space_is_refused(end: int) -> None:
    # Python's len() of such a range overflows: it must be refused before anything measures it.
    error = refusal(raw_frame(start=end - 4, end=end, shape=(4,), payload=bytes(16)))
    assert type(error) is ProtocolError
    assert str(error) == f"key end {end} is past the largest key space ({2**63 - 1} keys)"


@pytest.mark.parametrize("declared", [0, 12, 20, 2**40])
def test_header_payload_length_differs_from_actual(declared: int) -> None:
    error = refusal(raw_frame(nbytes=declared))  # 16 payload bytes follow the shape
    assert type(error) is ProtocolError
    assert str(error) == f"frame holds 16 payload bytes but its header says {declared}"


def test_truncated_frame_is_refused() -> None:
    data = raw_frame()[:-3]
    error = refusal(data)
    assert str(error) == "frame holds 13 payload bytes but its header says 16"


def test_shape_disagrees_with_payload_size() -> None:
    error = refusal(raw_frame(shape=(3,)))  # 3 floats need 12 bytes, 16 are there
    assert isinstance(error, BadPayload)
    assert str(error) == "shape (3,) of FLOAT32 needs 12 bytes, payload has 16"


@pytest.mark.parametrize(
    ("shape", "text"),
    [((3,), "(3,)"), ((2, 2), "(2, 2)"), ((), "()"), ((1, 4), "(1, 4)")],
)
def test_shape_disagrees_with_keys(shape: tuple[int, ...], text: str) -> None:
    count = int(np.prod(shape))
    payload = np.zeros(count, "<f4").tobytes()
    error = refusal(raw_frame(start=0, end=4, shape=shape, payload=payload))
    assert isinstance(error, BadPayload)
    assert str(error) == f"PUSH shape {text} does not match the 4 keys of [0, 4)"


@pytest.mark.parametrize("kind", [MsgType.PUSH, MsgType.INIT, MsgType.VALUES])
def test_bytes_dtype_for_values_is_refused(kind: MsgType) -> None:
    error = refusal(raw_frame(msg_type=kind, dtype=DType.BYTES, payload=bytes(4)))
    assert isinstance(error, BadPayload)
    assert str(error) == f"{kind.name} values must be floating point, got BYTES"


@pytest.mark.parametrize("kind", [MsgType.PUSH, MsgType.INIT])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_pushed_values_are_refused(kind: MsgType, bad: float) -> None:
    payload = np.array([0.0, 1.0, bad, 3.0], "<f4").tobytes()
    error = refusal(raw_frame(msg_type=kind, payload=payload))
    assert isinstance(error, BadPayload)
    assert str(error) == f"{kind.name} values contain NaN or infinity"


def test_non_finite_float16_push_is_refused() -> None:
    payload = np.array([np.inf, 0.0], "<f2").tobytes()
    error = refusal(raw_frame(dtype=DType.FLOAT16, end=2, payload=payload))
    assert str(error) == "PUSH values contain NaN or infinity"


def test_non_finite_values_reply_is_accepted() -> None:
    # A diverged model is still the model: the server may report NaN, only pushes are checked.
    payload = np.array([np.nan, np.inf, 0.0, 1.0], "<f4").tobytes()
    frame = decode(raw_frame(msg_type=MsgType.VALUES, payload=payload), max_bytes=MAX)
    assert np.isnan(frame.values[0]) and np.isinf(frame.values[1])


def test_oversize_frame() -> None:
    data = raw_frame(end=300)  # 104 + 8 + 1200 bytes
    assert len(data) == 1312
    error = refusal(data, max_bytes=1311)
    assert isinstance(error, FrameTooLarge)
    assert str(error) == "frame of 1312 bytes exceeds the limit of 1311"
    assert decode(data, max_bytes=1312).keys == KeyRange(0, 300)


def test_oversize_is_checked_before_anything_else() -> None:
    error = refusal(b"x" * 100, max_bytes=99)
    assert isinstance(error, FrameTooLarge)


def test_payload_on_a_frame_that_carries_none() -> None:
    error = refusal(raw_frame(msg_type=MsgType.PULL))
    assert isinstance(error, BadPayload)
    assert str(error) == "PULL frames carry no payload, got 16 bytes"


def test_an_ack_carries_at_most_one_float64_scale() -> None:
    error = refusal(raw_frame(msg_type=MsgType.ACK))
    assert isinstance(error, BadPayload)
    assert str(error) == ("an ACK carries at most one FLOAT64 value (the applied scale), got "
                          "FLOAT32 of shape (4,)")
    two = raw_frame(msg_type=MsgType.ACK, dtype=DType.FLOAT64, shape=(2,), payload=bytes(16))
    assert "at most one FLOAT64" in str(refusal(two))
    ack = Frame(MsgType.ACK, 9, KeyRange(0, 4), dtype=DType.FLOAT64,
                payload=np.array([0.0625], dtype=np.float64))
    decoded = decode(encode(ack), max_bytes=1 << 20)
    assert decoded.payload is not None and decoded.payload.tolist() == [0.0625]
    bare = decode(encode(Frame(MsgType.ACK, 9, KeyRange(0, 4))), max_bytes=1 << 20)
    assert bare.payload is None


def test_pull_with_a_shape_but_no_bytes_is_refused() -> None:
    error = refusal(raw_frame(msg_type=MsgType.PULL, shape=(0,), payload=b""))
    assert str(error) == "PULL frames carry no payload, got 0 bytes"


def test_more_than_max_ndim_dimensions() -> None:
    shape = (1,) * (MAX_NDIM + 1)
    error = refusal(raw_frame(shape=shape))
    assert type(error) is ProtocolError
    assert str(error) == "5 dimensions exceed the maximum of 4"


def test_a_huge_ndim_is_refused_before_reading_dimensions() -> None:
    data = bytearray(raw_frame())
    data[5] = 255  # ndim byte
    error = refusal(data)
    assert str(error) == "255 dimensions exceed the maximum of 4"


def test_max_ndim_is_accepted_for_the_error_body() -> None:
    body = b'{"code": "c", "message": "m"}'
    data = raw_frame(
        msg_type=MsgType.ERROR,
        dtype=DType.BYTES,
        start=0,
        end=0,
        shape=(1, 1, 1, len(body)),
        payload=body,
    )
    assert decode(data, max_bytes=MAX).error() == ("c", "m")


# -- peek_request_id ----------------------------------------------------------------------------


def test_peek_request_id_of_an_invalid_but_psctl_frame() -> None:
    data = raw_frame(request_id=987654321, dtype=DType.BYTES, payload=bytes(4))
    refusal(data)
    assert peek_request_id(data) == 987654321


@pytest.mark.parametrize(
    "data",
    [b"", b"PS", b"PS" + bytes(HEADER_BYTES - 3), b"garbage" * 20, raw_frame(magic=b"SP")],
)
def test_peek_request_id_of_non_frames_is_zero(data: bytes) -> None:
    assert peek_request_id(data) == 0


def test_push_timing_and_final_flag_round_trip() -> None:
    frame = Frame(MsgType.PUSH, 1, KeyRange(0, 2), role=Role.WORKER, stamp_ns=to_ns(1.7e9 + 0.25),
                  wait_ns=to_ns(0.125), flags=FLAG_FINAL,
                  payload=np.zeros(2, dtype=np.float32))
    got = decode(encode(frame), max_bytes=MAX)
    assert (got.flags, from_ns(got.wait_ns)) == (FLAG_FINAL, 0.125)
    assert abs(from_ns(got.stamp_ns) - (1.7e9 + 0.25)) < 1e-6


def test_unknown_flag_bits_are_refused() -> None:
    data = bytearray(encode(Frame(MsgType.PULL, 1, KeyRange(0, 2), role=Role.WORKER)))
    data[7] = 0x84  # the flags byte
    assert str(refusal(data)) == "unknown flag bits 0x84"


# -- key lists (protocol version 3) -------------------------------------------------------------


def u32(*keys: int) -> bytes:
    return np.array(keys, dtype="<u4").tobytes()


def test_a_sparse_push_round_trips_with_its_key_list() -> None:
    index = np.array([3, 9, 1000], dtype=np.uint32)
    frame = Frame(MsgType.PUSH, 1, KeyRange(0, 2000), role=Role.WORKER, index=index,
                  payload=np.array([1.0, 2.0, 3.0], dtype=np.float32), flags=FLAG_COMMIT)
    data = encode(frame)
    fields = LAYOUT.unpack_from(data, 0)
    assert fields[-2:] == (KeyKind.U32, 3)
    assert data[112:124] == u32(3, 9, 1000)  # keys right after the shape, 8-byte aligned
    back = decode(data, max_bytes=MAX)
    assert back.index is not None and back.index.tolist() == [3, 9, 1000]
    assert back.values.tolist() == [1.0, 2.0, 3.0]
    assert back.keys == KeyRange(0, 2000) and back.flags == FLAG_COMMIT and back.key_count == 3


def test_keys_past_2_to_the_32_travel_as_uint64() -> None:
    index = np.array([5, 2**33], dtype=np.uint64)
    frame = Frame(MsgType.PULL, 1, KeyRange(0, 2**33 + 1), role=Role.WORKER, index=index)
    back = decode(encode(frame), max_bytes=MAX)
    assert LAYOUT.unpack_from(encode(frame), 0)[-2] == KeyKind.U64
    assert back.index is not None and back.index.tolist() == [5, 2**33] and back.payload is None


def test_an_empty_key_list_is_a_legal_push() -> None:
    frame = Frame(MsgType.PUSH, 1, KeyRange(0, 8), role=Role.WORKER,
                  index=np.array([], dtype=np.uint32), payload=np.zeros(0, dtype=np.float32))
    back = decode(encode(frame), max_bytes=MAX)
    assert back.key_count == 0 and back.values.size == 0


@pytest.mark.parametrize(("keys", "reason"), [
    (u32(5, 3, 7), "key list is not sorted: key 3 at position 1 follows 5"),
    (u32(3, 3, 7), "key list is duplicated: key 3 at position 1 follows 3"),
    (u32(3, 7, 50), r"keys 3..50 are not all inside the span \[0, 10\)"),
])
def test_bad_key_lists_are_refused_with_the_reason(keys: bytes, reason: str) -> None:
    error = refusal(raw_frame(key_kind=1, keys=keys, start=0, end=10))
    assert isinstance(error, BadPayload)
    with pytest.raises(BadPayload, match=reason):
        decode(raw_frame(key_kind=1, keys=keys, start=0, end=10), max_bytes=MAX)


def test_a_key_past_2_to_the_63_cannot_pass_for_sorted_in_front_of_small_keys() -> None:
    # Found by the fuzz: compared as int64, 2**64 - 1 is -1, "smaller" than 1017, and only the
    # first and last keys are checked against the span.
    keys = np.array([2**64 - 1, 1017, 1018], dtype="<u8").tobytes()
    data = raw_frame(msg_type=MsgType.PULL, key_kind=2, keys=keys, start=1016, end=1040,
                     payload=b"", shape=())
    with pytest.raises(BadPayload, match="not all inside the span|not sorted"):
        decode(data, max_bytes=MAX)


def test_a_key_count_that_does_not_match_the_values_is_refused() -> None:
    data = raw_frame(key_kind=1, keys=u32(1, 2, 3), start=0, end=10,
                     payload=np.zeros(2, dtype="<f4").tobytes(), shape=(2,))
    with pytest.raises(BadPayload, match=r"shape \(2,\) does not match the 3 keys of the key list"):
        decode(data, max_bytes=MAX)


def test_a_declared_key_count_larger_than_the_frame_is_refused() -> None:
    data = raw_frame(key_kind=1, keys=u32(1, 2), key_count=10**9, start=0, end=10)
    with pytest.raises(BadPayload, match="declares 1000000000 keys but holds room for at most"):
        decode(data, max_bytes=MAX)


def test_a_range_frame_may_not_declare_keys_and_init_takes_no_list() -> None:
    with pytest.raises(ProtocolError, match="key-range frame declares a key count of 2"):
        decode(raw_frame(key_count=2), max_bytes=MAX)
    with pytest.raises(ProtocolError, match="INIT frames address a key range, not a key list"):
        decode(raw_frame(msg_type=MsgType.INIT, key_kind=1, keys=u32(1), end=4), max_bytes=MAX)
    with pytest.raises(ProtocolError, match="unknown key kind code 7"):
        decode(raw_frame(key_kind=0, key_count=0)[:92] + bytes([7]) + raw_frame()[93:],
               max_bytes=MAX)


def test_uint32_keys_cannot_describe_a_span_past_2_to_the_32() -> None:
    with pytest.raises(ProtocolError, match="does not fit the frame's uint32 keys"):
        decode(raw_frame(key_kind=1, keys=u32(1), start=0, end=2**32 + 5), max_bytes=MAX)


def test_a_frame_takes_another_request_id_and_keeps_the_rest() -> None:
    sent = Frame(MsgType.PUSH, 7, KeyRange(0, 3), rank=2, clock=5,
                 payload=np.arange(3, dtype=np.float32))
    got = decode(with_request_id(encode(sent), 2**40 + 1), max_bytes=MAX)
    assert got.request_id == 2**40 + 1
    assert (got.rank, got.clock, got.keys) == (2, 5, KeyRange(0, 3))
    np.testing.assert_array_equal(got.values, np.arange(3, dtype=np.float32))


def test_a_small_frame_declaring_64_mib_is_refused_before_anything_is_allocated() -> None:
    keys = 16 * 2**20  # float32 zeros: 64 MiB that zstd packs into a few KiB
    bomb = bytes(encode(Frame(MsgType.PUSH, 1, KeyRange(0, keys), role=Role.WORKER,
                              payload=np.zeros(keys, dtype=np.float32), codec=Codec.ZSTD)))
    assert len(bomb) < 8192
    tracemalloc.start()
    try:
        with pytest.raises(FrameTooLarge) as caught:
            decode(bomb, max_bytes=2**27, max_keys=1797)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert str(caught.value) == f"the frame addresses {keys} keys; this server holds 1797"
    assert peak < 2**20
    lying = bytearray(bomb)  # the same body with a span that fits, but 64 MiB of payload
    struct.pack_into("<QQ", lying, 52, 0, 1797)  # key start, key end
    with pytest.raises(FrameTooLarge, match=r"^the frame declares 67108864 payload bytes; "
                                             r"values for this server's 1797 keys take at most "
                                             r"14376$"):
        decode(bytes(lying), max_bytes=2**27, max_keys=1797)
