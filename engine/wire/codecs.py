"""Wire codecs: how a frame's body (everything after its header) may be compressed, and the value
types a frame may carry (float32, float16, bfloat16).

A compressed frame keeps its header readable and says which codec packed the body in the
header's codec byte (``Codec``); its header still declares the uncompressed sizes, so the reader
knows exactly how large the body becomes before it inflates anything and refuses a body that would
exceed its frame limit (no decompression bomb). The codecs come from cramjam (one maintained
library with lz4, zstd and snappy); each is a small entry in ``CODECS``.

Compression pays only on key lists and sparse values (measured here: dense float32 gradients do
not compress), so the parameter client asks for it on key-list frames only, and ``encode`` sends
a frame raw when packing did not make it smaller.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

import cramjam
import ml_dtypes
import numpy as np

from engine.errors import BadPayload
from engine.registry import Registry


class Codec(IntEnum):
    """The header's codec byte: 0 is a raw body, which every older frame had."""

    NONE = 0
    LZ4 = 1
    ZSTD = 2
    SNAPPY = 3


@dataclass(frozen=True)
class Packer:
    code: Codec
    compress: Callable[[Any], Any]
    # Inflate into a buffer of the exact expected size; refuses input that does not fit it.
    decompress_into: Callable[[Any, Any], int]


def _lz4(data: Any) -> Any:
    return cramjam.lz4.compress_block(data, store_size=True)


CODECS: Registry[Packer] = Registry("wire codec")
CODECS.register("none", Packer(Codec.NONE, bytes, lambda data, out: 0),
                "frames travel as they are")
CODECS.register("lz4", Packer(Codec.LZ4, _lz4, cramjam.lz4.decompress_block_into),
                "LZ4 blocks: the fastest, the least packing")
CODECS.register("zstd", Packer(Codec.ZSTD, cramjam.zstd.compress, cramjam.zstd.decompress_into),
                "Zstandard (level 3): the most packing for its speed")
CODECS.register("snappy", Packer(Codec.SNAPPY, cramjam.snappy.compress_raw,
                                 cramjam.snappy.decompress_raw_into),
                "Snappy, as OSDI'14's parameter server used")
_BY_CODE = {packer.code: packer for packer in map(CODECS.get, CODECS.names())}


def packer(code: Codec) -> Packer:
    return _BY_CODE[code]


def pack(code: Codec, body: memoryview) -> bytes:
    return bytes(_BY_CODE[code].compress(body))


def unpack(code: Codec, body: memoryview, out: memoryview) -> None:
    """Inflate ``body`` into ``out``, which must come out exactly full."""
    try:
        written = _BY_CODE[code].decompress_into(body, out)
    except cramjam.DecompressionError as exc:
        raise BadPayload(f"the {code.name.lower()} body does not inflate: {exc}") from None
    if written != len(out):
        raise BadPayload(f"the {code.name.lower()} body inflates to {written} bytes; the header "
                         f"declares {len(out)}")


# -- value types on the wire --------------------------------------------------------------------

BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
_FLOAT16_MAX = float(np.finfo(np.float16).max)
WIRE_DTYPES = ("float32", "float16", "bfloat16")


# numpy casts float16 one value at a time: 7.8 ms each way for the MNIST MLP's 932k values
# here, against 0.4 ms for torch's vectorised cast (docs/communication.md#wire-codecs). Arrays
# from this size on go through torch, imported on first use, so only float16 runs load it.
_TORCH_CAST_FROM = 4096


def narrow(values: np.ndarray, dtype: np.dtype[Any]) -> np.ndarray:
    """``values`` (float32) in a narrower float type for the wire. float16 saturates at its
    largest finite value (65504) instead of turning a large gradient into infinity, which a
    server would refuse (a NaN stays NaN); bfloat16 has float32's range and rounds to nearest
    even."""
    if dtype == values.dtype:
        return values
    if dtype == np.float16:
        if len(values) >= _TORCH_CAST_FROM and values.dtype == np.float32:
            return _torch_cast(values, np.dtype(np.float16), saturate=_FLOAT16_MAX)
        values = np.clip(values, -_FLOAT16_MAX, _FLOAT16_MAX)
    narrowed: np.ndarray = values.astype(dtype)
    return narrowed


def widen_into(out: np.ndarray, values: np.ndarray) -> None:
    """``np.copyto(out, values)`` into a float32 ``out``, float16 values cast by torch."""
    if values.dtype == np.float16 and len(values) >= _TORCH_CAST_FROM and out.dtype == np.float32:
        torch = _torch()
        torch.from_numpy(out).copy_(torch.from_numpy(values))
        return
    np.copyto(out, values)


def widen(values: np.ndarray) -> np.ndarray:
    """``values`` as float32 (the same array when they already are)."""
    if values.dtype == np.float32:
        return values
    out = np.empty(values.shape, dtype=np.float32)
    widen_into(out, values)
    return out


def prepare_casts(dtype: str) -> None:
    """Load what casting to ``dtype`` needs now (a float16 run's first frame would otherwise wait
    for torch's import)."""
    if dtype == "float16":
        _torch()


def _torch_cast(values: np.ndarray, dtype: np.dtype[Any], *, saturate: float) -> np.ndarray:
    torch = _torch()
    out = np.empty(values.shape, dtype=dtype)
    # clamp keeps NaN (which a server refuses), as numpy's clip does
    torch.from_numpy(out).copy_(torch.from_numpy(values).clamp(-saturate, saturate))
    return out


def _torch() -> Any:
    import torch

    # A frame's values are a read-only buffer that torch only reads here; torch warns about
    # any tensor over one (this process's filter, once: catch_warnings is not thread-safe).
    warnings.filterwarnings("ignore", message="The given NumPy array is not writable",
                            category=UserWarning)
    return torch
