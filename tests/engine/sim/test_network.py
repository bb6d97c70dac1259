from __future__ import annotations

import pytest

from engine.errors import ConfigError
from engine.sim.network import Link, parse_network, transmit


@pytest.mark.parametrize(("text", "rate", "latency", "spec"), [
    ("10gbit:50us", 1.25e9, 50e-6, "10gbit:50us"),
    ("1GBit:0.2ms", 1.25e8, 2e-4, "1gbit:0.2ms"),
    ("100mbyte:0s", 1e8, 0.0, "100mbyte:0s"),
])
def test_parse(text: str, rate: float, latency: float, spec: str) -> None:
    model = parse_network(text)
    assert model.bytes_per_s == pytest.approx(rate)
    assert model.latency_s == pytest.approx(latency)
    assert model.spec == spec


@pytest.mark.parametrize(("text", "says"), [
    ("10gbit", "BANDWIDTH:LATENCY"), ("10gb:1ms", "bandwidth unit"),
    ("10gbit:1min", "latency unit"), ("0gbit:1ms", "between"), ("1gbit:11s", "at most 10 s"),
    ("1..2gbit:1ms", "not a number"),
])
def test_bad_specs_say_what_is_wrong(text: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        parse_network(text)


def test_links_are_fifo_on_both_ends() -> None:
    model = parse_network("8kbit:1s")  # 1000 bytes per second
    a, b, server = Link(), Link(), Link()
    assert transmit(model, 0.0, a, server, 500) == pytest.approx(1.5)
    # b's message waits for the server's incoming side to be free
    assert transmit(model, 0.0, b, server, 500) == pytest.approx(2.0)
    # a's next message waits for nothing on a's side (free at 0.5) but the server's (at 1.0)
    assert transmit(model, 0.6, a, server, 1000) == pytest.approx(3.0)
