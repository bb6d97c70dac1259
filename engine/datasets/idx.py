"""Reader and writer for the IDX format of MNIST-style data sets, gzip-compressed or raw.

An IDX file is a 4-byte magic number (two zero bytes, a dtype code, the number of dimensions),
one big-endian uint32 per dimension, then the values in C order, big-endian. Everything about
the header is checked against the payload length before a single value is read, so a truncated
download or a file of the wrong kind fails with :class:`DatasetFormatError` instead of a numpy
reshape error. Arrays come from :func:`numpy.frombuffer` and so are read-only views.
"""

from __future__ import annotations

import gzip
import math
import zlib
from pathlib import Path

import numpy as np

from engine.errors import DataError, DatasetFormatError, DatasetNotFound

_DTYPES: dict[int, np.dtype] = {
    0x08: np.dtype("u1"),
    0x09: np.dtype("i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}
_GZIP_MAGIC = b"\x1f\x8b"
# Four magic bytes plus at most 255 uint32 dimensions.
_MAX_HEADER = 4 + 4 * 255


def parse_idx(buf: bytes, *, max_items: int | None = None, name: str = "<bytes>") -> np.ndarray:
    """Decode an uncompressed IDX image in ``buf``.

    With ``max_items`` only the first that many entries along axis 0 are returned and ``buf``
    may end right after them (so a prefix of the file suffices); without it the payload must
    fill ``buf`` exactly.
    """
    dtype, dims, header_len = _parse_header(buf, name)
    item_values = math.prod(dims[1:])
    count = dims[0] if max_items is None else min(dims[0], _check_max_items(max_items))
    expected = header_len + count * item_values * dtype.itemsize
    if len(buf) < expected:
        raise DatasetFormatError(
            f"{name}: truncated IDX data: header promises shape {dims} ({expected} bytes "
            f"with header) but only {len(buf)} bytes are there; fetch the file again"
        )
    if max_items is None and len(buf) > expected:
        raise DatasetFormatError(
            f"{name}: {len(buf) - expected} unexpected bytes after the IDX data of shape "
            f"{dims}; this is not a well-formed IDX file"
        )
    flat = np.frombuffer(buf, dtype=dtype, count=count * item_values, offset=header_len)
    return flat.reshape((count, *dims[1:]))


def read_idx(path: Path, *, max_items: int | None = None) -> np.ndarray:
    """Read an IDX file, gzip-compressed or raw (told apart by content, not by file name).

    With ``max_items`` a gzip file is only decompressed as far as needed, which makes a small
    ``train_limit`` cheap.
    """
    raw = _read_bytes(path)
    name = str(path)
    if not raw.startswith(_GZIP_MAGIC):
        return parse_idx(raw, max_items=max_items, name=name)
    if max_items is None:
        return parse_idx(_gunzip(raw, name), name=name)
    dtype, dims, header_len = _parse_header(_gunzip(raw, name, limit=_MAX_HEADER), name)
    count = min(dims[0], _check_max_items(max_items))
    needed = header_len + count * math.prod(dims[1:]) * dtype.itemsize
    return parse_idx(_gunzip(raw, name, limit=needed), max_items=max_items, name=name)


def encode_idx(array: np.ndarray) -> bytes:
    """The uncompressed IDX encoding of ``array`` (any of the six IDX dtypes, 1 to 255 dims)."""
    code = _dtype_code(array.dtype)
    if not 1 <= array.ndim <= 255:
        raise DatasetFormatError(f"IDX needs 1 to 255 dimensions, got {array.ndim}")
    if any(d >= 2**32 for d in array.shape):
        raise DatasetFormatError(f"IDX dimensions must fit in uint32, got {array.shape}")
    header = bytes([0, 0, code, array.ndim]) + np.asarray(array.shape, dtype=">u4").tobytes()
    return header + np.ascontiguousarray(array, dtype=_DTYPES[code]).tobytes()


def write_idx(path: Path, array: np.ndarray, *, compress: bool = True) -> None:
    """Write ``array`` as an IDX file, gzip-compressed unless ``compress`` is false."""
    data = encode_idx(array)
    # mtime=0 keeps the output byte-identical across runs, so its md5 is reproducible.
    payload = gzip.compress(data, mtime=0) if compress else data
    try:
        Path(path).write_bytes(payload)
    except OSError as exc:
        raise DataError(f"cannot write IDX file {path}: {exc.strerror or exc}") from exc


def _parse_header(buf: bytes, name: str) -> tuple[np.dtype, tuple[int, ...], int]:
    if len(buf) < 4:
        raise DatasetFormatError(f"{name}: {len(buf)} bytes is too short for an IDX header")
    zero, code, ndim = int.from_bytes(buf[:2], "big"), buf[2], buf[3]
    if zero != 0:
        raise DatasetFormatError(
            f"{name}: bad IDX magic number 0x{buf[:4].hex()} (must start with two zero bytes); "
            "this is not an IDX file, or it is compressed with something other than gzip"
        )
    if code not in _DTYPES:
        raise DatasetFormatError(f"{name}: unknown IDX dtype code 0x{code:02x}")
    if ndim == 0:
        raise DatasetFormatError(f"{name}: IDX header declares zero dimensions")
    header_len = 4 + 4 * ndim
    if len(buf) < header_len:
        raise DatasetFormatError(f"{name}: truncated IDX header ({ndim} dimensions declared)")
    dims = tuple(int(d) for d in np.frombuffer(buf, dtype=">u4", count=ndim, offset=4))
    return _DTYPES[code], dims, header_len


def _gunzip(raw: bytes, name: str, *, limit: int | None = None) -> bytes:
    """Decompress all gzip members of ``raw``, or only the first ``limit`` bytes of output."""
    parts: list[bytes] = []
    got, rest = 0, raw
    try:
        while rest and (limit is None or got < limit):
            member = zlib.decompressobj(wbits=31)  # 31: expect a gzip header and trailer
            chunk = member.decompress(rest, 0 if limit is None else limit - got)
            parts.append(chunk)
            got += len(chunk)
            if not member.eof:
                if limit is not None and got >= limit:
                    break
                raise DatasetFormatError(f"{name}: truncated gzip stream; fetch the file again")
            rest = member.unused_data
            # gzip itself tolerates zero padding after the last member, so do we.
            if not rest.strip(b"\0"):
                break
    except zlib.error as exc:
        message = f"{name}: corrupt gzip data ({exc}); fetch the file again"
        raise DatasetFormatError(message) from exc
    return b"".join(parts)


def _read_bytes(path: Path) -> bytes:
    try:
        return Path(path).read_bytes()
    except FileNotFoundError as exc:
        raise DatasetNotFound(f"IDX file {path} does not exist") from exc
    except OSError as exc:
        raise DataError(f"cannot read IDX file {path}: {exc.strerror or exc}") from exc


def _check_max_items(max_items: int) -> int:
    if isinstance(max_items, bool) or not isinstance(max_items, int) or max_items < 0:
        raise DataError(f"max_items must be a non-negative integer, got {max_items!r}")
    return max_items


def _dtype_code(dtype: np.dtype) -> int:
    for code, known in _DTYPES.items():
        if known.kind == dtype.kind and known.itemsize == dtype.itemsize:
            return code
    raise DatasetFormatError(f"IDX cannot store dtype {dtype}")
