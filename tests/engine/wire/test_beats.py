"""Heartbeat datagrams: signed with the run's token, exact in size, refused otherwise."""

from __future__ import annotations

import pytest

from engine.errors import ProtocolError
from engine.wire import beats


def test_a_beat_round_trips() -> None:
    beat = beats.Beat(rank=3, seq=2**40, loop_lag_s=0.25)
    data = beats.encode(beat, "token")
    assert len(data) == beats.SIZE
    assert beats.decode(data, "token") == beat


@pytest.mark.parametrize(("data", "says"), [
    (b"", "40 bytes, not 0"),
    (beats.encode(beats.Beat(0, 1, 0.0), "token")[:-1], "not 39"),
    (b"XXXX" + beats.encode(beats.Beat(0, 1, 0.0), "token")[4:], "not a psctl heartbeat"),
    (beats.encode(beats.Beat(0, 1, 0.0), "another run's token"), "not signed"),
    (beats.encode(beats.Beat(0, 1, float("nan")), "token"), "loop lag nan"),
    (beats.encode(beats.Beat(0, 1, -1.0), "token"), "loop lag -1"),
], ids=["empty", "short", "magic", "token", "nan", "negative"])
def test_anything_else_is_refused(data: bytes, says: str) -> None:
    with pytest.raises(ProtocolError, match=says):
        beats.decode(data, "token")


def test_a_changed_field_breaks_the_signature() -> None:
    data = bytearray(beats.encode(beats.Beat(1, 7, 0.0), "token"))
    data[7] ^= 1  # the rank
    with pytest.raises(ProtocolError, match="not signed"):
        beats.decode(bytes(data), "token")
