"""Heartbeat datagrams: signed with the run's token, bound to the server process's incarnation,
exact in size, refused otherwise."""

from __future__ import annotations

import pytest

from engine.errors import ProtocolError
from engine.wire import beats


def test_a_beat_round_trips() -> None:
    beat = beats.Beat(rank=3, incarnation=2**64 - 1, seq=2**40, loop_lag_s=0.25)
    data = beats.encode(beat, "token")
    assert len(data) == beats.SIZE
    assert beats.decode(data, "token") == beat


@pytest.mark.parametrize(("data", "says"), [
    (b"", "48 bytes, not 0"),
    (beats.encode(beats.Beat(0, 5, 1, 0.0), "token")[:-1], "not 47"),
    (b"XXXX" + beats.encode(beats.Beat(0, 5, 1, 0.0), "token")[4:], "not a psctl heartbeat"),
    (beats.encode(beats.Beat(0, 5, 1, 0.0), "another run's token"), "not signed"),
    (beats.encode(beats.Beat(0, 5, 1, float("nan")), "token"), "loop lag nan"),
    (beats.encode(beats.Beat(0, 5, 1, -1.0), "token"), "loop lag -1"),
], ids=["empty", "short", "magic", "token", "nan", "negative"])
def test_anything_else_is_refused(data: bytes, says: str) -> None:
    with pytest.raises(ProtocolError, match=says):
        beats.decode(data, "token")


@pytest.mark.parametrize("offset", [7, 15], ids=["rank", "incarnation"])
def test_a_changed_field_breaks_the_signature(offset: int) -> None:
    data = bytearray(beats.encode(beats.Beat(1, 9, 7, 0.0), "token"))
    data[offset] ^= 1
    with pytest.raises(ProtocolError, match="not signed"):
        beats.decode(bytes(data), "token")
