"""Compressed frames and narrow value types: what is packed comes back exactly, a frame that
would not shrink travels raw, and a hostile body can neither inflate past the frame limit nor
lie about its size."""

from __future__ import annotations

import numpy as np
import pytest

from engine.errors import BadPayload, FrameTooLarge, ProtocolError
from engine.keys import KeyRange
from engine.wire.codecs import BFLOAT16, CODECS, Codec, narrow, widen, widen_into
from engine.wire.protocol import (
    HEADER_BYTES,
    DType,
    Frame,
    MsgType,
    Role,
    decode,
    encode,
    numpy_dtype,
    wire_dtype,
)

LIMIT = 1 << 22
CODES = [Codec.LZ4, Codec.ZSTD, Codec.SNAPPY]


def sparse_push(codec: Codec, count: int = 5000, span: int = 500_000) -> Frame:
    rng = np.random.default_rng(0)
    index = np.sort(rng.choice(span, size=count, replace=False)).astype(np.uint32)
    values = rng.standard_normal(count).astype(np.float32)
    return Frame(MsgType.PUSH, 7, KeyRange(0, span), role=Role.WORKER, rank=1, clock=3,
                 payload=values, index=index, codec=codec)


@pytest.mark.parametrize("codec", CODES)
def test_a_compressed_sparse_frame_round_trips_exactly(codec: Codec) -> None:
    frame = sparse_push(codec)
    raw = encode(sparse_push(Codec.NONE))
    data = encode(frame)
    assert len(data) < len(raw) or data == raw  # packed only where it pays
    back = decode(data, max_bytes=LIMIT)
    assert back.index is not None and frame.index is not None
    np.testing.assert_array_equal(back.index, frame.index)
    np.testing.assert_array_equal(back.values, frame.values)
    assert (back.clock, back.rank, back.keys) == (3, 1, KeyRange(0, 500_000))
    assert back.codec in (codec, Codec.NONE)


def test_zstd_packs_a_sorted_key_list() -> None:
    # Sorted keys share their high bytes; what zstd saves on them is measured in
    # docs/communication.md, here only that it saves something.
    assert len(encode(sparse_push(Codec.ZSTD))) < len(encode(sparse_push(Codec.NONE)))


def test_a_frame_that_does_not_shrink_travels_raw() -> None:
    noise = np.random.default_rng(1).standard_normal(64).astype(np.float32)
    frame = Frame(MsgType.PUSH, 1, KeyRange(0, 64), role=Role.WORKER, payload=noise,
                  codec=Codec.LZ4)
    data = encode(frame)
    assert data[93] == Codec.NONE and decode(data, max_bytes=LIMIT).codec is Codec.NONE


def _packed(frame: Frame) -> bytearray:
    data = encode(frame)
    assert data[93] == frame.codec, "the test frame must be compressible"
    return data


def test_a_body_cannot_inflate_past_the_frame_limit() -> None:
    zeros = Frame(MsgType.PUSH, 1, KeyRange(0, 1 << 20), role=Role.WORKER,
                  payload=np.zeros(1 << 20, dtype=np.float32), codec=Codec.ZSTD)
    data = _packed(zeros)
    assert len(data) < 1000  # 4 MiB of zeros in a few hundred bytes
    with pytest.raises(FrameTooLarge, match="would inflate to"):
        decode(data, max_bytes=1 << 20)
    assert decode(data, max_bytes=(1 << 22) + 200).values.shape == (1 << 20,)


@pytest.mark.parametrize("codec", CODES)
def test_a_body_that_lies_about_its_size_or_is_garbage_is_refused(codec: Codec) -> None:
    data = _packed(Frame(MsgType.PUSH, 1, KeyRange(0, 4096), role=Role.WORKER,
                         payload=np.zeros(4096, dtype=np.float32), codec=codec))
    longer = bytearray(data)
    longer[84:92] = (4 * 4096 + 4).to_bytes(8, "little")  # payload bytes: one value more
    with pytest.raises((BadPayload, ProtocolError)):
        decode(longer, max_bytes=LIMIT)
    garbage = data[:HEADER_BYTES + 8] + bytes(range(200))
    with pytest.raises(BadPayload, match="does not inflate|inflates to"):
        decode(garbage, max_bytes=LIMIT)


def test_an_unknown_codec_is_refused() -> None:
    data = encode(sparse_push(Codec.NONE))
    data[93] = 9
    with pytest.raises(ProtocolError, match="unknown codec code 9"):
        decode(data, max_bytes=LIMIT)


def test_the_codec_registry_names_every_codec() -> None:
    assert CODECS.names() == ("none", "lz4", "zstd", "snappy")
    assert {entry.value.code for entry in CODECS} == set(Codec)


@pytest.mark.parametrize("name", ["float16", "bfloat16"])
def test_narrow_values_travel_in_half_the_bytes(name: str) -> None:
    dtype = wire_dtype(name)
    values = np.linspace(-3, 3, 1000, dtype=np.float32)
    narrow_values = narrow(values, numpy_dtype(dtype))
    frame = Frame(MsgType.PUSH, 1, KeyRange(0, 1000), role=Role.WORKER, dtype=dtype,
                  payload=narrow_values)
    wide = Frame(MsgType.PUSH, 1, KeyRange(0, 1000), role=Role.WORKER, payload=values)
    assert len(encode(frame)) - HEADER_BYTES - 8 == (len(encode(wide)) - HEADER_BYTES - 8) // 2
    back = decode(encode(frame), max_bytes=LIMIT).values.astype(np.float32)
    tolerance = 2.0**-8 if name == "float16" else 2.0**-7  # 11 and 8 significant bits
    np.testing.assert_allclose(back, values, rtol=tolerance, atol=1e-3)


def test_float16_saturates_instead_of_overflowing() -> None:
    values = np.array([1e6, -1e6, 1.0], dtype=np.float32)
    assert narrow(values, np.dtype(np.float16)).tolist() == [65504.0, -65504.0, 1.0]
    assert np.isfinite(narrow(np.array([3e38], dtype=np.float32), BFLOAT16)).all()


def awkward_floats(count: int) -> np.ndarray:
    """Normal, subnormal-in-float16, exactly-halfway, overflowing, signed-zero and NaN values."""
    rng = np.random.default_rng(7)
    values = np.concatenate([
        rng.normal(0, 1, count), rng.normal(0, 1e-6, count), rng.normal(0, 1e5, count // 10),
        (np.arange(2048) + 0.5) * 2.0**-24,  # halfway between float16 subnormals
        [0.0, -0.0, 65504.0, 65519.0, 65520.0, -7e4, 6.0e-8, 5.96e-8, 1e-9, np.nan]])
    return values.astype(np.float32)


def test_large_float16_casts_match_numpy_bit_for_bit() -> None:
    values = awkward_floats(20_000)  # past the size from which torch casts
    fast = narrow(values, np.dtype(np.float16))
    slow = np.clip(values, -65504, 65504).astype(np.float16)  # numpy's own, value by value
    assert fast.dtype == np.float16
    assert np.array_equal(fast.view(np.uint16), slow.view(np.uint16))
    assert np.isnan(fast[-1])  # kept, so that the server refuses it
    out = np.full(len(fast), 7.0, dtype=np.float32)
    widen_into(out, fast)

    def same(a: np.ndarray, b: np.ndarray) -> bool:  # bit for bit, any NaN payload
        nan = np.isnan(a)
        return bool(np.array_equal(nan, np.isnan(b))
                    and np.array_equal(a[~nan].view(np.uint32), b[~nan].view(np.uint32)))

    assert same(out, slow.astype(np.float32))
    assert same(widen(fast), out)
    read_only = np.frombuffer(fast.tobytes(), dtype=np.float16)  # a frame's values
    assert same(widen(read_only), out)


def test_a_non_finite_bfloat16_push_is_refused() -> None:
    values = np.array([1.0, np.inf], dtype=np.float32).astype(BFLOAT16)
    frame = Frame(MsgType.PUSH, 1, KeyRange(0, 2), role=Role.WORKER, dtype=DType.BFLOAT16,
                  payload=values)
    with pytest.raises(BadPayload, match="NaN or infinity"):
        decode(encode(frame), max_bytes=LIMIT)
