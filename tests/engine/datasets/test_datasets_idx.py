"""The IDX reader and writer: round trips, exact encoding, and rejection of damaged files."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from engine.datasets.idx import encode_idx, parse_idx, read_idx, write_idx
from engine.errors import DataError, DatasetFormatError, DatasetNotFound

IDX_DTYPES = [np.uint8, np.int8, np.int16, np.int32, np.float32, np.float64]


@settings(max_examples=60, deadline=None)
@given(
    array=hnp.arrays(
        dtype=st.sampled_from(IDX_DTYPES),
        shape=hnp.array_shapes(min_dims=1, max_dims=4, min_side=0, max_side=5),
    ),
    compress=st.booleans(),
)
def test_round_trip(
    tmp_path_factory: pytest.TempPathFactory, array: np.ndarray, compress: bool
) -> None:
    path = tmp_path_factory.mktemp("idx") / "a.idx"
    write_idx(path, array, compress=compress)
    back = read_idx(path)
    assert back.shape == array.shape
    assert back.dtype.kind == array.dtype.kind and back.dtype.itemsize == array.dtype.itemsize
    np.testing.assert_array_equal(back, array)


def test_encoding_matches_the_published_layout() -> None:
    # Magic 0x00000801 (ubyte, 1 dim), big-endian dimension 2, then the values.
    assert encode_idx(np.array([7, 9], dtype=np.uint8)) == bytes.fromhex("00000801 00000002 0709")
    # Multi-byte values are big-endian whatever the host order.
    encoded = encode_idx(np.array([[1, 2]], dtype="<i4"))
    assert encoded == bytes.fromhex("00000c02 00000001 00000002 00000001 00000002")


def test_gzip_is_detected_by_content_not_name(tmp_path: Path) -> None:
    array = np.arange(12, dtype=np.uint8).reshape(3, 4)
    raw, packed = tmp_path / "x.gz", tmp_path / "x.raw"
    write_idx(raw, array, compress=False)
    write_idx(packed, array, compress=True)
    np.testing.assert_array_equal(read_idx(raw), array)
    np.testing.assert_array_equal(read_idx(packed), array)


def test_result_is_a_zero_copy_view() -> None:
    array = parse_idx(encode_idx(np.arange(6, dtype=np.uint8)))
    assert not array.flags.owndata and not array.flags.writeable


@pytest.mark.parametrize("compress", [True, False])
@pytest.mark.parametrize(("max_items", "expected"), [(0, 0), (2, 2), (5, 5), (99, 5)])
def test_max_items_reads_a_prefix(
    tmp_path: Path, compress: bool, max_items: int, expected: int
) -> None:
    array = np.arange(5 * 6, dtype=np.int16).reshape(5, 2, 3)
    path = tmp_path / "a"
    write_idx(path, array, compress=compress)
    np.testing.assert_array_equal(read_idx(path, max_items=max_items), array[:expected])


def test_max_items_needs_only_the_prefix_of_a_gzip_stream(tmp_path: Path) -> None:
    array = np.random.default_rng(0).integers(0, 256, (400, 50), dtype=np.uint8)
    packed = gzip.compress(encode_idx(array))
    path = tmp_path / "cut.gz"
    path.write_bytes(packed[: len(packed) * 3 // 4])  # the tail, and the gzip trailer, are gone
    np.testing.assert_array_equal(read_idx(path, max_items=3), array[:3])
    with pytest.raises(DatasetFormatError, match="truncated"):
        read_idx(path)


def test_multi_member_gzip_and_zero_padding(tmp_path: Path) -> None:
    data = encode_idx(np.arange(10, dtype=np.uint8))
    path = tmp_path / "multi.gz"
    path.write_bytes(gzip.compress(data[:7]) + gzip.compress(data[7:]) + b"\0" * 8)
    np.testing.assert_array_equal(read_idx(path), np.arange(10))


def _valid() -> bytes:
    return encode_idx(np.arange(24, dtype=np.uint8).reshape(2, 3, 4))


BAD_RAW = {
    "empty": b"",
    "short header": b"\x00\x00",
    "wrong magic": b"\x01\x02" + _valid()[2:],
    "text file": b"<html>not found</html>",
    "unknown dtype code": b"\x00\x00\x0a\x03" + _valid()[4:],
    "zero dimensions": b"\x00\x00\x08\x00",
    "truncated dimensions": _valid()[:10],
    "truncated payload": _valid()[:-1],
    "trailing bytes": _valid() + b"\x00",
}


@pytest.mark.parametrize("compress", [True, False])
@pytest.mark.parametrize("case", sorted(BAD_RAW))
def test_malformed_idx_is_rejected(tmp_path: Path, case: str, compress: bool) -> None:
    path = tmp_path / "bad"
    path.write_bytes(gzip.compress(BAD_RAW[case]) if compress else BAD_RAW[case])
    with pytest.raises(DatasetFormatError):
        read_idx(path)


def test_truncated_payload_message_says_what_is_missing() -> None:
    with pytest.raises(
        DatasetFormatError, match=r"shape \(2, 3, 4\) \(40 bytes with header\) but only 39 bytes"
    ):
        parse_idx(_valid()[:-1], name="f")


@pytest.mark.parametrize("max_items", [None, 1])
def test_truncated_gzip_is_rejected(tmp_path: Path, max_items: int | None) -> None:
    packed = gzip.compress(_valid())
    path = tmp_path / "cut.gz"
    path.write_bytes(packed[:12])  # inside the deflate stream
    with pytest.raises(DatasetFormatError, match="truncated"):
        read_idx(path, max_items=max_items)


def test_corrupt_gzip_is_rejected(tmp_path: Path) -> None:
    packed = bytearray(gzip.compress(np.arange(3000, dtype=np.int32).tobytes()))
    packed[-6] ^= 0xFF  # damages the CRC trailer, so zlib reports it
    path = tmp_path / "bad.gz"
    path.write_bytes(bytes(packed))
    with pytest.raises(DatasetFormatError, match="corrupt gzip"):
        read_idx(path)


def test_garbage_after_the_gzip_member_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "junk.gz"
    path.write_bytes(gzip.compress(_valid()) + b"not gzip")
    with pytest.raises(DatasetFormatError):
        read_idx(path)


def test_missing_and_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(DatasetNotFound, match="does not exist"):
        read_idx(tmp_path / "nope.gz")
    with pytest.raises(DataError, match="cannot read"):
        read_idx(tmp_path)  # a directory


@pytest.mark.parametrize("bad", [-1, 1.5, True])
def test_max_items_must_be_a_count(tmp_path: Path, bad: object) -> None:
    path = tmp_path / "a"
    write_idx(path, np.arange(3, dtype=np.uint8))
    with pytest.raises(DataError, match="max_items"):
        read_idx(path, max_items=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("array", [np.zeros(3, dtype=np.int64), np.zeros((), dtype=np.uint8)])
def test_unencodable_arrays_are_refused(array: np.ndarray) -> None:
    with pytest.raises(DatasetFormatError):
        encode_idx(array)
