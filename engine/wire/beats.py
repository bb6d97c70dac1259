"""Heartbeat datagrams: a shard server's thread tells the coordinator it is alive.

A beat travels by UDP, apart from the run's websockets, so that a server whose event loop is
busy (a long update, a machine with more busy processes than cores) still answers: its
liveness is the process's, not the loop's. Each beat carries how long the server's loop has
not turned (``loop_lag_s``), so that a loop that truly hangs is still seen.

Layout (network byte order), 48 bytes: magic ``PSB2``, rank (u32), incarnation (u64),
sequence number (u64), loop lag in seconds (f64), then the first 16 bytes of HMAC-SHA256 over
the 32 bytes before it, keyed with the run's join token: a beat nobody with the token sent is
dropped. The incarnation is the number the coordinator drew for the server process when it
welcomed it: a restarted server counts its sequence from 1 again, so a beat of an earlier
process (a replayed datagram with a higher number) is told apart by its incarnation, not its
sequence number.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import struct
from dataclasses import dataclass

from engine.errors import ProtocolError

MAGIC = b"PSB2"
_BODY = struct.Struct("!4sIQQd")
_MAC_BYTES = 16
SIZE = _BODY.size + _MAC_BYTES
_MAX_RANK = 2**31


@dataclass(frozen=True)
class Beat:
    rank: int
    incarnation: int  # the server process's, as its welcome gave it
    seq: int
    loop_lag_s: float


def _key(token: str) -> bytes:
    return hashlib.sha256(b"psctl-beat\0" + token.encode()).digest()


def encode(beat: Beat, token: str) -> bytes:
    body = _BODY.pack(MAGIC, beat.rank, beat.incarnation, beat.seq, beat.loop_lag_s)
    return body + hmac.new(_key(token), body, hashlib.sha256).digest()[:_MAC_BYTES]


def decode(data: bytes, token: str) -> Beat:
    """The beat in ``data``; :class:`ProtocolError` for anything else (wrong size, magic or
    signature, a rank or lag out of range)."""
    if len(data) != SIZE:
        raise ProtocolError(f"a heartbeat is {SIZE} bytes, not {len(data)}")
    body, mac = data[:_BODY.size], data[_BODY.size:]
    magic, rank, incarnation, seq, lag = _BODY.unpack(body)
    if magic != MAGIC:
        raise ProtocolError("not a psctl heartbeat")
    if not hmac.compare_digest(mac, hmac.new(_key(token), body, hashlib.sha256).digest()[
            :_MAC_BYTES]):
        raise ProtocolError("a heartbeat not signed with the run's token")
    if rank >= _MAX_RANK or not (math.isfinite(lag) and lag >= 0):
        raise ProtocolError(f"a heartbeat with rank {rank} and loop lag {lag}")
    return Beat(rank=rank, incarnation=incarnation, seq=seq, loop_lag_s=lag)
